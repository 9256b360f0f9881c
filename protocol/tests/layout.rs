//! The shape of `protocol/src`: no import circle between its modules or between the files of a
//! folder, and no module reaching into another folder's files past what its `mod.rs` exports.
//!
//! `cargo test -p pgwake-protocol --test layout -- --nocapture` prints the module graph.

use pgwake_testkit::layout::Layout;

#[test]
fn modules_form_no_circles() {
    let layout = Layout::of_crate(env!("CARGO_MANIFEST_DIR"));
    println!("{}", layout.describe("pgwake-protocol"));
    let problems = layout.problems(&[]);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
