//! Sessions outlive their backend: idle sessions are parked while their tenant sleeps and
//! revived on their next message, pinned sessions keep the tenant awake (or are ended in force
//! mode), and a backend restarted under an idle session does not end it. Real Postgres servers,
//! real tokio-postgres and psql clients.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, backend, show, verified_fixed_tenant};
use pgwake_testkit::pg_bin_dir;
use tokio_postgres::{Client, NoTls};

/// Quick idle sleep and snapshots, so a test sees a tenant sleep within a couple of seconds.
const FAST: &str = "allow_plaintext = true
[wake]
idle_timeout = \"1s\"
idle_check_interval = \"100ms\"
[revival]
snapshot_after = \"200ms\"
";

fn conninfo(gw: &Gateway, tenant: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    )
}

async fn connect(
    conninfo: &str,
) -> (
    Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls).await.unwrap();
    (client, tokio::spawn(conn))
}

fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(f)
}

/// `pgwake_revivals_total` for one reason and outcome.
fn revivals(gw: &Gateway, reason: &str, outcome: &str) -> f64 {
    gw.labelled_metric(
        "pgwake_revivals_total",
        &[("reason", reason), ("outcome", outcome)],
    )
}

/// Waits until the gateway's log has `needle` at least `count` times.
fn wait_log(gw: &Gateway, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while gw.log().matches(needle).count() < count {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log: {}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_survives_tenant_sleep() {
    let gw = blocking(|| Gateway::start_local(&["nap"], FAST, "", &[]))
        .await
        .unwrap();
    let pidfile = gw.local_dir("nap").join("data").join("postmaster.pid");
    let (client, _conn) = connect(&conninfo(&gw, "nap")).await;
    client
        .batch_execute(
            "CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, name text);
             INSERT INTO app.items VALUES (1, 'one');
             SET search_path = app, public; SET statement_timeout = '5s'; SET app.x = 'hello'",
        )
        .await
        .unwrap();
    // Resolved through search_path: re-preparing before the settings would fail.
    let by_id = client
        .prepare("SELECT name FROM items WHERE id = $1")
        .await
        .unwrap();
    let plus_one = client.prepare("SELECT $1::int4 + 1").await.unwrap();
    let postmaster = std::fs::read_to_string(&pidfile).unwrap();
    let postmaster: u32 = postmaster.lines().next().unwrap().trim().parse().unwrap();

    let gw = blocking(move || {
        gw.wait_state("nap", "asleep", Duration::from_secs(15));
        gw
    })
    .await
    .unwrap();
    assert!(!pidfile.exists(), "postgres stopped");
    assert!(
        !std::path::Path::new(&format!("/proc/{postmaster}")).exists(),
        "the postmaster process {postmaster} is gone"
    );
    assert_eq!(gw.metric("pgwake_sessions_parked"), 1.0);
    let nap = gw.tenant("nap");
    assert_eq!(
        (&nap["connections"], &nap["parked"]),
        (&0.into(), &1.into())
    );

    let row = client.query_one(&by_id, &[&1i32]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "one");
    let row = client.query_one(&plus_one, &[&41i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(show(&client, "search_path").await, "app, public");
    assert_eq!(show(&client, "statement_timeout").await, "5s");
    assert_eq!(show(&client, "app.x").await, "hello");
    assert_eq!(gw.tenant_state("nap").0, "awake");
    assert_eq!(revivals(&gw, "idle_sleep", "ok"), 1.0);
    assert_eq!(gw.metric("pgwake_sessions_parked"), 0.0);
    let nap = gw.tenant("nap");
    assert_eq!(
        (&nap["connections"], &nap["parked"]),
        (&1.into(), &0.into())
    );

    // And again: the revived session parks and revives a second time.
    let gw = blocking(move || {
        gw.wait_state("nap", "asleep", Duration::from_secs(15));
        gw
    })
    .await
    .unwrap();
    let row = client.query_one(&plus_one, &[&1i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    assert_eq!(show(&client, "app.x").await, "hello");
    drop(client);
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[test]
fn psql_session_survives_tenant_sleep() {
    let gw = Gateway::start_local(&["nap"], FAST, "", &[]);
    let mut psql = Command::new(pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .arg(conninfo(&gw, "nap"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = psql.stdin.take().unwrap();
    writeln!(
        stdin,
        // `\;` makes one Query of both: the tracker cannot tell which statement PREPARE named.
        "SET app.x = 'from-psql'\\; PREPARE twice(int) AS SELECT $1 * 2;"
    )
    .unwrap();
    stdin.flush().unwrap();
    wait_log(&gw, "session state recorded", 1);
    gw.wait_state("nap", "asleep", Duration::from_secs(15));
    writeln!(stdin, "EXECUTE twice(21);\nSHOW app.x;\n\\q").unwrap();
    drop(stdin);
    let mut out = String::new();
    psql.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    psql.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(psql.wait().unwrap().success(), "{err}");
    assert_eq!(out.trim(), "42\nfrom-psql", "{err}");
    gw.wait_idle();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_sessions_keep_the_tenant_awake() {
    let gw = blocking(|| Gateway::start_local(&["pin"], FAST, "", &[]))
        .await
        .unwrap();
    let info = conninfo(&gw, "pin");
    let (tx, _c1) = connect(&info).await;
    tx.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let (temp, _c2) = connect(&info).await;
    temp.batch_execute("CREATE TEMP TABLE scratch (x int)")
        .await
        .unwrap();
    let (lock, _c3) = connect(&info).await;
    lock.batch_execute("SELECT pg_advisory_lock(42)")
        .await
        .unwrap();
    let (listen, _c4) = connect(&info).await;
    listen.batch_execute("LISTEN news").await.unwrap();
    let gw = blocking(move || {
        // Each of the SQL-checked pins is found when the session's state is recorded.
        for reason in ["temporary objects", "session advisory lock", "LISTEN"] {
            wait_log(&gw, &format!("pins={reason}"), 1);
        }
        // Three idle timeouts: the tenant would be asleep by now without the pins.
        std::thread::sleep(Duration::from_secs(3));
        gw
    })
    .await
    .unwrap();
    assert_eq!(gw.tenant_state("pin").0, "awake");
    assert_eq!(gw.metric("pgwake_sessions_parked"), 0.0);
    // Every pinned session still works on its own backend.
    tx.batch_execute("COMMIT").await.unwrap();
    temp.batch_execute("INSERT INTO scratch VALUES (1)")
        .await
        .unwrap();
    lock.batch_execute("SELECT pg_advisory_unlock(42)")
        .await
        .unwrap();
    listen.batch_execute("UNLISTEN news").await.unwrap();
    drop((tx, temp, lock, listen));
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_mode_ends_pinned_sessions_with_fatal() {
    let extra = format!("{FAST}pinned = \"terminate\"\n");
    let gw = blocking(move || Gateway::start_local(&["pin"], &extra, "", &[]))
        .await
        .unwrap();
    let (temp, conn) = connect(&conninfo(&gw, "pin")).await;
    temp.batch_execute("CREATE TEMP TABLE scratch (x int)")
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), conn)
        .await
        .expect("the gateway ends the pinned session")
        .unwrap();
    let err = ended.expect_err("ended with an error");
    let db = err.as_db_error().expect("a FATAL from the gateway");
    assert_eq!(db.code().code(), "57P05");
    assert!(
        db.message().contains("temporary objects"),
        "{}",
        db.message()
    );
    blocking(move || {
        gw.wait_state("pin", "asleep", Duration::from_secs(15));
        gw.wait_idle();
    })
    .await
    .unwrap();
}

/// Sends cancel requests until aborted (a request that arrives before the query starts is a
/// no-op, so one alone could be lost).
async fn cancel_after_start(token: tokio_postgres::CancelToken) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        token.cancel_query(NoTls).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_restart_under_an_idle_session() {
    let mut pg = blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tenants = verified_fixed_tenant(dir.path(), &pg);
    // The tenant never idles out here: the backend goes away under the session instead.
    let extra = FAST.replace("idle_timeout = \"1s\"", "idle_timeout = \"1h\"");
    let gw = blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    let info = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=alpha.postgres sslmode=disable",
        gw.port, pg.options.user, pg.options.password
    );
    let (client, _conn) = connect(&info).await;
    client
        .batch_execute("SET search_path = pg_catalog; SET app.x = 'kept'")
        .await
        .unwrap();
    let stmt = client.prepare("SELECT $1::text || '!'").await.unwrap();
    let old_pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let (gw, pg) = blocking(move || {
        // Quiet for three times snapshot_after: the session's state is recorded.
        std::thread::sleep(Duration::from_millis(600));
        wait_log(&gw, "session state recorded", 1);
        pg.pg_ctl_restart_fast().unwrap();
        (gw, pg)
    })
    .await
    .unwrap();
    let row = client.query_one(&stmt, &[&"still here"]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "still here!");
    assert_eq!(show(&client, "app.x").await, "kept");
    assert_eq!(show(&client, "search_path").await, "pg_catalog");
    let new_pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_ne!(old_pid, new_pid, "a new backend process");
    // The client's cancel key (issued by the gateway at login) now cancels on the new backend.
    let cancel = client.cancel_token();
    let sleeper = tokio::spawn(async move { cancel_after_start(cancel).await });
    let err = client
        .batch_execute("SELECT pg_sleep(30)")
        .await
        .expect_err("cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    sleeper.abort();
    assert_eq!(revivals(&gw, "backend_ended", "ok"), 1.0);

    // An operator's migrate moves the session to a fresh backend connection at once.
    let (status, body) = gw.http("POST", "/v1/tenants/alpha/migrate").unwrap();
    assert_eq!(status, 200, "{body}");
    let gw = blocking(move || {
        wait_log(&gw, "reason=\"migrate\"", 1);
        gw
    })
    .await
    .unwrap();
    let migrated_pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_ne!(migrated_pid, new_pid);
    let row = client.query_one(&stmt, &[&"moved"]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "moved!");
    drop(client);
    blocking(move || {
        gw.wait_idle();
        drop(pg);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_busy_session_keeps_every_session_on_its_backend() {
    let gw = blocking(|| Gateway::start_local(&["busy"], FAST, "", &[]))
        .await
        .unwrap();
    let info = conninfo(&gw, "busy");
    let (idle, _c1) = connect(&info).await;
    idle.batch_execute("SET app.x = 'idle'").await.unwrap();
    let idle_pid: i32 = idle
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let (busy, _c2) = connect(&info).await;
    // Three idle timeouts of queries, one every 200 ms: the tenant is never idle.
    for _ in 0..15 {
        busy.simple_query("SELECT 1").await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(gw.tenant_state("busy").0, "awake");
    assert_eq!(gw.metric("pgwake_sessions_parked"), 0.0);
    let still: i32 = idle
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        still, idle_pid,
        "the idle session kept its backend connection"
    );
    drop((idle, busy));
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_revival_ends_with_a_clear_fatal() {
    let extra = format!("{FAST}token_ttl = \"1s\"\n");
    let gw = blocking(move || Gateway::start_local(&["late"], &extra, "", &[]))
        .await
        .unwrap();
    let (client, conn) = connect(&conninfo(&gw, "late")).await;
    client.batch_execute("SET app.x = 'late'").await.unwrap();
    let gw = blocking(move || {
        gw.wait_state("late", "asleep", Duration::from_secs(15));
        // Parked past the token's expiry.
        std::thread::sleep(Duration::from_millis(1500));
        gw
    })
    .await
    .unwrap();
    // The message that found the session parked gets the FATAL.
    let err = client
        .simple_query("SELECT 1")
        .await
        .expect_err("the revival fails");
    let _ = conn.await;
    let db = err.as_db_error().expect("a FATAL from the gateway");
    assert_eq!(db.code().code(), "08006");
    assert!(
        db.message().contains("revival token expired"),
        "{}",
        db.message()
    );
    assert_eq!(revivals(&gw, "idle_sleep", "error"), 1.0);
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_the_wake_leaves_the_session_counted_as_parked() {
    // pre_auth_delay holds every login, the readiness probe's included, so the wake is slow.
    let gw = blocking(|| Gateway::start_local(&["nap"], FAST, "pre_auth_delay = '3s'", &[]))
        .await
        .unwrap();
    let (client, _conn) = connect(&conninfo(&gw, "nap")).await;
    client.batch_execute("SET app.x = 'kept'").await.unwrap();
    let gw = blocking(move || {
        gw.wait_state("nap", "asleep", Duration::from_secs(30));
        gw
    })
    .await
    .unwrap();
    assert_eq!(gw.tenant("nap")["parked"], 1);

    let token = client.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        token.cancel_query(NoTls).await.unwrap();
    });
    let err = client
        .batch_execute("SELECT 1")
        .await
        .expect_err("the wait for the wake was cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    canceller.await.unwrap();
    let nap = gw.tenant("nap");
    println!("after the cancel: {nap}");
    assert_eq!(nap["parked"], 1, "the session is parked still: {nap}");
    assert_eq!(gw.metric("pgwake_sessions_parked"), 1.0);

    // Its next message revives it; then it is counted parked no more.
    assert_eq!(show(&client, "app.x").await, "kept");
    assert_eq!(gw.tenant("nap")["parked"], 0);
}
