//! Wake on connect with the local backend: a wake storm, the queue bound, timeouts, a broken
//! tenant, idle sleep, shutdown during a wake and the quickstart, against real Postgres servers
//! the gateway starts.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, backend};
use tokio_postgres::NoTls;

const PLAINTEXT: &str = "allow_plaintext = true";

fn conninfo(gw: &Gateway, tenant: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    )
}

async fn select_one(conninfo: &str) -> Result<i32, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls).await?;
    tokio::spawn(conn);
    Ok(client.query_one("select 1::int4", &[]).await?.get(0))
}

/// The server's message of a database error (tokio-postgres displays only "db error").
fn message(err: &tokio_postgres::Error) -> String {
    err.as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| err.to_string())
}

fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(f)
}

/// Starts `n` clients of `tenant` and returns once all of them wait in its accept queue.
async fn queue_clients(
    gw: &Arc<Gateway>,
    tenant: &'static str,
    n: u64,
) -> Vec<tokio::task::JoinHandle<Result<i32, tokio_postgres::Error>>> {
    let conninfo = conninfo(gw, tenant);
    let waiting = (0..n)
        .map(|_| {
            let c = conninfo.clone();
            tokio::spawn(async move { select_one(&c).await })
        })
        .collect();
    let g = gw.clone();
    blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while g.tenant_state(tenant).2 < n {
            assert!(Instant::now() < deadline, "waiters never reached {n}");
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .unwrap();
    waiting
}

/// Tests start their servers from the binaries testkit finds and the gateway from those its
/// local backend finds; testkit repeats the search rather than depend on the routing crate.
#[test]
fn testkit_and_the_local_backend_find_the_same_postgres() {
    assert_eq!(
        pgwake_testkit::find_bin_dir(),
        pgwake_routing::backend::find_bin_dir()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_storm_starts_postgres_once() {
    let gw = Arc::new(
        blocking(|| {
            Gateway::start_local(
                &["storm"],
                PLAINTEXT,
                "max_connections = '600'\nlog_min_messages = 'log'",
                &[],
            )
        })
        .await
        .unwrap(),
    );
    let conninfo = conninfo(&gw, "storm");
    let tasks: Vec<_> = (0..500)
        .map(|_| {
            let c = conninfo.clone();
            tokio::spawn(async move { select_one(&c).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(1) => ok += 1,
            other => panic!("a storm connection failed: {other:?}"),
        }
    }
    assert_eq!(ok, 500);
    let g = gw.clone();
    let starts = blocking(move || g.local_starts("storm")).await.unwrap();
    assert_eq!(starts, 1, "postgres started {starts} times");
    assert_eq!(
        gw.metric("pgwake_wakes_total{backend=\"local\",outcome=\"ok\"}"),
        1.0
    );
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_gets_53300_at_once() {
    // pre_auth_delay holds every login, the readiness probe's included, so the wake is slow.
    let gw = Arc::new(
        blocking(|| {
            Gateway::start_local(
                &["slow"],
                &format!("{PLAINTEXT}\n[wake]\nmax_waiters_per_tenant = 10"),
                "pre_auth_delay = '3s'",
                &[],
            )
        })
        .await
        .unwrap(),
    );
    let conninfo = conninfo(&gw, "slow");
    let waiting = queue_clients(&gw, "slow", 10).await;
    let started = Instant::now();
    let err = select_one(&conninfo).await.expect_err("queue is full");
    assert_eq!(err.code().map(|c| c.code()), Some("53300"), "{err}");
    assert!(
        message(&err).contains("too many connections waiting for tenant"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "took {:?}",
        started.elapsed()
    );
    for w in waiting {
        assert_eq!(w.await.unwrap().expect("waiter admitted after the wake"), 1);
    }
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_while_queued_leave_the_queue() {
    // pre_auth_delay makes the wake take seconds: long enough to hang up in the middle of it.
    let gw = Arc::new(
        blocking(|| Gateway::start_local(&["slow"], PLAINTEXT, "pre_auth_delay = '3s'", &[]))
            .await
            .unwrap(),
    );
    let conninfo = conninfo(&gw, "slow");
    let waiting = queue_clients(&gw, "slow", 3).await;
    // Dropping the clients closes their sockets, as a killed application would.
    for w in &waiting {
        w.abort();
    }
    let g = gw.clone();
    blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (state, connections, waiters) = g.tenant_state("slow");
            if waiters == 0 && g.metric("pgwake_connections_active") == 0.0 {
                // Gone from the queue while the wake still runs, not when it ends.
                assert_eq!(state, "waking");
                assert_eq!(connections, 0);
                break;
            }
            assert!(Instant::now() < deadline, "waiters stayed queued");
            std::thread::sleep(Duration::from_millis(10));
        }
        g.wait_state("slow", "awake", Duration::from_secs(30));
    })
    .await
    .unwrap();
    // The wake went on for the tenant, and the next client is served.
    assert_eq!(select_one(&conninfo).await.unwrap(), 1);
    blocking(move || gw.wait_idle()).await.unwrap();
}

/// Settings that hold a local tenant's wake far longer than a test: every login, the readiness
/// probe's included, waits a minute before Postgres reads it.
const HELD_WAKE: &str = "[wake]\nwake_timeout = \"120s\"";
const HELD_LOGINS: &str = "pre_auth_delay = '60s'";

/// Live processes whose command line names `data_dir`: a postmaster of that data directory and
/// its children (a backend still in `pre_auth_delay` keeps the postmaster's command line).
fn server_processes(data_dir: &std::path::Path) -> Vec<u32> {
    let needle = data_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(&needle)
                .then_some(pid)
        })
        .collect()
}

/// Waits until the tenant's postmaster reports itself ready in its pid file (initdb's
/// single-user runs write that file too, but without the status line).
fn wait_for_postmaster(gw: &Gateway, tenant: &str) -> std::path::PathBuf {
    let data = gw.local_dir(tenant).join("data");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(data.join("postmaster.pid"))
        .is_ok_and(|t| t.lines().nth(7).is_some_and(|l| l.trim() == "ready"))
    {
        assert!(
            Instant::now() < deadline,
            "postgres never started: {}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    data
}

/// Expects the client's task to end with FATAL 57P01 from the gateway's shutdown.
async fn ended_by_shutdown(task: tokio::task::JoinHandle<Result<i32, tokio_postgres::Error>>) {
    let err = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("a queued client was left waiting after SIGTERM")
        .unwrap()
        .expect_err("a queued client was served during shutdown");
    assert_eq!(err.code().map(|c| c.code()), Some("57P01"), "{err:?}");
    assert!(message(&err).contains("shutting down"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_queued_clients_at_once_and_stops_the_waking_server() {
    // The default shutdown_grace (30 s): queued clients must not make the gateway wait it out.
    let gw = Arc::new(
        blocking(|| {
            Gateway::start_local(
                &["held"],
                &format!("{PLAINTEXT}\n{HELD_WAKE}"),
                HELD_LOGINS,
                &[],
            )
        })
        .await
        .unwrap(),
    );
    let waiting = queue_clients(&gw, "held", 3).await;
    let g = gw.clone();
    let data = blocking(move || wait_for_postmaster(&g, "held"))
        .await
        .unwrap();
    assert_eq!(gw.tenant_state("held").0, "waking");
    let mut gw = Arc::into_inner(gw).expect("no other handle on the gateway");

    let sent = Instant::now();
    gw.signal("-TERM");
    for w in waiting {
        ended_by_shutdown(w).await;
    }
    let answered = sent.elapsed();
    assert!(
        answered < Duration::from_secs(5),
        "queued clients answered {answered:?} after SIGTERM"
    );
    let (exited, gw) = blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw))
        .await
        .unwrap();
    assert!(
        exited,
        "pgwake still running 20 s after SIGTERM with only queued clients: {}",
        gw.log()
    );
    assert_eq!(
        server_processes(&data),
        Vec::<u32>::new(),
        "the server whose wake was under way outlived the gateway: {}",
        gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_a_relaying_transaction_for_the_grace_period_only() {
    // One tenant relaying on a running Postgres, one whose wake is held.
    let pg = blocking(backend).await.unwrap();
    let tenants = format!(
        "{}[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n",
        Gateway::local_tenants(&["held"], HELD_LOGINS),
        pg.port
    );
    let grace = Duration::from_secs(10);
    let gw = Arc::new(Gateway::launch(
        &format!("{PLAINTEXT}\n{HELD_WAKE}"),
        &tenants,
        &[("PGWAKE_LIMITS__SHUTDOWN_GRACE", "10s")],
    ));
    let relaying = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=alpha.postgres sslmode=disable",
        gw.port, pg.options.user, pg.options.password
    );
    let (client, conn) = tokio_postgres::connect(&relaying, NoTls).await.unwrap();
    let conn = tokio::spawn(conn);
    client.simple_query("begin").await.unwrap();
    client
        .simple_query("create temporary table t (n int)")
        .await
        .unwrap();
    let waiting = queue_clients(&gw, "held", 2).await;
    let mut gw = Arc::into_inner(gw).expect("no other handle on the gateway");

    let sent = Instant::now();
    gw.signal("-TERM");
    for w in waiting {
        ended_by_shutdown(w).await;
    }
    // The transaction goes on after the queued clients are gone, within the grace period.
    tokio::time::sleep(Duration::from_secs(1)).await;
    client
        .simple_query("insert into t values (1)")
        .await
        .expect("the transaction lives on in the grace period");
    assert!(sent.elapsed() < grace);
    let err = tokio::time::timeout(grace + Duration::from_secs(10), conn)
        .await
        .expect("the session ended after the grace period")
        .unwrap()
        .expect_err("ended with an error");
    assert_eq!(err.code().map(|c| c.code()), Some("57P01"), "{err}");
    let ended = sent.elapsed();
    assert!(
        ended >= grace - Duration::from_secs(1),
        "the relaying session ended {ended:?} after SIGTERM, before its grace of {grace:?}"
    );
    let (exited, gw) = blocking(move || (gw.wait_exit(Duration::from_secs(20)), gw))
        .await
        .unwrap();
    assert!(exited, "pgwake did not exit: {}", gw.log());
    assert_eq!(
        server_processes(&gw.local_dir("held").join("data")),
        Vec::<u32>::new(),
        "the server whose wake was under way outlived the gateway: {}",
        gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_timeout_gets_57p03() {
    let gw = blocking(|| {
        Gateway::start_local(
            &["late"],
            &format!("{PLAINTEXT}\n[wake]\nwake_timeout = \"1s\"\nattempts = 1"),
            "pre_auth_delay = '5s'",
            &[],
        )
    })
    .await
    .unwrap();
    let started = Instant::now();
    let err = select_one(&conninfo(&gw, "late"))
        .await
        .expect_err("timed out");
    assert_eq!(err.code().map(|c| c.code()), Some("57P03"), "{err}");
    assert!(
        message(&err).contains("did not start within 1 s"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_tenant_fails_cleanly_and_is_retried() {
    let gw = blocking(|| {
        Gateway::start_local(
            &["ok", "broken"],
            &format!(
                "{PLAINTEXT}\n[wake]\nfailed_retry_delay = \"1s\"\nretry_backoff = \"50ms\"\nattempts = 2"
            ),
            "",
            &[],
        )
    })
    .await
    .unwrap();
    // A data directory that claims to exist but holds nothing Postgres can start from.
    let data = gw.local_dir("broken").join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("PG_VERSION"), "15\n").unwrap();
    let chown = Command::new("chown")
        .args(["-R", "postgres:", gw.local_dir("broken").to_str().unwrap()])
        .status();
    assert!(chown.is_ok());

    let err = select_one(&conninfo(&gw, "broken"))
        .await
        .expect_err("broken");
    assert_eq!(err.code().map(|c| c.code()), Some("57P03"), "{err}");
    assert!(message(&err).contains("failed to start"), "{err:?}");
    let log = gw.log();
    assert!(
        log.contains("wake failed") && log.contains("postgres exited"),
        "{log}"
    );
    assert_eq!(gw.tenant_state("broken").0, "failed");
    // Inside the retry delay the tenant is refused without a new attempt.
    let err = select_one(&conninfo(&gw, "broken"))
        .await
        .expect_err("still failed");
    assert_eq!(err.code().map(|c| c.code()), Some("57P03"));
    assert_eq!(
        gw.metric("pgwake_wakes_total{backend=\"local\",outcome=\"error\"}"),
        1.0
    );
    // Other tenants are unaffected.
    assert_eq!(select_one(&conninfo(&gw, "ok")).await.unwrap(), 1);
    // After the delay the next connection makes a new attempt.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    select_one(&conninfo(&gw, "broken"))
        .await
        .expect_err("still broken");
    assert_eq!(
        gw.metric("pgwake_wakes_total{backend=\"local\",outcome=\"error\"}"),
        2.0
    );
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tenant_sleeps_and_wakes_again() {
    let gw = blocking(|| {
        Gateway::start_local(
            &["nap"],
            &format!("{PLAINTEXT}\n[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"100ms\""),
            "",
            &[],
        )
    })
    .await
    .unwrap();
    let pidfile = gw.local_dir("nap").join("data").join("postmaster.pid");
    assert_eq!(gw.tenant_state("nap").0, "asleep");
    assert_eq!(select_one(&conninfo(&gw, "nap")).await.unwrap(), 1);
    assert!(pidfile.exists(), "postgres is running");
    let gw = blocking(move || {
        gw.wait_state("nap", "asleep", Duration::from_secs(10));
        gw
    })
    .await
    .unwrap();
    assert!(!pidfile.exists(), "postgres stopped");
    assert_eq!(select_one(&conninfo(&gw, "nap")).await.unwrap(), 1);
    assert_eq!(gw.tenant_state("nap").0, "awake");
    blocking(move || {
        gw.wait_state("nap", "asleep", Duration::from_secs(10));
        gw.wait_idle();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_notice_after_gateway_authentication() {
    let gw = blocking(|| {
        Gateway::start_local(
            &["loud"],
            &format!("{PLAINTEXT}\n[wake]\nwake_notice = true"),
            "",
            &[],
        )
    })
    .await
    .unwrap();
    let out = Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-c", "select 2"])
        .arg(conninfo(&gw, "loud"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2", "{stderr}");
    assert!(
        stderr.contains("waking database for tenant \"loud\""),
        "{stderr}"
    );
    let gw = blocking(move || {
        gw.wait_idle();
        let (status, body) = gw
            .http("POST", "/v1/tenants/loud/sleep")
            .expect("admin sleep");
        assert_eq!(status, 200, "{body}");
        gw
    })
    .await
    .unwrap();
    assert_eq!(
        select_one(&conninfo(&gw, "loud"))
            .await
            .expect("tokio-postgres takes the notice"),
        1
    );
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[test]
fn quickstart_serves_a_sleeping_tenant() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (port, admin) = (pgwake_testkit::free_port(), pgwake_testkit::free_port());
    let qs_dir = dir.path().join("qs");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .arg("quickstart")
        .arg("--dir")
        .arg(&qs_dir)
        .args(["--tenants", "alpha,beta", "--idle-timeout", "1s"])
        .args([
            "--port",
            &port.to_string(),
            "--admin-port",
            &admin.to_string(),
            "--http-port",
            &pgwake_testkit::free_port().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("qs.log")).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut banner = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !banner.contains("Stop with Ctrl-C") {
        let mut buf = [0u8; 1024];
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0 && Instant::now() < deadline, "no banner: {banner}");
        banner.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let line = banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("psql \"postgres://"))
        .map(|rest| format!("postgres://{}", rest.trim_end_matches('"')))
        .expect("a psql line for alpha");
    let tenants = |admin: u16| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", admin)).unwrap();
        std::io::Write::write_all(&mut s, b"GET /v1/tenants HTTP/1.0\r\n\r\n").unwrap();
        let mut t = String::new();
        std::io::Read::read_to_string(&mut s, &mut t).unwrap();
        t
    };
    assert!(tenants(admin).contains("\"id\":\"alpha\",\"backend\":\"local\",\"state\":\"asleep\""));
    let out = Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-c", "select 'hello'"])
        .arg(&line)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tenants(admin).contains("\"id\":\"alpha\",\"backend\":\"local\",\"state\":\"awake\""));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tenants(admin).contains("\"id\":\"alpha\",\"backend\":\"local\",\"state\":\"asleep\"") {
        assert!(Instant::now() < deadline, "alpha never went back to sleep");
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "quickstart did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !qs_dir.join("data/alpha/data/postmaster.pid").exists(),
        "postgres outlived the gateway"
    );
}
