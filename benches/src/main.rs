//! The pgwake load harness: Postgres direct vs PgBouncer vs pgwake under pgbench, on loopback.
//!
//! `cargo run -p pgwake-bench --release -- all [--quick] [--write] [--reps N]`
//!
//! The harness sets everything up in a temporary directory, lets pgbench generate the load, reads
//! the proxies' CPU and memory from /proc between runs, and prints a Markdown report. See
//! `benches/README.md` for the scenarios and how to read the table.

mod pgbench;
mod process;
mod report;
mod scenarios;
mod targets;

use std::sync::OnceLock;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};

use crate::process::{ProcSample, clock_ticks_per_second};
use crate::report::{Facts, Measurement, ReportInput, Results};
use crate::scenarios::{Durations, Metric, Scenario};
use crate::targets::{Auth, Environment, PgwakeSource, Target, TargetKind};

#[derive(Parser)]
#[command(about = "Load harness: Postgres direct vs PgBouncer vs pgwake under pgbench")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Set up Postgres, PgBouncer and pgwake on loopback and run every scenario.
    All(AllArgs),
}

#[derive(Args)]
struct AllArgs {
    /// One repetition of short runs (whole run under three minutes), for a smoke check.
    #[arg(long)]
    quick: bool,
    /// Replace the harness section of benches/RESULTS.md with the report.
    #[arg(long)]
    write: bool,
    /// Repetitions of the whole scenario list (default 3, or 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    reps: Option<u32>,
    /// pgbench scale factor of the test data (`pgbench -i -s`).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    scale: u32,
    /// How clients log in on every target.
    #[arg(long, value_enum, default_value_t = Auth::Trust)]
    auth: Auth,
    /// Use this pgwake binary instead of building the workspace's release binary.
    #[arg(long, value_name = "PATH")]
    pgwake: Option<std::path::PathBuf>,
    /// Do not run `cargo build --release -p pgwake`; use the binary already in the target folder.
    #[arg(long)]
    no_build: bool,
}

/// Pause between runs so sockets in TIME_WAIT and exiting backends from one run do not weigh on
/// the next.
const SETTLE: Duration = Duration::from_secs(1);
/// After pgbench exits, the proxy still closes its connections; wait this long before reading its
/// CPU time so that work counts for the run that caused it.
const CPU_TAIL: Duration = Duration::from_millis(300);

fn main() -> Result<()> {
    let Cmd::All(args) = Cli::parse().command;
    run_all(&args)
}

/// When the harness started, for the timestamps of its progress lines.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Prints a progress line on stderr (stdout carries only the report), stamped with the seconds
/// since start so slow phases show.
pub(crate) fn progress(message: impl std::fmt::Display) {
    let t = STARTED.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[{t:6.1}s] {message}");
}

fn run_all(args: &AllArgs) -> Result<()> {
    let started = *STARTED.get_or_init(Instant::now);
    let durations = if args.quick {
        Durations::QUICK
    } else {
        Durations::FULL
    };
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 });
    let command = command_line();

    let mut env = Environment::start(
        args.scale,
        args.auth,
        &PgwakeSource {
            binary: args.pgwake.clone(),
            build: !args.no_build,
        },
    )?;
    for (kind, why) in &env.skipped {
        progress(format_args!("{kind}: skipped: {why}"));
    }
    let scenarios = scenarios::scenarios(durations);
    let clk_tck = clock_ticks_per_second();

    // Warm-up per target: fills caches and pools and proves the target accepts logins, so a
    // broken target is dropped once instead of failing every scenario.
    for target in env.targets.clone() {
        progress(format_args!("warming up {} ...", target.kind));
        if let Err(e) = env.pgbench.run(
            &target.endpoint,
            "disable",
            &scenarios::warmup_args(durations),
        ) {
            let log = env.proxy_log_tail(target.kind);
            progress(format_args!(
                "{}: warm-up failed, skipping it: {e:#}\n{log}",
                target.kind
            ));
            env.drop_target(target.kind, format!("warm-up run failed: {e:#}"));
        }
    }

    let mut results = Results::default();
    for rep in 0..reps as usize {
        for scenario in &scenarios {
            let mut order = env.targets.clone();
            // Rotating the order spreads slow drift (thermal, page cache, other load) over all
            // targets instead of always penalizing the one that runs last.
            if !order.is_empty() {
                let n = order.len();
                order.rotate_left(rep % n);
            }
            for target in &order {
                let outcome = measure(&env, target, scenario, args.scale, clk_tck);
                let shown = match &outcome {
                    Ok(m) => format!("{:.1} {}", m.value, scenario.metric.unit()),
                    Err(e) => format!("failed: {e:#}"),
                };
                progress(format_args!(
                    "rep {}/{reps} scenario {} {:<9} {shown}",
                    rep + 1,
                    scenario.number,
                    target.kind.to_string()
                ));
                results.record(
                    scenario.number,
                    target.kind,
                    outcome.map_err(|e| format!("{e:#}")),
                );
                sleep(SETTLE);
            }
        }
    }

    let facts = Facts::collect(
        &command,
        vec![
            ("PostgreSQL", env.postgres_version.clone()),
            (
                "pgbench",
                env.pgbench.version().unwrap_or_else(|| "unknown".into()),
            ),
            (
                "PgBouncer",
                env.pgbouncer_version
                    .clone()
                    .unwrap_or_else(|| "not installed".into()),
            ),
        ],
    );
    let measured: Vec<TargetKind> = env.targets.iter().map(|t| t.kind).collect();
    let report = report::render(
        &ReportInput {
            facts: &facts,
            scenarios: &scenarios,
            measured: &measured,
            skipped: &env.skipped,
            reps,
            scale: args.scale,
            auth: args.auth,
        },
        &results,
    );
    // Stop everything before writing files, so a hung shutdown shows before "done".
    drop(env);
    println!("{report}");
    if args.write {
        let path = targets::workspace_root().join("benches").join("RESULTS.md");
        report::write_results_file(&path, &report)?;
        progress(format_args!("wrote {}", path.display()));
    }
    progress(format_args!("done in {:.0?}", started.elapsed()));
    Ok(())
}

/// One pgbench run of `scenario` against `target`, with the proxy's CPU and memory around it.
fn measure(
    env: &Environment,
    target: &Target,
    scenario: &Scenario,
    scale: u32,
    clk_tck: u64,
) -> Result<Measurement> {
    let before = target.proxy_pid.map(ProcSample::read).transpose()?;
    let summary = env
        .pgbench
        .run(&target.endpoint, scenario.sslmode, &scenario.args)?;
    let after = match target.proxy_pid {
        Some(pid) => {
            sleep(CPU_TAIL);
            Some(
                ProcSample::read(pid)
                    .map_err(|e| anyhow!("{} died during the run: {e:#}", target.kind))?,
            )
        }
        None => None,
    };
    if scenario.builtin_script && summary.scale != Some(scale) {
        bail!(
            "pgbench reported scale {:?}, but the data was initialized at scale {scale}",
            summary.scale
        );
    }
    if summary.transactions == 0 {
        bail!("pgbench completed no transactions");
    }
    let proxy_cpu_us_per_tx = before.zip(after).map(|(b, a)| {
        let ticks = a.cpu_ticks.saturating_sub(b.cpu_ticks) as f64;
        ticks / clk_tck as f64 * 1e6 / summary.transactions as f64
    });
    Ok(Measurement {
        value: match scenario.metric {
            Metric::Tps => summary.tps,
            Metric::LatencyUs => summary.latency_ms * 1000.0,
        },
        failed: summary.failed,
        proxy_cpu_us_per_tx,
        proxy_rss_kib: after.map(|a| a.rss_kib),
    })
}

/// The command that reproduces this run, as documented (the binary is normally started by
/// `cargo run`, which does not show in our own arguments).
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| {
            if a.contains(char::is_whitespace) {
                format!("'{a}'")
            } else {
                a
            }
        })
        .collect();
    format!("cargo run -p pgwake-bench --release -- {}", args.join(" "))
}
