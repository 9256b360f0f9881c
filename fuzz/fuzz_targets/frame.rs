//! The relay's frame scanner on any byte stream, fed in two chunks split where the first byte
//! says: framing must not depend on where reads end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::FrameScanner;

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let at = usize::from(split).min(stream.len());
    let mut whole = FrameScanner::new(1 << 16);
    let whole_result = whole.feed(stream, |_, _| {});
    let mut parts = FrameScanner::new(1 << 16);
    let parts_result = parts
        .feed(&stream[..at], |_, _| {})
        .and_then(|()| parts.feed(&stream[at..], |_, _| {}));
    assert_eq!(whole_result.is_ok(), parts_result.is_ok());
    if whole_result.is_ok() {
        assert_eq!(whole.at_boundary(), parts.at_boundary());
        assert_eq!(whole.last_tag(), parts.last_tag());
    }
});
