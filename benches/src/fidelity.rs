//! Scale-to-zero fidelity: applications on real drivers (psycopg 3 with `executemany` and with
//! pipelines, node-postgres, pgx, asyncpg, SQLAlchemy) hold a pool of 10 connections open and run
//! one query every 10 minutes against a `local` tenant with a 1-minute idle timeout; the app
//! zoo's ORMs (see [`crate::zoo`]) run the six steps of their flow at the same times instead. The
//! hour is run time-scaled (every duration of the workload and of the gateway's idle handling
//! divided by the same factor); the tenant's state is sampled every 5 ms, and the time it was not
//! asleep is scaled back with starts, shutdowns and the zoo's steps at their real length. With
//! `--baseline`, every application runs against a second pgwake binary too, right after, in the
//! same run.
//!
//! The ideal is what a perfect gateway costs: each wake runs the database for the idle timeout
//! plus the wake itself. The anchor is a gateway that keeps a tenant awake while any connection
//! is open: the whole hour.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::gateway::LocalGateway;
use crate::process::load_average;
use crate::report::Facts;
use crate::revive::{spec, wait_state};
use crate::zoo::{self, Framework, Lines};

/// The workload, unscaled.
const QUERY_EVERY: Duration = Duration::from_secs(600);
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const SNAPSHOT_AFTER: Duration = Duration::from_secs(1);
const IDLE_CHECK: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);
/// Queries in one hour of workload (the zoo's flow has as many steps).
const QUERIES: u32 = zoo::STEPS;
/// The workload's ideal when a row has no wake to measure it by: one wake per query, each
/// running the database for the idle timeout.
const IDEAL_FALLBACK: f64 = QUERIES as f64 * IDLE_TIMEOUT.as_secs() as f64;
/// Connections each driver application's pool holds open.
const POOL: u32 = 10;
/// Client sessions parked now (connected, without a backend connection).
const SESSIONS_PARKED: &str = "pgwake_sessions_parked";
/// The goal: every client within this factor of the ideal.
const GOAL_RATIO: f64 = 1.10;

/// One client application of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// SQLAlchemy 2 (Core, `text()` queries) on psycopg 3, its own `QueuePool`.
    Sqlalchemy,
    /// An ORM of the app zoo running its create / read / update / delete flow.
    Zoo(Framework),
}

impl App {
    /// Every application, in report order.
    pub const ALL: [App; 11] = [
        App::PsycopgExecutemany,
        App::PsycopgPipeline,
        App::NodePg,
        App::Pgx,
        App::Asyncpg,
        App::Sqlalchemy,
        App::Zoo(Framework::Sqlalchemy),
        App::Zoo(Framework::Django),
        App::Zoo(Framework::Drizzle),
        App::Zoo(Framework::Gorm),
        App::Zoo(Framework::Hibernate),
    ];

    fn name(self) -> &'static str {
        match self {
            App::PsycopgExecutemany => "psycopg 3 pool, executemany",
            App::PsycopgPipeline => "psycopg 3 pool, pipeline",
            App::NodePg => "node-postgres Pool",
            App::Pgx => "pgx pgxpool",
            App::Asyncpg => "asyncpg pool",
            App::Sqlalchemy => "SQLAlchemy on psycopg 3",
            App::Zoo(f) => f.name(),
        }
    }

    /// The name `--only` selects the application by.
    pub fn key(self) -> &'static str {
        match self {
            App::PsycopgExecutemany => "psycopg-executemany",
            App::PsycopgPipeline => "psycopg-pipeline",
            App::NodePg => "node-pg",
            App::Pgx => "pgx",
            App::Asyncpg => "asyncpg",
            App::Sqlalchemy => "sqlalchemy",
            App::Zoo(Framework::Sqlalchemy) => "zoo-sqlalchemy",
            App::Zoo(Framework::Django) => "zoo-django",
            App::Zoo(Framework::Drizzle) => "zoo-drizzle",
            App::Zoo(Framework::Gorm) => "zoo-gorm",
            App::Zoo(Framework::Hibernate) => "zoo-hibernate",
        }
    }

    /// The applications `only` selects (keys, `zoo` or `drivers`), every one when it is empty.
    pub fn select(only: &[String]) -> Result<Vec<App>> {
        if let Some(bad) = only.iter().find(|k| {
            !matches!(k.as_str(), "zoo" | "drivers") && !App::ALL.iter().any(|a| a.key() == *k)
        }) {
            let keys: Vec<&str> = App::ALL.iter().map(|a| a.key()).collect();
            bail!(
                "no application {bad}: one of zoo, drivers, {}",
                keys.join(", ")
            );
        }
        Ok(App::ALL
            .into_iter()
            .filter(|a| {
                only.is_empty()
                    || only.iter().any(|k| match k.as_str() {
                        "zoo" => matches!(a, App::Zoo(_)),
                        "drivers" => !matches!(a, App::Zoo(_)),
                        k => k == a.key(),
                    })
            })
            .collect())
    }

    /// The command that runs a driver application (built or installed first where needed), or
    /// why it cannot run here.
    fn command(self, scratch: &Path) -> Result<Command> {
        let clients = zoo::clients();
        let python = |script: &str| -> Result<Command> {
            let mut cmd = Command::new(zoo::python()?);
            cmd.arg(clients.join(script));
            Ok(cmd)
        };
        Ok(match self {
            App::PsycopgExecutemany | App::PsycopgPipeline => {
                let mut cmd = python("psycopg_pool_app.py")?;
                cmd.arg(match self {
                    App::PsycopgExecutemany => "executemany",
                    _ => "pipeline",
                });
                cmd
            }
            App::Asyncpg => python("asyncpg_pool_app.py")?,
            App::Sqlalchemy => python("sqlalchemy_app.py")?,
            App::NodePg => {
                zoo::npm_ci(&clients, "pg")?;
                let mut cmd = Command::new("node");
                cmd.arg(clients.join("pg_pool_app.mjs"));
                cmd
            }
            App::Pgx => {
                let binary = scratch.join("pgx-pool-app");
                zoo::go_build(&clients.join("pgx"), &binary)?;
                Command::new(binary)
            }
            App::Zoo(_) => bail!("a zoo application is driven step by step"),
        })
    }
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
    /// Of which awake while a zoo step ran: the application's own work, which takes as long
    /// in a real hour as in a scaled one (real length at any scale, like the transitions).
    pub steps: Duration,
    /// Time scale.
    pub scale: u32,
    /// Connections the application's pool held open.
    pub pool: u32,
    /// Sessions parked each time the tenant was found asleep, against the pool's connections:
    /// the mean and the least share over the sleeps (1.0: every pooled session was parked at
    /// every sleep); `None` without a sleep. Counted from the gauge, not from parks at sleep: a
    /// connection the application did not use since the last sleep is still parked from then.
    pub parked_share: Option<(f64, f64)>,
    /// Snapshots that found a session pinned, by reason (`pgwake_session_pins_total`).
    pub pins: Vec<(String, u64)>,
    /// A zoo application's transcript through pgwake against the one straight against
    /// Postgres: one line per step that differs; `None` for a driver application.
    pub differences: Option<Vec<String>>,
    /// What else happened that the table cannot show.
    pub notes: Vec<String>,
}

impl Row {
    /// Awake seconds per real hour: the scaled part times the scale, starts, shutdowns and the
    /// zoo's steps once.
    pub fn per_hour_s(&self) -> f64 {
        let real = self.transitions + self.steps;
        let scaled = self.awake.saturating_sub(real).as_secs_f64();
        scaled * f64::from(self.scale) + real.as_secs_f64()
    }

    /// The ideal: every wake runs the database for the idle timeout plus the wake itself (one
    /// wake per query when the tenant never woke during the hour, i.e. never slept).
    pub fn ideal_s(&self) -> f64 {
        if self.wakes == 0 {
            return IDEAL_FALLBACK;
        }
        f64::from(self.wakes) * IDLE_TIMEOUT.as_secs_f64() + self.waking.as_secs_f64()
    }

    /// Issue 40's targets for a zoo row: what it missed of awake time within the goal, every
    /// pooled session parked at every sleep, no pinned snapshot and no difference.
    fn missed(&self) -> Vec<&'static str> {
        let mut missed = Vec::new();
        if self.per_hour_s() / self.ideal_s() > GOAL_RATIO {
            missed.push("awake time");
        }
        if self.parked_share.is_none_or(|(_, least)| least < 1.0) {
            missed.push("parked");
        }
        if !self.pins.is_empty() {
            missed.push("pins");
        }
        if self.differences.as_ref().is_some_and(|d| !d.is_empty()) {
            missed.push("differences");
        }
        missed
    }
}

/// Every application's rows, and the machine's load before and after.
pub struct FidelityResults {
    /// One row per application run, in [`App::ALL`] order (or why it did not run).
    pub rows: Vec<(App, Result<Row, String>)>,
    /// The same against the baseline binary, when one was given.
    pub baseline: Option<Vec<Result<Row, String>>>,
    /// Load averages before and after.
    pub load: (String, String),
}

/// Runs each of `apps`' hour at 1/`scale` against `binary`, and then against `baseline` when
/// given.
pub fn run(
    binary: &Path,
    baseline: Option<&Path>,
    scale: u32,
    apps: &[App],
) -> Result<FidelityResults> {
    let before = load_average();
    let one = |binary: &Path, app: App, which: &str| {
        crate::progress(format_args!("fidelity: {} ({which}) ...", app.name()));
        let row = run_app(binary, app, scale).map_err(|e| format!("{e:#}"));
        match &row {
            Err(e) => crate::progress(format_args!("fidelity: {} failed: {e}", app.name())),
            Ok(r) => {
                for d in r.differences.iter().flatten() {
                    crate::progress(format_args!("fidelity: {} differs: {d}", app.name()));
                }
            }
        }
        row
    };
    let (mut rows, mut base_rows) = (Vec::new(), Vec::new());
    for &app in apps {
        rows.push((app, one(binary, app, "pgwake")));
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

/// The tenant's time during one hour, as sampled.
#[derive(Default)]
struct Sampled {
    wakes: u32,
    awake: Duration,
    transitions: Duration,
    waking: Duration,
    /// Awake while the application said it was busy.
    steps: Duration,
    /// Sessions parked at each sleep.
    parked: Vec<f64>,
}

/// What the application is doing, as its driver tells [`sample`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tick {
    /// Waiting (or keeping its own time).
    Idle,
    /// Running a step of the zoo's flow.
    Busy,
    /// Finished its hour.
    Done,
}

/// Samples the tenant's state every 5 ms from `last` on, calling `drive` between samples until
/// it says the application is done.
fn sample(
    gw: &LocalGateway,
    mut last: (Instant, String),
    limit: Instant,
    mut drive: impl FnMut(Instant) -> Result<Tick>,
) -> Result<Sampled> {
    let mut s = Sampled::default();
    let mut was = Tick::Idle;
    loop {
        let tick = drive(Instant::now())?;
        if tick == Tick::Done {
            return Ok(s);
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
                s.awake += span;
                s.waking += span;
                s.transitions += span;
            }
            "sleeping" => {
                s.awake += span;
                s.transitions += span;
            }
            _ => {
                s.awake += span;
                if was == Tick::Busy {
                    s.steps += span;
                }
            }
        }
        if last.1 != "waking" && state == "waking" {
            s.wakes += 1;
        }
        if last.1 != "asleep" && state == "asleep" {
            s.parked.push(gw.metric(SESSIONS_PARKED)?);
        }
        last = (now, state);
        was = tick;
        sleep(Duration::from_millis(5));
    }
}

fn url_of(gw: &LocalGateway) -> String {
    let login = gw.login();
    format!(
        "postgres://{}:{}@127.0.0.1:{}/{}?sslmode=disable",
        login.user, login.password, login.port, login.dbname
    )
}

fn run_app(binary: &Path, app: App, scale: u32) -> Result<Row> {
    let gw = LocalGateway::start(
        binary,
        &spec(
            IDLE_TIMEOUT / scale,
            IDLE_CHECK / scale,
            SNAPSHOT_AFTER / scale,
        ),
    )?;
    let limit = HOUR / scale + Duration::from_secs(60);
    let (pool, sampled, differences, notes) = match app {
        App::Zoo(framework) => {
            let (pool, sampled, differences, notes) = run_zoo(&gw, framework, scale, limit)?;
            (pool, sampled, Some(differences), notes)
        }
        _ => (POOL, run_driver(&gw, app, scale, limit)?, None, Vec::new()),
    };
    let shares: Vec<f64> = sampled
        .parked
        .iter()
        .map(|p| p / f64::from(pool.max(1)))
        .collect();
    let parked_share = (!shares.is_empty()).then(|| {
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        (mean, shares.iter().copied().fold(f64::INFINITY, f64::min))
    });
    let mut pins = Vec::new();
    for (reason, n) in gw.labelled_metrics("pgwake_session_pins_total", "reason")? {
        if n > 0.0 {
            pins.push((reason, n as u64));
        }
    }
    Ok(Row {
        wakes: sampled.wakes,
        awake: sampled.awake,
        transitions: sampled.transitions,
        waking: sampled.waking,
        steps: sampled.steps,
        scale,
        pool,
        parked_share,
        pins,
        differences,
        notes,
    })
}

/// A driver application: it keeps its own time from `ready` on, one query per interval.
fn run_driver(gw: &LocalGateway, app: App, scale: u32, limit: Duration) -> Result<Sampled> {
    let mut cmd = app.command(gw.scratch())?;
    cmd.arg(url_of(gw))
        .arg((QUERY_EVERY / scale).as_millis().to_string())
        .arg(QUERIES.to_string())
        .stderr(Stdio::inherit());
    let lines = Lines::spawn(&mut cmd)?;
    match lines.next(Duration::from_secs(120))?.as_str() {
        "ready" => {}
        l => bail!("the application printed {l:?}, expected \"ready\""),
    }
    // Its pool is open; the hour starts once the tenant has gone to sleep.
    wait_state(gw, "asleep")?;
    let mut answered = 0u32;
    let start = (Instant::now(), "asleep".to_owned());
    let sampled = sample(gw, start, Instant::now() + limit, |_| {
        while let Some(l) = lines.try_next()? {
            match l.as_str() {
                "done" => return Ok(Tick::Done),
                l if l.starts_with("query ") => answered += 1,
                l => bail!("the application printed {l:?}"),
            }
        }
        Ok(Tick::Idle)
    })?;
    if answered != QUERIES {
        bail!("{answered} of {QUERIES} queries answered");
    }
    Ok(sampled)
}

/// A zoo application: its flow straight against Postgres first, then through the gateway with
/// one step at the middle of each interval, the tenant left to sleep between them. Returns the
/// pool's size, the hour, the differences between the two transcripts and notes.
fn run_zoo(
    gw: &LocalGateway,
    framework: Framework,
    scale: u32,
    limit: Duration,
) -> Result<(u32, Sampled, Vec<String>, Vec<String>)> {
    let launcher = framework.prepare(gw.scratch())?;
    let direct =
        zoo::direct(&launcher, gw.scratch()).context("the flow straight against Postgres")?;
    let mut app = zoo::App::start(&launcher, &url_of(gw), &gw.scratch().join("app.log"))
        .context("setting up through pgwake")?;
    let mut notes = Vec::new();
    // The schema is in place and the pool open; the hour starts once the tenant has gone to
    // sleep, or after a while regardless, since a pinned session keeps it awake for good.
    let settle = Duration::from_secs(15) + 3 * (IDLE_TIMEOUT / scale);
    let deadline = Instant::now() + settle;
    let mut state = gw.status()?.state;
    while state != "asleep" && Instant::now() < deadline {
        sleep(Duration::from_millis(10));
        state = gw.status()?.state;
    }
    if state != "asleep" {
        notes.push(format!(
            "the tenant was still {state} {} s after the setup (schema, pool), so the hour \
             started with it {state}",
            settle.as_secs()
        ));
    }
    let every = QUERY_EVERY / scale;
    let start = Instant::now();
    let end = start + HOUR / scale;
    let sampled = sample(gw, (start, state), start + limit, |now| {
        if !app.poll()? {
            return Ok(Tick::Busy);
        }
        let next = app.steps_done();
        if next < QUERIES {
            if now >= start + every / 2 + every * next {
                app.begin_step()?;
                return Ok(Tick::Busy);
            }
            return Ok(Tick::Idle);
        }
        Ok(if now >= end { Tick::Done } else { Tick::Idle })
    })?;
    notes.push(format!(
        "its steps ran {:.1} s while the tenant was awake, counted at real length",
        sampled.steps.as_secs_f64()
    ));
    let pool = app.pool;
    let through = app.finish()?;
    Ok((pool, sampled, zoo::differences(&direct, &through), notes))
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
        "Scale-to-zero fidelity: pooled idle connections on real drivers and ORMs (local backend)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "\nWorkload: each driver application holds a pool of 10 open connections and runs one \
         query every {} min; each app-zoo application (an ORM with its default settings) sets up \
         its schema through pgwake, holds its pool open and runs one step of its create / read / \
         update / delete flow (a transaction each) at the same times. Idle timeout {} min, \
         `snapshot_after` {} s, sleeper interval {} s, `[revival]` otherwise the defaults; one \
         hour run at 1/{scale} ({} s). The tenant's state sampled every 5 ms; time not asleep \
         scaled back, waking, sleeping and the zoo's steps (the application's own work, as long in a \
         real hour) counted at real length. Ideal: wakes × (idle timeout + \
         wake time). Anchor: a gateway that keeps the tenant awake while a connection is open \
         (the whole hour). Parked: the share of the pool's connections parked when the tenant \
         was found asleep, the mean over the sleeps (and the least where lower). Direct vs \
         pgwake: the zoo's flow also runs straight against a throwaway Postgres, and its \
         printed ids, rows and counts are compared step by step. Baseline: {}.\n",
        QUERY_EVERY.as_secs() / 60,
        IDLE_TIMEOUT.as_secs() / 60,
        SNAPSHOT_AFTER.as_secs(),
        IDLE_CHECK.as_secs(),
        HOUR.as_secs() / u64::from(scale),
        baseline_name.unwrap_or("none"),
    );
    let _ = writeln!(
        out,
        "| client | pool | wakes | awake per idle tenant-hour | ideal | measured / ideal | goal ≤ \
         {GOAL_RATIO:.2} × ideal | baseline: wakes | baseline: awake per hour | baseline / ideal \
         | anchor | pooled sessions parked at each sleep | pinned snapshots | direct vs pgwake \
         | zoo targets (issue 40) |\n\
         |---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|"
    );
    let none = vec![Err("not run".to_owned()); r.rows.len()];
    let base = r.baseline.as_ref().unwrap_or(&none);
    let mut below = Vec::new();
    for ((app, row), base) in r.rows.iter().zip(base) {
        let dash = || "–".to_owned();
        let cells = match row {
            Ok(row) => {
                let (got, ideal) = (row.per_hour_s(), row.ideal_s());
                let ratio = got / ideal;
                let parked = match row.parked_share {
                    None => "no sleep".to_owned(),
                    Some((mean, least)) if least < mean => {
                        format!("{:.0} % (least {:.0} %)", mean * 100.0, least * 100.0)
                    }
                    Some((mean, _)) => format!("{:.0} %", mean * 100.0),
                };
                let pins = if row.pins.is_empty() {
                    "none".to_owned()
                } else {
                    let each: Vec<String> =
                        row.pins.iter().map(|(r, n)| format!("{r} {n}")).collect();
                    each.join(", ")
                };
                let (diffs, targets) = match &row.differences {
                    None => (dash(), dash()),
                    Some(d) => {
                        let missed = row.missed();
                        let targets = if missed.is_empty() {
                            "met".to_owned()
                        } else {
                            format!("**missed**: {}", missed.join(", "))
                        };
                        (format!("{} differences", d.len()), targets)
                    }
                };
                for d in row.differences.iter().flatten() {
                    below.push(format!("{}: {d}", app.name()));
                }
                for n in &row.notes {
                    below.push(format!("{}: {n}", app.name()));
                }
                [
                    row.pool.to_string(),
                    row.wakes.to_string(),
                    format!("{got:.0} s"),
                    format!("{ideal:.0} s"),
                    format!("{ratio:.3}"),
                    if ratio <= GOAL_RATIO { "met" } else { "missed" }.to_owned(),
                    parked,
                    pins,
                    diffs,
                    targets,
                ]
            }
            Err(e) => {
                let why = format!("not run: {}", e.replace('|', "\\|"));
                let targets = if matches!(app, App::Zoo(_)) {
                    "**missed**: not run".to_owned()
                } else {
                    dash()
                };
                [
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    dash(),
                    why,
                    dash(),
                    dash(),
                    dash(),
                    targets,
                ]
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
            Err(_) => (dash(), dash(), dash()),
        };
        let [
            pool,
            wakes,
            got,
            ideal,
            ratio,
            goal,
            parked,
            pins,
            diffs,
            targets,
        ] = cells;
        let _ = writeln!(
            out,
            "| {} | {pool} | {wakes} | {got} | {ideal} | {ratio} | {goal} | {b_wakes} | {b_got} \
             | {b_ratio} | 3600 s | {parked} | {pins} | {diffs} | {targets} |",
            app.name()
        );
    }
    if !below.is_empty() {
        let _ = writeln!(out);
        for line in below {
            let _ = writeln!(out, "- {}", line.replace('|', "\\|"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_selects_by_key_or_group() {
        let keys = |only: &[&str]| -> Vec<&str> {
            let only: Vec<String> = only.iter().map(|k| (*k).to_owned()).collect();
            App::select(&only)
                .unwrap()
                .iter()
                .map(|a| a.key())
                .collect()
        };
        assert_eq!(keys(&[]).len(), App::ALL.len());
        assert_eq!(keys(&["zoo-gorm", "pgx"]), ["pgx", "zoo-gorm"]);
        assert_eq!(keys(&["zoo"]).len(), 5);
        assert!(keys(&["drivers"]).iter().all(|k| !k.starts_with("zoo-")));
        assert!(App::select(&["prisma".to_owned()]).is_err());
    }
}
