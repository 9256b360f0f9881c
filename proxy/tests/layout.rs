//! The shape of `proxy/src`: no import circles between its modules or between the files of a
//! folder, shared modules never reach into a stage of the journey, and a stage reaches a later
//! one only through what the later one's `mod.rs` exports (its handles), never into its files.
//!
//! Also that no function in `proxy/src` is over 100 lines and the pipeline's `open_session` is at
//! most 60, and that the README's test command is the one `.ci/run` runs.
//!
//! The module graph is read from the source text by `pgwake_testkit::layout`, the reader every
//! crate's layout test shares; `cargo test -p pgwake --test layout -- --nocapture` prints it.

use std::path::Path;

use pgwake_testkit::layout::{Layout, functions};

/// The journey's stages in order; a stage may use a later one through its handles only.
const STAGES: &[(&str, usize)] = &[
    ("front", 1),
    ("http", 1),
    ("pipeline", 2),
    ("upstream", 3),
    ("session", 4),
];
/// Modules that build and run everything, above the journey.
const TOP: &[&str] = &["app", "admin", "main", "lib"];

fn stage(module: &str) -> Option<usize> {
    STAGES.iter().find(|(m, _)| *m == module).map(|(_, s)| *s)
}

#[test]
fn modules_form_no_circles_and_stages_meet_through_handles() {
    let layout = Layout::of_crate(env!("CARGO_MANIFEST_DIR"));
    println!("{}", layout.describe("pgwake"));
    let mut problems: Vec<String> = layout
        .circles()
        .iter()
        .map(|c| format!("import circle: {c}"))
        .collect();
    for u in &layout.uses {
        let from = u.from.split('/').next().unwrap_or_default();
        if from == u.module || TOP.contains(&from) {
            continue;
        }
        match (stage(from), stage(&u.module)) {
            (None, Some(_)) => problems.push(format!(
                "{}: the shared module {from} uses the stage crate::{}",
                u.from, u.path
            )),
            (Some(a), Some(b)) if b > a && u.names_file => problems.push(format!(
                "{}: reaches into a later stage's file: crate::{}",
                u.from, u.path
            )),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn functions_stay_short_and_open_session_shorter() {
    let mut long = Vec::new();
    let mut open_session = None;
    for s in Layout::of_crate(env!("CARGO_MANIFEST_DIR")).files {
        for (name, lines) in functions(&s.raw) {
            if lines > 100 {
                long.push(format!("{}: {name} is {lines} lines", s.name()));
            }
            if name == "open_session" {
                open_session = Some(lines);
            }
        }
    }
    println!("open_session: {open_session:?} lines");
    assert!(long.is_empty(), "{}", long.join("\n"));
    assert!(open_session.is_some_and(|n| n <= 60), "{open_session:?}");
}

/// The command in the README's `sh` block that runs the test suite.
fn readme_test_command(readme: &str) -> Option<&str> {
    readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .flat_map(str::lines)
        .find(|l| l.starts_with("cargo test"))
}

#[test]
fn the_readme_test_command_is_the_one_ci_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let ci = std::fs::read_to_string(repo.join(".ci/run")).unwrap();
    let readme_command = readme_test_command(&readme).expect("a cargo test command in README.md");
    let ci_commands: Vec<&str> = ci
        .lines()
        .filter(|l| l.trim_start().starts_with("cargo test"))
        .collect();
    assert_eq!(ci_commands, [readme_command], "README.md and .ci/run");
    assert!(
        readme_command.contains("--no-fail-fast"),
        "one failing test file must not hide the others: {readme_command}"
    );
}

/// The Rust version the README's install text asks for is the one the workspace declares, so a
/// raised `rust-version` cannot leave the README promising an older compiler.
#[test]
fn the_readme_names_the_workspace_rust_version_and_the_install_command() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).unwrap();
    let declared = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("rust-version in the workspace Cargo.toml");
    assert_eq!(
        env!("CARGO_PKG_RUST_VERSION"),
        declared,
        "the gateway inherits the workspace's rust-version"
    );
    let install = readme
        .split("**Installing.**")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("an Installing paragraph in README.md")
        .replace('\n', " ");
    assert!(
        install.contains(&format!("Rust {declared} or newer")),
        "README.md's Installing paragraph names Rust {declared}: {install}"
    );
    assert!(
        install.contains("`cargo install --locked --path proxy`"),
        "{install}"
    );
}
