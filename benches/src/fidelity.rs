//! Scale-to-zero fidelity: applications on real drivers (psycopg 3 with `executemany` and with
//! pipelines, node-postgres, pgx, asyncpg) hold a pool of 10 connections open and run one query
//! every 10 minutes against a `local` tenant with a 1-minute idle timeout. The hour is run
//! time-scaled (every duration of the workload and of the gateway's idle handling divided by the
//! same factor); the tenant's state is sampled every 5 ms, and the time it was not asleep is
//! scaled back with starts and shutdowns at their real length. With `--baseline`, every
//! application runs against a second pgwake binary too, right after, in the same run.
//!
//! The ideal is what a perfect gateway costs: each wake runs the database for the idle timeout
//! plus the wake itself. The anchor is a gateway that keeps a tenant awake while any connection
//! is open: the whole hour.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::gateway::LocalGateway;
use crate::process::load_average;
use crate::report::Facts;
use crate::revive::{spec, wait_state};

/// The workload, unscaled.
const QUERY_EVERY: Duration = Duration::from_secs(600);
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const SNAPSHOT_AFTER: Duration = Duration::from_secs(1);
const IDLE_CHECK: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);
/// Queries in one hour of workload.
const QUERIES: u32 = 6;
/// The workload's ideal when this pgwake's row is missing: one wake per query, each running
/// the database for the idle timeout.
const IDEAL_FALLBACK: f64 = QUERIES as f64 * IDLE_TIMEOUT.as_secs() as f64;
/// Connections each application's pool holds open.
const POOL: u32 = 10;
/// Client sessions parked now (connected, without a backend connection).
const SESSIONS_PARKED: &str = "pgwake_sessions_parked";
/// The goal: every client within this factor of the ideal.
const GOAL_RATIO: f64 = 1.10;

/// One client application of the benchmark.
#[derive(Clone, Copy, Debug)]
pub enum App {
    /// psycopg 3, `psycopg_pool`, `cursor.executemany` (a pipeline ending in Sync, Flush).
    PsycopgExecutemany,
    /// psycopg 3, `psycopg_pool`, `connection.pipeline()`.
    PsycopgPipeline,
    /// node-postgres `pg.Pool`.
    NodePg,
    /// pgx v5 `pgxpool`.
    Pgx,
    /// asyncpg `create_pool`.
    Asyncpg,
    /// SQLAlchemy 2 on psycopg 3, its own `QueuePool`.
    Sqlalchemy,
    /// The same, each query inserting into a table keyed by a serial column: its connections
    /// draw from a sequence, which pins them under the default `revival.sequence_state`.
    SqlalchemySerial,
}

impl App {
    /// Every application, in report order.
    pub const ALL: [App; 7] = [
        App::PsycopgExecutemany,
        App::PsycopgPipeline,
        App::NodePg,
        App::Pgx,
        App::Asyncpg,
        App::Sqlalchemy,
        App::SqlalchemySerial,
    ];

    fn name(self) -> &'static str {
        match self {
            App::PsycopgExecutemany => "psycopg 3 pool, executemany",
            App::PsycopgPipeline => "psycopg 3 pool, pipeline",
            App::NodePg => "node-postgres Pool",
            App::Pgx => "pgx pgxpool",
            App::Asyncpg => "asyncpg pool",
            App::Sqlalchemy => "SQLAlchemy on psycopg 3",
            App::SqlalchemySerial => "SQLAlchemy on psycopg 3, inserts into a serial key",
        }
    }

    /// The command that runs the application (built or installed first where needed), or why it
    /// cannot run here.
    fn command(self, clients: &Path, scratch: &Path) -> Result<Command> {
        let python = |module: &str, script: &str| -> Result<Command> {
            let ok = Command::new("python3")
                .args(["-c", &format!("import {module}")])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                bail!(
                    "python3 cannot import {module} (pip install psycopg[binary] psycopg-pool asyncpg sqlalchemy)"
                );
            }
            let mut cmd = Command::new("python3");
            cmd.arg(clients.join(script));
            Ok(cmd)
        };
        Ok(match self {
            App::PsycopgExecutemany | App::PsycopgPipeline => {
                let mut cmd = python("psycopg_pool", "psycopg_pool_app.py")?;
                cmd.arg(match self {
                    App::PsycopgExecutemany => "executemany",
                    _ => "pipeline",
                });
                cmd
            }
            App::Asyncpg => python("asyncpg", "asyncpg_pool_app.py")?,
            App::Sqlalchemy => python("sqlalchemy", "sqlalchemy_app.py")?,
            App::SqlalchemySerial => {
                let mut cmd = python("sqlalchemy", "sqlalchemy_app.py")?;
                cmd.arg("serial");
                cmd
            }
            App::NodePg => {
                if !clients.join("node_modules/pg").exists() {
                    let ok = Command::new("npm")
                        .args(["ci", "--no-audit", "--no-fund"])
                        .current_dir(clients)
                        .stdout(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success());
                    if !ok {
                        bail!(
                            "npm ci in {} failed (install nodejs and npm)",
                            clients.display()
                        );
                    }
                }
                let mut cmd = Command::new("node");
                cmd.arg(clients.join("pg_pool_app.mjs"));
                cmd
            }
            App::Pgx => {
                let binary = scratch.join("pgx-pool-app");
                let go = which_go().ok_or_else(|| anyhow!("no Go toolchain for the pgx app"))?;
                let ok = Command::new(go)
                    .args(["build", "-o"])
                    .arg(&binary)
                    .arg(".")
                    .current_dir(clients.join("pgx"))
                    .env("GOTOOLCHAIN", "local")
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    bail!("go build of the pgx app failed");
                }
                Command::new(binary)
            }
        })
    }
}

fn which_go() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("go"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
}

/// One application's hour.
#[derive(Clone, Debug)]
pub struct Row {
    /// Wakes during the hour.
    pub wakes: u32,
    /// Time the database ran (waking, awake, sleeping) during the scaled run.
    pub awake: Duration,
    /// Of which waking or going to sleep (real length at any scale).
    pub transitions: Duration,
    /// Of which waking.
    pub waking: Duration,
    /// Time scale.
    pub scale: u32,
    /// Sessions parked each time the tenant was found asleep, against the pool's connections
    /// (1.0: every pooled session was parked at every sleep); `None` without a sleep. Counted
    /// from the gauge, not from parks at sleep: a connection the application did not use since
    /// the last sleep is still parked from then.
    pub parked_share: Option<f64>,
    /// Snapshots that found a session pinned, by reason (`pgwake_session_pins_total`).
    pub pins: Vec<(String, u64)>,
}

impl Row {
    /// Awake seconds per real hour: the scaled part times the scale, starts and shutdowns once.
    pub fn per_hour_s(&self) -> f64 {
        let scaled = self.awake.saturating_sub(self.transitions).as_secs_f64();
        scaled * f64::from(self.scale) + self.transitions.as_secs_f64()
    }

    /// The ideal: every wake runs the database for the idle timeout plus the wake itself.
    pub fn ideal_s(&self) -> f64 {
        f64::from(self.wakes) * IDLE_TIMEOUT.as_secs_f64() + self.waking.as_secs_f64()
    }
}

/// Every application's rows, and the machine's load before and after.
pub struct FidelityResults {
    /// One row per application, in [`App::ALL`] order (or why it did not run).
    pub rows: Vec<Result<Row, String>>,
    /// The same against the baseline binary, when one was given.
    pub baseline: Option<Vec<Result<Row, String>>>,
    /// Load averages before and after.
    pub load: (String, String),
}

/// Runs every application's hour at 1/`scale` against `binary`, and then against `baseline`
/// when given.
pub fn run(binary: &Path, baseline: Option<&Path>, scale: u32) -> Result<FidelityResults> {
    let clients = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients");
    let before = load_average();
    let one = |binary: &Path, app: App, which: &str| {
        crate::progress(format_args!("fidelity: {} ({which}) ...", app.name()));
        let row = run_app(binary, &clients, app, scale).map_err(|e| format!("{e:#}"));
        if let Err(e) = &row {
            crate::progress(format_args!("fidelity: {} failed: {e}", app.name()));
        }
        row
    };
    let (mut rows, mut base_rows) = (Vec::new(), Vec::new());
    for app in App::ALL {
        rows.push(one(binary, app, "pgwake"));
        if let Some(b) = baseline {
            base_rows.push(one(b, app, "baseline"));
        }
    }
    Ok(FidelityResults {
        rows,
        baseline: baseline.map(|_| base_rows),
        load: (before, load_average()),
    })
}

/// The application's process, killed if the run ends early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_app(binary: &Path, clients: &Path, app: App, scale: u32) -> Result<Row> {
    let idle = IDLE_TIMEOUT / scale;
    let gw = LocalGateway::start(
        binary,
        &spec(idle, IDLE_CHECK / scale, SNAPSHOT_AFTER / scale),
    )?;
    let login = gw.login();
    let url = format!(
        "postgres://{}:{}@127.0.0.1:{}/{}?sslmode=disable",
        login.user, login.password, login.port, login.dbname
    );
    let every = QUERY_EVERY / scale;
    let mut cmd = app.command(clients, gw.scratch())?;
    cmd.arg(&url)
        .arg(every.as_millis().to_string())
        .arg(QUERIES.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = Running(cmd.spawn().context("starting the application")?);
    let out = child.0.stdout.take().context("application stdout")?;
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let expect = |what: &str, limit: Duration| -> Result<()> {
        match lines.recv_timeout(limit) {
            Ok(l) if l == what => Ok(()),
            Ok(l) => bail!("the application printed {l:?}, expected {what:?}"),
            Err(_) => bail!("no {what:?} from the application within {limit:?}"),
        }
    };
    expect("ready", Duration::from_secs(120))?;
    // Its pool is open; the hour starts once the tenant has gone to sleep.
    wait_state(&gw, "asleep")?;
    let (mut awake, mut transitions, mut waking) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut wakes = 0u32;
    let mut sleeps = 0u32;
    let mut parked = 0.0;
    let mut last = (Instant::now(), "asleep".to_owned());
    let mut answered = 0u32;
    let limit = Instant::now() + HOUR / scale + Duration::from_secs(60);
    loop {
        match lines.try_recv() {
            Ok(l) if l == "done" => break,
            Ok(l) if l.starts_with("query ") => answered += 1,
            Ok(l) => bail!("the application printed {l:?}"),
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => bail!("the application ended early"),
        }
        if Instant::now() > limit {
            bail!("the application did not finish its hour");
        }
        let state = gw.status()?.state;
        let now = Instant::now();
        let span = now - last.0;
        match last.1.as_str() {
            "asleep" | "failed" => {}
            "waking" => {
                awake += span;
                waking += span;
                transitions += span;
            }
            "sleeping" => {
                awake += span;
                transitions += span;
            }
            _ => awake += span,
        }
        if last.1 != "waking" && state == "waking" {
            wakes += 1;
        }
        if last.1 != "asleep" && state == "asleep" {
            sleeps += 1;
            parked += gw.metric(SESSIONS_PARKED)?;
        }
        last = (now, state);
        sleep(Duration::from_millis(5));
    }
    if answered != QUERIES {
        bail!("{answered} of {QUERIES} queries answered");
    }
    let parked_share = (sleeps > 0).then(|| parked / f64::from(POOL * sleeps));
    let mut pins = Vec::new();
    for (reason, n) in gw.labelled_metrics("pgwake_session_pins_total", "reason")? {
        if n > 0.0 {
            pins.push((reason, n as u64));
        }
    }
    Ok(Row {
        wakes,
        awake,
        transitions,
        waking,
        scale,
        parked_share,
        pins,
    })
}

/// The Markdown section for RESULTS.md.
pub fn render(
    facts: &Facts,
    scale: u32,
    baseline_name: Option<&str>,
    outcome: &Result<FidelityResults, String>,
) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(
        &mut out,
        "Scale-to-zero fidelity: pooled idle connections on real drivers (local backend)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "\nWorkload: each application holds a pool of 10 open connections and runs one query \
         every {} min; idle timeout {} min, `snapshot_after` {} s, sleeper interval {} s; one hour \
         run at 1/{scale} ({} s). The tenant's state sampled every 5 ms; time not asleep scaled \
         back, waking and sleeping counted at real length. Ideal: wakes × (idle timeout + wake \
         time). Anchor: a gateway that keeps the tenant awake while a connection is open (the \
         whole hour). Baseline: {}.\n",
        QUERY_EVERY.as_secs() / 60,
        IDLE_TIMEOUT.as_secs() / 60,
        SNAPSHOT_AFTER.as_secs(),
        IDLE_CHECK.as_secs(),
        HOUR.as_secs() / u64::from(scale),
        baseline_name.unwrap_or("none"),
    );
    let _ = writeln!(
        out,
        "| client | wakes | awake per idle tenant-hour | ideal | measured / ideal | goal ≤ \
         {GOAL_RATIO:.2} × ideal | baseline: wakes | baseline: awake per hour | baseline / ideal \
         | anchor | pooled sessions parked at each sleep | pinned snapshots |\n\
         |---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"
    );
    let none = vec![Err("not run".to_owned()); App::ALL.len()];
    let base = r.baseline.as_ref().unwrap_or(&none);
    for ((app, row), base) in App::ALL.iter().zip(&r.rows).zip(base) {
        let (wakes, got, ideal, ratio, goal) = match row {
            Ok(row) => {
                let (got, ideal) = (row.per_hour_s(), row.ideal_s());
                let ratio = got / ideal;
                let goal = if ratio <= GOAL_RATIO { "met" } else { "missed" };
                (
                    row.wakes.to_string(),
                    format!("{got:.0} s"),
                    format!("{ideal:.0} s"),
                    format!("{ratio:.3}"),
                    goal.to_owned(),
                )
            }
            Err(e) => {
                let why = format!("not run: {}", e.replace('|', "\\|"));
                ("–".into(), "–".into(), "–".into(), "–".into(), why)
            }
        };
        // The workload's ideal, as measured with this pgwake: a baseline that slept fewer
        // times than the queries need is not measured against its own few wakes.
        let workload_ideal = row.as_ref().map_or_else(|_| IDEAL_FALLBACK, Row::ideal_s);
        let (b_wakes, b_got, b_ratio) = match base {
            Ok(b) => (
                b.wakes.to_string(),
                format!("{:.0} s", b.per_hour_s()),
                format!("{:.3}", b.per_hour_s() / workload_ideal),
            ),
            Err(_) => ("–".into(), "–".into(), "–".into()),
        };
        let (parked, pins) = match row {
            Ok(row) => (
                row.parked_share
                    .map_or_else(|| "no sleep".to_owned(), |s| format!("{:.0} %", s * 100.0)),
                if row.pins.is_empty() {
                    "none".to_owned()
                } else {
                    let each: Vec<String> =
                        row.pins.iter().map(|(r, n)| format!("{r} {n}")).collect();
                    each.join(", ")
                },
            ),
            Err(_) => ("–".into(), "–".into()),
        };
        let _ = writeln!(
            out,
            "| {} | {wakes} | {got} | {ideal} | {ratio} | {goal} | {b_wakes} | {b_got} | {b_ratio} | 3600 s | {parked} | {pins} |",
            app.name()
        );
    }
    out
}
