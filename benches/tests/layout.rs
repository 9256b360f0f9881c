//! The shape of `benches/src`: `main` runs the sections (each one measurement of the report),
//! which stand on the report and the gateway they start, on the targets pgbench is pointed at,
//! on the peer poolers, on the clients, and at the bottom on the harness's processes, progress
//! lines and workspace. No module imports one above it, and there is no import circle.
//!
//! `cargo test -p pgwake-bench --test layout -- --nocapture` prints the module graph.

use pgwake_testkit::layout::Layout;

/// Modules from the top of the stack down: each may use its own level and those below, never
/// one above.
const LEVELS: &[&[&str]] = &[
    &["main"],
    &[
        "churn",
        "fidelity",
        "kube_wake",
        "multiplex",
        "predict",
        "queued",
        "revive",
        "scale",
        "sql_http",
        "wake",
        "whole",
    ],
    &["report"],
    &["gateway", "zoo"],
    &["targets"],
    &["peers"],
    &["scenarios", "pgbench", "raw_login", "client", "http"],
    &["process", "progress", "workspace"],
];

#[test]
fn modules_form_no_circles_and_no_arrow_runs_back_up() {
    let layout = Layout::of_crate(env!("CARGO_MANIFEST_DIR"));
    println!("{}", layout.describe("pgwake-bench"));
    let problems = layout.problems(LEVELS);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
