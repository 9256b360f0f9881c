//! Ten thousand client connections held open against twenty `local`-backend tenants: a tenth of
//! them query at a modest rate, the rest log in and stay idle, so the gateway parks them. The
//! gateway's memory (resident and peak), its CPU over a measured window, the active clients'
//! query latency, the logins' time and every error are reported.
//!
//! The gateway starts every tenant's Postgres itself; the first connection to each runs initdb,
//! so all tenants are woken once before anything is measured. Logins run at a bounded
//! concurrency: the scenario is about holding connections, not about a thundering herd.
//!
//! The same command holds 100,000 connections (`--connections 100000 --active 1000`, issue 29):
//! clients connect from many loopback source addresses in 127.0.0.0/8, so no single address runs
//! out of ephemeral ports, and the idle ones are raw protocol clients (a socket and nothing
//! else after their login, with the SCRAM keys derived once per salt) so the harness's own
//! memory and CPU do not grow with a library client per connection. The open-files limit is
//! raised within the harness's process (the gateway inherits it); nothing global is changed.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use anyhow::{Context, Result, anyhow, bail};
use pgwake_protocol::scram::ScramKeys;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_postgres::{Client, NoTls};

use crate::client::Login;
use crate::gateway::{LocalGateway, Spec, StopReport};
use crate::process::{ProcSample, clock_ticks_per_second, load_average};
use crate::raw_login;
use crate::report::{Facts, fmt_ms, met, percentile};

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct ScaleOptions {
    /// Client connections held open.
    pub connections: u32,
    /// Of those, how many query; the rest stay idle.
    pub active: u32,
    /// Local tenants the connections are spread over.
    pub tenants: u32,
    /// Length of the measured window.
    pub seconds: u64,
}

/// Goals for the gateway's resident memory with every connection open, in MB: issue 17's for
/// ten thousand connections, issue 29's from a hundred thousand on.
const GOAL_RSS_MB: f64 = 200.0;
const GOAL_RSS_MB_100K: f64 = 600.0;
/// Loopback source addresses the clients connect from (127.1.0.1, 127.1.0.2, …), round-robin:
/// each address has its own ephemeral port range towards the gateway's one address and port.
const SOURCE_ADDRESSES: u32 = 64;
/// File descriptors the harness keeps beyond one per client connection.
const HARNESS_SPARE_FDS: u64 = 1024;
/// Logins under way at once.
const LOGINS_AT_ONCE: usize = 200;
/// Tenants woken (initdb, first start) at once before the measured part.
const WARMING_AT_ONCE: usize = 4;
/// An active client's pause between the end of one query and the start of the next, drawn
/// uniformly from this range (mean 550 ms: about 1.8 queries per second per client).
const PAUSE_MS: (u64, u64) = (100, 1000);
/// Snapshot and park settings: longer than the longest pause, so active sessions are never
/// snapshotted or parked between their queries, while idle ones park this long after login.
const SNAPSHOT_AFTER: Duration = Duration::from_millis(1500);
const PARK_AFTER: Duration = Duration::from_secs(2);
/// Backend connections per tenant beyond its active clients' share: room for idle sessions
/// that have logged in and not parked yet, and for the connections kept for reuse.
const BACKEND_HEADROOM: u32 = 50;
/// Postgres connections per tenant beyond the gateway's cap (superuser reserve, probes).
const POSTGRES_SPARE: u32 = 10;
/// A login or a query taking longer than this counts as an error.
const LOGIN_LIMIT: Duration = Duration::from_secs(60);
const QUERY_LIMIT: Duration = Duration::from_secs(30);
/// How long idle sessions get to park after the last login before the window starts anyway.
const PARK_LIMIT: Duration = Duration::from_secs(60);
/// Active clients run this long after the last session parked before the window opens.
const WARM_UP: Duration = Duration::from_secs(3);
/// Parked sessions woken with one query after the window, to show they still answer.
const REVIVE_SAMPLE: usize = 100;
/// Error messages kept for the report.
const FIRST_ERRORS: usize = 5;
/// File descriptors beyond two per connection (the gateway fits its caps to half its limit,
/// keeping one for each client's backend connection).
const SPARE_FDS: u64 = 4096;

/// The goal for the gateway's RSS in MB with `connections` open.
fn goal_rss_mb(connections: u32) -> f64 {
    if connections >= 100_000 {
        GOAL_RSS_MB_100K
    } else {
        GOAL_RSS_MB
    }
}

/// The loopback address client `i` connects from.
fn source_address(i: usize) -> Ipv4Addr {
    let k = (i as u32 % SOURCE_ADDRESSES) + 1;
    Ipv4Addr::new(127, 1, (k >> 8) as u8, (k & 0xff) as u8)
}

/// What the scenario measured.
#[derive(Debug)]
pub struct ScaleResults {
    /// The options it ran with.
    pub opts: ScaleOptions,
    /// Backend connections each tenant was capped at (`max_backend_connections`).
    pub backend_cap: u32,
    /// Every successful login's time: TCP connect until ReadyForQuery.
    pub login_ms: Vec<f64>,
    /// Wall time from the first login to the last.
    pub login_phase: Duration,
    /// Active clients' query latencies in the window.
    pub latency_ms: Vec<f64>,
    /// Actual length of the window.
    pub window: Duration,
    /// Gateway CPU (utime + stime, all threads) over the window.
    pub cpu: Duration,
    /// Gateway VmRSS with the tenants warm and no client connected.
    pub rss_warm_kib: u64,
    /// Gateway VmRSS at the end of the window.
    pub rss_kib: u64,
    /// Gateway VmHWM (peak resident memory) at the end of the window.
    pub hwm_kib: u64,
    /// `pgwake_sessions_parked` at the end of the window.
    pub parked: f64,
    /// `pgwake_connections_active` at the end of the window.
    pub gateway_connections: f64,
    /// Postgres client backends of all tenants at the end of the window.
    pub backends: usize,
    /// Seconds from the last login until the parked count reached the idle clients (`None`:
    /// not within the limit).
    pub parked_after: Option<f64>,
    /// Revival of parked sessions after the window: latencies of the ones that answered.
    pub revive_ms: Vec<f64>,
    /// Failed logins and queries, and idle sessions found closed.
    pub errors: u64,
    /// The first few error messages.
    pub first_errors: Vec<String>,
    /// Gateway counters (parks, revivals, reuse, waits) at the end, as one line.
    pub counters: String,
    /// The open-files limit the harness and the gateway ran with.
    pub nofile: u64,
    /// How the gateway stopped.
    pub stop: StopReport,
    /// Load average before and after.
    pub load: (String, String),
}

impl ScaleResults {
    /// Queries per second in the window.
    pub fn rate(&self) -> f64 {
        self.latency_ms.len() as f64 / self.window.as_secs_f64().max(1e-9)
    }

    /// Gateway CPU over the window as a share of one core, in percent.
    pub fn cpu_percent(&self) -> f64 {
        self.cpu.as_secs_f64() / self.window.as_secs_f64().max(1e-9) * 100.0
    }

    /// Gateway CPU per query in the window, in µs (idle sessions' upkeep included).
    pub fn cpu_us_per_query(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.latency_ms.len().max(1) as f64)
    }
}

/// Failed logins and queries, counted, with the first few messages kept.
#[derive(Default)]
struct Errors {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Errors {
    fn record(&self, what: impl std::fmt::Display) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.len() < FIRST_ERRORS {
            first.push(what.to_string());
        }
    }
}

/// Where the run is, for the active clients: latencies count only in the window.
const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPING: u8 = 2;

/// Runs the scenario with the pgwake binary at `binary`.
pub fn run(binary: &Path, opts: ScaleOptions) -> Result<ScaleResults> {
    if opts.tenants == 0 || opts.active > opts.connections || opts.connections == 0 {
        bail!(
            "need at least one tenant and connection, and no more active clients than connections"
        );
    }
    let load_before = load_average();
    let nofile = raise_nofile(2 * u64::from(opts.connections) + SPARE_FDS)?;
    let active_per_tenant = opts.active.div_ceil(opts.tenants);
    let backend_cap = active_per_tenant + BACKEND_HEADROOM;
    // Both the harness (one socket per client) and the gateway (one per client, plus its
    // backend connections) run under this limit; past it, logins would fail one by one.
    let gateway_needs = u64::from(opts.connections) + u64::from(backend_cap * opts.tenants) + 100;
    let harness_needs = u64::from(opts.connections) + HARNESS_SPARE_FDS;
    if nofile < gateway_needs.max(harness_needs) {
        bail!(
            "the open-files limit in force is {nofile} and cannot be raised further here (the \
             hard limit; raising it needs CAP_SYS_RESOURCE), so one process holds at most about \
             {} client connections; {} connections need {} (the gateway: one per client and its \
             {} backend connections)",
            nofile.saturating_sub(u64::from(backend_cap * opts.tenants) + 100),
            opts.connections,
            gateway_needs.max(harness_needs),
            backend_cap * opts.tenants,
        );
    }
    let tenants: Vec<String> = (0..opts.tenants).map(|i| format!("t{i:02}")).collect();
    let mut gw = LocalGateway::start_tenants(
        binary,
        &Spec {
            tenant: &tenants[0],
            // Active clients keep every tenant awake; the wake timeout covers initdb.
            wake: vec![
                "idle_timeout = \"1h\"".into(),
                "wake_timeout = \"120s\"".into(),
            ],
            limits: vec![
                format!("max_client_connections = {}", opts.connections + 100),
                format!("max_unauthenticated_connections = {}", LOGINS_AT_ONCE * 2),
                "shutdown_grace = \"1s\"".into(),
            ],
            settings: vec![format!(
                "max_connections = \"{}\"",
                backend_cap + POSTGRES_SPARE
            )],
            revival: vec![
                format!("snapshot_after = \"{}ms\"", SNAPSHOT_AFTER.as_millis()),
                format!("park_session_after = \"{}ms\"", PARK_AFTER.as_millis()),
            ],
            auth: vec![],
        },
        &tenants[1..],
        &[format!("max_backend_connections = {backend_cap}")],
    )?;
    let pid = gw.pid();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    crate::progress(format_args!(
        "scale: waking {} tenants (initdb and first start, not measured) ...",
        opts.tenants
    ));
    rt.block_on(warm(&gw, &tenants))
        .with_context(|| format!("warming the tenants: {}", gw.log_tail(5)))?;
    sleep(Duration::from_secs(1));
    let rss_warm_kib = ProcSample::read(pid)?.rss_kib;

    let errors = Arc::new(Errors::default());
    let phase = Arc::new(AtomicU8::new(WARMING));
    crate::progress(format_args!(
        "scale: {} logins, {LOGINS_AT_ONCE} at a time; {} of them query every {}-{} ms from their login on ...",
        opts.connections, opts.active, PAUSE_MS.0, PAUSE_MS.1
    ));
    let logins = rt.block_on(log_in(&gw, &tenants, opts, &errors, &phase));
    let login_phase = logins.elapsed;
    let login_ms = logins.times;
    crate::progress(format_args!(
        "scale: {} logged in after {:.1} s, {} errors so far",
        login_ms.len(),
        login_phase.as_secs_f64(),
        errors.count.load(Ordering::Relaxed)
    ));

    let idle = logins.idle.len() as f64;
    let parked_since = Instant::now();
    let mut parked_after = None;
    while parked_since.elapsed() < PARK_LIMIT {
        if gw.metric("pgwake_sessions_parked")? >= idle {
            parked_after = Some(parked_since.elapsed().as_secs_f64());
            break;
        }
        sleep(Duration::from_millis(200));
    }
    crate::progress(format_args!(
        "scale: {} sessions parked ({}); measuring {} s ...",
        gw.metric("pgwake_sessions_parked")?,
        parked_after.map_or("not all within the limit".into(), |s| format!(
            "all idle ones after {s:.1} s"
        )),
        opts.seconds
    ));
    sleep(WARM_UP);

    let clk_tck = clock_ticks_per_second();
    let before = ProcSample::read(pid)?;
    let opened = Instant::now();
    phase.store(MEASURING, Ordering::SeqCst);
    sleep(Duration::from_secs(opts.seconds));
    phase.store(STOPPING, Ordering::SeqCst);
    let window = opened.elapsed();
    let after = ProcSample::read(pid).context("the gateway died during the window")?;
    let hwm_kib = status_kib(pid, "VmHWM:")?;
    let parked = gw.metric("pgwake_sessions_parked")?;
    let gateway_connections = gw.metric("pgwake_connections_active")?;
    let backends = client_backends(&gw, &tenants);
    let cpu = Duration::from_secs_f64(
        after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / clk_tck as f64,
    );

    let latency_ms = rt.block_on(async {
        let mut all = Vec::new();
        let mut tasks = logins.active;
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(v) => all.extend(v),
                Err(e) => errors.record(format!("active client task: {e}")),
            }
        }
        all
    });
    let mut idle_clients = logins.idle;
    let closed = rt.block_on(async { idle_clients.iter().filter(|c| c.is_closed()).count() });
    for _ in 0..closed {
        errors.record("an idle session was closed while held");
    }
    let revive_ms = rt.block_on(revive_sample(&mut idle_clients, &errors));
    let counters = gateway_counters(gw.admin);
    crate::progress(format_args!(
        "scale: RSS {rss_kib} KiB (peak {hwm_kib} KiB), CPU {:.1} s over {:.0} s, {} queries, {} errors",
        cpu.as_secs_f64(),
        window.as_secs_f64(),
        latency_ms.len(),
        errors.count.load(Ordering::Relaxed),
        rss_kib = after.rss_kib,
    ));

    rt.block_on(async { drop(idle_clients) });
    rt.shutdown_timeout(Duration::from_secs(5));
    crate::progress("scale: stopping the gateway ...");
    let stop = gw.stop();
    let first_errors = errors
        .first
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(ScaleResults {
        opts,
        backend_cap,
        login_ms,
        login_phase,
        latency_ms,
        window,
        cpu,
        rss_warm_kib,
        rss_kib: after.rss_kib,
        hwm_kib,
        parked,
        gateway_connections,
        backends,
        parked_after,
        revive_ms,
        errors: errors.count.load(Ordering::Relaxed),
        first_errors,
        counters,
        nofile,
        stop,
        load: (load_before, load_average()),
    })
}

/// Raises the open-files limit as far as allowed towards `wanted`, saying so when it stays
/// below (the gateway then fits its connection caps to it).
fn raise_nofile(wanted: u64) -> Result<u64> {
    let target = crate::process::raise_nofile(wanted)?;
    if target < wanted {
        crate::progress(format_args!(
            "scale: open-files limit {target} (the hard limit; {wanted} wanted): the gateway \
             fits its connection caps to it"
        ));
    }
    Ok(target)
}

/// A TCP connection to the gateway from loopback address `from`.
async fn tcp_from(from: Ipv4Addr, port: u16) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    let stream = socket
        .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .with_context(|| format!("connect from {from}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A tokio-postgres client logged in from loopback address `from`.
async fn connect(login: &Login, from: Ipv4Addr) -> Result<Client> {
    let mut config = login.plain_config();
    config.application_name(APPLICATION_NAME);
    let attempt = async {
        let tcp = tcp_from(from, login.port).await?;
        Ok::<_, anyhow::Error>(config.connect_raw(tcp, NoTls).await?)
    };
    let (client, conn) = tokio::time::timeout(LOGIN_LIMIT, attempt)
        .await
        .map_err(|_| anyhow!("login timed out after {LOGIN_LIMIT:?}"))??;
    tokio::spawn(conn);
    Ok(client)
}

/// The `application_name` every client sends.
const APPLICATION_NAME: &str = "pgwake-bench-scale";

/// SCRAM keys by salt, derived on first use: every tenant has its own verifier, and a hundred
/// thousand PBKDF2 runs would only slow the harness down (the gateway sees the same messages).
#[derive(Default)]
struct KeyCache {
    password: String,
    by_salt: Mutex<HashMap<(Vec<u8>, u32), ScramKeys>>,
}

impl KeyCache {
    fn keys(&self, salt: &[u8], iterations: u32) -> ScramKeys {
        let key = (salt.to_vec(), iterations);
        if let Some(k) = self.lock().get(&key) {
            return k.clone();
        }
        let derived = ScramKeys::from_password(&self.password, salt, iterations);
        self.lock().entry(key).or_insert(derived).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Vec<u8>, u32), ScramKeys>> {
        self.by_salt.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An idle client: a raw protocol connection that logged in (the startup parameters
/// tokio-postgres sends, SCRAM-SHA-256) and now holds its socket and nothing else.
struct RawClient {
    stream: TcpStream,
}

impl RawClient {
    /// Connects from `from` and logs in up to ReadyForQuery.
    async fn log_in(login: &Login, from: Ipv4Addr, keys: &KeyCache) -> Result<RawClient> {
        let attempt = async {
            let mut s = tcp_from(from, login.port).await?;
            s.write_all(&startup_message(login)).await?;
            raw_login::scram(&mut s, |salt, iterations| keys.keys(salt, iterations)).await?;
            until_ready(&mut s).await?;
            Ok::<_, anyhow::Error>(RawClient { stream: s })
        };
        tokio::time::timeout(LOGIN_LIMIT, attempt)
            .await
            .map_err(|_| anyhow!("login timed out after {LOGIN_LIMIT:?}"))?
    }

    /// Whether the gateway closed the connection (read without waiting: end of stream).
    fn is_closed(&self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.try_read(&mut byte) {
            Ok(n) => n == 0,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }

    /// `SELECT 1` with the simple protocol, until ReadyForQuery.
    async fn select1(&mut self) -> Result<()> {
        let mut q = vec![b'Q'];
        q.extend_from_slice(&13u32.to_be_bytes());
        q.extend_from_slice(b"SELECT 1\0");
        self.stream.write_all(&q).await?;
        until_ready(&mut self.stream).await
    }
}

/// The StartupMessage tokio-postgres sends: user, database, application_name, client_encoding.
fn startup_message(login: &Login) -> Vec<u8> {
    raw_login::startup_message(&[
        ("client_encoding", "UTF8"),
        ("user", login.user.as_str()),
        ("database", login.dbname.as_str()),
        ("application_name", APPLICATION_NAME),
    ])
}

/// Reads messages until ReadyForQuery.
async fn until_ready(s: &mut TcpStream) -> Result<()> {
    while raw_login::read_message(s).await?.0 != b'Z' {}
    Ok(())
}

/// Wakes every tenant with one query, a few at a time (each first wake runs initdb).
async fn warm(gw: &LocalGateway, tenants: &[String]) -> Result<()> {
    let gate = Arc::new(Semaphore::new(WARMING_AT_ONCE));
    let mut set = JoinSet::new();
    for t in tenants {
        let login = gw.login_to(t);
        let gate = gate.clone();
        let t = t.clone();
        set.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let c = connect(&login, Ipv4Addr::LOCALHOST)
                .await
                .with_context(|| format!("tenant {t}"))?;
            c.simple_query("SELECT 1").await?;
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// The login phase's outcome: idle clients held, active clients' tasks (each returns its
/// latencies in the window), login times.
struct Logins {
    idle: Vec<RawClient>,
    active: JoinSet<Vec<f64>>,
    times: Vec<f64>,
    elapsed: Duration,
}

/// Logs every client in, `LOGINS_AT_ONCE` at a time. Connection `i` goes to tenant `i mod T`;
/// the first `active` connections query from their login on, so the active load runs while the
/// idle clients log in.
async fn log_in(
    gw: &LocalGateway,
    tenants: &[String],
    opts: ScaleOptions,
    errors: &Arc<Errors>,
    phase: &Arc<AtomicU8>,
) -> Logins {
    let gate = Arc::new(Semaphore::new(LOGINS_AT_ONCE));
    let keys = Arc::new(KeyCache {
        password: gw.login().password,
        ..KeyCache::default()
    });
    let started = Instant::now();
    let mut set = JoinSet::new();
    let mut active = JoinSet::new();
    for i in 0..opts.connections as usize {
        let login = gw.login_to(&tenants[i % tenants.len()]);
        let gate = gate.clone();
        let keys = keys.clone();
        let is_active = i < opts.active as usize;
        set.spawn(async move {
            let _permit = gate.acquire_owned().await;
            let t = Instant::now();
            let from = source_address(i);
            let c = if is_active {
                connect(&login, from).await.map(Held::Active)
            } else {
                RawClient::log_in(&login, from, &keys).await.map(Held::Idle)
            };
            (c, t.elapsed())
        });
    }
    let mut idle = Vec::with_capacity(opts.connections as usize);
    let mut times = Vec::with_capacity(opts.connections as usize);
    while let Some(done) = set.join_next().await {
        let (client, took) = match done {
            Ok(v) => v,
            Err(e) => {
                errors.record(format!("login task: {e}"));
                continue;
            }
        };
        match client {
            Ok(held) => {
                times.push(took.as_secs_f64() * 1000.0);
                match held {
                    Held::Active(c) => {
                        active.spawn(query_loop(c, errors.clone(), phase.clone()));
                    }
                    Held::Idle(c) => idle.push(c),
                }
            }
            Err(e) => errors.record(format!("login: {e:#}")),
        }
    }
    Logins {
        idle,
        active,
        times,
        elapsed: started.elapsed(),
    }
}

/// A logged-in client: an active one (tokio-postgres, it queries) or an idle one (raw).
enum Held {
    Active(Client),
    Idle(RawClient),
}

/// One active client: a pause, `SELECT 1`, again, until the run stops. Returns the latencies of
/// the queries that started in the window.
async fn query_loop(client: Client, errors: Arc<Errors>, phase: Arc<AtomicU8>) -> Vec<f64> {
    let mut latencies = Vec::new();
    loop {
        let pause = rand::random_range(PAUSE_MS.0..=PAUSE_MS.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let now = phase.load(Ordering::SeqCst);
        if now == STOPPING {
            return latencies;
        }
        let t = Instant::now();
        match tokio::time::timeout(QUERY_LIMIT, client.simple_query("SELECT 1")).await {
            Ok(Ok(_)) => {
                if now == MEASURING {
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            Ok(Err(e)) => {
                errors.record(format!("query: {e}"));
                if client.is_closed() {
                    return latencies;
                }
            }
            Err(_) => errors.record(format!("query timed out after {QUERY_LIMIT:?}")),
        }
    }
}

/// Wakes up to `REVIVE_SAMPLE` parked sessions, spread over the idle clients, with one query
/// each, all at once; returns the latencies of those that answered.
async fn revive_sample(idle: &mut [RawClient], errors: &Errors) -> Vec<f64> {
    let step = (idle.len() / REVIVE_SAMPLE).max(1);
    let runs = idle
        .iter_mut()
        .step_by(step)
        .take(REVIVE_SAMPLE)
        .map(|c| async move {
            let t = Instant::now();
            match tokio::time::timeout(QUERY_LIMIT, c.select1()).await {
                Ok(Ok(())) => Some(t.elapsed().as_secs_f64() * 1000.0),
                Ok(Err(e)) => {
                    errors.record(format!("revival query: {e:#}"));
                    None
                }
                Err(_) => {
                    errors.record(format!("revival query timed out after {QUERY_LIMIT:?}"));
                    None
                }
            }
        });
    futures_util::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// A `kB` line of `/proc/PID/status` (e.g. `VmHWM:`), in KiB.
fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_status_kib(&status, key).ok_or_else(|| anyhow!("no {key} in /proc/{pid}/status"))
}

fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Client backends of the tenants' servers: children of each postmaster that serve a login
/// (their title starts with `postgres: ` and the user name; auxiliary processes name
/// themselves instead).
fn client_backends(gw: &LocalGateway, tenants: &[String]) -> usize {
    let postmasters: Vec<String> = tenants
        .iter()
        .filter_map(|t| {
            let pid = std::fs::read_to_string(gw.data_dir_of(t).join("postmaster.pid")).ok()?;
            Some(pid.lines().next()?.trim().to_owned())
        })
        .collect();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let dir = e.path();
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
                return false;
            };
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1));
            ppid.is_some_and(|p| postmasters.iter().any(|m| m == p))
                && std::fs::read(dir.join("cmdline"))
                    .is_ok_and(|c| c.starts_with(b"postgres: pgwake "))
        })
        .count()
}

/// Park, revival, reuse and wait counters from `/metrics`, for the note under the table.
fn gateway_counters(admin: u16) -> String {
    let Ok(reply) = crate::http::request(admin, "GET", "/metrics", Duration::from_secs(5)) else {
        return "metrics unavailable".into();
    };
    let sum = |name: &str, label: &str| crate::http::metric_sum(&reply.body, name, label);
    format!(
        "parks on their own {:.0}, revivals ok {:.0} / error {:.0}, reuse hits {:.0} / misses \
         {:.0}, waits for a backend connection: kept {:.0}, slot {:.0}, timeout {:.0}",
        sum("pgwake_parks_total", "reason=\"session_idle\""),
        sum("pgwake_revivals_total", "outcome=\"ok\""),
        sum("pgwake_revivals_total", "outcome=\"error\""),
        sum("pgwake_backend_reuse_total", "outcome=\"hit\""),
        sum("pgwake_backend_reuse_total", "outcome=\"miss\""),
        sum("pgwake_backend_waits_total", "outcome=\"kept\""),
        sum("pgwake_backend_waits_total", "outcome=\"slot\""),
        sum("pgwake_backend_waits_total", "outcome=\"timeout\""),
    )
}

/// The Markdown section for RESULTS.md.
pub fn render(facts: &Facts, outcome: &Result<ScaleResults, String>) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(
        &mut out,
        "Scale: thousands of client connections held open (local tenants)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let o = r.opts;
    let idle = o.connections - o.active;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let _ = writeln!(
        out,
        "| method | {} clients (plaintext, SCRAM login at the gateway, {LOGINS_AT_ONCE} logins at \
         a time, from {SOURCE_ADDRESSES} loopback source addresses 127.1.0.1… in turn) over {} \
         `local` tenants (connection i to tenant i mod {}); the first {} (tokio-postgres) run \
         `SELECT 1` (simple protocol) after a pause drawn uniformly from {}–{} ms, from their \
         login on; the other {idle} (raw protocol clients sending tokio-postgres's startup \
         parameters) log in and stay idle. Gateway: `park_session_after = \"{}ms\"`, \
         `snapshot_after = \"{}ms\"`, `max_backend_connections = {}` per tenant (Postgres \
         `max_connections = {}`), reuse on (defaults). Window: {:.0} s, opened {} s after every \
         idle session had parked (or {} s after the last login) |",
        o.connections,
        o.tenants,
        o.tenants,
        o.active,
        PAUSE_MS.0,
        PAUSE_MS.1,
        PARK_AFTER.as_millis(),
        SNAPSHOT_AFTER.as_millis(),
        r.backend_cap,
        r.backend_cap + POSTGRES_SPARE,
        r.window.as_secs_f64(),
        WARM_UP.as_secs(),
        PARK_LIMIT.as_secs(),
    );
    let _ = writeln!(
        out,
        "| open-files limit (harness and gateway) | {} |",
        r.nofile
    );
    let _ = writeln!(out);
    let rss_mib = mib(r.rss_kib);
    let goal_mb = goal_rss_mb(o.connections);
    let _ = writeln!(
        out,
        "| measure | value | goal | met |\n|---|---:|---|---|\n\
         | **gateway RSS (VmRSS) at the end of the window** | **{rss_mib:.1} MiB** | ≤ {goal_mb:.0} MB | {} |\n\
         | gateway peak RSS (VmHWM, logins included) | {:.1} MiB | | |\n\
         | gateway RSS with the tenants warm, no client | {:.1} MiB | | |\n\
         | gateway CPU over the window | {:.1} % of one core | | |\n\
         | gateway CPU per query | {:.0} µs | | |\n\
         | queries in the window | {} ({:.0} q/s) | | |\n\
         | **query latency p50 / p99 / max** | **{} / {} / {} ms** | p99 stated | yes |\n\
         | **time to accept every connection** (first login to last) | **{:.1} s** | stated | yes |\n\
         | login time p50 / p99 / max ({} logins in {:.1} s) | {} / {} / {} ms | | |\n\
         | **errors** (failed logins and queries, idle sessions closed) | **{}** | 0 | {} |\n\
         | sessions parked at the end (`pgwake_sessions_parked`) | {:.0} of {idle} idle | | |\n\
         | client connections at the end (`pgwake_connections_active`) | {:.0} | | |\n\
         | Postgres client backends at the end (all tenants) | {} | | |\n\
         | every idle session parked | {} | | |\n\
         | {} parked sessions revived at once after the window: p50 / max | {} / {} ms | | |",
        met(rss_mib * 1024.0 * 1024.0 <= goal_mb * 1e6),
        mib(r.hwm_kib),
        mib(r.rss_warm_kib),
        r.cpu_percent(),
        r.cpu_us_per_query(),
        r.latency_ms.len(),
        r.rate(),
        p(&r.latency_ms, 50.0),
        p(&r.latency_ms, 99.0),
        max(&r.latency_ms),
        r.login_phase.as_secs_f64(),
        r.login_ms.len(),
        r.login_phase.as_secs_f64(),
        p(&r.login_ms, 50.0),
        p(&r.login_ms, 99.0),
        max(&r.login_ms),
        r.errors,
        met(r.errors == 0),
        r.parked,
        r.gateway_connections,
        r.backends,
        r.parked_after.map_or(
            format!("not within {} s", PARK_LIMIT.as_secs()),
            |s| format!("{s:.1} s after the last login")
        ),
        r.revive_ms.len(),
        p(&r.revive_ms, 50.0),
        max(&r.revive_ms),
    );
    let _ = writeln!(out, "\nGateway counters at the end: {}.", r.counters);
    if !r.first_errors.is_empty() {
        let _ = writeln!(out, "\nFirst errors:\n");
        for e in &r.first_errors {
            let _ = writeln!(out, "- {}", e.replace('\n', " "));
        }
    }
    if let Some(pid) = r.stop.leftover_postmaster {
        let _ = writeln!(
            out,
            "\nA tenant's postmaster (pid {pid}) was still running after the gateway exited."
        );
    }
    let _ = writeln!(
        out,
        "\nCPU is utime + stime of the gateway process (all threads) from /proc over the window, \
         so it includes the upkeep of the idle and parked sessions; per query it is divided by \
         the active clients' queries only. Latency runs from sending `SELECT 1` to its answer, \
         measured in the harness (on the same two cores as the gateway and twenty Postgres \
         servers). Login time runs from the TCP connect to ReadyForQuery and includes any wait \
         for a backend connection at the tenant's cap. The harness's own memory is not measured."
    );
    out
}

fn p(values: &[f64], q: f64) -> String {
    percentile(values, q).map_or("—".into(), fmt_ms)
}

fn max(values: &[f64]) -> String {
    values
        .iter()
        .copied()
        .reduce(f64::max)
        .map_or("—".into(), fmt_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::Stopped;

    #[test]
    fn clients_spread_over_loopback_source_addresses() {
        assert_eq!(source_address(0), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(source_address(63), Ipv4Addr::new(127, 1, 0, 64));
        assert_eq!(source_address(64), Ipv4Addr::new(127, 1, 0, 1));
        // A hundred thousand clients leave each address far below its ephemeral ports.
        let per_address = 100_000usize.div_ceil(SOURCE_ADDRESSES as usize);
        assert!(per_address < 28_000, "{per_address}");
        assert_eq!(goal_rss_mb(10_000), 200.0);
        assert_eq!(goal_rss_mb(100_000), 600.0);
    }

    #[test]
    fn raw_clients_send_tokio_postgres_startup_parameters() {
        let login = Login {
            port: 1,
            user: "pgwake".into(),
            password: "pw".into(),
            dbname: "t01.postgres".into(),
        };
        let msg = startup_message(&login);
        assert_eq!(
            u32::from_be_bytes(msg[..4].try_into().unwrap()) as usize,
            msg.len()
        );
        assert_eq!(&msg[4..8], &196_608u32.to_be_bytes());
        let body = String::from_utf8_lossy(&msg[8..]).into_owned();
        assert_eq!(
            body,
            "client_encoding\0UTF8\0user\0pgwake\0database\0t01.postgres\0\
             application_name\0pgwake-bench-scale\0\0"
        );
    }

    #[test]
    fn hwm_is_read_from_status() {
        let status = "Name:\tpgwake\nVmHWM:\t   81234 kB\nVmRSS:\t   70000 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM:"), Some(81234));
        assert_eq!(parse_status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn report_states_memory_latency_and_errors() {
        let r = ScaleResults {
            opts: ScaleOptions {
                connections: 10_000,
                active: 1_000,
                tenants: 20,
                seconds: 60,
            },
            backend_cap: 100,
            login_ms: (1..=100).map(f64::from).collect(),
            login_phase: Duration::from_secs(40),
            latency_ms: vec![0.5; 120_000],
            window: Duration::from_secs(60),
            cpu: Duration::from_secs(12),
            rss_warm_kib: 20 * 1024,
            rss_kib: 150 * 1024,
            hwm_kib: 180 * 1024,
            parked: 9000.0,
            gateway_connections: 10_000.0,
            backends: 1200,
            parked_after: Some(3.5),
            revive_ms: vec![2.0, 4.0],
            errors: 2,
            first_errors: vec!["login: db error".into()],
            counters: "parks on their own 9000".into(),
            nofile: 24_096,
            stop: StopReport {
                gateway: Stopped::After(Duration::from_millis(900)),
                leftover_postmaster: None,
            },
            load: ("1.0 1.0 1.0".into(), "2.0 2.0 2.0".into()),
        };
        assert_eq!(r.rate(), 2000.0);
        assert_eq!(r.cpu_percent(), 20.0);
        assert_eq!(r.cpu_us_per_query(), 100.0);
        let text = render(&Facts { rows: vec![] }, &Ok(r));
        assert!(
            text.contains("| **150.0 MiB** | ≤ 200 MB | yes |"),
            "{text}"
        );
        assert!(text.contains("| **0.5 / 0.5 / 0.5 ms** |"), "{text}");
        assert!(
            text.contains("(100 logins in 40.0 s) | 50.0 / 99.0 / 100.0 ms |"),
            "{text}"
        );
        assert!(text.contains("| **2** | 0 | **no** |"), "{text}");
        assert!(text.contains("| 9000 of 9000 idle |"), "{text}");
        assert!(text.contains("- login: db error"), "{text}");
        assert!(text.contains("load average"), "{text}");
        let failed = render(&Facts { rows: vec![] }, &Err("no binary".into()));
        assert!(failed.contains("Not measured: no binary"), "{failed}");
    }
}
