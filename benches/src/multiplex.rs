//! Many sessions, few backends: N sessions with their own settings and prepared statements,
//! querying at random times, through pgwake (sessions park on their own, a cap of C backend
//! connections), PgBouncer in transaction mode and PgBouncer in session mode, pgcat and PgDog in
//! transaction mode (pools of C, each peer skipped when its binary is missing), and Postgres
//! direct as the reference. Per target: queries answered per second, p50/p99 latency,
//! the peak of backend connections in `pg_stat_activity`, and which semantic checks failed.
//!
//! Every session sets `application_name` and a custom setting (`app.n`) to its own values,
//! prepares a protocol-level named statement (tokio-postgres names them uniquely per process)
//! and an SQL-level `PREPARE`, then runs `rounds` check rounds at random times over the run.
//! A round is three queries, each one check: the protocol statement's answer, both settings,
//! and `EXECUTE` of the SQL statement. Each answer holds the session's own number, so an answer
//! from another session's state counts as lost too.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage, Statement};

use crate::peers::{PGCAT_PREPARED_CACHE, Peer, PeerPool};
use crate::pgbench::Auth;
use crate::pgbench::Endpoint;
use crate::process::load_average;
use crate::report::{Facts, percentile};
use crate::targets::{BouncerPool, Environment, Target, TargetKind};

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct MultiplexOptions {
    /// Sessions per target.
    pub clients: u32,
    /// Length of the query phase.
    pub run: Duration,
    /// Check rounds (three queries each) per session within the run.
    pub rounds: u32,
    /// Backend connections every target may use (pgwake's cap, PgBouncer's pool size).
    pub cap: u32,
    /// A client gives up on a login or query after this long.
    pub timeout: Duration,
}

/// Time between launching the sessions and the start of the query phase, for logins and setup.
const SETUP: Duration = Duration::from_secs(5);
/// How often `pg_stat_activity` is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Why a check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Failure {
    /// `application_name` is not the session's own.
    AppNameLost,
    /// The custom setting `app.n` is not the session's own.
    SettingLost,
    /// `EXECUTE` of the session's SQL-level statement failed or answered another's.
    SqlPrepareLost,
    /// The protocol-level named statement failed or answered another's.
    ProtocolStatementLost,
    /// Any other SQL error.
    OtherError,
    /// Login failed, the connection closed or a login or query timed out.
    Connection,
}

impl Failure {
    /// All kinds in table order.
    const ALL: [Failure; 6] = [
        Failure::AppNameLost,
        Failure::SettingLost,
        Failure::SqlPrepareLost,
        Failure::ProtocolStatementLost,
        Failure::OtherError,
        Failure::Connection,
    ];
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Failure::AppNameLost => "SET application_name lost",
            Failure::SettingLost => "SET app.n lost",
            Failure::SqlPrepareLost => "SQL PREPARE lost",
            Failure::ProtocolStatementLost => "protocol statement lost",
            Failure::OtherError => "other SQL error",
            Failure::Connection => "connection/timeout",
        })
    }
}

/// What one target did.
#[derive(Clone, Debug)]
pub struct Row {
    /// Label.
    pub name: String,
    /// Sessions whose setup (login, SETs, both prepares) succeeded.
    pub sessions_ok: u32,
    /// Queries of the check rounds answered without an error.
    pub answered: u64,
    /// Check-round queries never sent because their session had ended.
    pub not_run: u64,
    /// Latency of each answered query, ms.
    pub latencies_ms: Vec<f64>,
    /// From the start of the query phase until the last session finished.
    pub elapsed: Duration,
    /// Most client backends `pg_stat_activity` showed at once (the watcher not counted).
    pub peak_backends: i64,
    /// Failed checks by kind.
    pub failures: BTreeMap<Failure, u64>,
    /// The first message of each kind, to show what failing looks like.
    pub examples: BTreeMap<Failure, String>,
    /// Counters of the gateway, when the target is pgwake.
    pub notes: Option<String>,
}

/// What the run measured.
#[derive(Clone, Debug)]
pub struct MultiplexResults {
    /// One row per target.
    pub rows: Vec<Row>,
    /// Load average before and after.
    pub load: (String, String),
    /// Versions for the facts table.
    pub software: Vec<(&'static str, String)>,
    /// Whether PgBouncer's transaction mode ran with `max_prepared_statements`.
    pub prepared_supported: bool,
    /// Targets left out (a peer binary missing or not starting), with why.
    pub skipped: Vec<String>,
}

/// Starts Postgres and the targets one after another and runs the workload against each.
pub fn run(binary: &Path, opts: MultiplexOptions) -> Result<MultiplexResults> {
    let load_before = load_average();
    // SCRAM everywhere: pgwake authenticates clients itself (static credentials with the
    // backend's verifier), which revival needs.
    let mut env = Environment::start(1, Auth::Scram, Err("started by multiplex"))?;
    let direct = env
        .targets
        .iter()
        .find(|t| t.kind == TargetKind::Direct)
        .cloned()
        .ok_or_else(|| anyhow!("no direct target"))?;
    if env.pgbouncer_version.is_none() {
        bail!("PgBouncer is needed for this comparison: apt-get install -y pgbouncer");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    let max_clients = opts.clients + 50;
    let pgwake_extra = format!(
        "max_backend_connections = {cap}\n\
         [revival]\n\
         snapshot_after = \"50ms\"\n\
         park_session_after = \"100ms\"\n\
         [limits]\n\
         backend_wait_timeout = \"{wait}s\"\n",
        cap = opts.cap,
        wait = opts.timeout.as_secs().max(1),
    );
    let pgwake = env.start_pgwake_variant(binary, "pgwake-multiplex", &pgwake_extra)?;
    let mut row = rt.block_on(measure(
        "pgwake (park_session_after 100ms, cap)",
        &pgwake.target,
        &direct.endpoint,
        opts,
    ))?;
    row.notes = Some(gateway_counters(pgwake.admin));
    rows.push(row);
    env.stop_variant(pgwake.target.proxy_pid.unwrap_or_default());
    rt.block_on(wait_no_backends(&direct.endpoint))?;

    let prepared_supported = env
        .pgbouncer_version
        .as_deref()
        .is_some_and(supports_prepared_statements);
    for mode in ["transaction", "session"] {
        let pool = BouncerPool {
            mode,
            size: opts.cap,
            max_clients,
            max_prepared_statements: (mode == "transaction" && prepared_supported)
                .then_some(PGBOUNCER_PREPARED),
        };
        let target =
            env.start_pgbouncer_variant(&format!("pgbouncer-{mode}"), pool, Auth::Scram)?;
        rows.push(rt.block_on(measure(
            &format!("PgBouncer {mode} mode (pool_size {})", opts.cap),
            &target,
            &direct.endpoint,
            opts,
        ))?);
        env.stop_variant(target.proxy_pid.unwrap_or_default());
        rt.block_on(wait_no_backends(&direct.endpoint))?;
    }
    let mut skipped = Vec::new();
    for peer in Peer::ALL {
        if let Err(why) = peer.binary() {
            crate::progress(format_args!("multiplex: {peer} skipped: {why}"));
            skipped.push(format!("{peer}: {why}"));
            continue;
        }
        let pool = PeerPool {
            mode: "transaction",
            size: opts.cap,
            prepared: true,
        };
        let name = match peer {
            Peer::Pgcat => format!(
                "pgcat transaction mode (pool_size {}, prepared_statements_cache_size \
                 {PGCAT_PREPARED_CACHE}, MD5 client logins)",
                opts.cap
            ),
            Peer::PgDog => format!(
                "PgDog transaction mode (pool_size {}, prepared_statements default)",
                opts.cap
            ),
        };
        let target = match env.start_peer_variant(
            peer,
            &format!("{}-transaction", peer.to_string().to_lowercase()),
            pool,
            Auth::Scram,
        ) {
            Ok(t) => t,
            Err(e) => {
                crate::progress(format_args!("multiplex: {peer} did not start: {e:#}"));
                skipped.push(format!("{peer}: did not start: {e:#}"));
                continue;
            }
        };
        rows.push(rt.block_on(measure(&name, &target, &direct.endpoint, opts))?);
        env.stop_variant(target.proxy_pid.unwrap_or_default());
        rt.block_on(wait_no_backends(&direct.endpoint))?;
    }
    rows.push(rt.block_on(measure(
        "Postgres direct (no cap; reference)",
        &direct,
        &direct.endpoint,
        opts,
    ))?);

    let mut software = vec![
        ("PostgreSQL", env.postgres_version.clone()),
        (
            "PgBouncer",
            env.pgbouncer_version
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        ),
    ];
    for (peer, version) in &env.peer_versions {
        software.push((
            match peer {
                Peer::Pgcat => "pgcat",
                Peer::PgDog => "PgDog",
            },
            version.clone(),
        ));
    }
    drop(env);
    Ok(MultiplexResults {
        rows,
        load: (load_before, load_average()),
        software,
        prepared_supported,
        skipped,
    })
}

/// `max_prepared_statements` for PgBouncer's transaction mode where the version has it: room
/// for every statement of the sessions sharing one server connection.
const PGBOUNCER_PREPARED: u32 = 1000;

/// Whether `pgbouncer --version`'s first line names 1.21 or later, which tracks protocol-level
/// prepared statements in transaction mode (`max_prepared_statements`).
fn supports_prepared_statements(version: &str) -> bool {
    let Some(number) = version
        .split_whitespace()
        .find(|w| w.starts_with(char::is_numeric))
    else {
        return false;
    };
    let mut parts = number.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 21)
}

/// pgwake's park, revival, reuse and wait counters, for the note under the table.
fn gateway_counters(admin: u16) -> String {
    let Ok(reply) = crate::http::request(admin, "GET", "/metrics", Duration::from_secs(5)) else {
        return "metrics unavailable".into();
    };
    let sum = |name: &str, label: &str| crate::http::metric_sum(&reply.body, name, label);
    format!(
        "parks on their own {:.0}, revivals ok {:.0}, reuse hits {:.0} / misses {:.0}, \
         waits for a connection: kept {:.0}, slot {:.0}, timeout {:.0}",
        sum("pgwake_parks_total", "reason=\"session_idle\""),
        sum("pgwake_revivals_total", "outcome=\"ok\""),
        sum("pgwake_backend_reuse_total", "outcome=\"hit\""),
        sum("pgwake_backend_reuse_total", "outcome=\"miss\""),
        sum("pgwake_backend_waits_total", "outcome=\"kept\""),
        sum("pgwake_backend_waits_total", "outcome=\"slot\""),
        sum("pgwake_backend_waits_total", "outcome=\"timeout\""),
    )
}

/// A connection straight to Postgres, for `pg_stat_activity`.
async fn watcher(direct: &Endpoint) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(&conninfo(direct), NoTls)
        .await
        .context("connect the pg_stat_activity watcher")?;
    tokio::spawn(conn);
    Ok(client)
}

const CLIENT_BACKENDS: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";

/// Waits until the previous target's server connections are gone, so each peak is its own.
async fn wait_no_backends(direct: &Endpoint) -> Result<()> {
    let client = watcher(direct).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = client.query_one(CLIENT_BACKENDS, &[]).await?.get(0);
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{n} client backends still open 20 s after the target stopped");
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

fn conninfo(e: &Endpoint) -> String {
    format!(
        "host=127.0.0.1 port={} user={} password={} dbname={} sslmode=disable",
        e.port, e.user, e.password, e.dbname
    )
}

/// Runs the workload against one target while sampling `pg_stat_activity` on `direct`.
async fn measure(
    name: &str,
    target: &Target,
    direct: &Endpoint,
    opts: MultiplexOptions,
) -> Result<Row> {
    crate::progress(format_args!(
        "multiplex: {name}: {} sessions, {} rounds each in {:?} ...",
        opts.clients, opts.rounds, opts.run
    ));
    let watch = watcher(direct).await?;
    let peak = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = {
        let (peak, stop) = (peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(row) = watch.query_one(CLIENT_BACKENDS, &[]).await {
                    peak.fetch_max(row.get(0), Ordering::Relaxed);
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        })
    };
    let start = Instant::now() + SETUP;
    let conninfo = Arc::new(conninfo(&target.endpoint));
    let sessions: Vec<_> = (0..opts.clients)
        .map(|n| tokio::spawn(session(conninfo.clone(), n, start, opts)))
        .collect();
    let mut row = Row {
        name: name.to_owned(),
        sessions_ok: 0,
        answered: 0,
        not_run: 0,
        latencies_ms: Vec::new(),
        elapsed: Duration::ZERO,
        peak_backends: 0,
        failures: BTreeMap::new(),
        examples: BTreeMap::new(),
        notes: None,
    };
    for s in sessions {
        let outcome = s.await.context("a session task panicked")?;
        row.sessions_ok += u32::from(outcome.set_up);
        row.answered += outcome.latencies_ms.len() as u64;
        row.not_run += outcome.not_run;
        row.latencies_ms.extend(outcome.latencies_ms);
        for (kind, message) in outcome.failures {
            *row.failures.entry(kind).or_default() += 1;
            row.examples.entry(kind).or_insert(message);
        }
    }
    row.elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampling.await?;
    row.peak_backends = peak.load(Ordering::Relaxed);
    let p = |q| percentile(&row.latencies_ms, q).unwrap_or(f64::NAN);
    crate::progress(format_args!(
        "multiplex: {name}: {}/{} sessions set up, {} queries answered, p50 {:.1} ms, p99 {:.1} \
         ms, peak backends {}, failures {:?}",
        row.sessions_ok,
        opts.clients,
        row.answered,
        p(50.0),
        p(99.0),
        row.peak_backends,
        row.failures
    ));
    Ok(row)
}

/// What one session saw.
struct SessionOutcome {
    set_up: bool,
    latencies_ms: Vec<f64>,
    failures: Vec<(Failure, String)>,
    not_run: u64,
}

/// Queries per check round.
const QUERIES_PER_ROUND: u64 = 3;

/// How a query went wrong: the check's own kind for SQL errors that mean lost state, the
/// connection kind for closed connections, timeouts and errors that end the session.
fn classify(e: &tokio_postgres::Error, lost: Failure) -> Failure {
    match e.code() {
        None => Failure::Connection,
        Some(c)
            if *c == SqlState::TOO_MANY_CONNECTIONS
                || c.code().starts_with("08")
                || c.code().starts_with("57P") =>
        {
            Failure::Connection
        }
        Some(c)
            if *c == SqlState::INVALID_SQL_STATEMENT_NAME
                || *c == SqlState::UNDEFINED_OBJECT
                || *c == SqlState::DUPLICATE_PSTATEMENT =>
        {
            lost
        }
        Some(_) => Failure::OtherError,
    }
}

/// Runs `fut` with the client timeout; a timeout is a connection failure.
async fn timed<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    lost: Failure,
) -> Result<T, (Failure, String)> {
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Err((Failure::Connection, format!("no answer within {timeout:?}"))),
        Ok(Err(e)) => Err((classify(&e, lost), error_text(&e))),
        Ok(Ok(v)) => Ok(v),
    }
}

/// The server's message when there is one (tokio-postgres' Display says only "db error").
fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// The rows' text cells of a simple query's answer.
fn cells(messages: &[SimpleQueryMessage]) -> Vec<Vec<Option<String>>> {
    messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
            }
            _ => None,
        })
        .collect()
}

/// One session: log in, set its state up, then its check rounds at random times.
async fn session(
    conninfo: Arc<String>,
    n: u32,
    start: Instant,
    opts: MultiplexOptions,
) -> SessionOutcome {
    let planned = u64::from(opts.rounds) * QUERIES_PER_ROUND;
    let mut out = SessionOutcome {
        set_up: false,
        latencies_ms: Vec::new(),
        failures: Vec::new(),
        not_run: planned,
    };
    let (client, stmt) = match set_up(&conninfo, n, opts.timeout).await {
        Ok(v) => v,
        Err(f) => {
            out.failures.push(f);
            return out;
        }
    };
    out.set_up = true;
    let mut times: Vec<Duration> = (0..opts.rounds)
        .map(|_| opts.run.mul_f64(rand::random::<f64>()))
        .collect();
    times.sort();
    for (round, at) in times.into_iter().enumerate() {
        tokio::time::sleep_until((start + at).into()).await;
        let round = round as i32;
        let ended = check_round(&client, &stmt, n, round, opts.timeout, &mut out).await;
        if ended {
            break;
        }
    }
    out
}

/// Logs in and sets the session's settings and both statements up.
async fn set_up(
    conninfo: &str,
    n: u32,
    timeout: Duration,
) -> Result<(Client, Statement), (Failure, String)> {
    let (client, conn) = timed(
        timeout,
        tokio_postgres::connect(conninfo, NoTls),
        Failure::Connection,
    )
    .await?;
    tokio::spawn(conn);
    let setup = format!(
        "SET application_name = 'mx{n}'; SET app.n = '{n}'; \
         PREPARE mx_{n} (int4) AS SELECT $1 + {n} * 2"
    );
    timed(timeout, client.batch_execute(&setup), Failure::OtherError).await?;
    let stmt = timed(
        timeout,
        client.prepare(&format!("SELECT $1::int4 + {n}")),
        Failure::OtherError,
    )
    .await?;
    Ok((client, stmt))
}

/// One check round: the protocol statement, both settings, the SQL statement. Returns whether
/// the session has ended (its connection failed); the queries it will not send stay counted in
/// `not_run`.
async fn check_round(
    client: &Client,
    stmt: &Statement,
    n: u32,
    round: i32,
    timeout: Duration,
    out: &mut SessionOutcome,
) -> bool {
    let n_i = n as i32;

    let begun = Instant::now();
    let want = round + n_i;
    let r = timed(
        timeout,
        client.query_one(stmt, &[&round]),
        Failure::ProtocolStatementLost,
    )
    .await
    .map(|row| {
        let got: i32 = row.get(0);
        wrong_if(got != want, Failure::ProtocolStatementLost, || {
            format!("answered {got}, expected {want}")
        })
    });
    if record(out, begun, r) {
        return true;
    }

    let begun = Instant::now();
    let r = timed(
        timeout,
        client.simple_query(
            "SELECT current_setting('application_name'), current_setting('app.n', true)",
        ),
        Failure::SettingLost,
    )
    .await
    .map(|messages| {
        let row = cells(&messages).into_iter().next().unwrap_or_default();
        let app = row.first().cloned().flatten().unwrap_or_default();
        let own = row.get(1).cloned().flatten().unwrap_or_default();
        let mut wrong = wrong_if(app != format!("mx{n}"), Failure::AppNameLost, || {
            format!("application_name is '{app}', set 'mx{n}'")
        });
        wrong.extend(wrong_if(own != n.to_string(), Failure::SettingLost, || {
            format!("app.n is '{own}', set '{n}'")
        }));
        wrong
    });
    if record(out, begun, r) {
        return true;
    }

    let begun = Instant::now();
    let want = round + 2 * n_i;
    let r = timed(
        timeout,
        client.simple_query(&format!("EXECUTE mx_{n}({round})")),
        Failure::SqlPrepareLost,
    )
    .await
    .map(|messages| {
        let got = cells(&messages)
            .into_iter()
            .next()
            .and_then(|r| r.into_iter().next().flatten())
            .unwrap_or_default();
        wrong_if(got != want.to_string(), Failure::SqlPrepareLost, || {
            format!("answered {got}, expected {want}")
        })
    });
    record(out, begun, r)
}

/// The failed check, when `wrong`.
fn wrong_if(
    wrong: bool,
    kind: Failure,
    message: impl FnOnce() -> String,
) -> Vec<(Failure, String)> {
    if wrong {
        vec![(kind, message())]
    } else {
        Vec::new()
    }
}

/// Records one query: an answer (its latency, and the checks it failed) or an error. Returns
/// whether the error ended the session.
fn record(
    out: &mut SessionOutcome,
    begun: Instant,
    r: Result<Vec<(Failure, String)>, (Failure, String)>,
) -> bool {
    out.not_run -= 1;
    match r {
        Ok(wrong) => {
            out.latencies_ms.push(begun.elapsed().as_secs_f64() * 1e3);
            out.failures.extend(wrong);
            false
        }
        Err(f) => {
            let ended = f.0 == Failure::Connection;
            out.failures.push(f);
            ended
        }
    }
}

/// The Markdown section for RESULTS.md.
pub fn render(
    command: &str,
    opts: MultiplexOptions,
    outcome: &Result<MultiplexResults, String>,
) -> String {
    let mut out = String::new();
    let software = outcome
        .as_ref()
        .map(|r| r.software.clone())
        .unwrap_or_default();
    let facts = Facts::collect(command, software);
    let Some(r) = facts.open_section(
        &mut out,
        "Many sessions, few backends: pgwake beside PgBouncer, pgcat and PgDog",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| workload | {} sessions, each: `SET application_name`, `SET app.n`, SQL `PREPARE`, a \
         protocol-level named statement; then {} check rounds at random times over {} s, a round \
         being 3 queries (the protocol statement, both settings, `EXECUTE`); client timeout {} s \
         per login or query; SCRAM logins; queries start {} s after the sessions are launched |",
        opts.clients,
        opts.rounds,
        opts.run.as_secs(),
        opts.timeout.as_secs(),
        SETUP.as_secs(),
    );
    let _ = writeln!(
        out,
        "| backend connections allowed | {cap} for each proxy: pgwake `max_backend_connections = \
         {cap}` (gateway auth, `park_session_after = \"100ms\"`, `snapshot_after = \"50ms\"`, \
         `backend_wait_timeout` = the client timeout); PgBouncer `default_pool_size = {cap}`; \
         direct Postgres is uncapped (`max_connections = 300`), as a reference |",
        cap = opts.cap
    );
    let _ = writeln!(
        out,
        "| PgBouncer `max_prepared_statements` | {} |",
        if r.prepared_supported {
            format!("{PGBOUNCER_PREPARED} in transaction mode")
        } else {
            "not set: this PgBouncer predates it (added in 1.21), so transaction mode runs \
             without protocol-level prepared statement tracking"
                .to_owned()
        }
    );
    let _ = writeln!(out);
    let _ = write!(
        out,
        "| target | sessions set up | queries answered/s | p50 ms | p99 ms | peak backends |"
    );
    for kind in Failure::ALL {
        let _ = write!(out, " {kind} |");
    }
    let _ = write!(out, " queries not sent |\n|---|---:|---:|---:|---:|---:|");
    for _ in Failure::ALL {
        let _ = write!(out, "---:|");
    }
    let _ = writeln!(out, "---:|");
    for row in &r.rows {
        let p = |q| percentile(&row.latencies_ms, q).map_or("—".into(), |v| format!("{v:.1}"));
        let _ = write!(
            out,
            "| {} | {}/{} | {:.0} | {} | {} | {} |",
            row.name,
            row.sessions_ok,
            opts.clients,
            row.answered as f64 / row.elapsed.as_secs_f64(),
            p(50.0),
            p(99.0),
            row.peak_backends
        );
        for kind in Failure::ALL {
            let _ = write!(out, " {} |", row.failures.get(&kind).copied().unwrap_or(0));
        }
        let _ = writeln!(out, " {} |", row.not_run);
    }
    let planned = u64::from(opts.clients) * u64::from(opts.rounds) * QUERIES_PER_ROUND;
    let _ = writeln!(
        out,
        "\n{planned} check-round queries planned per target. Queries answered/s counts answers \
         without an error (a wrong answer counts, and also as a failure) over the time from the \
         start of the query phase until the last session finished; the load is offered at random \
         times, not as fast as possible, so this is what each target completed of the same \
         offered load, not its capacity. Peak backends: client \
         backends in `pg_stat_activity` sampled every {} ms from a separate connection.",
        SAMPLE_EVERY.as_millis()
    );
    if !r.skipped.is_empty() {
        let _ = writeln!(out, "\nTargets skipped:\n");
        for why in &r.skipped {
            let _ = writeln!(
                out,
                "- {}",
                why.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
    }
    for row in &r.rows {
        if let Some(notes) = &row.notes {
            let _ = writeln!(out, "\n{}: {notes}.", row.name);
        }
        if !row.examples.is_empty() {
            let _ = writeln!(out, "\nFirst failure of each kind, {}:\n", row.name);
            for (kind, message) in &row.examples {
                let _ = writeln!(out, "- {kind}: `{}`", message.replace('`', "'"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbouncer_versions_with_prepared_statement_tracking() {
        assert!(!supports_prepared_statements("PgBouncer 1.18.0"));
        assert!(!supports_prepared_statements("PgBouncer 1.20.1"));
        assert!(supports_prepared_statements("PgBouncer 1.21.0"));
        assert!(supports_prepared_statements("PgBouncer 1.24.1"));
        assert!(supports_prepared_statements("pgbouncer 2.0"));
        assert!(!supports_prepared_statements("unknown"));
    }
}
