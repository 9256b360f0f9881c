//! The stale-statement filter and the SQL text splitter on arbitrary input. The first byte
//! picks the chunk size; the client side must write exactly as many bytes as it read, changed
//! only where it renames a statement in a Bind or Describe (or rewrite a whole Query); the backend side must keep its replacement within what
//! it lets go; splitting a text must give pieces of that text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::sql_text::{prepare_source, split_statements};
use pgwake_protocol::stale::{StaleAnswer, StaleStatement, StaleStatements};

fuzz_target!(|data: &[u8]| {
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let size = usize::from(size).max(1);
    let stale = |answer| StaleStatement {
        answer,
        param_types: [23, 25].into(),
    };
    let mut s = StaleStatements::start([
        ("s1".into(), stale(StaleAnswer::ResultChanged)),
        ("a".into(), stale(StaleAnswer::Failed(b"E\0\0\0\x04".to_vec().into()))),
    ]);
    let mut held: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut rewrote = false;
    for chunk in stream.chunks(size) {
        held.extend_from_slice(chunk);
        loop {
            let a = s.client(&mut held);
            assert!(a.ready <= held.len());
            let mut from = 0;
            if let Some(sp) = a.splice {
                // Only a whole Query is rewritten, into another Query.
                assert!(sp.at + sp.len <= a.ready && held[sp.at] == b'Q' && sp.with[0] == b'Q');
                out.extend_from_slice(&held[..sp.at]);
                out.extend_from_slice(&sp.with);
                from = sp.at + sp.len;
                rewrote = true;
            }
            out.extend_from_slice(&held[from..a.ready]);
            held.drain(..a.ready);
            if a.ready == 0 || held.is_empty() {
                break;
            }
        }
    }
    out.extend(held);
    if !rewrote {
        assert_eq!(out.len(), stream.len());
        assert!(out.iter().zip(stream).all(|(o, i)| o == i || *o == 0x7f));
    }

    // The same bytes as the backend's answer, with the expectations the client side left; held
    // bytes are offered again before more arrive, as the relay does.
    let mut held: Vec<u8> = Vec::new();
    for chunk in stream.chunks(size) {
        held.extend_from_slice(chunk);
        loop {
            let a = s.backend(&held);
            assert!(a.ready <= held.len());
            if let Some(sp) = &a.splice {
                assert!(sp.at + sp.len <= a.ready);
            }
            held.drain(..a.ready);
            if a.ready == 0 || held.is_empty() {
                break;
            }
        }
    }

    if let Ok(text) = std::str::from_utf8(stream) {
        for piece in split_statements(text) {
            let start = piece.as_ptr() as usize - text.as_ptr() as usize;
            assert!(start + piece.len() <= text.len());
        }
        let _ = prepare_source(text, "p");
    }
});
