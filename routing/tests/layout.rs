//! The shape of `routing/src`. A connection's trip through it is who (`resolver`, the tenant
//! `directory`, `discovery` filling it) → where (`backend/`) → wake (`wake/`); in imports the
//! wake stage stands on the other two and the directory on the backends (a tenant's record names
//! its backend), all on a ground of values (`tenant`, the sans-io `predict`, the shared
//! `activity` record, `lease`, `private_file`). No module imports one above it, none reaches
//! into another folder's files, and there is no import circle between modules or between the
//! files of a folder. Inside `wake/` the coordinator owns the scheduler and the slots: neither
//! imports it.
//!
//! `cargo test -p pgwake-routing --test layout -- --nocapture` prints the module graph.

use pgwake_testkit::layout::{Layout, against};

/// Top-level modules from the top of the stack down: each may use its own level and those
/// below, never one above.
const LEVELS: &[&[&str]] = &[
    &["lib"],
    &["wake"],
    &["discovery"],
    &["directory", "resolver"],
    &["backend"],
    &["activity", "predict", "tenant", "lease", "private_file"],
];

/// The files of `wake/` from the top down: the coordinator's own files (admission, the idle
/// sleeper, the shared sleep decision) over the coordinator, which owns the scheduler and the
/// slots; the slot holds its forecast values and its pinned sessions; `mod.rs` holds the types.
const WAKE: &[&[&str]] = &[
    &["wake/queue", "wake/sleeper", "wake/shared"],
    &["wake/coordinator"],
    &["wake/ahead"],
    &["wake/slot"],
    &["wake/forecast", "wake/pinned"],
    &["wake/mod"],
];

/// The files of `backend/` from the top down: the backends over the primary-pod route, over the
/// Cluster resource they share, over the readiness probe and the trait in `mod.rs`.
const BACKEND: &[&[&str]] = &[
    &[
        "backend/cnpg",
        "backend/pool",
        "backend/local",
        "backend/fixed",
    ],
    &["backend/primary"],
    &["backend/cluster"],
    &["backend/probe"],
    &["backend/mod"],
];

#[test]
fn modules_form_no_circles_and_no_arrow_runs_back_up() {
    let layout = Layout::of_crate(env!("CARGO_MANIFEST_DIR"));
    println!("{}", layout.describe("pgwake-routing"));
    let mut problems = layout.problems(LEVELS);
    let folders = layout.folders();
    for (folder, levels) in [("wake", WAKE), ("backend", BACKEND)] {
        let graph = &folders[folder];
        for file in graph.keys() {
            if !levels.iter().any(|l| l.contains(&file.as_str())) {
                problems.push(format!("{file} is on no level of {folder}/: place it"));
            }
        }
        for (from, to) in against(graph, levels) {
            problems.push(format!("arrow running back up in {folder}/: {from} → {to}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
