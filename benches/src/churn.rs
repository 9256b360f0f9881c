//! Connection churn with backend connection reuse: `pgbench -C -S` (a new connection per
//! transaction, SCRAM logins) against Postgres direct, PgBouncer in session mode (which keeps its
//! server connections) and pgwake with gateway authentication, with `[reuse]` on and off.

use std::fmt::Write as _;
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use crate::process::{ProcSample, clock_ticks_per_second, load_average};
use crate::report::{Facts, median};
use crate::targets::{Auth, Environment, Target, TargetKind};

/// The ratio over PgBouncer the issue asks pgwake with reuse to reach.
const GOAL_VS_PGBOUNCER: f64 = 1.5;

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct ChurnOptions {
    /// Interleaved repetitions.
    pub reps: u32,
    /// Seconds per pgbench run.
    pub secs: u32,
    /// pgbench scale factor.
    pub scale: u32,
}

/// One row of the table: a target and its runs.
#[derive(Clone, Debug)]
pub struct Row {
    /// Label.
    pub name: &'static str,
    /// Connections (= transactions) per second, one per repetition.
    pub tps: Vec<f64>,
    /// Proxy CPU per connection, µs, one per repetition (none for direct).
    pub cpu_us: Vec<f64>,
}

/// What the churn run measured.
#[derive(Clone, Debug)]
pub struct ChurnResults {
    /// Direct, PgBouncer, pgwake with reuse, pgwake without.
    pub rows: Vec<Row>,
    /// `pgwake_backend_reuse_total` of the reuse gateway: (hit, miss, stale).
    pub reuse: (f64, f64, f64),
    /// The pgbench command line.
    pub command: String,
    /// Load average before and after.
    pub load: (String, String),
    /// Versions for the facts table.
    pub software: Vec<(&'static str, String)>,
}

/// Starts the targets and runs the interleaved repetitions.
pub fn run(binary: &Path, opts: ChurnOptions) -> Result<ChurnResults> {
    let load_before = load_average();
    let mut env = Environment::start(opts.scale, Auth::Scram, Err("started by churn"))?;
    let mut targets: Vec<(&'static str, Target, Option<u16>)> = Vec::new();
    for t in &env.targets {
        match t.kind {
            TargetKind::Direct => targets.push(("direct Postgres", t.clone(), None)),
            TargetKind::PgBouncer => targets.push(("PgBouncer (session mode)", t.clone(), None)),
            TargetKind::Pgwake => {}
        }
    }
    if !targets
        .iter()
        .any(|(_, t, _)| t.kind == TargetKind::PgBouncer)
    {
        let why = env
            .skipped
            .iter()
            .find(|(k, _)| *k == TargetKind::PgBouncer)
            .map_or("unknown", |(_, w)| w.as_str());
        bail!("PgBouncer is needed for this comparison: {why}");
    }
    let on = env.start_pgwake_variant(binary, "pgwake-reuse", "")?;
    let off = env.start_pgwake_variant(binary, "pgwake-noreuse", "[reuse]\nenabled = false\n")?;
    targets.push(("pgwake, reuse on", on.target.clone(), Some(on.admin)));
    targets.push(("pgwake, reuse off", off.target.clone(), None));

    let args: Vec<String> = ["-n", "-C", "-S", "-c", "16", "-j", "2", "-T"]
        .iter()
        .map(|s| s.to_string())
        .chain([opts.secs.to_string()])
        .collect();
    let warmup: Vec<String> = ["-n", "-C", "-S", "-c", "4", "-j", "2", "-T", "1"]
        .map(String::from)
        .to_vec();
    for (name, t, _) in &targets {
        crate::progress(format_args!("churn: warming up {name} ..."));
        env.pgbench.run(&t.endpoint, "disable", &warmup)?;
    }
    let clk_tck = clock_ticks_per_second();
    let mut rows: Vec<Row> = targets
        .iter()
        .map(|(name, _, _)| Row {
            name,
            tps: Vec::new(),
            cpu_us: Vec::new(),
        })
        .collect();
    for rep in 0..opts.reps as usize {
        let n = targets.len();
        for i in 0..n {
            // Rotated order spreads drift over every target.
            let idx = (i + rep) % n;
            let (name, t, _) = &targets[idx];
            let before = t.proxy_pid.map(ProcSample::read).transpose()?;
            let summary = env.pgbench.run(&t.endpoint, "disable", &args)?;
            if summary.transactions == 0 || summary.failed > 0 {
                bail!("{name}: {} failed transactions", summary.failed);
            }
            if let Some(b) = before {
                sleep(Duration::from_millis(300));
                let a = ProcSample::read(t.proxy_pid.unwrap_or_default())?;
                let ticks = a.cpu_ticks.saturating_sub(b.cpu_ticks) as f64;
                rows[idx]
                    .cpu_us
                    .push(ticks / clk_tck as f64 * 1e6 / summary.transactions as f64);
            }
            crate::progress(format_args!(
                "churn rep {}/{} {name}: {:.0} tps",
                rep + 1,
                opts.reps,
                summary.tps
            ));
            rows[idx].tps.push(summary.tps);
            sleep(Duration::from_secs(1));
        }
    }
    let metrics = crate::http::request(on.admin, "GET", "/metrics", Duration::from_secs(5))?.body;
    let count = |outcome: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("pgwake_backend_reuse_total{"))
            .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let software = vec![
        ("PostgreSQL", env.postgres_version.clone()),
        (
            "pgbench",
            env.pgbench.version().unwrap_or_else(|| "unknown".into()),
        ),
        (
            "PgBouncer",
            env.pgbouncer_version
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        ),
    ];
    let reuse = (count("hit"), count("miss"), count("stale"));
    drop(env);
    if reuse.0 == 0.0 {
        return Err(anyhow!("the reuse gateway never reused a connection"));
    }
    Ok(ChurnResults {
        rows,
        reuse,
        command: format!("pgbench {}", args.join(" ")),
        load: (load_before, load_average()),
        software,
    })
}

/// The Markdown section for RESULTS.md.
pub fn render(command: &str, opts: ChurnOptions, outcome: &Result<ChurnResults, String>) -> String {
    let mut out = String::new();
    let software = outcome
        .as_ref()
        .map(|r| r.software.clone())
        .unwrap_or_default();
    let facts = Facts::collect(command, software);
    let Some(r) = facts.open_section(
        &mut out,
        "Connection churn with backend connection reuse (SCRAM)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| method | `{}`, `sslmode=disable`, SCRAM-SHA-256 logins everywhere; {} interleaved \
         repetitions of {} s; PgBouncer: `pool_mode = session`, plain password in its auth file; \
         pgwake: gateway authentication (static credentials file with the backend's verifier), \
         one instance with `[reuse]` defaults and one with `enabled = false` |",
        r.command, opts.reps, opts.secs
    );
    let _ = writeln!(
        out,
        "| reuse counters of the reuse-on gateway | hit {:.0}, miss {:.0}, stale {:.0} |",
        r.reuse.0, r.reuse.1, r.reuse.2
    );
    let _ = writeln!(out);
    let bouncer = r
        .rows
        .iter()
        .find(|row| row.name.starts_with("PgBouncer"))
        .and_then(|row| median(&row.tps));
    let _ = writeln!(
        out,
        "| target | median tps | min–max | vs PgBouncer | proxy CPU µs/connection |\n\
         |---|---:|---:|---:|---:|"
    );
    for row in &r.rows {
        let med = median(&row.tps).unwrap_or(0.0);
        let min = row.tps.iter().copied().fold(f64::INFINITY, f64::min);
        let max = row.tps.iter().copied().fold(0.0, f64::max);
        let ratio = bouncer.map_or("—".into(), |b| format!("{:.2}×", med / b));
        let cpu = median(&row.cpu_us).map_or("—".into(), |c| format!("{c:.0}"));
        let _ = writeln!(
            out,
            "| {} | {med:.0} | {min:.0}–{max:.0} | {ratio} | {cpu} |",
            row.name
        );
    }
    let on = r
        .rows
        .iter()
        .find(|row| row.name == "pgwake, reuse on")
        .and_then(|row| median(&row.tps));
    if let (Some(on), Some(b)) = (on, bouncer) {
        let ratio = on / b;
        let _ = writeln!(
            out,
            "\nGoal: pgwake with reuse ≥ {GOAL_VS_PGBOUNCER}× PgBouncer session mode: **{ratio:.2}×, {}**.",
            if ratio >= GOAL_VS_PGBOUNCER {
                "met"
            } else {
                "not met"
            }
        );
    }
    out
}
