//! Turning runs into the Markdown report, and keeping `benches/RESULTS.md` up to date.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use crate::process::command_output;
use crate::scenarios::{Goal, Metric, Scenario};
use crate::targets::TargetKind;

/// A part of RESULTS.md that the harness rewrites, between two marker comments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    /// The line that opens it.
    pub begin: &'static str,
    /// The line that closes it.
    pub end: &'static str,
}

/// The wake measured on a real one-node Kubernetes cluster (CloudNativePG, real pods): run by
/// hand with `testkit/k8s/node/exec.sh` (see the section's facts), never by the harness.
pub const KUBE_NODE_SECTION: Section = Section {
    begin: "<!-- harness:kube_node:begin -->",
    end: "<!-- harness:kube_node:end -->",
};
/// The pgbench comparison table (`all`).
pub const PGBENCH_SECTION: Section = Section {
    begin: "<!-- harness:begin -->",
    end: "<!-- harness:end -->",
};
/// The wake latency cycles (`wake`, and `all`).
pub const WAKE_SECTION: Section = Section {
    begin: "<!-- harness:wake:begin -->",
    end: "<!-- harness:wake:end -->",
};
/// Kubernetes wake latency, cnpg annotation vs pool claim (`kube`).
pub const KUBE_SECTION: Section = Section {
    begin: "<!-- harness:kube:begin -->",
    end: "<!-- harness:kube:end -->",
};
/// Memory per queued connection (`queued`, and `all`).
pub const QUEUED_SECTION: Section = Section {
    begin: "<!-- harness:queued:begin -->",
    end: "<!-- harness:queued:end -->",
};

/// SQL over HTTP against direct queries (`http`).
pub const HTTP_SECTION: Section = Section {
    begin: "<!-- harness:http:begin -->",
    end: "<!-- harness:http:end -->",
};

/// Parked sessions: revival latency, memory, awake time (`revive`).
pub const REVIVE_SECTION: Section = Section {
    begin: "<!-- harness:revive:begin -->",
    end: "<!-- harness:revive:end -->",
};

/// The scale-to-zero fidelity section (`fidelity`).
pub const FIDELITY_SECTION: Section = Section {
    begin: "<!-- harness:fidelity:begin -->",
    end: "<!-- harness:fidelity:end -->",
};

/// Connection churn with backend connection reuse (`churn`).
pub const CHURN_SECTION: Section = Section {
    begin: "<!-- harness:churn:begin -->",
    end: "<!-- harness:churn:end -->",
};

/// Many sessions, few backends, beside PgBouncer's pooling modes (`multiplex`).
pub const MULTIPLEX_SECTION: Section = Section {
    begin: "<!-- harness:multiplex:begin -->",
    end: "<!-- harness:multiplex:end -->",
};

/// Thousands of connections held open against many local tenants (`scale`).
pub const SCALE_SECTION: Section = Section {
    begin: "<!-- harness:scale:begin -->",
    end: "<!-- harness:scale:end -->",
};

/// Predictive wake and sleep over traces of runs (`predict`).
pub const PREDICT_SECTION: Section = Section {
    begin: "<!-- harness:predict:begin -->",
    end: "<!-- harness:predict:end -->",
};

/// A hundred thousand client connections held open, 1 % active (`scale --connections 100000`).
pub const SCALE_100K_SECTION: Section = Section {
    begin: "<!-- harness:scale100k:begin -->",
    end: "<!-- harness:scale100k:end -->",
};

/// What one pgbench run against one target measured.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// tps or average latency in µs, according to the scenario's metric.
    pub value: f64,
    /// Transactions pgbench counted as failed.
    pub failed: u64,
    /// Proxy CPU (user + system) per completed transaction, in µs.
    pub proxy_cpu_us_per_tx: Option<f64>,
    /// Proxy resident memory at the end of the run, in KiB.
    pub proxy_rss_kib: Option<u64>,
}

/// Every run's outcome, keyed by scenario number and target.
#[derive(Default)]
pub struct Results {
    runs: BTreeMap<(u8, TargetKind), Vec<Result<Measurement, String>>>,
}

impl Results {
    /// Records one run.
    pub fn record(&mut self, scenario: u8, target: TargetKind, run: Result<Measurement, String>) {
        self.runs.entry((scenario, target)).or_default().push(run);
    }

    fn ok(&self, scenario: u8, target: TargetKind) -> Vec<&Measurement> {
        self.runs
            .get(&(scenario, target))
            .map(|v| v.iter().filter_map(|r| r.as_ref().ok()).collect())
            .unwrap_or_default()
    }

    fn median_value(&self, scenario: u8, target: TargetKind) -> Option<f64> {
        median(
            &self
                .ok(scenario, target)
                .iter()
                .map(|m| m.value)
                .collect::<Vec<_>>(),
        )
    }

    /// Error messages of failed runs, each with its scenario and target.
    pub fn errors(&self) -> Vec<String> {
        self.runs
            .iter()
            .flat_map(|((s, t), runs)| {
                runs.iter()
                    .filter_map(move |r| r.as_ref().err().map(|e| format!("{s}. {t}: {e}")))
            })
            .collect()
    }
}

/// The median of `values` (mean of the middle two for an even count), `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// Facts about the machine and the software measured, shown above the table.
pub struct Facts {
    /// Label and value pairs, in order.
    pub rows: Vec<(&'static str, String)>,
}

impl Facts {
    /// Opens a report section: its heading, then either why nothing was measured (`None`: the
    /// section is complete) or the facts table ending with the run's load averages.
    pub fn open_section<'a, T>(
        &self,
        out: &mut String,
        title: &str,
        outcome: &'a Result<T, String>,
        load: impl Fn(&T) -> &(String, String),
    ) -> Option<&'a T> {
        let _ = writeln!(out, "## {title}\n");
        let r = match outcome {
            Ok(r) => r,
            Err(e) => {
                let _ = writeln!(out, "Not measured: {e}");
                return None;
            }
        };
        let _ = writeln!(out, "| fact | value |\n|---|---|");
        for (k, v) in &self.rows {
            let _ = writeln!(out, "| {k} | {} |", v.replace('|', "\\|"));
        }
        let (before, after) = load(r);
        let _ = writeln!(
            out,
            "| load average (1/5/15 min) | before {before}, after {after} |"
        );
        Some(r)
    }

    /// Reads /proc and the workspace's commit; `software` lists the measured programs' versions.
    pub fn collect(command: &str, software: Vec<(&'static str, String)>) -> Facts {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or("unknown".into(), |(_, m)| m.trim().to_owned());
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or("unknown".into(), |kib| {
                format!("{:.1} GiB", kib / 1024.0 / 1024.0)
            });
        let or_unknown = |v: Option<String>| v.unwrap_or_else(|| "unknown".into());
        let mut rows = vec![
            ("command", format!("`{command}`")),
            (
                "date",
                or_unknown(command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])),
            ),
            ("CPUs (nproc)", or_unknown(command_output("nproc", &[]))),
            ("CPU model", cpu_model),
            ("memory", memory),
            ("kernel", or_unknown(command_output("uname", &["-sr"]))),
        ];
        rows.extend(software);
        rows.push(("pgwake commit", pgwake_commit()));
        Facts { rows }
    }
}

/// The workspace commit, marked when the gateway's folders have uncommitted changes.
fn pgwake_commit() -> String {
    let root = crate::workspace::workspace_root();
    let root = root.to_string_lossy();
    let Some(head) = command_output("git", &["-C", &root, "rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    let dirty = command_output(
        "git",
        &[
            "-C",
            &root,
            "status",
            "--porcelain",
            "--",
            "proxy",
            "protocol",
            "routing",
        ],
    )
    .is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head} + uncommitted changes")
    } else {
        head
    }
}

/// Everything the report needs besides the runs.
pub struct ReportInput<'a> {
    /// Machine and software facts.
    pub facts: &'a Facts,
    /// The scenarios in table order.
    pub scenarios: &'a [Scenario],
    /// Targets that were measured.
    pub measured: &'a [TargetKind],
    /// Targets left out, with the reason.
    pub skipped: &'a [(TargetKind, String)],
    /// Repetitions run.
    pub reps: u32,
    /// pgbench scale of the data.
    pub scale: u32,
    /// How clients logged in.
    pub auth: crate::pgbench::Auth,
}

/// The Markdown report: facts, the results table, what was skipped and what went wrong.
pub fn render(input: &ReportInput<'_>, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Relay: Postgres direct, PgBouncer, pgcat, PgDog, a bare relay and pgwake under \
         pgbench\n"
    );
    let _ = writeln!(out, "| fact | value |\n|---|---|");
    for (k, v) in &input.facts.rows {
        let _ = writeln!(out, "| {k} | {} |", cell(v));
    }
    let _ = writeln!(
        out,
        "| method | {} repetition(s); per repetition every scenario runs against each target in \
         turn, target order rotated each repetition; pgbench data at scale {}; client auth {} |",
        input.reps, input.scale, input.auth
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| # | scenario | transport | target | median | min–max | vs direct | vs PgBouncer | \
         failed tx | proxy CPU µs/tx | proxy RSS MiB |\n\
         |---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for s in input.scenarios {
        for kind in TargetKind::ALL {
            let _ = writeln!(out, "{}", row(input, results, s, kind));
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Median and min–max over repetitions. Ratios divide this row's median by the reference \
         target's median: above 1.00× is better for tps, worse for latency. Proxy CPU is the \
         proxy process's utime+stime during the run divided by transactions; RSS is VmRSS at the \
         end of the run (both medians; direct Postgres has no proxy). TLS: `sslmode=require` \
         against every target, each proxy serving the same ECDSA P-256 certificate; the bare \
         tokio relay passes TLS through to Postgres, so its TLS rows hold no crypto of its own. \
         Peers (session mode, two worker threads each): pgcat, whose clients log in with MD5 \
         when `--auth scram` (it has no SCRAM for clients), and PgDog.\n"
    );
    let checks = checks(input.scenarios, results);
    if !checks.is_empty() {
        let _ = writeln!(
            out,
            "Issue 17's acceptance checks, computed from the medians above:\n\n\
             | # | check | pgwake | PgBouncer | ratio | goal | result |\n\
             |---|---|---:|---:|---:|---|---|"
        );
        for c in &checks {
            let _ = writeln!(out, "{}", c.row());
        }
        let _ = writeln!(out);
    }
    let floor_checks = floor_and_peer_checks(input.scenarios, results);
    if !floor_checks.is_empty() {
        let _ = writeln!(
            out,
            "Issue 29's relay checks (against the floor and the peers measured in this run), \
             from the medians above; the reference is named in each check:\n\n\
             | # | check | pgwake | reference | ratio | goal | result |\n\
             |---|---|---:|---:|---:|---|---|"
        );
        for c in &floor_checks {
            let _ = writeln!(out, "{}", c.row());
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "Commands (connection settings come from PG* variables):\n"
    );
    for s in input.scenarios {
        let _ = writeln!(
            out,
            "{}. `{}` with sslmode={}",
            s.number,
            s.command_line(),
            s.sslmode
        );
    }
    if !input.skipped.is_empty() {
        let _ = writeln!(out, "\nTargets skipped:\n");
        for (kind, why) in input.skipped {
            let _ = writeln!(out, "- {kind}: {}", one_line(why));
        }
    }
    let errors = results.errors();
    if !errors.is_empty() {
        let _ = writeln!(out, "\nFailed runs:\n");
        for e in errors {
            let _ = writeln!(out, "- {}", one_line(&e));
        }
    }
    out
}

/// One acceptance check of issue 17: a pgwake median against PgBouncer's in one scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// The scenario's number.
    pub scenario: u8,
    /// What is compared, e.g. "simple protocol, plaintext: tps".
    pub what: String,
    /// pgwake's median, `None` when it has no successful run.
    pub pgwake: Option<f64>,
    /// The reference target's median (PgBouncer's in issue 17's checks), `None` when it has no
    /// successful run.
    pub reference: Option<f64>,
    /// The goal as text, e.g. "≥ 1.15×".
    pub goal: String,
    /// Whether the ratio meets the goal; `None` when a figure is missing.
    pub pass: Option<bool>,
}

impl Check {
    fn new(
        scenario: &Scenario,
        measure: &str,
        pgwake: Option<f64>,
        reference: Option<f64>,
        at_least: bool,
        limit: f64,
    ) -> Check {
        let ratio = pgwake
            .zip(reference.filter(|b| *b > 0.0))
            .map(|(w, b)| w / b);
        Check {
            scenario: scenario.number,
            what: format!("{}, {}: {measure}", scenario.name, scenario.transport()),
            pgwake,
            reference,
            goal: format!("{} {limit:.2}×", if at_least { "≥" } else { "≤" }),
            pass: ratio.map(|r| if at_least { r >= limit } else { r <= limit }),
        }
    }

    fn row(&self) -> String {
        let shown = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.1}"));
        let ratio = self
            .pgwake
            .zip(self.reference.filter(|b| *b > 0.0))
            .map_or("—".to_owned(), |(w, b)| format!("{:.2}×", w / b));
        let result = match self.pass {
            Some(true) => "PASS",
            Some(false) => "**FAIL**",
            None => "not measured",
        };
        format!(
            "| {} | {} | {} | {} | {ratio} | {} | {result} |",
            self.scenario,
            self.what,
            shown(self.pgwake),
            shown(self.reference),
            self.goal
        )
    }
}

/// The acceptance checks of every scenario with a goal, from the medians of its runs.
pub fn checks(scenarios: &[Scenario], results: &Results) -> Vec<Check> {
    let cpu = |s: &Scenario, kind| {
        median(
            &results
                .ok(s.number, kind)
                .iter()
                .filter_map(|m| m.proxy_cpu_us_per_tx)
                .collect::<Vec<_>>(),
        )
    };
    let mut out = Vec::new();
    for s in scenarios {
        let value = |kind| results.median_value(s.number, kind);
        match s.goal {
            None => {}
            Some(Goal::Relay { min_tps, max_cpu }) => {
                out.push(Check::new(
                    s,
                    "tps",
                    value(TargetKind::Pgwake),
                    value(TargetKind::PgBouncer),
                    true,
                    min_tps,
                ));
                out.push(Check::new(
                    s,
                    "proxy CPU µs/tx",
                    cpu(s, TargetKind::Pgwake),
                    cpu(s, TargetKind::PgBouncer),
                    false,
                    max_cpu,
                ));
            }
            Some(Goal::RoundTrip { max_latency }) => out.push(Check::new(
                s,
                "µs per round trip",
                value(TargetKind::Pgwake),
                value(TargetKind::PgBouncer),
                false,
                max_latency,
            )),
        }
    }
    out
}

/// The relay goals of issue 29, from the medians: in the four `-S` rows pgwake's proxy CPU per
/// transaction at most 1.03× the bare tokio relay's (the floor measured in the same run), and in
/// every row at most each peer's (pgcat's and PgDog's). The reference is named in `what`.
pub fn floor_and_peer_checks(scenarios: &[Scenario], results: &Results) -> Vec<Check> {
    let cpu = |s: &Scenario, kind| {
        median(
            &results
                .ok(s.number, kind)
                .iter()
                .filter_map(|m| m.proxy_cpu_us_per_tx)
                .collect::<Vec<_>>(),
        )
    };
    let mut out = Vec::new();
    for s in scenarios {
        let ours = cpu(s, TargetKind::Pgwake);
        if matches!(s.goal, Some(Goal::Relay { .. })) {
            out.push(Check::new(
                s,
                "proxy CPU µs/tx vs bare tokio relay",
                ours,
                cpu(s, TargetKind::BareRelay),
                false,
                RELAY_FLOOR_MAX,
            ));
        }
        for peer in [TargetKind::Pgcat, TargetKind::PgDog] {
            out.push(Check::new(
                s,
                &format!("proxy CPU µs/tx vs {peer}"),
                ours,
                cpu(s, peer),
                false,
                1.0,
            ));
        }
    }
    out
}

/// Issue 29: pgwake's relay CPU per transaction at most this × the bare tokio relay's.
const RELAY_FLOOR_MAX: f64 = 1.03;

fn row(input: &ReportInput<'_>, results: &Results, s: &Scenario, kind: TargetKind) -> String {
    let head = format!(
        "| {} | {} ({}) | {} | {kind} |",
        s.number,
        s.name,
        s.metric.unit(),
        s.transport()
    );
    if !input.measured.contains(&kind) {
        return format!("{head} skipped | | | | | | |");
    }
    let ok = results.ok(s.number, kind);
    let total = results.runs.get(&(s.number, kind)).map_or(0, Vec::len);
    if ok.is_empty() {
        return format!("{head} failed | | | | | | |");
    }
    let values: Vec<f64> = ok.iter().map(|m| m.value).collect();
    let med = median(&values).unwrap_or(f64::NAN);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ratio = |reference: TargetKind| {
        if reference == kind {
            return "—".to_owned();
        }
        results
            .median_value(s.number, reference)
            .filter(|r| *r > 0.0)
            .map_or("—".into(), |r| format!("{:.2}×", med / r))
    };
    let failed: u64 = ok.iter().map(|m| m.failed).sum();
    let cpu = median(
        &ok.iter()
            .filter_map(|m| m.proxy_cpu_us_per_tx)
            .collect::<Vec<_>>(),
    )
    .map_or("—".into(), |v| format!("{v:.1}"));
    let rss = median(
        &ok.iter()
            .filter_map(|m| m.proxy_rss_kib.map(|k| k as f64 / 1024.0))
            .collect::<Vec<_>>(),
    )
    .map_or("—".into(), |v| format!("{v:.1}"));
    let partial = if ok.len() < total {
        format!(" ({}/{total} runs ok)", ok.len())
    } else {
        String::new()
    };
    format!(
        "{head} {}{partial} | {}–{} | {} | {} | {failed} | {cpu} | {rss} |",
        number(s.metric, med),
        number(s.metric, min),
        number(s.metric, max),
        ratio(TargetKind::Direct),
        ratio(TargetKind::PgBouncer),
    )
}

/// tps as whole numbers; latencies with one decimal, since single-client round trips on loopback
/// are tens of µs.
fn number(metric: Metric, v: f64) -> String {
    match metric {
        Metric::Tps => format!("{v:.0}"),
        Metric::LatencyUs => format!("{v:.1}"),
    }
}

fn cell(s: &str) -> String {
    one_line(s).replace('|', "\\|")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Replaces each given section of `path` (between its markers) with its new text, creating the
/// file with a short header if it is missing, and appending a section whose markers are missing.
/// Everything outside the markers is kept, so people's notes survive.
pub fn write_results_file(path: &Path, sections: &[(Section, &str)]) -> Result<()> {
    let mut text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => RESULTS_HEADER.to_owned(),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    for (section, body) in sections {
        text = replace_section(&text, *section, body);
    }
    fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

const RESULTS_HEADER: &str = "# pgwake benchmark results\n\n\
Numbers from the load harness. `cargo run -p pgwake-bench --release -- report --write` rewrites \
this whole file (notes come from benches/notes/); a single command with `--write` replaces only \
its section between the harness markers.\n";

/// `text` with the marked section replaced by `body` (or appended when there is none).
pub fn replace_section(text: &str, section: Section, body: &str) -> String {
    let block = format!("{}\n{}\n{}", section.begin, body.trim_end(), section.end);
    if let Some(begin) = text.find(section.begin)
        && let Some(end_rel) = text[begin..].find(section.end)
    {
        let end = begin + end_rel + section.end.len();
        return format!("{}{block}{}", &text[..begin], &text[end..]);
    }
    let mut out = text.trim_end().to_owned();
    out.push_str("\n\n");
    out.push_str(&block);
    out.push('\n');
    out
}

/// The nearest-rank percentile `q` (0–100] of `values`: the smallest value with at least q % of
/// the values at or below it. `None` when empty.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// The "met" column of a goal row: `yes`, or a bold `no` that stands out in the table.
pub fn met(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

/// Milliseconds with one decimal ("0.0" rather than "-0.0" for tiny negative differences).
pub fn fmt_ms(v: f64) -> String {
    let v = if v.abs() < 0.05 { 0.0 } else { v };
    format!("{v:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn section_is_replaced_and_notes_survive() {
        let (b, e) = (PGBENCH_SECTION.begin, PGBENCH_SECTION.end);
        let text = format!("# title\n\nnote above\n\n{b}\nold table\n{e}\n\nnote below\n");
        let new = replace_section(&text, PGBENCH_SECTION, "new table\n");
        assert_eq!(
            new,
            format!("# title\n\nnote above\n\n{b}\nnew table\n{e}\n\nnote below\n")
        );
        // Idempotent in shape: a second write replaces, never duplicates.
        let again = replace_section(&new, PGBENCH_SECTION, "newer");
        assert_eq!(again.matches(b).count(), 1);
        assert!(again.contains("newer") && !again.contains("new table"));
        // Another section is added after it and leaves it alone.
        let both = replace_section(&again, WAKE_SECTION, "wake table");
        assert!(
            both.contains("newer") && both.contains("wake table"),
            "{both}"
        );
        let wake_again = replace_section(&both, WAKE_SECTION, "wake 2");
        assert!(wake_again.contains("newer") && !wake_again.contains("wake table"));
        assert!(wake_again.ends_with(&format!(
            "{}\nwake 2\n{}\n",
            WAKE_SECTION.begin, WAKE_SECTION.end
        )));
    }

    #[test]
    fn section_is_appended_when_markers_are_missing() {
        let new = replace_section("# title\n\nnotes\n", QUEUED_SECTION, "table");
        assert_eq!(
            new,
            format!(
                "# title\n\nnotes\n\n{}\ntable\n{}\n",
                QUEUED_SECTION.begin, QUEUED_SECTION.end
            )
        );
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=30).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(15.0));
        assert_eq!(percentile(&v, 95.0), Some(29.0));
        assert_eq!(percentile(&v, 99.0), Some(30.0));
        assert_eq!(percentile(&[7.0], 50.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0, 1.0, 2.0, 4.0, 5.0], 50.0), Some(3.0));
    }

    #[test]
    fn ratios_and_skips_in_rows() {
        let scenarios = crate::scenarios::scenarios(crate::scenarios::Durations::QUICK);
        let mut results = Results::default();
        let m = |value, cpu| Measurement {
            value,
            failed: 0,
            proxy_cpu_us_per_tx: cpu,
            proxy_rss_kib: cpu.map(|_| 2048),
        };
        for v in [100.0, 110.0, 90.0] {
            results.record(1, TargetKind::Direct, Ok(m(v, None)));
            results.record(1, TargetKind::PgBouncer, Ok(m(v / 2.0, Some(12.0))));
        }
        let facts = Facts { rows: vec![] };
        let skipped = vec![(TargetKind::Pgwake, "binary missing".to_owned())];
        let input = ReportInput {
            facts: &facts,
            scenarios: &scenarios[..1],
            measured: &[TargetKind::Direct, TargetKind::PgBouncer],
            skipped: &skipped,
            reps: 3,
            scale: 10,
            auth: crate::pgbench::Auth::Trust,
        };
        let text = render(&input, &results);
        assert!(
            text.contains("| direct | 100 | 90–110 | — | 2.00× | 0 | — | — |"),
            "{text}"
        );
        assert!(
            text.contains("| PgBouncer | 50 | 45–55 | 0.50× | — | 0 | 12.0 | 2.0 |"),
            "{text}"
        );
        assert!(text.contains("| pgwake | skipped |"), "{text}");
        assert!(text.contains("- pgwake: binary missing"), "{text}");
    }

    #[test]
    fn floor_and_peer_checks_name_their_reference() {
        let scenarios = crate::scenarios::scenarios(crate::scenarios::Durations::QUICK);
        let simple = &scenarios[0];
        let mut results = Results::default();
        let m = |cpu| Measurement {
            value: 1000.0,
            failed: 0,
            proxy_cpu_us_per_tx: Some(cpu),
            proxy_rss_kib: Some(1024),
        };
        // pgwake 10.0 µs against the relay's 9.8 (1.02×, within 1.03×), pgcat's 12 and PgDog's 9.
        results.record(simple.number, TargetKind::Pgwake, Ok(m(10.0)));
        results.record(simple.number, TargetKind::BareRelay, Ok(m(9.8)));
        results.record(simple.number, TargetKind::Pgcat, Ok(m(12.0)));
        results.record(simple.number, TargetKind::PgDog, Ok(m(9.0)));
        let checks = floor_and_peer_checks(&scenarios, &results);
        // A floor check in the four -S rows, two peer checks in all eight.
        assert_eq!(checks.len(), 4 + 2 * 8);
        let find = |what: &str| {
            checks
                .iter()
                .find(|c| c.scenario == simple.number && c.what.ends_with(what))
                .unwrap()
        };
        assert_eq!(find("vs bare tokio relay").pass, Some(true));
        assert_eq!(find("vs pgcat").pass, Some(true));
        let pgdog = find("vs PgDog");
        assert_eq!(pgdog.pass, Some(false));
        assert!(
            pgdog.row().ends_with("| 1.11× | ≤ 1.00× | **FAIL** |"),
            "{}",
            pgdog.row()
        );
        assert!(
            checks
                .iter()
                .filter(|c| c.scenario != simple.number)
                .all(|c| c.pass.is_none())
        );
    }

    #[test]
    fn acceptance_checks_are_computed_from_the_medians() {
        let scenarios = crate::scenarios::scenarios(crate::scenarios::Durations::QUICK);
        let simple_tls = scenarios
            .iter()
            .find(|s| s.name.contains("simple") && s.sslmode == "require")
            .unwrap();
        let round_trip = scenarios
            .iter()
            .find(|s| s.metric == Metric::LatencyUs && s.sslmode == "disable")
            .unwrap();
        let mut results = Results::default();
        let m = |value, cpu| Measurement {
            value,
            failed: 0,
            proxy_cpu_us_per_tx: Some(cpu),
            proxy_rss_kib: Some(1024),
        };
        // Throughput 1.20× PgBouncer (passes ≥ 1.15×), CPU 0.90× (fails ≤ 0.8×).
        results.record(
            simple_tls.number,
            TargetKind::PgBouncer,
            Ok(m(1000.0, 20.0)),
        );
        results.record(simple_tls.number, TargetKind::Pgwake, Ok(m(1200.0, 18.0)));
        // Round trip 90 µs against 100: passes.
        results.record(round_trip.number, TargetKind::PgBouncer, Ok(m(100.0, 40.0)));
        results.record(round_trip.number, TargetKind::Pgwake, Ok(m(90.0, 30.0)));
        let checks = checks(&scenarios, &results);
        // Simple and extended, plaintext and TLS, two checks each; two round trips.
        assert_eq!(checks.len(), 10);
        let find = |number, what: &str| {
            checks
                .iter()
                .find(|c| c.scenario == number && c.what.ends_with(what))
                .unwrap()
        };
        let tps = find(simple_tls.number, ": tps");
        assert_eq!(tps.pass, Some(true));
        assert_eq!(
            tps.row(),
            format!(
                "| {} | select-only, simple protocol, TLS: tps | 1200.0 | 1000.0 | 1.20× | ≥ 1.15× | PASS |",
                simple_tls.number
            )
        );
        let cpu = find(simple_tls.number, "CPU µs/tx");
        assert_eq!(cpu.pass, Some(false));
        assert!(
            cpu.row().ends_with("| 0.90× | ≤ 0.80× | **FAIL** |"),
            "{}",
            cpu.row()
        );
        assert_eq!(find(round_trip.number, "round trip").pass, Some(true));
        // Scenarios nobody measured are reported as such, not as passed or failed.
        let untouched = checks.iter().filter(|c| c.pass.is_none()).count();
        assert_eq!(untouched, 7);
        assert!(checks.iter().any(|c| c.row().ends_with("| not measured |")));
    }
}
