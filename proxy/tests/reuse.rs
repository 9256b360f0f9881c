//! Backend connection reuse: a gateway-authenticated client that leaves at a safe point hands
//! its backend connection, reset, to the next client with the same startup parameters. Real
//! Postgres (a local-backend tenant), real tokio-postgres clients.

mod common;

use std::time::Duration;

use common::{
    Gateway, LOCAL_PASSWORD, backend_pid, blocking, connect_plain, counted, show, wait_returns,
};
use tokio_postgres::NoTls;

const PLAINTEXT: &str = "allow_plaintext = true\n";

fn conninfo(gw: &Gateway, tenant: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departed_clients_hand_their_reset_backend_to_the_next() {
    let gw = blocking(|| Gateway::start_local(&["re"], PLAINTEXT, "", &[]))
        .await
        .unwrap();
    let info = conninfo(&gw, "re");

    // A session that changes settings and prepares statements, then says goodbye.
    let a = connect_plain(&info).await;
    let first = backend_pid(&a).await;
    a.batch_execute(
        "SET statement_timeout = '7s'; SET search_path = pg_catalog; \
         PREPARE by_sql AS SELECT 1",
    )
    .await
    .unwrap();
    a.prepare("SELECT $1::int4 + 1").await.unwrap();
    let default_path = {
        let b = connect_plain(&info).await;
        let p = show(&b, "search_path").await;
        drop(b);
        wait_returns(&gw, "kept", 1.0).await;
        p
    };
    drop(a);
    wait_returns(&gw, "kept", 2.0).await;
    assert_eq!(gw.metric("pgwake_backend_reuse_idle_connections"), 2.0);

    // The next client gets the newest kept connection: the first session's, reset.
    let c = connect_plain(&info).await;
    assert_eq!(backend_pid(&c).await, first, "the same backend process");
    assert_eq!(show(&c, "statement_timeout").await, "0");
    assert_eq!(show(&c, "search_path").await, default_path);
    // Over the simple protocol: tokio-postgres prepares a named statement for `query`.
    let rows = c
        .simple_query("SELECT count(*) FROM pg_prepared_statements")
        .await
        .unwrap();
    let statements = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    });
    assert_eq!(
        statements.as_deref(),
        Some("0"),
        "prepared statements discarded"
    );
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "hit"), 1.0);

    // A temp table pins the session: its connection is closed, not kept.
    c.batch_execute("CREATE TEMP TABLE scratch (x int)")
        .await
        .unwrap();
    drop(c);
    wait_returns(&gw, "not_safe", 1.0).await;
    // So is one left inside a transaction.
    let d = connect_plain(&info).await;
    let in_tx = backend_pid(&d).await;
    assert_ne!(in_tx, first);
    d.batch_execute("BEGIN; SELECT 1").await.unwrap();
    drop(d);
    wait_returns(&gw, "not_safe", 2.0).await;
    let e = connect_plain(&info).await;
    let e_pid = backend_pid(&e).await;
    assert!(e_pid != first && e_pid != in_tx, "neither was kept");
    let temp: i64 = e
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relname = 'scratch' AND relpersistence = 't'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(temp, 0);
    let e_cancel = e.cancel_token();
    drop(e);
    wait_returns(&gw, "kept", 3.0).await;

    // Cancel on a reused connection: the new client's own key works, the old client's does not.
    let f = connect_plain(&info).await;
    assert_eq!(backend_pid(&f).await, e_pid);
    let f_cancel = f.cancel_token();
    let stale_cancel = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = e_cancel.cancel_query(NoTls).await;
    });
    f.batch_execute("SELECT pg_sleep(0.6)")
        .await
        .expect("the old client's key cancels nothing");
    stale_cancel.await.unwrap();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        f_cancel.cancel_query(NoTls).await.unwrap();
    });
    let err = f
        .batch_execute("SELECT pg_sleep(30)")
        .await
        .expect_err("cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    canceller.await.unwrap();
    drop(f);
    wait_returns(&gw, "kept", 4.0).await;

    // A kept backend that dies is not handed out: the next client gets a fresh login.
    std::process::Command::new("kill")
        .args(["-TERM", &e_pid.to_string()])
        .status()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stale_before = counted(&gw, "pgwake_backend_reuse_total", "stale");
    let g = connect_plain(&info).await;
    let g_pid = backend_pid(&g).await;
    assert_ne!(g_pid, e_pid);
    assert_eq!(
        g.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0),
        1
    );
    assert!(counted(&gw, "pgwake_backend_reuse_total", "stale") > stale_before);
    drop(g);
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_off_means_a_new_backend_each_time() {
    let gw = blocking(|| {
        Gateway::start_local(
            &["fresh"],
            &format!("{PLAINTEXT}[reuse]\nenabled = false\n"),
            "",
            &[],
        )
    })
    .await
    .unwrap();
    let info = conninfo(&gw, "fresh");
    let a = connect_plain(&info).await;
    let first = backend_pid(&a).await;
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = connect_plain(&info).await;
    assert_ne!(backend_pid(&b).await, first);
    drop(b);
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "hit"), 0.0);
    blocking(move || gw.wait_idle()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_connections_do_not_keep_a_tenant_awake() {
    let config =
        format!("{PLAINTEXT}[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"100ms\"\n");
    let gw = blocking(move || Gateway::start_local(&["nap"], &config, "", &[]))
        .await
        .unwrap();
    let info = conninfo(&gw, "nap");
    let a = connect_plain(&info).await;
    let first = backend_pid(&a).await;
    drop(a);
    wait_returns(&gw, "kept", 1.0).await;
    // Nothing but the kept connection: the tenant sleeps, which closes it.
    let gw = blocking(move || {
        gw.wait_state("nap", "asleep", Duration::from_secs(15));
        gw
    })
    .await
    .unwrap();
    let b = connect_plain(&info).await;
    assert_ne!(backend_pid(&b).await, first, "a fresh login after the wake");
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "stale"), 1.0);
    drop(b);
    blocking(move || gw.wait_idle()).await.unwrap();
}
