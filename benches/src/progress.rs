//! Progress lines on stderr (stdout carries only the report), stamped with the seconds since the
//! harness started so slow phases show.

use std::sync::OnceLock;
use std::time::Instant;

/// When the harness started, for the timestamps of its progress lines.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// When the harness started: the first call fixes it.
pub(crate) fn started() -> Instant {
    *STARTED.get_or_init(Instant::now)
}

/// Prints a progress line.
pub(crate) fn progress(message: impl std::fmt::Display) {
    let t = started().elapsed().as_secs_f64();
    eprintln!("[{t:6.1}s] {message}");
}
