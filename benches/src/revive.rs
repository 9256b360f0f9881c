//! Sessions that outlive their backend, measured on a `local`-backend tenant:
//!
//! - **revival latency**: a client holds a session with settings and a prepared statement; the
//!   tenant idles to sleep (the session is parked); the client executes the statement. Its wait
//!   minus the backend's own start (`last_wake_ms`) minus a warm execution is what reviving the
//!   session adds on top of the wake.
//! - **a burst of revivals**: that many sessions, each with a setting and a prepared statement,
//!   parked on a sleeping tenant, execute their statement at the same moment: one wake, then
//!   every session revived on a backend connection of its own; each client's wait is a sample.
//! - **memory per parked session**: the gateway's RSS before and after that many sessions have
//!   been parked (opened in batches, each batch idling the tenant to sleep).
//! - **awake-seconds per idle tenant-hour**: a pool of 10 idle connections, one query every 10
//!   minutes, idle timeout 1 minute, run time-scaled (every duration of the workload and the
//!   gateway's idle handling divided by the same factor); the tenant's awake time is read from
//!   the admin API and scaled back, wakes and sleeps counted at their real length.

use std::fmt::Write as _;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio_postgres::{Client, NoTls, Statement};

use crate::client::Login;
use crate::gateway::LocalGateway;
use crate::gateway::Spec;
use crate::process::{ProcSample, load_average};
use crate::report::{Facts, fmt_ms, met, percentile};

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct ReviveOptions {
    /// Park/revive cycles for the latency.
    pub cycles: u32,
    /// Sessions parked for the memory figure.
    pub parked: u32,
    /// Sessions revived at once in the burst.
    pub burst: u32,
    /// Time-scale factor of the awake-seconds run (60: one hour in one minute).
    pub scale: u32,
}

/// Goals from the issue.
const GOAL_OVERHEAD_P50_MS: f64 = 50.0;
const GOAL_PARKED_KIB: f64 = 4.0;
const GOAL_BURST_P50_MS: f64 = 200.0;
const GOAL_BURST_MAX_MS: f64 = 500.0;
/// `snapshot_after` in the burst: the gateway's default.
const BURST_SNAPSHOT: Duration = Duration::from_secs(1);
/// Bursts measured, each after the tenant slept with every session parked.
const BURST_ROUNDS: u32 = 5;
/// The tenant's `max_connections` in the burst: every revived session holds a backend
/// connection until it parks again, beside the gateway's probes and the reserved slots.
const BURST_MAX_CONNECTIONS: u32 = 300;
/// Sessions opened per batch in the memory run (under the tenant's max_connections of 100,
/// with room for the gateway's probes).
const BATCH: u32 = 80;
/// Limit for waiting on the tenant to reach a state.
const STATE_LIMIT: Duration = Duration::from_secs(60);
/// The workload of the awake-seconds figure, unscaled.
const POOL: usize = 10;
const QUERY_EVERY: Duration = Duration::from_secs(600);
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// One park/revive cycle.
#[derive(Clone, Debug)]
pub struct Cycle {
    /// The client's execute, tenant asleep and session parked before.
    pub e2e_ms: f64,
    /// The backend's start (`last_wake_ms`).
    pub start_ms: f64,
    /// Median warm execute right after.
    pub warm_ms: f64,
}

impl Cycle {
    /// What the revival adds beyond the wake and the query itself.
    pub fn overhead_ms(&self) -> f64 {
        self.e2e_ms - self.start_ms - self.warm_ms
    }
}

/// Everything measured.
pub struct ReviveResults {
    /// Latency cycles.
    pub cycles: Vec<Cycle>,
    /// The bursts: each session's wait, ms, and each burst's backend start (`last_wake_ms`).
    pub burst: Burst,
    /// Gateway RSS with the tenant asleep and no session, KiB.
    pub rss_empty_kib: u64,
    /// Gateway RSS with every session parked, KiB.
    pub rss_parked_kib: u64,
    /// Gateway RSS once about half the sessions were parked, KiB, and how many they were.
    pub rss_half: (u64, u32),
    /// Sessions parked for that.
    pub parked: u32,
    /// Awake-seconds run: (scaled run length, awake seconds measured, wakes, seconds spent
    /// waking or sleeping, awake seconds per real hour).
    pub awake: AwakeRun,
    /// Load average before and after.
    pub load: (String, String),
}

/// Revivals at the same moment.
#[derive(Clone, Debug, Default)]
pub struct Burst {
    /// Sessions per burst.
    pub sessions: u32,
    /// Every session's execute, ms, all bursts together.
    pub waits_ms: Vec<f64>,
    /// Each burst's backend start (`last_wake_ms`), ms.
    pub starts_ms: Vec<f64>,
    /// The baseline: each of as many fresh logins straight to the awake tenant's Postgres at
    /// once, doing the same work (`SET`, prepare, execute), ms.
    pub direct_ms: Vec<f64>,
}

/// The time-scaled awake-seconds run.
#[derive(Clone, Debug)]
pub struct AwakeRun {
    /// Factor every workload duration was divided by.
    pub scale: u32,
    /// Real length of the run.
    pub run: Duration,
    /// Time the tenant was not asleep.
    pub awake: Duration,
    /// Wakes seen.
    pub wakes: u32,
    /// Time spent in the waking and sleeping states (not scaled back: a Postgres start takes
    /// its real time at any scale).
    pub transitions: Duration,
    /// Queries run, all successful.
    pub queries: u32,
}

impl AwakeRun {
    /// Awake seconds per real hour: the scaled part (awake minus transitions) times the scale,
    /// plus the transitions as measured, per hour of workload.
    pub fn per_hour_s(&self) -> f64 {
        let scaled = self.awake.saturating_sub(self.transitions).as_secs_f64();
        let hours = self.run.as_secs_f64() * f64::from(self.scale) / HOUR.as_secs_f64();
        (scaled * f64::from(self.scale) + self.transitions.as_secs_f64()) / hours
    }
}

/// A local tenant with these idle, sleeper and snapshot timings.
pub(crate) fn spec(idle: Duration, check: Duration, snapshot: Duration) -> Spec<'static> {
    Spec {
        tenant: "revive",
        wake: vec![
            format!("idle_timeout = \"{}ms\"", idle.as_millis()),
            format!("idle_check_interval = \"{}ms\"", check.as_millis()),
        ],
        limits: vec!["shutdown_grace = \"1s\"".into()],
        settings: vec![],
        revival: vec![format!("snapshot_after = \"{}ms\"", snapshot.as_millis())],
        auth: vec![],
    }
}

async fn connect(login: &Login) -> Result<Client> {
    let mut config = login.plain_config();
    config
        .application_name("pgwake-bench")
        .connect_timeout(Duration::from_secs(60));
    let (client, conn) = config.connect(NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Waits until the tenant is in `state`.
pub(crate) fn wait_state(gw: &LocalGateway, state: &str) -> Result<()> {
    let deadline = Instant::now() + STATE_LIMIT;
    loop {
        let now = gw.status()?.state;
        if now == state {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("tenant is {now}, not {state}: {}", gw.log_tail(5));
        }
        sleep(Duration::from_millis(10));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the bench's statement (`SELECT $1::int4 + 1`) with 41 and checks the answer.
async fn execute_checked(client: &Client, stmt: &Statement) -> Result<()> {
    let v: i32 = client.query_one(stmt, &[&41i32]).await?.get(0);
    if v != 42 {
        bail!("wrong answer {v}");
    }
    Ok(())
}

/// The largest of `values` (`f64::MIN` when there are none).
fn max_of(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::MIN, f64::max)
}

/// Runs the three measurements with the pgwake binary at `binary`.
pub fn run(binary: &std::path::Path, opts: ReviveOptions) -> Result<ReviveResults> {
    let load_before = load_average();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let cycles = latency(&rt, binary, opts.cycles).context("revival latency")?;
    let burst = burst(&rt, binary, opts.burst).context("burst of revivals")?;
    let (rss_empty_kib, rss_half, rss_parked_kib) =
        memory(&rt, binary, opts.parked).context("memory per parked session")?;
    let awake = awake_seconds(&rt, binary, opts.scale).context("awake-seconds")?;
    Ok(ReviveResults {
        cycles,
        burst,
        rss_empty_kib,
        rss_parked_kib,
        rss_half,
        parked: opts.parked,
        awake,
        load: (load_before, load_average()),
    })
}

fn latency(rt: &tokio::runtime::Runtime, binary: &std::path::Path, n: u32) -> Result<Vec<Cycle>> {
    let gw = LocalGateway::start(
        binary,
        &spec(
            Duration::from_millis(500),
            Duration::from_millis(50),
            Duration::from_millis(100),
        ),
    )?;
    let login = gw.login();
    crate::progress("revive: first connection (initdb and first start, not measured) ...");
    let client = rt.block_on(connect(&login))?;
    let stmt = rt.block_on(async {
        client
            .batch_execute(
                "SET search_path = pg_catalog, public; SET statement_timeout = '30s'; \
                 SET app.x = 'bench'",
            )
            .await?;
        client.prepare("SELECT $1::int4 + 1").await
    })?;
    let mut out = Vec::new();
    // One unmeasured cycle: the first start after initdb differs.
    for i in 0..=n {
        wait_state(&gw, "asleep")?;
        if gw.metric("pgwake_sessions_parked")? != 1.0 {
            bail!("the session is not parked while the tenant sleeps");
        }
        let started = Instant::now();
        rt.block_on(execute_checked(&client, &stmt))?;
        let e2e = started.elapsed();
        let start_ms = gw
            .status()?
            .last_wake_ms
            .ok_or_else(|| anyhow!("no last_wake_ms"))?;
        let mut warm = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            rt.block_on(client.query_one(&stmt, &[&1i32]))?;
            warm.push(ms(t.elapsed()));
        }
        let c = Cycle {
            e2e_ms: ms(e2e),
            start_ms,
            warm_ms: crate::report::median(&warm).unwrap_or(0.0),
        };
        if i == 0 {
            continue;
        }
        crate::progress(format_args!(
            "revive cycle {i:>2}/{n} execute {:7.1} ms  start {:7.1} ms  warm {:5.2} ms  revival overhead {:6.1} ms",
            c.e2e_ms,
            c.start_ms,
            c.warm_ms,
            c.overhead_ms()
        ));
        out.push(c);
    }
    drop(client);
    Ok(out)
}

/// `n` sessions parked on a sleeping tenant execute their prepared statement at once,
/// [`BURST_ROUNDS`] times.
fn burst(rt: &tokio::runtime::Runtime, binary: &std::path::Path, n: u32) -> Result<Burst> {
    // The gateway's default `snapshot_after`: a revived session's state is read again a second
    // after its query, after the burst. With 100 ms, as the other measurements use to keep
    // their cycles short, the reads of the first revived sessions compete with the last
    // revivals for the tenant's CPU, which a burst at the defaults does not see.
    let mut spec = spec(
        Duration::from_millis(500),
        Duration::from_millis(50),
        BURST_SNAPSHOT,
    );
    spec.settings
        .push(format!("max_connections = \"{BURST_MAX_CONNECTIONS}\""));
    // The bursts come at a steady pace, which the predictor would learn and wake ahead of: each
    // burst is to wait for its wake.
    spec.wake.push("predict = \"off\"".into());
    let gw = LocalGateway::start(binary, &spec)?;
    let login = gw.login();
    crate::progress(format_args!(
        "revive: opening {n} sessions for the burst ..."
    ));
    let sessions = rt.block_on(async {
        let mut sessions = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let c = connect(&login).await?;
            c.batch_execute("SET app.x = 'burst'").await?;
            let stmt = c.prepare("SELECT $1::int4 + 1").await?;
            sessions.push((c, stmt));
        }
        Ok::<_, anyhow::Error>(sessions)
    })?;
    let mut out = Burst {
        sessions: n,
        ..Burst::default()
    };
    for round in 1..=BURST_ROUNDS {
        wait_state(&gw, "asleep")?;
        wait_parked(&gw, n)?;
        let waits = rt.block_on(async {
            let started = Instant::now();
            let each = sessions.iter().map(|(c, stmt)| async move {
                execute_checked(c, stmt).await?;
                Ok::<_, anyhow::Error>(ms(started.elapsed()))
            });
            futures_util::future::try_join_all(each).await
        })?;
        let start_ms = gw
            .status()?
            .last_wake_ms
            .ok_or_else(|| anyhow!("no last_wake_ms"))?;
        crate::progress(format_args!(
            "revive burst {round}/{BURST_ROUNDS}: {n} sessions, median {:.1} ms, max {:.1} ms, \
             start {start_ms:.1} ms",
            crate::report::median(&waits).unwrap_or(0.0),
            max_of(&waits)
        ));
        out.waits_ms.extend(waits);
        out.starts_ms.push(start_ms);
    }
    // The baseline: as many fresh logins straight to the tenant's Postgres at once, each doing
    // what a revival restores and the execute, while a transaction through the gateway keeps
    // the tenant up.
    let holder = rt.block_on(async {
        let c = connect(&login).await?;
        c.batch_execute("BEGIN").await?;
        Ok::<_, anyhow::Error>(c)
    })?;
    let direct = gw.direct_login(gw.postgres_port()?);
    // The last burst's sessions read their state first, so the baseline has the tenant alone.
    sleep(BURST_SNAPSHOT * 2);
    for round in 1..=BURST_ROUNDS {
        sleep(Duration::from_millis(300));
        let waits = rt.block_on(async {
            let started = Instant::now();
            let each = (0..n).map(|_| {
                let direct = &direct;
                async move {
                    let c = connect(direct).await?;
                    c.batch_execute("SET app.x = 'burst'").await?;
                    let stmt = c.prepare("SELECT $1::int4 + 1").await?;
                    execute_checked(&c, &stmt).await?;
                    Ok::<_, anyhow::Error>(ms(started.elapsed()))
                }
            });
            futures_util::future::try_join_all(each).await
        })?;
        crate::progress(format_args!(
            "direct burst {round}/{BURST_ROUNDS}: {n} logins, median {:.1} ms, max {:.1} ms",
            crate::report::median(&waits).unwrap_or(0.0),
            max_of(&waits)
        ));
        out.direct_ms.extend(waits);
    }
    drop(holder);
    Ok(out)
}

/// Gateway RSS (KiB) with no session, with about half of `n` sessions parked (and their
/// count), and with all `n` parked.
fn memory(
    rt: &tokio::runtime::Runtime,
    binary: &std::path::Path,
    n: u32,
) -> Result<(u64, (u64, u32), u64)> {
    let gw = LocalGateway::start(
        binary,
        &spec(
            Duration::from_millis(500),
            Duration::from_millis(50),
            Duration::from_millis(100),
        ),
    )?;
    let login = gw.login();
    // Wake once and let it sleep, so the baseline has the runtime and the local backend warm.
    rt.block_on(async {
        connect(&login).await?.simple_query("SELECT 1").await?;
        Ok::<_, anyhow::Error>(())
    })?;
    wait_state(&gw, "asleep")?;
    sleep(Duration::from_millis(300));
    let pid = gw.pid();
    let empty = ProcSample::read(pid)?.rss_kib;
    let mut clients = Vec::with_capacity(n as usize);
    let mut half = None;
    while clients.len() < n as usize {
        let batch = BATCH.min(n - clients.len() as u32);
        crate::progress(format_args!(
            "revive: parking sessions {}..{} of {n}",
            clients.len() + 1,
            clients.len() + batch as usize
        ));
        for _ in 0..batch {
            let c = rt.block_on(async {
                let c = connect(&login).await?;
                c.batch_execute("SET app.x = 'parked'; PREPARE q(int) AS SELECT $1")
                    .await?;
                Ok::<_, anyhow::Error>(c)
            })?;
            clients.push(c);
        }
        sleep(Duration::from_millis(200));
        wait_state(&gw, "asleep")?;
        let count = clients.len() as u32;
        if half.is_none() && count >= n / 2 && count < n {
            wait_parked(&gw, count)?;
            half = Some((ProcSample::read(pid)?.rss_kib, count));
        }
    }
    wait_parked(&gw, n)?;
    let parked = ProcSample::read(pid)?.rss_kib;
    drop(clients);
    Ok((empty, half.unwrap_or((empty, 0)), parked))
}

/// Waits until `n` sessions are parked, then lets the gateway settle.
fn wait_parked(gw: &LocalGateway, n: u32) -> Result<()> {
    let deadline = Instant::now() + STATE_LIMIT;
    while gw.metric("pgwake_sessions_parked")? < f64::from(n) {
        if Instant::now() > deadline {
            bail!("not every session parked: {}", gw.log_tail(5));
        }
        sleep(Duration::from_millis(50));
    }
    sleep(Duration::from_millis(300));
    Ok(())
}

fn awake_seconds(
    rt: &tokio::runtime::Runtime,
    binary: &std::path::Path,
    scale: u32,
) -> Result<AwakeRun> {
    let idle = IDLE_TIMEOUT / scale;
    let every = QUERY_EVERY / scale;
    let run = HOUR / scale;
    let gw = LocalGateway::start(
        binary,
        &spec(idle, (idle / 20).max(Duration::from_millis(10)), idle / 10),
    )?;
    let login = gw.login();
    let pool = rt.block_on(async {
        let mut pool = Vec::new();
        for _ in 0..POOL {
            let c = connect(&login).await?;
            c.batch_execute("SET application_name = 'pool'").await?;
            pool.push(std::sync::Arc::new(c));
        }
        Ok::<_, anyhow::Error>(pool)
    })?;
    wait_state(&gw, "asleep")?;
    crate::progress(format_args!(
        "revive: awake-seconds run, {} s (one hour at 1/{scale}) ...",
        run.as_secs()
    ));
    let started = Instant::now();
    let (mut awake, mut transitions) = (Duration::ZERO, Duration::ZERO);
    let (mut wakes, mut queries) = (0u32, 0u32);
    let mut last = (Instant::now(), "asleep".to_owned());
    // Queries at the middle of each interval: one hour of workload holds exactly six.
    let mut next_query = started + every / 2;
    let mut answers = Vec::new();
    while started.elapsed() < run {
        if Instant::now() >= next_query {
            // The query runs while the state is sampled: its wake is part of what is measured.
            let c = pool[queries as usize % POOL].clone();
            answers.push(rt.spawn(async move { c.simple_query("SELECT 1").await.map(drop) }));
            queries += 1;
            next_query += every;
        }
        let state = gw.status()?.state;
        let now = Instant::now();
        let span = now - last.0;
        match last.1.as_str() {
            "asleep" => {}
            "awake" => awake += span,
            _ => {
                awake += span;
                transitions += span;
            }
        }
        if last.1 != "waking" && state == "waking" {
            wakes += 1;
        }
        last = (now, state);
        sleep(Duration::from_millis(5));
    }
    // Every query must have been answered (a failed revival would show here).
    rt.block_on(async {
        for a in answers {
            a.await??;
        }
        for c in &pool {
            c.simple_query("SELECT 1").await?;
        }
        Ok::<_, anyhow::Error>(())
    })
    .context("the pool's sessions after the run")?;
    Ok(AwakeRun {
        scale,
        run,
        awake,
        wakes,
        transitions,
        queries,
    })
}

/// One row of the latency table: `name`, then the count, p50, p95 and max of `v` (ms), then
/// the goal and whether it was met.
fn latency_row(out: &mut String, name: &str, v: &[f64], goal: &str, met: &str) {
    let p = |q| percentile(v, q).map(fmt_ms).unwrap_or_default();
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {goal} | {met} |",
        v.len(),
        p(50.0),
        p(95.0),
        fmt_ms(max_of(v))
    );
}

/// The burst's rows of the latency table.
fn render_burst(out: &mut String, b: &Burst) {
    let met_goal = percentile(&b.waits_ms, 50.0).is_some_and(|p| p <= GOAL_BURST_P50_MS)
        && max_of(&b.waits_ms) <= GOAL_BURST_MAX_MS;
    latency_row(
        out,
        &format!(
            "**burst of {} revivals** (each client's execute, one wake)",
            b.sessions
        ),
        &b.waits_ms,
        &format!("p50 ≤ {GOAL_BURST_P50_MS} ms, max ≤ {GOAL_BURST_MAX_MS} ms"),
        met(met_goal),
    );
    latency_row(
        out,
        "backend start in the bursts (last_wake_ms)",
        &b.starts_ms,
        "",
        "",
    );
    latency_row(
        out,
        &format!(
            "baseline: {} fresh logins straight to the awake Postgres at once (login, `SET`, \
             prepare, execute)",
            b.sessions
        ),
        &b.direct_ms,
        "",
        "",
    );
}

/// The Markdown section for RESULTS.md.
pub fn render(
    facts: &Facts,
    opts: ReviveOptions,
    outcome: &Result<ReviveResults, String>,
) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(
        &mut out,
        "Parked sessions: revival latency, memory, awake time (local backend)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| method | one tokio-postgres session (plaintext, SCRAM login at the gateway) with three \
         SETs and a prepared statement; idle timeout 500 ms, snapshot after 100 ms; {} cycles of \
         \"tenant asleep, session parked → execute the statement\" after one unmeasured cycle; \
         revival overhead = execute time − backend start (`last_wake_ms`) − median warm execute. \
         Burst: {} such sessions (one `SET`, one prepared statement each) parked on the asleep \
         tenant execute their statement at the same moment, {BURST_ROUNDS} times; each \
         client's wait (wake and revival) is a sample; the tenant's `max_connections` is \
         {BURST_MAX_CONNECTIONS}, `predict = \"off\"` (no wake ahead of a burst) and \
         `snapshot_after` the default {} s (with 100 ms the state reads of the first revived \
         sessions compete with the last revivals). Its baseline: as many fresh logins straight \
         to the tenant's Postgres at once, kept awake, each doing the same `SET`, prepare and \
         execute |",
        opts.cycles,
        opts.burst,
        BURST_SNAPSHOT.as_secs()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| measure (ms) | n | p50 | p95 | max | goal | met |\n|---|---:|---:|---:|---:|---|---|"
    );
    let col = |f: &dyn Fn(&Cycle) -> f64| -> Vec<f64> { r.cycles.iter().map(f).collect() };
    let rows: [(&str, Vec<f64>, Option<f64>); 4] = [
        (
            "execute on a parked session (wake + revival)",
            col(&|c| c.e2e_ms),
            None,
        ),
        ("backend start (last_wake_ms)", col(&|c| c.start_ms), None),
        ("warm execute", col(&|c| c.warm_ms), None),
        (
            "**revival overhead beyond the wake**",
            col(&|c| c.overhead_ms()),
            Some(GOAL_OVERHEAD_P50_MS),
        ),
    ];
    for (name, v, goal) in rows {
        let (goal_text, met) = match goal {
            Some(g) => (
                format!("p50 ≤ {g} ms"),
                if percentile(&v, 50.0).is_some_and(|p| p <= g) {
                    "yes"
                } else {
                    "no"
                },
            ),
            None => (String::new(), ""),
        };
        latency_row(&mut out, name, &v, &goal_text, met);
    }
    render_burst(&mut out, &r.burst);
    let per = (r.rss_parked_kib as f64 - r.rss_empty_kib as f64) / f64::from(r.parked.max(1));
    let (half_kib, half_n) = r.rss_half;
    let marginal =
        (r.rss_parked_kib as f64 - half_kib as f64) / f64::from((r.parked - half_n).max(1));
    let within_goal = |v: f64| met(v <= GOAL_PARKED_KIB);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| memory | value | goal | met |\n|---|---:|---|---|\n\
         | method | sessions opened in batches of {BATCH} (each: SCRAM login, `SET`, `PREPARE`), each batch idling the tenant to sleep; gateway RSS from /proc. The average from the empty gateway includes what the allocator kept of the last batch's relay buffers ({BATCH} sessions × 2 × 16 KiB), a fixed amount however many sessions are parked; the second half's growth, between two counts that both carry it, is what each further parked session costs | | |\n\
         | gateway RSS, tenant asleep, no session | {} KiB | | |\n\
         | gateway RSS, {half_n} sessions parked | {half_kib} KiB | | |\n\
         | gateway RSS, {} sessions parked (tenant asleep) | {} KiB | | |\n\
         | per parked session, average from the empty gateway | {per:.1} KiB | ≤ {GOAL_PARKED_KIB} KiB | {} |\n\
         | **per parked session, sessions {}–{} (each further session)** | **{marginal:.1} KiB** | ≤ {GOAL_PARKED_KIB} KiB | {} |",
        r.rss_empty_kib,
        r.parked,
        r.rss_parked_kib,
        within_goal(per),
        half_n + 1,
        r.parked,
        within_goal(marginal),
    );
    let a = &r.awake;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| awake time | value |\n|---|---:|\n\
         | workload | pool of {POOL} idle connections, one query every {} min, idle timeout {} min, run at 1/{} scale ({} s) |\n\
         | queries / wakes | {} / {} |\n\
         | awake (not asleep) during the scaled run | {:.1} s, of which waking or sleeping {:.1} s |\n\
         | **awake-seconds per idle tenant-hour** (scaled part × {}, wakes and sleeps at real length) | **{:.0} s** ({:.1} min) |\n\
         | an anchor that stays awake while a connection is open | 3600 s (60 min) |",
        QUERY_EVERY.as_secs() / 60,
        IDLE_TIMEOUT.as_secs() / 60,
        a.scale,
        a.run.as_secs(),
        a.queries,
        a.wakes,
        a.awake.as_secs_f64(),
        a.transitions.as_secs_f64(),
        a.scale,
        a.per_hour_s(),
        a.per_hour_s() / 60.0
    );
    out
}
