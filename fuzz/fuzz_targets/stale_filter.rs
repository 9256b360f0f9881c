//! The stale-statement filter and the SQL text splitter on arbitrary input. The first byte
//! picks the chunk size; the client side must write exactly as many bytes as it read, changed
//! only where it renames a statement; the backend side must keep its replacement within what
//! it lets go; splitting a text must give pieces of that text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::sql_text::{prepare_source, split_statements};
use pgwake_protocol::stale::StaleStatements;

fuzz_target!(|data: &[u8]| {
    let Some((&size, stream)) = data.split_first() else {
        return;
    };
    let size = usize::from(size).max(1);
    let mut s = StaleStatements::start(["s1".into(), "a".into()]);
    let mut held: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    for chunk in stream.chunks(size) {
        held.extend_from_slice(chunk);
        let a = s.client(&mut held);
        assert!(a.ready <= held.len() && a.splice.is_none());
        out.extend(held.drain(..a.ready));
    }
    out.extend(held);
    assert_eq!(out.len(), stream.len());
    assert!(out.iter().zip(stream).all(|(o, i)| o == i || *o == 0x7f));

    let mut b = StaleStatements::start(["s1".into()]);
    let mut held: Vec<u8> = Vec::new();
    for chunk in stream.chunks(size) {
        held.extend_from_slice(chunk);
        let a = b.backend(&held);
        assert!(a.ready <= held.len());
        if let Some(sp) = a.splice {
            assert!(sp.at + sp.len <= a.ready);
        }
        held.drain(..a.ready);
    }

    if let Ok(text) = std::str::from_utf8(stream) {
        for piece in split_statements(text) {
            let start = piece.as_ptr() as usize - text.as_ptr() as usize;
            assert!(start + piece.len() <= text.len());
        }
        let _ = prepare_source(text, "p");
    }
});
