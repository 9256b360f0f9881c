//! Backend connection reuse for passthrough tenants (`reuse_passthrough`): a client whose login
//! the backend let in without a password hands its reset backend connection to the next client
//! with the same startup; a backend that asks for a password never shares. Real Postgres
//! servers (one trusting host connections, one asking SCRAM, then md5), real tokio-postgres and
//! psql clients.

mod common;

use std::time::Duration;

use common::{Gateway, backend_pid, blocking, connect_plain, counted, wait_returns};
use pgwake_testkit::{PgOptions, TestPostgres};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

const PLAINTEXT: &str = "allow_plaintext = true\n";

fn start_pg(trust: bool) -> TestPostgres {
    TestPostgres::start(PgOptions {
        trust,
        ..PgOptions::default()
    })
    .expect("start postgres")
}

/// A `fixed` passthrough tenant on `pg`, opted in to reuse or not.
fn tenant(id: &str, pg: &TestPostgres, opt_in: bool) -> String {
    format!(
        "[[tenant]]\nid = \"{id}\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n\
         reuse_passthrough = {opt_in}\n",
        pg.port
    )
}

/// A conninfo for `tenant` through the gateway, with `password` when it is `Some`.
fn conninfo(gw: &Gateway, tenant: &str, password: Option<&str>) -> String {
    let password = password.map_or(String::new(), |p| format!(" password={p}"));
    format!(
        "host=127.0.0.1 port={} user=pgwake{password} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=30",
        gw.port
    )
}

/// The first column of the first row of `sql` over the simple protocol (no statement of the
/// client's own is prepared for it).
async fn simple_value(client: &Client, sql: &str) -> String {
    let rows = client.simple_query(sql).await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a row")
}

/// `SELECT pg_backend_pid()` through the gateway with psql.
fn psql_pid(gw: &Gateway, pg: &TestPostgres, tenant: &str) -> String {
    let info = format!("host=127.0.0.1 user=pgwake dbname={tenant}.postgres sslmode=disable");
    let out = gw.psql(pg, &info, "SELECT pg_backend_pid()");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_passthrough_clients_share_a_reset_backend() {
    let (gw, pg) = blocking(|| {
        let pg = start_pg(true);
        let tenants = format!(
            "{}{}",
            tenant("opted", &pg, true),
            tenant("plain", &pg, false)
        );
        (Gateway::launch(PLAINTEXT, &tenants, &[]), pg)
    })
    .await
    .unwrap();
    // No password: the backend trusts the gateway's address.
    let info = conninfo(&gw, "opted", None);

    let a = connect_plain(&info).await;
    let first = backend_pid(&a).await;
    a.batch_execute("SET statement_timeout = '7s'; PREPARE by_sql AS SELECT 1")
        .await
        .unwrap();
    let a_cancel = a.cancel_token();
    drop(a);
    wait_returns(&gw, "kept", 1.0).await;
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "miss"), 1.0);

    // The next client with the same startup gets the same backend process, reset.
    let b = connect_plain(&info).await;
    assert_eq!(backend_pid(&b).await, first, "the kept backend process");
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "hit"), 1.0);
    assert_eq!(simple_value(&b, "SHOW statement_timeout").await, "0");
    let statements = "SELECT count(*) FROM pg_prepared_statements";
    assert_eq!(simple_value(&b, statements).await, "0", "PREPARE discarded");

    // Cancel on the reused connection: the new client's key works, the old client's does not.
    let stale_cancel = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = a_cancel.cancel_query(NoTls).await;
    });
    b.batch_execute("SELECT pg_sleep(0.6)")
        .await
        .expect("the old client's key cancels nothing");
    stale_cancel.await.unwrap();
    let b_cancel = b.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        b_cancel.cancel_query(NoTls).await.unwrap();
    });
    let err = b
        .batch_execute("SELECT pg_sleep(30)")
        .await
        .expect_err("cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    canceller.await.unwrap();

    // A temp table pins the session: its connection is closed, and the next client has a new
    // backend without it.
    b.batch_execute("CREATE TEMP TABLE scratch (x int)")
        .await
        .unwrap();
    drop(b);
    wait_returns(&gw, "not_safe", 1.0).await;
    let c = connect_plain(&info).await;
    assert_ne!(
        backend_pid(&c).await,
        first,
        "the pinned connection was not kept"
    );
    let temp = "SELECT count(*) FROM pg_class WHERE relname = 'scratch' AND relpersistence = 't'";
    assert_eq!(simple_value(&c, temp).await, "0");
    drop(c);
    wait_returns(&gw, "kept", 2.0).await;

    // psql sends another startup (application_name): its own key, shared between its runs.
    let (gw, pg) = blocking(move || {
        let one = psql_pid(&gw, &pg, "opted");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(psql_pid(&gw, &pg, "opted"), one, "psql's second run reused");
        (gw, pg)
    })
    .await
    .unwrap();

    // Without the opt-in, each client gets its own backend and nothing is counted.
    let plain = conninfo(&gw, "plain", None);
    let hits = counted(&gw, "pgwake_backend_reuse_total", "hit");
    let d = connect_plain(&plain).await;
    let d_pid = backend_pid(&d).await;
    drop(d);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = connect_plain(&plain).await;
    assert_ne!(
        backend_pid(&e).await,
        d_pid,
        "no reuse without reuse_passthrough"
    );
    drop(e);
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "hit"), hits);
    let (gw, pg) = blocking(move || {
        assert_ne!(psql_pid(&gw, &pg, "plain"), psql_pid(&gw, &pg, "plain"));
        (gw, pg)
    })
    .await
    .unwrap();
    blocking(move || gw.wait_idle()).await.unwrap();
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_asks_for_a_password_never_shares() {
    let (gw, pg) = blocking(|| {
        let pg = start_pg(false);
        let gw = Gateway::launch(PLAINTEXT, &tenant("guarded", &pg, true), &[]);
        (gw, pg)
    })
    .await
    .unwrap();
    let info = conninfo(&gw, "guarded", Some(&pg.options.password));

    // SCRAM, then md5 (a password stored as md5 and an md5 line in pg_hba.conf).
    for round in 1..=2 {
        let a = connect_plain(&info).await;
        let first = backend_pid(&a).await;
        drop(a);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let b = connect_plain(&info).await;
        assert_ne!(backend_pid(&b).await, first, "round {round}: never reused");
        drop(b);
        let untrusted = counted(&gw, "pgwake_backend_reuse_total", "untrusted");
        assert_eq!(untrusted, 2.0 * round as f64);
        assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "hit"), 0.0);
        assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "miss"), 0.0);
        assert_eq!(gw.metric("pgwake_backend_reuse_idle_connections"), 0.0);
        if round == 2 {
            break;
        }
        let hba = pg.data_dir().join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(&hba, rules.replace("scram-sha-256", "md5")).unwrap();
        let password = pg.options.password.replace('\'', "''");
        pg.psql(&format!(
            "SET password_encryption = 'md5'; ALTER ROLE pgwake PASSWORD '{password}'; \
             SELECT pg_reload_conf()"
        ))
        .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        gw.log().contains("passthrough login asked for a password"),
        "the debug log says why"
    );
    // psql too.
    let (gw, pg) = blocking(move || {
        let info = "host=127.0.0.1 user=pgwake dbname=guarded.postgres sslmode=disable";
        let run = || {
            let out = gw.psql(&pg, info, "SELECT pg_backend_pid()");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        assert_ne!(run(), run());
        (gw, pg)
    })
    .await
    .unwrap();
    assert_eq!(counted(&gw, "pgwake_backend_reuse_total", "hit"), 0.0);
    blocking(move || gw.wait_idle()).await.unwrap();
    drop(pg);
}
