//! The session tracker fed both directions: each chunk is introduced by one byte, whose low bit
//! says the direction and whose other bits its length. Any stream must leave the tracker
//! queryable, and a broken one never at a safe point.
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use pgwake_protocol::{Pins, SessionTracker, TrackerLimits};

fuzz_target!(|data: &[u8]| {
    let mut t = SessionTracker::new(TrackerLimits {
        max_statements: 8,
        max_custom_settings: 8,
    });
    let now = Instant::now();
    let mut rest = data;
    while let Some((&head, tail)) = rest.split_first() {
        let len = usize::from(head >> 1).min(tail.len());
        let (chunk, next) = tail.split_at(len);
        if head & 1 == 0 {
            t.observe_client(chunk, now);
        } else {
            t.observe_backend(chunk, now);
        }
        rest = next;
        let safe = t.at_safe_point();
        assert!(!(safe && t.pins().contains(Pins::BROKEN)));
        assert!(!safe || t.at_rest());
        let _ = (t.in_flight(), t.statements().count(), t.custom_settings().count());
    }
});
