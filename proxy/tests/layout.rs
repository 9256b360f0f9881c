//! The shape of `proxy/src`: no import circles between its modules or between the files of a
//! folder, shared modules never reach into a stage of the journey, and a stage reaches a later
//! one only through what the later one's `mod.rs` exports (its handles), never into its files.
//!
//! Also that no function in `proxy/src` is over 100 lines and the pipeline's `open_session` is at
//! most 60, and that the README's test command is the one `.ci/run` runs.
//!
//! Read from the source text (`use crate::…`, `crate::…::` paths, `super::…` inside a folder),
//! so it needs no tool beyond the test itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

struct Source {
    /// Top-level module (`pipeline` for `pipeline/admit.rs`).
    module: String,
    /// File within its folder (`admit`, or `mod` for the folder's own file).
    file: String,
    /// The code, without comments and tests.
    text: String,
    /// The whole file.
    raw: String,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(source(&root, &path));
            }
        }
    }
    out
}

fn source(root: &Path, path: &PathBuf) -> Source {
    let rel = path.strip_prefix(root).expect("under src");
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    let raw = std::fs::read_to_string(path).expect("readable source");
    // Tests inside a file may use anything; only the code counts.
    let code = match raw.find("#[cfg(test)]\nmod tests") {
        Some(at) => raw[..at].to_owned(),
        None => raw.clone(),
    };
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    Source {
        module: parts[0].clone(),
        file: if parts.len() > 1 {
            parts[1].clone()
        } else {
            "mod".into()
        },
        text: code,
        raw,
    }
}

/// Every `crate::a::b…` path in `text`, as its segments (braces expanded one level).
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        out.extend(expand(rest));
    }
    out
}

/// The paths starting at `text` (after a prefix), expanding `{a, b::c}` one level.
fn expand(text: &str) -> Vec<Vec<String>> {
    let mut segs = Vec::new();
    let mut rest = text;
    loop {
        if let Some(inner) = rest.strip_prefix('{') {
            let end = inner.find('}').unwrap_or(inner.len());
            return inner[..end]
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|item| {
                    let mut p = segs.clone();
                    p.extend(
                        item.split("::")
                            .map(|s| s.split_whitespace().next().unwrap_or("").to_owned()),
                    );
                    p
                })
                .collect();
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            return vec![segs];
        }
        segs.push(rest[..end].to_owned());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![segs],
        }
    }
}

fn stage(module: &str) -> Option<usize> {
    STAGES.iter().find(|(m, _)| *m == module).map(|(_, s)| *s)
}

/// A cycle in `graph`, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut c = path[at..].to_vec();
            c.push(n.to_owned());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn modules_form_no_circles_and_stages_meet_through_handles() {
    let sources = sources();
    let folders: BTreeMap<String, BTreeSet<String>> =
        sources.iter().fold(BTreeMap::new(), |mut m, s| {
            m.entry(s.module.clone())
                .or_default()
                .insert(s.file.clone());
            m
        });
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for s in &sources {
        let here = format!("{}/{}", s.module, s.file);
        modules.entry(s.module.clone()).or_default();
        for path in crate_paths(&s.text) {
            let Some(target) = path.first() else { continue };
            if *target == s.module {
                if let Some(f) = path.get(1).filter(|f| folders[target].contains(*f)) {
                    files
                        .entry(here.clone())
                        .or_default()
                        .insert(format!("{target}/{f}"));
                }
                continue;
            }
            modules
                .entry(s.module.clone())
                .or_default()
                .insert(target.clone());
            let (from, to) = (stage(&s.module), stage(target));
            let reaches_in = path.get(1).is_some_and(|f| {
                f != "mod" && folders.get(target).is_some_and(|fs| fs.contains(f))
            });
            if TOP.contains(&s.module.as_str()) {
                continue;
            }
            match (from, to) {
                (None, Some(_)) => problems.push(format!(
                    "{here}: the shared module {} uses the stage {}",
                    s.module,
                    path.join("::")
                )),
                (Some(a), Some(b)) if b > a && reaches_in => problems.push(format!(
                    "{here}: reaches into a later stage's file: crate::{}",
                    path.join("::")
                )),
                _ => {}
            }
        }
        for line in s.text.lines() {
            for (i, _) in line.match_indices("super::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if s.file != "mod" && folders[&s.module].contains(&name) {
                    files
                        .entry(here.clone())
                        .or_default()
                        .insert(format!("{}/{name}", s.module));
                }
                if s.file != "mod" && name.chars().next().is_some_and(char::is_uppercase) {
                    files
                        .entry(here.clone())
                        .or_default()
                        .insert(format!("{}/mod", s.module));
                }
            }
        }
    }
    for (name, graph) in [("modules", &modules), ("files", &files)] {
        if let Some(c) = cycle(graph) {
            problems.push(format!("import circle between {name}: {}", c.join(" → ")));
        }
    }
    for (m, uses) in &modules {
        println!(
            "{m} → {}",
            uses.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// How a function's first line starts, after its indentation.
const FN_STARTS: &[&str] = &[
    "fn ",
    "async fn ",
    "pub fn ",
    "pub async fn ",
    "pub(crate) fn ",
    "pub(crate) async fn ",
    "pub(super) fn ",
    "pub(super) async fn ",
];

/// Functions of `text` as (name, lines), from their `fn` line to the closing brace at the same
/// indentation (the sources are formatted by rustfmt).
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let decl = FN_STARTS.iter().find_map(|p| trimmed.strip_prefix(p));
        let Some(rest) = decl else { continue };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            out.push((name, end + 2));
        }
    }
    out
}

#[test]
fn functions_stay_short_and_open_session_shorter() {
    let mut long = Vec::new();
    let mut open_session = None;
    for s in sources() {
        let text = s.raw;
        for (name, lines) in functions(&text) {
            if lines > 100 {
                long.push(format!("{}/{}: {name} is {lines} lines", s.module, s.file));
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
