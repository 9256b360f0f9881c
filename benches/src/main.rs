//! The pgwake load harness, on loopback: Postgres direct vs PgBouncer vs pgwake under pgbench,
//! wake latency over sleep/wake cycles of a `local`-backend tenant, and the gateway's memory per
//! connection queued for a wake.
//!
//! `cargo run -p pgwake-bench --release -- report [--quick] [--write]` measures every section of
//! `benches/RESULTS.md` in one run at one commit; `relay`, `churn`, `wake`, `revive`, `queued`,
//! `http`, `fidelity`, `multiplex` and `kube` measure one section each, and `all` the pgbench
//! comparison, `wake` and `queued`.
//!
//! The harness sets everything up in temporary directories, lets pgbench or its own clients
//! generate the load, reads the proxies' CPU and memory from /proc, and prints a Markdown report.
//! See `benches/README.md` for the scenarios and how to read the tables.

mod churn;
mod client;
mod fidelity;
mod gateway;
mod http;
mod kube_wake;
mod multiplex;
mod peers;
mod pgbench;
mod predict;
mod process;
mod progress;
mod queued;
mod raw_login;
mod report;
mod revive;
mod scale;
mod scenarios;
mod sql_http;
mod targets;
mod wake;
mod whole;
mod workspace;
mod zoo;

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};

// Every section prints its progress as `crate::progress(…)`.
pub(crate) use crate::progress::progress;

use crate::kube_wake::KubeOptions;
use crate::pgbench::Auth;
use crate::process::{ProcSample, clock_ticks_per_second, command_output, load_average};
use crate::queued::QueuedOptions;
use crate::report::{
    CHURN_SECTION, FIDELITY_SECTION, Facts, HTTP_SECTION, KUBE_SECTION, MULTIPLEX_SECTION,
    Measurement, PGBENCH_SECTION, PREDICT_SECTION, QUEUED_SECTION, REVIVE_SECTION, ReportInput,
    Results, SCALE_100K_SECTION, SCALE_SECTION, Section, WAKE_SECTION,
};
use crate::revive::ReviveOptions;
use crate::scenarios::{Durations, Metric, Scenario};
use crate::targets::{Environment, PgwakeSource, Target, TargetKind};
use crate::wake::WakeOptions;

#[derive(Parser)]
#[command(
    about = "Load harness: Postgres direct vs PgBouncer vs pgwake, wake latency, queue memory"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The whole run: every section of benches/RESULTS.md (`relay`, `churn`, `wake`, `revive`,
    /// `queued`, `http`, `fidelity`, `multiplex`) one after another with one pgwake binary at
    /// one commit; `--write` rewrites the whole file with the notes of benches/notes/.
    Report(ReportArgs),
    /// The pgbench comparison (Postgres, PgBouncer and pgwake on loopback), then `wake` and
    /// `queued`.
    All(AllArgs),
    /// The pgbench comparison alone: `-S` simple and extended, churn and the one-client round
    /// trip, each in plaintext and with TLS.
    Relay(RelayArgs),
    /// Wake latency: sleep/wake cycles of one local-backend tenant, and a Postgres-only floor.
    Wake(WakeArgs),
    /// Gateway memory per connection waiting in a tenant's accept queue.
    Queued(QueuedArgs),
    /// SQL over HTTP: `POST /sql` `SELECT 1` with keep-alive beside tokio-postgres, direct and
    /// through the gateway.
    Http(HttpArgs),
    /// Parked sessions: revival latency over the wake, memory per parked session, and
    /// awake-seconds per idle tenant-hour (time-scaled).
    Revive(ReviveArgs),
    /// Kubernetes wake latency: a cnpg tenant woken by annotation vs a pool tenant claiming a
    /// warm cluster, through a real kube-apiserver and testkit's fake CNPG operator (not part of
    /// `all`: the first run builds kube-apiserver).
    Kube(KubeArgs),
    /// Connection churn (`pgbench -C -S`) through pgwake with backend connection reuse on and
    /// off, beside PgBouncer in session mode and direct Postgres: TLS + SCRAM with gateway
    /// authentication, and plaintext trust with a passthrough tenant (`reuse_passthrough`).
    Churn(ChurnArgs),
    /// Scale-to-zero fidelity: applications on real drivers (psycopg 3, node-postgres, pgx,
    /// asyncpg) and ORMs (the app zoo) hold pools of idle connections and query every 10
    /// minutes; awake time per idle tenant-hour beside the ideal (time-scaled), and the zoo's
    /// flow through pgwake against the same flow straight against Postgres.
    Fidelity(FidelityArgs),
    /// Many sessions, few backends: sessions with their own settings and prepared statements
    /// through pgwake (parking on their own, a cap on backend connections) beside PgBouncer in
    /// transaction and session mode with the same pool size; throughput, latency, backend
    /// connections and failed semantic checks.
    Multiplex(MultiplexArgs),
    /// Many connections held open against many local tenants (10,000 over 20 by default), a
    /// tenth of them querying and the rest idle and parked: gateway memory, CPU, latency, errors.
    Scale(ScaleArgs),
    /// Predictive wake and sleep: tenant mixes over days on the coordinator's simulated clock,
    /// then a compressed real-time run of local tenants beside its simulation (not part of the
    /// whole run).
    Predict(PredictArgs),
}

#[derive(Args)]
struct PredictArgs {
    #[command(flatten)]
    common: Common,
    /// Runs per mix in the compressed real-time part (default 10, or 5 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(5..=100))]
    runs: Option<u32>,
    /// Seed of the traces' random parts.
    #[arg(long, default_value_t = 30)]
    seed: u64,
    /// Only the simulated mixes (seconds, no Postgres), not the compressed real-time run.
    #[arg(long)]
    simulate_only: bool,
}

#[derive(Args)]
struct ScaleArgs {
    #[command(flatten)]
    common: Common,
    /// Client connections held open (default 10,000, or 2,000 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    connections: Option<u32>,
    /// Of those, clients that query (default 1,000, or 200 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100_000))]
    active: Option<u32>,
    /// Local tenants (default 20, or 4 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    tenants: Option<u32>,
    /// Seconds of the measured window (default 60, or 15 with --quick).
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..))]
    seconds: Option<u64>,
}

#[derive(Args)]
struct MultiplexArgs {
    #[command(flatten)]
    common: Common,
    /// Sessions per target (default 200, or 50 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=5000))]
    clients: Option<u32>,
    /// Seconds of the query phase (default 30, or 10 with --quick).
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..))]
    seconds: Option<u64>,
    /// Check rounds (three queries each) per session in that time.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Backend connections for every target: pgwake's cap and PgBouncer's pool size.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=250))]
    cap: u32,
    /// Seconds a client waits for a login or a query before counting it failed.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

#[derive(Args)]
struct FidelityArgs {
    #[command(flatten)]
    common: Common,
    /// Time scale: one hour of workload takes 3600/N seconds per client (default 60, or 300
    /// with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(10..=600))]
    scale: Option<u32>,
    /// Only these applications (comma-separated keys, `zoo` for the app zoo's ORMs, `drivers`
    /// for the others), e.g. `--only zoo-django`.
    #[arg(long, value_name = "KEYS", value_delimiter = ',')]
    only: Vec<String>,
    /// A second pgwake binary (e.g. an earlier commit's) to run every client against too.
    #[arg(long, value_name = "PATH")]
    baseline: Option<PathBuf>,
    /// How the baseline is named in the report (e.g. its commit).
    #[arg(long, value_name = "TEXT", requires = "baseline")]
    baseline_name: Option<String>,
}

#[derive(Args)]
struct ChurnArgs {
    #[command(flatten)]
    common: Common,
    /// Interleaved repetitions (default 3, or 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    reps: Option<u32>,
    /// Seconds per pgbench run (default 20, or 5 with --quick).
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u32).range(1..))]
    seconds: Option<u32>,
    /// pgbench scale factor of the test data.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    scale: u32,
}

#[derive(Args)]
struct HttpArgs {
    #[command(flatten)]
    common: Common,
    /// Seconds measured per row (default 10, or 3 with --quick).
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..))]
    seconds: Option<u64>,
    /// Concurrent clients, one row each (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 8])]
    clients: Vec<usize>,
}

/// Options every command takes.
#[derive(Args)]
struct Common {
    /// Short runs for a smoke check (pgbench: one repetition of 5 s runs; wake: 5 cycles;
    /// queued: 2,000 connections).
    #[arg(long)]
    quick: bool,
    /// Replace this command's sections of benches/RESULTS.md with the report.
    #[arg(long)]
    write: bool,
    /// Use this pgwake binary instead of building the workspace's release binary.
    #[arg(long, value_name = "PATH")]
    pgwake: Option<PathBuf>,
    /// Do not run `cargo build --release -p pgwake`; use the binary already in the target folder.
    #[arg(long)]
    no_build: bool,
}

#[derive(Args)]
struct WakeFlags {
    /// Sleep/wake cycles per transport, plaintext and TLS, each plaintext one with a start of
    /// Postgres alone (default 30, or 5 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    cycles: Option<u32>,
}

impl WakeFlags {
    fn options(&self, quick: bool) -> WakeOptions {
        WakeOptions {
            cycles: self.cycles.unwrap_or(if quick { 5 } else { 30 }),
        }
    }
}

#[derive(Args)]
struct QueuedFlags {
    /// Connections queued at once (default 10,000, or 2,000 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    connections: Option<u32>,
}

impl QueuedFlags {
    fn options(&self, quick: bool) -> QueuedOptions {
        QueuedOptions {
            connections: self
                .connections
                .unwrap_or(if quick { 2_000 } else { 10_000 }),
        }
    }
}

#[derive(Args)]
struct ReportArgs {
    #[command(flatten)]
    common: Common,
    /// Run even though tracked files differ from HEAD; the header then says so in bold.
    #[arg(long)]
    allow_dirty: bool,
}

/// The pgbench comparison's options.
#[derive(Args)]
struct PgbenchFlags {
    /// Repetitions of the whole pgbench scenario list (default 3, or 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    reps: Option<u32>,
    /// pgbench scale factor of the test data (`pgbench -i -s`).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    scale: u32,
    /// How pgbench clients log in on every target.
    #[arg(long, value_enum, default_value_t = Auth::Trust)]
    auth: Auth,
}

#[derive(Args)]
struct RelayArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    pgbench: PgbenchFlags,
}

#[derive(Args)]
struct AllArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    pgbench: PgbenchFlags,
    #[command(flatten)]
    wake: WakeFlags,
    #[command(flatten)]
    queued: QueuedFlags,
}

#[derive(Args)]
struct WakeArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    wake: WakeFlags,
}

#[derive(Args)]
struct ReviveArgs {
    #[command(flatten)]
    common: Common,
    /// Park/revive cycles (default 30, or 5 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    cycles: Option<u32>,
    /// Sessions parked for the memory figure (default 1,000, or 200 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    parked: Option<u32>,
    /// Sessions revived at the same moment in the burst (default 100, or 20 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=250))]
    burst: Option<u32>,
    /// Time scale of the awake-seconds run: one hour of workload takes 3600/N seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(10..=600))]
    scale: u32,
}

impl ReviveArgs {
    fn options(&self) -> ReviveOptions {
        let quick = self.common.quick;
        ReviveOptions {
            cycles: self.cycles.unwrap_or(if quick { 5 } else { 30 }),
            parked: self.parked.unwrap_or(if quick { 200 } else { 1_000 }),
            burst: self.burst.unwrap_or(if quick { 20 } else { 100 }),
            scale: self.scale,
        }
    }
}

#[derive(Args)]
struct KubeArgs {
    #[command(flatten)]
    common: Common,
    /// Sleep/wake cycles per backend (default 20, or 5 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    cycles: Option<u32>,
}

#[derive(Args)]
struct QueuedArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    queued: QueuedFlags,
}

/// Pause between runs so sockets in TIME_WAIT and exiting backends from one run do not weigh on
/// the next.
const SETTLE: Duration = Duration::from_secs(1);
/// After pgbench exits, the proxy still closes its connections; wait this long before reading its
/// CPU time so that work counts for the run that caused it.
const CPU_TAIL: Duration = Duration::from_millis(300);

fn main() -> Result<()> {
    let started = progress::started();
    let command = Cli::parse().command;
    if let Cmd::Report(args) = command {
        return report(&args);
    }
    let (common, sections) = run_command(command, &command_line())?;
    for (_, text) in &sections {
        println!("{text}");
    }
    if common.write {
        let path = results_path();
        let parts: Vec<(Section, &str)> = sections.iter().map(|(s, t)| (*s, t.as_str())).collect();
        report::write_results_file(&path, &parts)?;
        progress(format_args!("wrote {}", path.display()));
    }
    progress(format_args!("done in {:.0?}", started.elapsed()));
    Ok(())
}

fn results_path() -> PathBuf {
    workspace::workspace_root()
        .join("benches")
        .join("RESULTS.md")
}

/// The whole run: refuses a dirty tree unless allowed, builds pgwake once, runs every section's
/// command in turn with that binary (as `--no-build --pgwake BINARY`), and prints, or with
/// `--write` writes, the composed RESULTS.md.
fn report(args: &ReportArgs) -> Result<()> {
    let started = Instant::now();
    let root = workspace::workspace_root();
    let tree = whole::Tree::read(&root);
    if !tree.changed.is_empty() && !args.allow_dirty {
        bail!(
            "tracked files differ from {}: commit them, or pass --allow-dirty to measure anyway \
             (the report then says so in bold): {}",
            tree.commit,
            tree.changed.join("; ")
        );
    }
    let load_start = load_average();
    let date_start = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let binary = locate(&args.common).map_err(|e| anyhow!("{e}"))?;
    // The sections run with `--no-build`: build the floors' examples once, here.
    if !args.common.no_build
        && let Err(e) = peers::build_floors()
    {
        progress(format_args!("{e:#}"));
    }
    let binary_text = binary.to_string_lossy().into_owned();
    let mut runs = Vec::new();
    for runner in whole::RUNNERS {
        let shown = runner.args(args.common.quick);
        let command = whole::section_command(shown);
        let mut argv = vec!["pgwake-bench"];
        argv.extend(shown);
        argv.extend(["--no-build", "--pgwake", &binary_text]);
        let parsed = Cli::try_parse_from(argv)?;
        progress(format_args!("section {}: {command}", runner.key));
        let before = load_average();
        let t = Instant::now();
        let text = match run_command(parsed.command, &command) {
            Ok((_, sections)) => sections
                .into_iter()
                .map(|(_, text)| text)
                .collect::<Vec<_>>()
                .join("\n"),
            Err(e) => format!("## {}\n\nNot measured: {e:#}\n", runner.key),
        };
        runs.push(whole::SectionRun {
            runner: *runner,
            command,
            load: (before, load_average()),
            elapsed: t.elapsed(),
            text,
        });
    }
    let after = whole::Tree::read(&root);
    let mut commit = tree.describe();
    if after != tree {
        commit.push_str(&format!(
            "; **the tree changed during the run**, now {}",
            after.describe()
        ));
    }
    let facts = Facts::collect("", vec![]);
    let fact = |label: &str| {
        facts
            .rows
            .iter()
            .find(|(k, _)| *k == label)
            .map_or("unknown".to_owned(), |(_, v)| v.clone())
    };
    let mut command = String::from("cargo run -p pgwake-bench --release -- report");
    for (flag, on) in [
        (" --quick", args.common.quick),
        (" --no-build", args.common.no_build),
        (" --allow-dirty", args.allow_dirty),
        (" --write", args.common.write),
    ] {
        if on {
            command.push_str(flag);
        }
    }
    let header = whole::Header {
        rows: vec![
            ("command".into(), format!("`{command}`")),
            (
                "started".into(),
                date_start.unwrap_or_else(|| "unknown".into()),
            ),
            ("commit".into(), commit),
            (
                "pgwake binary".into(),
                if args.common.pgwake.is_some() {
                    "given with `--pgwake`, the same for every section".into()
                } else if args.common.no_build {
                    "the release build already in the target folder (`--no-build`), the same \
                     for every section"
                        .into()
                } else {
                    "release build of this commit, built once at the start (`cargo build \
                     --release -p pgwake`), the same for every section"
                        .into()
                },
            ),
            ("CPUs (nproc)".into(), fact("CPUs (nproc)")),
            ("CPU model".into(), fact("CPU model")),
            ("memory".into(), fact("memory")),
            ("kernel".into(), fact("kernel")),
            (
                "`kernel.sched_autogroup_enabled`".into(),
                format!(
                    "{} (with 1, each session has its own CPU share; every server and load \
                     generator of the run is started by the harness in its own session, see \
                     the relay section's scheduling row)",
                    process::autogroup_enabled()
                ),
            ),
            (
                "total duration".into(),
                whole::fmt_duration(started.elapsed()),
            ),
            (
                "load average (1/5/15 min)".into(),
                format!("before {load_start}, after {}", load_average()),
            ),
        ],
    };
    let path = results_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let notes_dir = root.join("benches").join("notes");
    let text = whole::compose(&header, &runs, &old, |key| whole::notes(&notes_dir, key));
    println!("{text}");
    if args.common.write {
        std::fs::write(&path, &text)?;
        progress(format_args!("wrote {}", path.display()));
    }
    progress(format_args!(
        "whole run done in {}",
        whole::fmt_duration(started.elapsed())
    ));
    Ok(())
}

/// Runs one harness command; returns its options and its report sections. `command` is the
/// command line shown in the report.
fn run_command(cmd: Cmd, command: &str) -> Result<(Common, Vec<(Section, String)>)> {
    Ok(match cmd {
        Cmd::Report(_) => bail!("report runs the other commands; it is not one of them"),
        Cmd::Relay(args) => {
            let binary = locate(&args.common);
            let section = run_pgbench(
                &args.common,
                &args.pgbench,
                binary.as_deref().map_err(String::as_str),
                command,
            )?;
            (args.common, vec![(PGBENCH_SECTION, section)])
        }
        Cmd::All(args) => {
            let binary = locate(&args.common);
            let mut sections = vec![(
                PGBENCH_SECTION,
                run_pgbench(
                    &args.common,
                    &args.pgbench,
                    binary.as_deref().map_err(String::as_str),
                    command,
                )?,
            )];
            sections.push((
                WAKE_SECTION,
                run_wake(
                    binary.as_deref().map_err(String::as_str),
                    args.wake.options(args.common.quick),
                    command,
                ),
            ));
            sections.push((
                QUEUED_SECTION,
                run_queued(
                    binary.as_deref().map_err(String::as_str),
                    args.queued.options(args.common.quick),
                    command,
                ),
            ));
            (args.common, sections)
        }
        Cmd::Wake(args) => {
            let binary = locate(&args.common);
            let section = run_wake(
                binary.as_deref().map_err(String::as_str),
                args.wake.options(args.common.quick),
                command,
            );
            (args.common, vec![(WAKE_SECTION, section)])
        }
        Cmd::Queued(args) => {
            let binary = locate(&args.common);
            let section = run_queued(
                binary.as_deref().map_err(String::as_str),
                args.queued.options(args.common.quick),
                command,
            );
            (args.common, vec![(QUEUED_SECTION, section)])
        }
        Cmd::Http(args) => {
            let binary = locate(&args.common);
            let opts = sql_http::HttpOptions {
                duration: Duration::from_secs(args.seconds.unwrap_or(if args.common.quick {
                    3
                } else {
                    10
                })),
                clients: args.clients.clone(),
            };
            progress("sql over http ...");
            let outcome = binary
                .map_err(|e| anyhow!("{e}"))
                .and_then(|b| sql_http::run(&b, &opts))
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &outcome {
                progress(format_args!("sql over http failed: {e}"));
            }
            let section = sql_http::render(&local_facts(command), &opts, &outcome);
            (args.common, vec![(HTTP_SECTION, section)])
        }
        Cmd::Revive(args) => {
            let binary = locate(&args.common);
            let opts = args.options();
            progress(format_args!(
                "revive: {} cycles, {} parked sessions, awake run at 1/{} ...",
                opts.cycles, opts.parked, opts.scale
            ));
            let outcome = binary
                .as_deref()
                .map_err(|e| anyhow!("{e}"))
                .and_then(|b| revive::run(b, opts))
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &outcome {
                progress(format_args!("revive failed: {e}"));
            }
            let section = revive::render(&local_facts(command), opts, &outcome);
            (args.common, vec![(REVIVE_SECTION, section)])
        }
        Cmd::Churn(args) => {
            let binary = locate(&args.common);
            let quick = args.common.quick;
            let opts = churn::ChurnOptions {
                reps: args.reps.unwrap_or(if quick { 1 } else { 3 }),
                secs: args.seconds.unwrap_or(if quick { 5 } else { 20 }),
                scale: args.scale,
            };
            progress(format_args!(
                "churn: {} repetitions of {} s per target ...",
                opts.reps, opts.secs
            ));
            let outcome = binary
                .as_deref()
                .map_err(|e| anyhow!("{e}"))
                .and_then(|b| churn::run(b, opts))
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &outcome {
                progress(format_args!("churn failed: {e}"));
            }
            let section = churn::render(command, opts, &outcome);
            (args.common, vec![(CHURN_SECTION, section)])
        }
        Cmd::Fidelity(args) => {
            let binary = locate(&args.common);
            let scale = args
                .scale
                .unwrap_or(if args.common.quick { 300 } else { 60 });
            let outcome = fidelity::App::select(&args.only)
                .and_then(|apps| {
                    progress(format_args!(
                        "fidelity: {} clients, one hour each at 1/{scale} ...",
                        apps.len(),
                    ));
                    let binary = binary.as_deref().map_err(|e| anyhow!("{e}"))?;
                    fidelity::run(binary, args.baseline.as_deref(), scale, &apps)
                })
                .map_err(|e| format!("{e:#}"));
            let name = args
                .baseline_name
                .clone()
                .or_else(|| args.baseline.as_ref().map(|p| p.display().to_string()));
            let section = fidelity::render(&local_facts(command), scale, name.as_deref(), &outcome);
            (args.common, vec![(FIDELITY_SECTION, section)])
        }
        Cmd::Multiplex(args) => {
            let binary = locate(&args.common);
            let quick = args.common.quick;
            let opts = multiplex::MultiplexOptions {
                clients: args.clients.unwrap_or(if quick { 50 } else { 200 }),
                run: Duration::from_secs(args.seconds.unwrap_or(if quick { 10 } else { 30 })),
                rounds: args.rounds,
                cap: args.cap,
                timeout: Duration::from_secs(args.timeout),
            };
            let outcome = binary
                .as_deref()
                .map_err(|e| anyhow!("{e}"))
                .and_then(|b| multiplex::run(b, opts))
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &outcome {
                progress(format_args!("multiplex failed: {e}"));
            }
            let section = multiplex::render(command, opts, &outcome);
            (args.common, vec![(MULTIPLEX_SECTION, section)])
        }
        Cmd::Scale(args) => {
            let binary = locate(&args.common);
            let quick = args.common.quick;
            let opts = scale::ScaleOptions {
                connections: args
                    .connections
                    .unwrap_or(if quick { 2_000 } else { 10_000 }),
                active: args.active.unwrap_or(if quick { 200 } else { 1_000 }),
                tenants: args.tenants.unwrap_or(if quick { 4 } else { 20 }),
                seconds: args.seconds.unwrap_or(if quick { 15 } else { 60 }),
            };
            let outcome = binary
                .as_deref()
                .map_err(|e| anyhow!("{e}"))
                .and_then(|b| scale::run(b, opts))
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &outcome {
                progress(format_args!("scale failed: {e}"));
            }
            // From a hundred thousand connections on it is issue 29's scenario, with its own
            // section, so the whole run can hold both.
            let section = if opts.connections >= 100_000 {
                SCALE_100K_SECTION
            } else {
                SCALE_SECTION
            };
            (
                args.common,
                vec![(section, scale::render(&local_facts(command), &outcome))],
            )
        }
        Cmd::Predict(args) => {
            let binary = locate(&args.common);
            let opts = predict::PredictOptions {
                runs: args.runs.unwrap_or(if args.common.quick { 5 } else { 10 }) as usize,
                seed: args.seed,
                real_time: !args.simulate_only,
            };
            let outcome = binary
                .as_deref()
                .map_err(|e| anyhow!("{e}"))
                .and_then(|b| predict::run(b, opts))
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &outcome {
                progress(format_args!("predict failed: {e}"));
            }
            let section = predict::render(&local_facts(command), opts, &outcome);
            (args.common, vec![(PREDICT_SECTION, section)])
        }
        Cmd::Kube(args) => {
            let binary = locate(&args.common);
            let opts = KubeOptions {
                cycles: args
                    .cycles
                    .unwrap_or(if args.common.quick { 5 } else { 20 }),
            };
            let section = run_kube(binary.as_deref().map_err(String::as_str), opts, command);
            (args.common, vec![(KUBE_SECTION, section)])
        }
    })
}

/// The pgwake binary (built first unless told not to), or why there is none. Building before
/// anything runs keeps the compiler off the CPUs during measurements.
fn locate(common: &Common) -> Result<PathBuf, String> {
    targets::locate_pgwake(&PgwakeSource {
        binary: common.pgwake.clone(),
        build: !common.no_build,
    })
    .map_err(|e| format!("{e:#}"))
}

/// Facts for the wake and queued sections: the machine, PostgreSQL and the commit.
fn local_facts(command: &str) -> Facts {
    let postgres = pgwake_testkit::pg_bin_dir()
        .ok()
        .and_then(|bin| command_output(bin.join("postgres"), &["--version"]))
        .unwrap_or_else(|| "unknown".into());
    Facts::collect(command, vec![("PostgreSQL", postgres)])
}

fn run_wake(binary: Result<&Path, &str>, opts: WakeOptions, command: &str) -> String {
    progress(format_args!(
        "wake latency: {} cycles per transport ...",
        opts.cycles
    ));
    let outcome = binary
        .map_err(|e| anyhow!("{e}"))
        .and_then(|b| wake::run(b, opts))
        .map_err(|e| format!("{e:#}"));
    if let Err(e) = &outcome {
        progress(format_args!("wake latency failed: {e}"));
    }
    wake::render(&local_facts(command), opts, &outcome)
}

fn run_kube(binary: Result<&Path, &str>, opts: KubeOptions, command: &str) -> String {
    progress(format_args!(
        "kube wake latency: {} cycles per backend ...",
        opts.cycles
    ));
    let outcome = binary
        .map_err(|e| anyhow!("{e}"))
        .and_then(|b| kube_wake::run(b, opts))
        .map_err(|e| format!("{e:#}"));
    if let Err(e) = &outcome {
        progress(format_args!("kube wake latency failed: {e}"));
    }
    kube_wake::render(&local_facts(command), opts, &outcome)
}

fn run_queued(binary: Result<&Path, &str>, opts: QueuedOptions, command: &str) -> String {
    progress(format_args!(
        "queued connections: {} clients ...",
        opts.connections
    ));
    let outcome = binary
        .map_err(|e| anyhow!("{e}"))
        .and_then(|b| queued::run(b, opts))
        .map_err(|e| format!("{e:#}"));
    if let Err(e) = &outcome {
        progress(format_args!("queued connections failed: {e}"));
    }
    queued::render(&local_facts(command), &outcome)
}

/// The pgbench comparison; returns its report section.
fn run_pgbench(
    common: &Common,
    args: &PgbenchFlags,
    pgwake: Result<&Path, &str>,
    command: &str,
) -> Result<String> {
    let quick = common.quick;
    let durations = if quick {
        Durations::QUICK
    } else {
        Durations::FULL
    };
    let reps = args.reps.unwrap_or(if quick { 1 } else { 3 });
    let load_before = load_average();

    if !common.no_build
        && let Err(e) = peers::build_floors()
    {
        progress(format_args!("{e:#}"));
    }
    let mut env = Environment::start(args.scale, args.auth, pgwake)?;
    env.start_peers(args.auth)?;
    env.start_bare_relay()?;
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

    // With autogroup scheduling each session gets its own CPU share: a server that put itself
    // in a session of its own (a daemonizing PgBouncer, pg_ctl) would compete on other terms.
    let scheduling = process::same_scheduling(&env.server_pids());
    progress(format_args!("scheduling: {scheduling}"));

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

    let mut facts = Facts::collect(
        command,
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
    for (peer, version) in &env.peer_versions {
        facts.rows.push((
            match peer {
                peers::Peer::Pgcat => "pgcat",
                peers::Peer::PgDog => "PgDog",
            },
            version.clone(),
        ));
    }
    facts.rows.push((
        "scheduling",
        format!(
            "`kernel.sched_autogroup_enabled` = {}; {scheduling}",
            process::autogroup_enabled()
        ),
    ));
    facts.rows.push((
        "load average (1/5/15 min)",
        format!("before {load_before}, after {}", load_average()),
    ));
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
    // Stop everything before the next scenarios, so a hung shutdown shows and nothing of this
    // part runs while they measure.
    drop(env);
    Ok(report)
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
