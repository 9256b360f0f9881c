//! The whole run (`report`): every section of `benches/RESULTS.md` measured one after another in
//! one process with one pgwake binary at one commit, and the file composed from them, a header
//! about the run and the hand-written notes kept in `benches/notes/`.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::process::command_output;
use crate::report::{
    CHURN_SECTION, FIDELITY_SECTION, HTTP_SECTION, KUBE_NODE_SECTION, KUBE_SECTION,
    MULTIPLEX_SECTION, PGBENCH_SECTION, PREDICT_SECTION, QUEUED_SECTION, REVIVE_SECTION,
    SCALE_100K_SECTION, SCALE_SECTION, Section, WAKE_SECTION,
};

/// One section of the whole run: the harness command that measures it, run in-process.
#[derive(Clone, Copy, Debug)]
pub struct Runner {
    /// Short name; its notes are `benches/notes/<key>.md`.
    pub key: &'static str,
    /// Where its text goes in RESULTS.md (the command's own markers, so the command alone with
    /// `--write` still replaces just this part).
    pub section: Section,
    /// The command's arguments for the full run.
    pub full: &'static [&'static str],
    /// The command's arguments for `report --quick`.
    pub quick: &'static [&'static str],
}

impl Runner {
    /// The arguments for this run's length.
    pub fn args(&self, quick: bool) -> &'static [&'static str] {
        if quick { self.quick } else { self.full }
    }
}

/// Every section the whole run measures, in report order.
pub const RUNNERS: &[Runner] = &[
    Runner {
        key: "relay",
        section: PGBENCH_SECTION,
        full: &["relay"],
        quick: &["relay", "--quick"],
    },
    Runner {
        key: "churn",
        section: CHURN_SECTION,
        full: &["churn"],
        quick: &["churn", "--quick"],
    },
    Runner {
        key: "wake",
        section: WAKE_SECTION,
        full: &["wake"],
        quick: &["wake", "--quick"],
    },
    Runner {
        key: "revive",
        section: REVIVE_SECTION,
        full: &["revive"],
        quick: &["revive", "--quick", "--scale", "240"],
    },
    Runner {
        key: "queued",
        section: QUEUED_SECTION,
        full: &["queued"],
        quick: &["queued", "--quick"],
    },
    Runner {
        key: "http",
        section: HTTP_SECTION,
        full: &["http"],
        quick: &["http", "--quick"],
    },
    Runner {
        key: "fidelity",
        section: FIDELITY_SECTION,
        full: &["fidelity"],
        quick: &["fidelity", "--quick", "--scale", "300"],
    },
    Runner {
        key: "multiplex",
        section: MULTIPLEX_SECTION,
        full: &["multiplex"],
        quick: &["multiplex", "--quick"],
    },
    Runner {
        key: "scale",
        section: SCALE_SECTION,
        full: &["scale"],
        quick: &["scale", "--quick"],
    },
    Runner {
        key: "scale100k",
        section: SCALE_100K_SECTION,
        full: &["scale", "--connections", "100000", "--active", "1000"],
        quick: &[
            "scale",
            "--connections",
            "100000",
            "--active",
            "1000",
            "--seconds",
            "15",
        ],
    },
];

/// Sections the whole run does not measure: their last text is carried over from RESULTS.md
/// with its own date and commit. `kube` needs the Kubernetes lab (kube-apiserver built from Go
/// modules on first use); `kube_node` a real one-node cluster, measured by hand; `predict`
/// measures the wake policy, not the gateway's speed, and its real-time part takes minutes of
/// mostly idle waiting.
pub const CARRIED: &[(&str, Section)] = &[
    ("kube", KUBE_SECTION),
    ("kube_node", KUBE_NODE_SECTION),
    ("predict", PREDICT_SECTION),
];

/// The marked sections of `old` that neither `measured` nor [`CARRIED`] name, in their order
/// there, as (begin marker, body, end marker): a runner this run skipped, or a section added by
/// hand. Regenerating the file keeps them rather than dropping a measurement nobody repeated.
fn unmeasured_sections<'a>(old: &'a str, measured: &[&str]) -> Vec<(&'a str, &'a str, String)> {
    let mut found = Vec::new();
    let mut rest = old;
    while let Some(at) = rest.find("<!-- harness:") {
        let Some(len) = rest[at..].find(" -->") else {
            break;
        };
        let begin = &rest[at..at + len + 4];
        rest = &rest[at + begin.len()..];
        let Some(stem) = begin.strip_suffix("begin -->") else {
            continue;
        };
        let end = format!("{stem}end -->");
        let known = measured.contains(&begin) || CARRIED.iter().any(|(_, s)| s.begin == begin);
        let Some(close) = rest.find(&end) else {
            continue;
        };
        if !known {
            found.push((begin, rest[..close].trim(), end.clone()));
        }
        rest = &rest[close + end.len()..];
    }
    found
}

/// The command that reproduces a section alone.
pub fn section_command(args: &[&str]) -> String {
    format!("cargo run -p pgwake-bench --release -- {}", args.join(" "))
}

/// The commit the run measures, and whether tracked files differ from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// `git rev-parse --short HEAD`.
    pub commit: String,
    /// `git status --porcelain --untracked-files=no` lines: tracked files changed since it.
    pub changed: Vec<String>,
}

impl Tree {
    /// Reads the workspace's commit and changes (untracked files are not built unless a
    /// tracked file names them, so they do not count).
    pub fn read(root: &Path) -> Tree {
        let root = root.to_string_lossy();
        let git = |args: &[&str]| {
            let mut all = vec!["-C", root.as_ref()];
            all.extend(args);
            command_output("git", &all)
        };
        Tree {
            commit: git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into()),
            changed: git(&["status", "--porcelain", "--untracked-files=no"])
                .map(|s| s.lines().map(|l| l.trim().to_owned()).collect())
                .unwrap_or_else(|| vec!["(git status failed)".into()]),
        }
    }

    /// The commit as the header shows it, loud when the tree is dirty.
    pub fn describe(&self) -> String {
        if self.changed.is_empty() {
            format!("{} (clean tree)", self.commit)
        } else {
            format!(
                "**{} + UNCOMMITTED CHANGES** (dirty tree, `--allow-dirty`): {}",
                self.commit,
                self.changed.join("; ")
            )
        }
    }
}

/// What one section's run produced.
#[derive(Clone, Debug)]
pub struct SectionRun {
    /// The runner it came from.
    pub runner: Runner,
    /// The command that reproduces it alone.
    pub command: String,
    /// `/proc/loadavg` before and after it.
    pub load: (String, String),
    /// How long it took.
    pub elapsed: Duration,
    /// Its Markdown text (starting with its `##` heading).
    pub text: String,
}

impl SectionRun {
    /// The section's heading without the `## `.
    pub fn title(&self) -> &str {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix("## "))
            .unwrap_or(self.runner.key)
    }

    /// Whether the section says it measured nothing (its command failed).
    pub fn failed(&self) -> bool {
        self.text.contains("\nNot measured: ")
    }
}

/// The facts about the whole run shown at the top of RESULTS.md.
pub struct Header {
    /// Label and value pairs, in order.
    pub rows: Vec<(String, String)>,
}

/// Minutes and seconds, e.g. "31 min 05 s".
pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

/// The hand-written notes for `key` (`benches/notes/<key>.md`), trimmed; empty when missing.
pub fn notes(dir: &Path, key: &str) -> String {
    fs::read_to_string(dir.join(format!("{key}.md")))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The text between `section`'s markers in `text`, markers excluded.
pub fn section_body(text: &str, section: Section) -> Option<&str> {
    let begin = text.find(section.begin)? + section.begin.len();
    let end = begin + text[begin..].find(section.end)?;
    Some(text[begin..end].trim())
}

/// RESULTS.md as a whole: title, the run's header and per-section summary, every measured
/// section between its markers followed by its notes, then the carried-over sections (taken
/// from `old`, the file as it was) and the notes on earlier measurements. `notes` returns the
/// notes for a key.
pub fn compose(
    header: &Header,
    runs: &[SectionRun],
    old: &str,
    notes: impl Fn(&str) -> String,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# pgwake benchmark results\n\n\
         Generated by the load harness's whole run (`cargo run -p pgwake-bench --release -- \
         report --write`): every section below was measured in one process, one after another, \
         with one pgwake binary at the commit in the header. Do not edit this file by hand: \
         notes live in `benches/notes/` (`<section>.md` is printed under its section) and \
         survive regeneration. A single command with `--write` (e.g. `wake --write`) replaces \
         only its own section; the header then no longer describes that section.\n"
    );
    let intro = notes("intro");
    if !intro.is_empty() {
        let _ = writeln!(out, "{intro}\n");
    }
    let _ = writeln!(out, "## The run\n\n| fact | value |\n|---|---|");
    for (k, v) in &header.rows {
        let _ = writeln!(out, "| {k} | {} |", v.replace('|', "\\|"));
    }
    let _ = writeln!(
        out,
        "\n| # | section | command | duration | load before | load after | outcome |\n\
         |---:|---|---|---:|---|---|---|"
    );
    for (i, r) in runs.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | `{}` | {} | {} | {} | {} |",
            i + 1,
            r.title().replace('|', "\\|"),
            r.command,
            fmt_duration(r.elapsed),
            r.load.0,
            r.load.1,
            if r.failed() {
                "**failed** (see the section)"
            } else {
                "measured"
            }
        );
    }
    for r in runs {
        let _ = writeln!(
            out,
            "\n{}\n{}\n{}",
            r.runner.section.begin,
            r.text.trim_end(),
            r.runner.section.end
        );
        let n = notes(r.runner.key);
        if !n.is_empty() {
            let _ = writeln!(out, "\n### Notes\n\n{n}");
        }
    }
    let _ = writeln!(
        out,
        "\n## Not regenerated by the whole run\n\n\
         These sections come from earlier runs, each with its own date and commit in its facts \
         table or heading."
    );
    for (key, section) in CARRIED {
        let body = section_body(old, *section).unwrap_or("Not measured yet.");
        let _ = writeln!(out, "\n{}\n{body}\n{}", section.begin, section.end);
        let n = notes(key);
        if !n.is_empty() {
            let _ = writeln!(out, "\n### Notes\n\n{n}");
        }
    }
    let measured: Vec<&str> = runs.iter().map(|r| r.runner.section.begin).collect();
    for (begin, body, end) in unmeasured_sections(old, &measured) {
        let _ = writeln!(out, "\n{begin}\n{body}\n{end}");
        let key = RUNNERS.iter().find(|r| r.section.begin == begin);
        let n = key.map(|r| notes(r.key)).unwrap_or_default();
        if !n.is_empty() {
            let _ = writeln!(out, "\n### Notes\n\n{n}");
        }
    }
    let earlier = notes("earlier");
    if !earlier.is_empty() {
        let _ = writeln!(out, "\n{earlier}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(key: &'static str, text: &str) -> SectionRun {
        let runner = *RUNNERS.iter().find(|r| r.key == key).unwrap();
        SectionRun {
            runner,
            command: section_command(runner.full),
            load: ("1.00 1.00 1.00".into(), "2.00 1.50 1.10".into()),
            elapsed: Duration::from_secs(125),
            text: text.into(),
        }
    }

    #[test]
    fn sections_keep_their_markers_order_and_notes() {
        let header = Header {
            rows: vec![("commit".into(), "abc1234 (clean tree)".into())],
        };
        let runs = [
            run("relay", "## Relay\n\n| table |\n"),
            run("wake", "## Wake latency\n\nNot measured: no postgres\n"),
        ];
        let old = format!(
            "# old\n\n{}\n## Kubernetes\n\nold kube table\n{}\n\nold notes\n",
            KUBE_SECTION.begin, KUBE_SECTION.end
        );
        let text = compose(&header, &runs, &old, |key| match key {
            "relay" => "relay note".into(),
            "earlier" => "## Earlier\n\nfuzzing".into(),
            _ => String::new(),
        });
        let relay = text.find(PGBENCH_SECTION.begin).unwrap();
        let wake = text.find(WAKE_SECTION.begin).unwrap();
        let kube = text.find(KUBE_SECTION.begin).unwrap();
        assert!(relay < wake && wake < kube, "{text}");
        assert!(
            text.contains("| 1 | Relay | `cargo run -p pgwake-bench --release -- relay` | 2 min 05 s | 1.00 1.00 1.00 | 2.00 1.50 1.10 | measured |"),
            "{text}"
        );
        assert!(text.contains("| 2 | Wake latency |"), "{text}");
        assert!(text.contains("**failed** (see the section)"), "{text}");
        assert!(
            text.contains(&format!(
                "| table |\n{}\n\n### Notes\n\nrelay note\n",
                PGBENCH_SECTION.end
            )),
            "{text}"
        );
        assert!(text.contains("old kube table"), "{text}");
        assert!(!text.contains("old notes"), "{text}");
        assert!(text.trim_end().ends_with("fuzzing"), "{text}");
        assert!(text.contains("| commit | abc1234 (clean tree) |"), "{text}");
    }

    #[test]
    fn sections_this_run_did_not_measure_are_kept() {
        let header = Header { rows: vec![] };
        let runs = [run("relay", "## Relay\n\nnew relay table\n")];
        let old = format!(
            "# old\n\n{}\nold relay table\n{}\n\n{}\n## Wake\n\nold wake table\n{}\n\n\
             <!-- harness:by_hand:begin -->\n## Measured by hand\n\nkept table\n\
             <!-- harness:by_hand:end -->\n\n{}\n## One node\n\nnode table\n{}\n",
            PGBENCH_SECTION.begin,
            PGBENCH_SECTION.end,
            WAKE_SECTION.begin,
            WAKE_SECTION.end,
            KUBE_NODE_SECTION.begin,
            KUBE_NODE_SECTION.end,
        );
        let text = compose(&header, &runs, &old, |key| match key {
            "wake" => "wake note".into(),
            _ => String::new(),
        });
        assert!(text.contains("new relay table"), "{text}");
        assert!(!text.contains("old relay table"), "{text}");
        for kept in ["old wake table", "wake note", "kept table", "node table"] {
            assert_eq!(text.matches(kept).count(), 1, "{kept}: {text}");
        }
        // Regenerating the regenerated file keeps them again.
        let again = compose(&header, &runs, &text, |_| String::new());
        for kept in ["old wake table", "kept table", "node table"] {
            assert_eq!(again.matches(kept).count(), 1, "{kept}: {again}");
        }
    }

    #[test]
    fn a_dirty_tree_is_said_loudly() {
        let clean = Tree {
            commit: "abc1234".into(),
            changed: vec![],
        };
        assert_eq!(clean.describe(), "abc1234 (clean tree)");
        let dirty = Tree {
            commit: "abc1234".into(),
            changed: vec!["M proxy/src/lib.rs".into()],
        };
        assert!(dirty.describe().contains("UNCOMMITTED CHANGES"));
        assert!(dirty.describe().contains("proxy/src/lib.rs"));
    }

    #[test]
    fn durations_and_commands() {
        assert_eq!(fmt_duration(Duration::from_secs(59)), "59 s");
        assert_eq!(fmt_duration(Duration::from_secs(1865)), "31 min 05 s");
        assert_eq!(
            section_command(&["churn", "--quick"]),
            "cargo run -p pgwake-bench --release -- churn --quick"
        );
    }

    #[test]
    fn every_section_has_one_runner_or_is_carried() {
        let mut markers: Vec<&str> = RUNNERS.iter().map(|r| r.section.begin).collect();
        markers.extend(CARRIED.iter().map(|(_, s)| s.begin));
        let count = markers.len();
        markers.sort_unstable();
        markers.dedup();
        assert_eq!(markers.len(), count, "a section is measured twice");
        for r in RUNNERS {
            assert_eq!(r.quick[0], r.full[0], "{}", r.key);
        }
    }
}
