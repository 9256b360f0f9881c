//! A backend connection a revived session logged in on is kept for the next client like any
//! other, and that client is greeted as a fresh login would greet it: with the backend's
//! ParameterStatus messages. Found by pgx's own suite with parking on (testkit/drivers): its
//! simple protocol refuses a connection that never said `standard_conforming_strings = on`.
//! Real Postgres, tokio-postgres clients, and psycopg (libpq) for what the last client was told.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Gateway, backend, connect_plain, verified_fixed_tenant, wait_returns};

/// Plaintext clients, sessions parked after 200 ms of quiet (their backend connection kept).
const CONFIG: &str = "allow_plaintext = true
[revival]
snapshot_after = \"50ms\"
park_session_after = \"200ms\"
";

/// Waits until `pgwake_sessions_parked` is `n`.
async fn wait_parked(gw: &Gateway, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.metric("pgwake_sessions_parked") != n {
        assert!(Instant::now() < deadline, "not {n} sessions parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_logged_in_for_a_revival_greets_its_next_client_in_full() {
    let psycopg = Command::new("python3")
        .args(["-c", "import psycopg"])
        .output();
    if !psycopg.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: needs python3 with psycopg");
        return;
    }
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tenants = verified_fixed_tenant(dir.path(), &pg);
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(CONFIG, &tenants, &[]))
        .await
        .unwrap();
    let info = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=postgres options='endpoint=alpha' \
         sslmode=disable",
        gw.port, pg.options.user, pg.options.password
    );
    // The session parks (its login backend, whose pid its client holds, is closed), is
    // revived on a connection logged in for it, and parks again: that connection is kept.
    let session = connect_plain(&info).await;
    session.simple_query("SELECT 1").await.unwrap();
    wait_parked(&gw, 1.0).await;
    session.simple_query("SELECT 1").await.unwrap();
    wait_parked(&gw, 1.0).await;
    wait_returns(&gw, "kept", 1.0).await;
    // The next client (with tokio-postgres's startup parameters, so it may take that
    // connection) takes it: what was it told at its login?
    let dsn = format!(
        "{} client_encoding=UTF8",
        info.replace("options='endpoint=alpha'", "options=endpoint=alpha")
    );
    let script = "import sys, psycopg\n\
        with psycopg.connect(sys.argv[1]) as c:\n\
        \x20   i = c.info\n\
        \x20   print(i.parameter_status('standard_conforming_strings'), i.parameter_status('server_version') is not None, i.backend_pid)\n";
    let out = Command::new("python3")
        .args(["-c", script, &dsn])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let told = String::from_utf8_lossy(&out.stdout);
    assert!(
        told.starts_with("b'on' True ") || told.starts_with("on True "),
        "the client was greeted without the backend's parameters: {told}"
    );
}
