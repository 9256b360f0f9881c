//! Sleep exactly when idle: applications on real drivers that keep their connection open after
//! their last query (psycopg 3 after `executemany` or an empty pipeline, node-postgres pausing
//! before its last query) let their tenant sleep no earlier than `idle_timeout` and no later
//! than `idle_timeout + 2 × snapshot_after` after that query, and their next query on the same
//! connection works. A client that gives up on a query (an abandoned `/sql` request, a
//! session whose connection closes) has the query cancelled on the backend.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD};
use tokio::io::AsyncWriteExt;

const IDLE_TIMEOUT: f64 = 3.0;
const SNAPSHOT_AFTER: f64 = 0.5;

/// Idle sleep and snapshots scaled down; the sleeper's periodic look keeps its default (1 s), so
/// a sleep that waited for it would show.
fn config() -> String {
    format!(
        "allow_plaintext = true\n[wake]\nidle_timeout = \"{}ms\"\n[revival]\nsnapshot_after = \"{}ms\"\n",
        IDLE_TIMEOUT * 1000.0,
        SNAPSHOT_AFTER * 1000.0
    )
}

/// A client application as a child process, killed if the test fails before it exits.
struct App {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl App {
    fn start(mut cmd: Command) -> App {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the client application");
        let out = BufReader::new(child.stdout.take().unwrap());
        App { child, out }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the client application ended early");
        line.trim().to_owned()
    }

    /// Lets the application run its next query; returns what it printed.
    fn go_on(&mut self) -> String {
        self.child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
        let answer = self.line();
        assert!(self.child.wait().unwrap().success());
        answer
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A number field of the tenant's entry in `GET /v1/tenants`.
fn tenant_field(gw: &Gateway, tenant: &str, field: &str) -> f64 {
    let (_, body) = gw.http_get("/v1/tenants").expect("tenants");
    let all: serde_json::Value = serde_json::from_str(&body).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == tenant)
        .and_then(|t| t[field].as_f64())
        .unwrap_or_else(|| panic!("no {field} for {tenant} in {body}"))
}

/// Seconds from `last_query` (epoch seconds) until the tenant was asleep, from the `since` of
/// its `asleep` state in the tenant list.
fn asleep_after(gw: &Gateway, tenant: &str, last_query: f64) -> f64 {
    gw.wait_state(tenant, "asleep", Duration::from_secs(30));
    tenant_field(gw, tenant, "since") - last_query
}

/// While the tenant (the gateway's only local one) sleeps, its awake time stands still, and
/// the per-kind counter says the same.
fn check_awake_time(gw: &Gateway, tenant: &str) {
    let awake = tenant_field(gw, tenant, "awake_s");
    assert!(awake >= IDLE_TIMEOUT, "awake {awake} s");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        tenant_field(gw, tenant, "awake_s"),
        awake,
        "asleep, yet counting"
    );
    let counted = gw.labelled_metric("pgwake_tenant_awake_seconds_total", &[("backend", "local")]);
    assert!(
        (counted - awake).abs() < 1e-3,
        "metric {counted}, tenant {awake}"
    );
}

/// Runs `app`, checks when its tenant fell asleep after its last query, then that its next
/// query works and answers `expected`.
fn check_sleeps_on_time(gw: &Gateway, tenant: &str, what: &str, app: Command, expected: &str) {
    let mut app = App::start(app);
    let last_query: f64 = app.line().parse().expect("a time stamp");
    let slept = asleep_after(gw, tenant, last_query);
    eprintln!("{what}: asleep {slept:.2} s after the last query");
    assert!(
        slept >= IDLE_TIMEOUT,
        "{what}: asleep after {slept:.2} s, before the idle timeout"
    );
    assert!(
        slept <= IDLE_TIMEOUT + 2.0 * SNAPSHOT_AFTER,
        "{what}: asleep only {slept:.2} s after the last query (idle timeout {IDLE_TIMEOUT} s, \
         snapshot_after {SNAPSHOT_AFTER} s)\n{}",
        gw.log()
    );
    check_awake_time(gw, tenant);
    assert_eq!(app.go_on(), expected, "{what}: the next query");
}

fn psycopg(gw: &Gateway, tenant: &str, mode: &str) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/psycopg_idle.py"
    ))
    .arg(format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    ))
    .arg(mode);
    cmd
}

#[test]
fn psycopg_executemany_and_pipeline_let_the_tenant_sleep() {
    let gw = Gateway::start_local(&["py"], &config(), "", &[]);
    // Sync then Flush ends every psycopg pipeline, executemany's included.
    check_sleeps_on_time(
        &gw,
        "py",
        "psycopg executemany",
        psycopg(&gw, "py", "executemany"),
        "2",
    );
    // An empty pipeline sends a lone Flush; simple queries follow.
    check_sleeps_on_time(
        &gw,
        "py",
        "psycopg pipeline",
        psycopg(&gw, "py", "pipeline"),
        "2",
    );
}

#[test]
fn node_postgres_pausing_before_its_last_query_lets_the_tenant_sleep() {
    let dir = common::node_project("clients", "pg");
    let gw = Gateway::start_local(&["js"], &config(), "", &[]);
    // Pauses longer than snapshot_after: a snapshot is taken in the pause and outdated by the
    // last query.
    for pause_ms in ["1500", "2500"] {
        let mut cmd = Command::new("node");
        cmd.arg(dir.join("pg_idle.mjs"))
            .args([&gw.port.to_string(), "pgwake", LOCAL_PASSWORD])
            .args(["js.postgres", pause_ms]);
        let what = format!("node-postgres, {pause_ms} ms pause");
        check_sleeps_on_time(&gw, "js", &what, cmd, "42");
    }
}

/// Backends running `pg_sleep(20)`, as `watcher` sees them.
async fn sleepers(watcher: &tokio_postgres::Client) -> i64 {
    watcher
        .query_one(
            "select count(*) from pg_stat_activity \
             where query like '%pg_sleep(20)%' and pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until `pg_sleep(20)` runs (`running`) or no longer does; returns how long that took.
async fn wait_sleepers(watcher: &tokio_postgres::Client, running: bool) -> Duration {
    let start = Instant::now();
    while (sleepers(watcher).await > 0) != running {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pg_sleep(20) running: {}",
            !running
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_cancels_its_query() {
    let http = pgwake_testkit::free_port();
    let extra = format!("allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n");
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["quit"], &extra, "", &[]))
        .await
        .unwrap();
    let watcher = common::local_session(&gw, "quit").await;

    // SQL over HTTP: the request is abandoned (the connection closed) mid-query.
    let body = br#"{"query": "select pg_sleep(20)", "params": []}"#;
    let mut request = tokio::net::TcpStream::connect(("127.0.0.1", http))
        .await
        .unwrap();
    let head = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Neon-Connection-String: postgresql://pgwake:{LOCAL_PASSWORD}@quit.{}:5432/postgres\r\n\
         Content-Length: {}\r\n\r\n",
        common::SNI_SUFFIX,
        body.len()
    );
    request.write_all(head.as_bytes()).await.unwrap();
    request.write_all(body).await.unwrap();
    wait_sleepers(&watcher, true).await;
    drop(request);
    let gone = wait_sleepers(&watcher, false).await;
    eprintln!("abandoned /sql query gone after {gone:?}");
    assert!(gone <= Duration::from_secs(1), "took {gone:?}");

    // The Postgres protocol (TCP here; WebSocket sessions share the relay): psql is killed
    // while its query runs, so its connection closes without a Terminate.
    let mut psql = std::process::Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-c", "select pg_sleep(20)"])
        .arg(format!(
            "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=quit.postgres \
             sslmode=disable",
            gw.port
        ))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_sleepers(&watcher, true).await;
    psql.kill().unwrap();
    psql.wait().unwrap();
    let gone = wait_sleepers(&watcher, false).await;
    eprintln!("abandoned session query gone after {gone:?}");
    assert!(
        gone <= Duration::from_secs(1),
        "took {gone:?}\n{}",
        gw.log()
    );
}
