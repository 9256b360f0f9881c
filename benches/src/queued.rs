//! Memory per queued connection: many clients wait in one tenant's accept queue while its wake is
//! held back, and the gateway's resident memory is compared before and after they arrived. Each
//! client logs in first (the gateway authenticates before it wakes a tenant), so a queued
//! connection holds everything a real one does: its socket, its task and its login material.
//!
//! The wake is held back by Postgres itself: `pre_auth_delay` makes every new backend sleep
//! before it reads the startup message, the gateway's readiness probe included, so the tenant
//! stays "waking" for at least that long while the clients queue.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use pgwake_protocol::scram::ScramKeys;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::gateway::{LocalGateway, Spec, StopReport};
use crate::process::{ProcSample, Stopped, load_average};
use crate::raw_login;
use crate::report::{Facts, met};

/// How many clients queue.
#[derive(Clone, Copy, Debug)]
pub struct QueuedOptions {
    /// Connections waiting at the same time.
    pub connections: u32,
}

/// The goal from the issue, KiB of gateway memory per waiting connection.
const GOAL_KIB: f64 = 4.0;
/// How long Postgres delays every login; everything below must be done well within it.
const HOLD: Duration = Duration::from_secs(40);
/// Connections being opened at once: enough to be quick, few enough to stay within the
/// listen backlog (an overflow would cost a SYN retry of a second or more).
const OPENING_AT_ONCE: usize = 200;
/// After the last client queued, time for the gateway to finish its per-connection work
/// before its memory is read.
const SETTLE: Duration = Duration::from_secs(1);
/// How long the closed clients get to leave the queue before the count is read again.
const LEAVE_TIME: Duration = Duration::from_secs(2);
/// File descriptors beyond one per connection (gateway and harness each need some of their own).
const SPARE_FDS: u64 = 1024;
/// The tenant's `max_backend_connections`. Queued clients hold no backend connection, and with
/// every tenant capped the gateway fits its client cap to the file limit by this bound instead
/// of reserving a backend descriptor per client (which cut 10,000 clients to 9,968 at a
/// 20,000-file limit).
const BACKEND_CAP: u32 = 10;

/// What the scenario measured.
#[derive(Debug)]
pub struct QueuedResults {
    /// Clients that queued.
    pub connections: u32,
    /// Gateway VmRSS right after start, no connection yet.
    pub rss_idle_kib: u64,
    /// With one client queued (the wake under way, Postgres started).
    pub rss_before_kib: u64,
    /// With all clients queued.
    pub rss_after_kib: u64,
    /// Opening the other clients until `/v1/tenants` counted them all.
    pub queue_secs: f64,
    /// Waiters the gateway still counted after all clients had closed their sockets.
    pub waiters_after_close: u64,
    /// The open-files limit the harness ran with (inherited by the gateway).
    pub nofile: u64,
    /// How the gateway stopped.
    pub stop: StopReport,
    /// Load average before and after.
    pub load: (String, String),
}

impl QueuedResults {
    /// Growth of the gateway's RSS per queued connection beyond the first, in KiB.
    pub fn kib_per_connection(&self) -> f64 {
        let added = self.connections.saturating_sub(1).max(1);
        (self.rss_after_kib as f64 - self.rss_before_kib as f64) / f64::from(added)
    }
}

/// Runs the scenario with the pgwake binary at `binary`.
pub fn run(binary: &Path, opts: QueuedOptions) -> Result<QueuedResults> {
    let n = opts.connections;
    if n < 2 {
        bail!("--connections must be at least 2");
    }
    let load_before = load_average();
    let nofile = raise_nofile(u64::from(n) + SPARE_FDS)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut gw = LocalGateway::start_tenants(
        binary,
        &Spec {
            tenant: "queue",
            wake: vec![
                // Far above the hold, so no waiter times out while it is measured.
                "wake_timeout = \"120s\"".into(),
                format!("max_waiters_per_tenant = {n}"),
                format!("max_waiters_total = {n}"),
            ],
            // The default grace: connections still queued for the wake end at SIGTERM at once.
            limits: vec![],
            settings: vec![format!("pre_auth_delay = \"'{}s'\"", HOLD.as_secs())],
            revival: vec![],
            auth: vec![],
        },
        &[],
        &[format!("max_backend_connections = {BACKEND_CAP}")],
    )?;
    let pid = gw.pid();
    let rss = || -> Result<u64> { Ok(ProcSample::read(pid)?.rss_kib) };
    let rss_idle_kib = rss()?;
    let started = Instant::now();
    let port = gw.port;
    let startup = startup_message(&format!("{}.postgres", gw.tenant));
    let login = Arc::new(Login {
        password: gw.login().password,
        keys: std::sync::OnceLock::new(),
    });

    crate::progress("queued: first client (the wake starts: initdb, then postgres) ...");
    let mut clients = rt.block_on(open(port, &startup, &login, 1))?;
    wait_for(&gw, started, Duration::from_secs(30), |s| s.waiters == 1)?;
    // initdb and the start of Postgres run in their own processes; let them finish before the
    // measured part so they do not compete with it for the CPUs.
    let pid_file = gw.data_dir().join("postmaster.pid");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&pid_file).is_ok_and(|t| t.contains("ready")) {
        if Instant::now() > deadline {
            bail!(
                "the tenant's Postgres did not report ready: {}",
                gw.log_tail(5)
            );
        }
        sleep(Duration::from_millis(50));
    }
    sleep(SETTLE);
    let rss_before_kib = rss()?;

    crate::progress(format_args!("queued: opening {} more clients ...", n - 1));
    let queue_started = Instant::now();
    clients.extend(rt.block_on(open(port, &startup, &login, n as usize - 1))?);
    wait_for(&gw, started, Duration::from_secs(20), |s| {
        s.waiters == u64::from(n)
    })?;
    let queue_secs = queue_started.elapsed().as_secs_f64();
    sleep(SETTLE);
    let rss_after_kib = rss()?;
    let state = gw.status()?;
    if state.state != "waking" || state.waiters != u64::from(n) {
        bail!(
            "the queue did not hold while measured: tenant {} with {} waiters",
            state.state,
            state.waiters
        );
    }
    crate::progress(format_args!(
        "queued: {n} waiting after {queue_secs:.1} s; RSS {rss_before_kib} KiB -> {rss_after_kib} KiB"
    ));

    drop(clients);
    sleep(LEAVE_TIME);
    let waiters_after_close = gw.status()?.waiters;
    crate::progress("queued: stopping the gateway ...");
    let stop = gw.stop();
    Ok(QueuedResults {
        connections: n,
        rss_idle_kib,
        rss_before_kib,
        rss_after_kib,
        queue_secs,
        waiters_after_close,
        nofile,
        stop,
        load: (load_before, load_average()),
    })
}

/// Raises the open-files limit to at least `wanted`, or fails saying how far it got.
fn raise_nofile(wanted: u64) -> Result<u64> {
    let got = crate::process::raise_nofile(wanted)?;
    if got < wanted {
        bail!(
            "the open-files limit stops at {got}, {wanted} needed (run as root, or raise ulimit -n)"
        );
    }
    Ok(got)
}

/// A StartupMessage (protocol 3.0) for user `pgwake` and `database`.
fn startup_message(database: &str) -> Vec<u8> {
    raw_login::startup_message(&[("user", "pgwake"), ("database", database)])
}

/// How the clients log in: the password, and the SCRAM keys derived from it for the gateway's
/// salt, computed by the first client and reused by the others. A real client derives them on
/// every login (PBKDF2, milliseconds of CPU); ten thousand derivations would only slow the
/// harness down, and the gateway sees the same messages either way.
struct Login {
    password: String,
    keys: std::sync::OnceLock<ScramKeys>,
}

/// Opens `count` connections to 127.0.0.1:`port`, each sending `startup`, logging in with
/// SCRAM-SHA-256 and then left waiting, at most `OPENING_AT_ONCE` in flight.
async fn open(
    port: u16,
    startup: &[u8],
    login: &Arc<Login>,
    count: usize,
) -> Result<Vec<TcpStream>> {
    let mut out = Vec::with_capacity(count);
    let mut opening = JoinSet::new();
    let mut started = 0;
    while out.len() < count {
        while started < count && opening.len() < OPENING_AT_ONCE {
            let startup = startup.to_vec();
            let login = login.clone();
            opening.spawn(async move {
                tokio::time::timeout(Duration::from_secs(10), queue_one(port, &startup, &login))
                    .await
                    .map_err(|_| anyhow!("connect and log in took over 10 s"))?
            });
            started += 1;
        }
        let done = opening
            .join_next()
            .await
            .ok_or_else(|| anyhow!("no connection in flight"))??;
        out.push(done.with_context(|| format!("client {}", out.len() + 1))?);
    }
    Ok(out)
}

/// One client: startup message, the gateway's SCRAM exchange up to AuthenticationOk. The gateway
/// authenticates before it wakes anything, so from here on the connection waits in the queue.
async fn queue_one(port: u16, startup: &[u8], login: &Login) -> Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.set_nodelay(true)?;
    s.write_all(startup).await?;
    raw_login::scram(&mut s, |salt, iterations| {
        login
            .keys
            .get_or_init(|| ScramKeys::from_password(&login.password, salt, iterations))
            .clone()
    })
    .await?;
    Ok(s)
}

/// Polls the tenant's status until `done` holds, failing after `limit` or when the tenant left
/// the waking state (the hold did not hold).
fn wait_for(
    gw: &LocalGateway,
    started: Instant,
    limit: Duration,
    done: impl Fn(&crate::gateway::TenantStatus) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let s = gw.status()?;
        if done(&s) {
            return Ok(());
        }
        // A client that has just logged in may not have reached the wake yet.
        let not_yet = s.state == "asleep" && s.waiters == 0;
        if s.state != "waking" && !not_yet {
            bail!(
                "tenant is {} after {:.1} s with {} waiters: {}",
                s.state,
                started.elapsed().as_secs_f64(),
                s.waiters,
                gw.log_tail(5)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "only {} waiters after {limit:?}: {}",
                s.waiters,
                gw.log_tail(5)
            );
        }
        sleep(Duration::from_millis(50));
    }
}

/// The Markdown section for RESULTS.md.
pub fn render(facts: &Facts, outcome: &Result<QueuedResults, String>) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(&mut out, "Memory per queued connection", outcome, |r| {
        &r.load
    }) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| method | {} plaintext clients each send a StartupMessage (user pgwake, database \
         `queue.postgres`), log in with SCRAM-SHA-256 at the gateway up to AuthenticationOk, and \
         wait while the tenant's wake is held by `pre_auth_delay = '{}s'`; the tenant has \
         `max_backend_connections = {BACKEND_CAP}`; open-files limit {} |",
        r.connections,
        HOLD.as_secs(),
        r.nofile
    );
    let _ = writeln!(out);
    let per = r.kib_per_connection();
    let verdict = met(per <= GOAL_KIB);
    let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
    let _ = writeln!(
        out,
        "| measure | value |\n|---|---:|\n\
         | gateway RSS at start, no connection (MiB) | {} |\n\
         | gateway RSS with 1 client queued (MiB) | {} |\n\
         | gateway RSS with {} clients queued (MiB) | {} |\n\
         | **RSS per queued connection (KiB)** (goal ≤ {GOAL_KIB:.0}: {verdict}) | **{per:.1}** |\n\
         | time to queue {} more clients (s) | {:.1} |\n\
         | waiters still counted {} s after every client closed its socket | {} |\n\
         | gateway exit after SIGTERM | {} |\n\
         | tenant Postgres left running after the gateway exited | {} |",
        mib(r.rss_idle_kib),
        mib(r.rss_before_kib),
        r.connections,
        mib(r.rss_after_kib),
        r.connections - 1,
        r.queue_secs,
        LEAVE_TIME.as_secs(),
        r.waiters_after_close,
        match r.stop.gateway {
            Stopped::After(d) => format!("{:.1} s", d.as_secs_f64()),
            Stopped::Already => "had already exited".into(),
            Stopped::Killed => "**ignored SIGTERM, killed**".into(),
        },
        match r.stop.leftover_postmaster {
            Some(pid) => format!("**yes** (pid {pid}; stopped by the harness)"),
            None => "no".into(),
        },
    );
    let _ = writeln!(
        out,
        "\nRSS is VmRSS of the gateway process. Per connection = (RSS with all queued − RSS with \
         one queued) / (clients − 1): the first client pays for one-time work (the wake task, \
         spawning Postgres, code paths run for the first time), which should not be spread over \
         the others. Kernel socket buffers are not in RSS."
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_message_layout() {
        let m = startup_message("q.postgres");
        let len = u32::from_be_bytes([m[0], m[1], m[2], m[3]]) as usize;
        assert_eq!(len, m.len());
        assert_eq!(&m[4..8], &[0, 3, 0, 0]);
        assert_eq!(&m[8..], b"user\0pgwake\0database\0q.postgres\0\0");
    }

    #[test]
    fn per_connection_memory_excludes_the_first_client() {
        let r = QueuedResults {
            connections: 1001,
            rss_idle_kib: 8000,
            rss_before_kib: 9000,
            rss_after_kib: 21000,
            queue_secs: 1.0,
            waiters_after_close: 0,
            nofile: 20000,
            stop: StopReport {
                gateway: Stopped::After(Duration::from_millis(1200)),
                leftover_postmaster: None,
            },
            load: (String::new(), String::new()),
        };
        assert_eq!(r.kib_per_connection(), 12.0);
        let text = render(&Facts { rows: vec![] }, &Ok(r));
        assert!(text.contains("| **12.0** |"), "{text}");
        assert!(text.contains("(goal ≤ 4: **no**)"), "{text}");
        assert!(
            text.contains("| gateway exit after SIGTERM | 1.2 s |"),
            "{text}"
        );
    }
}
