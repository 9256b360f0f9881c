//! Many sessions, few backends: a session quiet for `revival.park_session_after` parks on its
//! own while its tenant stays awake, its backend connection is kept for the next session of the
//! same user and startup parameters, and each session keeps its own settings and prepared
//! statements wherever it is revived. A real local Postgres and real tokio-postgres clients.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, PARK_ON_OWN, show};
use tokio_postgres::{Client, NoTls, Statement};

/// `pgwake_parks_total{reason="session_idle"}`.
fn parked_on_own(gw: &Gateway) -> f64 {
    gw.labelled_metric("pgwake_parks_total", &[("reason", "session_idle")])
}

/// Waits until `n` sessions in all have parked on their own.
async fn wait_parked(gw: &Gateway, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while parked_on_own(gw) < n {
        assert!(Instant::now() < deadline, "parks: {}", gw.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One session's own state, set once and checked after each revival.
struct Own {
    client: Client,
    name: &'static str,
    stmt: Statement,
}

impl Own {
    async fn new(gw: &Gateway, name: &'static str) -> Own {
        let client = connect_to(gw, "busy").await;
        client
            .batch_execute(&format!(
                "SET application_name = '{name}'; SET app.who = '{name}'"
            ))
            .await
            .unwrap();
        let stmt = client
            .prepare(&format!(
                "SELECT '{name}'::text || $1::text, pg_backend_pid()"
            ))
            .await
            .unwrap();
        Own { client, name, stmt }
    }

    /// Runs the session's statement and checks its settings; the backend it ran on.
    async fn check(&self, round: i32) -> i32 {
        let row = self
            .client
            .query_one(&self.stmt, &[&round.to_string()])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), format!("{}{round}", self.name));
        assert_eq!(show(&self.client, "application_name").await, self.name);
        assert_eq!(show(&self.client, "app.who").await, self.name);
        row.get(1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_sessions_park_on_their_own_and_share_backend_connections() {
    let gw = tokio::task::spawn_blocking(|| Gateway::start_local(&["busy"], PARK_ON_OWN, "", &[]))
        .await
        .unwrap();
    let a = Own::new(&gw, "alice").await;
    let b = Own::new(&gw, "bob").await;
    // The backends the sessions logged in on carry the pids their clients were given: they are
    // closed when their sessions first park, never handed to the other session.
    let logins = BTreeSet::from([a.check(0).await, b.check(0).await]);
    let mut pids = BTreeSet::new();
    let mut parks = 2.0;
    wait_parked(&gw, parks).await;
    assert_eq!(gw.tenant_state("busy").0, "awake", "the tenant stays awake");
    for round in 1..=3 {
        // One at a time: each revival after the first finds the kept connection.
        pids.insert(a.check(round).await);
        parks += 1.0;
        wait_parked(&gw, parks).await;
        pids.insert(b.check(round).await);
        parks += 1.0;
        wait_parked(&gw, parks).await;
    }
    assert!(
        pids.len() <= 2,
        "two revived sessions used {} backend processes: {pids:?}",
        pids.len()
    );
    assert!(
        pids.is_disjoint(&logins),
        "revived on {pids:?}, logged in on {logins:?}"
    );
    // The first revival finds nothing kept; every later one finds the other's connection.
    let hits = gw.labelled_metric("pgwake_backend_reuse_total", &[("outcome", "hit")]);
    assert!(hits >= 5.0, "revivals took kept connections: {hits}");
    let revived = gw.labelled_metric(
        "pgwake_revivals_total",
        &[("reason", "session_idle"), ("outcome", "ok")],
    );
    assert_eq!(revived, 6.0);
    drop((a, b));
    gw.wait_idle();
}

/// Sessions in the many-sessions test.
const SESSIONS: usize = 1000;
/// The cap on the gateway's connections to the tenant's database.
const CAP: i64 = 20;
/// How long the sessions run queries at random times.
const RUN: Duration = Duration::from_secs(60);
/// Queries each session runs in that time.
const QUERIES: usize = 3;

/// Connects straight to the local tenant's Postgres (its port from `postmaster.pid`), beside
/// the gateway, to watch `pg_stat_activity`.
async fn watch_backends(gw: &Gateway, tenant: &str) -> Client {
    let pid_file = gw.local_dir(tenant).join("data").join("postmaster.pid");
    let text = std::fs::read_to_string(pid_file).unwrap();
    let port: u16 = text.lines().nth(3).unwrap().trim().parse().unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={port} user=pgwake password={LOCAL_PASSWORD} dbname=postgres \
         sslmode=disable"
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// An error as a failure report shows it: the server's SQLSTATE and message when it sent one
/// (tokio-postgres displays only "db error").
fn why(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// One of the many sessions: its own application name, custom setting and named statement,
/// then `QUERIES` queries at random times within `RUN`, each checking all three.
async fn many_session(port: u16, n: usize, start: Instant) -> Result<(), String> {
    let conninfo = format!(
        "host=127.0.0.1 port={port} user=pgwake password={LOCAL_PASSWORD} \
         dbname=many.postgres sslmode=disable"
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls)
        .await
        .map_err(|e| format!("session {n} login: {}", why(&e)))?;
    tokio::spawn(conn);
    let set = format!("SET application_name = 's{n}'; SET app.n = '{n}'");
    client
        .batch_execute(&set)
        .await
        .map_err(|e| format!("{n} set: {}", why(&e)))?;
    let stmt = client
        .prepare(&format!("SELECT $1::int4 + {n}"))
        .await
        .map_err(|e| format!("{n} prepare: {}", why(&e)))?;
    let mut times: Vec<Duration> = (0..QUERIES)
        .map(|_| RUN.mul_f64(rand::random::<f64>()))
        .collect();
    times.sort();
    for (i, at) in times.into_iter().enumerate() {
        tokio::time::sleep_until((start + at).into()).await;
        let row = client
            .query_one(&stmt, &[&(i as i32)])
            .await
            .map_err(|e| format!("{n} query {i}: {}", why(&e)))?;
        let sum: i32 = row.get(0);
        if sum != i as i32 + n as i32 {
            return Err(format!("session {n} got {sum} from its statement"));
        }
        let app = show(&client, "application_name").await;
        let own = show(&client, "app.n").await;
        if app != format!("s{n}") || own != n.to_string() {
            return Err(format!(
                "session {n} sees application_name {app}, app.n {own}"
            ));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_sessions_keep_their_state_on_twenty_backend_connections() {
    let tenants = format!(
        "{}max_backend_connections = {CAP}\n",
        Gateway::local_tenants(&["many"], "max_connections = '40'")
    );
    let config = "allow_plaintext = true
[wake]
idle_timeout = \"1h\"
[revival]
snapshot_after = \"100ms\"
park_session_after = \"200ms\"
[limits]
backend_wait_timeout = \"60s\"
";
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(config, &tenants, &[]))
        .await
        .unwrap();
    // Wake the tenant with one session, then watch its Postgres from the side.
    drop(connect_to(&gw, "many").await);
    let watcher = watch_backends(&gw, "many").await;
    let peak = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let (peak, stop) = (peak.clone(), stop.clone());
        tokio::spawn(async move {
            let sql = "SELECT count(*) FROM pg_stat_activity \
                       WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
            while !stop.load(Ordering::Relaxed) {
                let n: i64 = watcher.query_one(sql, &[]).await.unwrap().get(0);
                peak.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let start = Instant::now() + Duration::from_secs(5);
    let port = gw.port;
    let sessions: Vec<_> = (0..SESSIONS)
        .map(|n| tokio::spawn(many_session(port, n, start)))
        .collect();
    let mut failures = Vec::new();
    for s in sessions {
        if let Err(e) = s.await.unwrap() {
            failures.push(e);
        }
    }
    stop.store(true, Ordering::Relaxed);
    watching.await.unwrap();
    let peak = peak.load(Ordering::Relaxed);
    let waits = |o| gw.labelled_metric("pgwake_backend_waits_total", &[("outcome", o)]);
    println!(
        "{SESSIONS} sessions, {QUERIES} queries each in {RUN:?}: {} failed; peak gateway \
         connections in pg_stat_activity {peak}; waits: kept {} slot {} timeout {}; \
         parks {}; revivals {}",
        failures.len(),
        waits("kept"),
        waits("slot"),
        waits("timeout"),
        parked_on_own(&gw),
        gw.labelled_metric(
            "pgwake_revivals_total",
            &[("reason", "session_idle"), ("outcome", "ok")]
        ),
    );
    assert!(
        failures.is_empty(),
        "{:?}",
        &failures[..failures.len().min(5)]
    );
    assert!(
        peak <= CAP,
        "pg_stat_activity showed {peak} gateway connections"
    );
    assert!(peak > 0);
    gw.wait_idle();
}

async fn connect_to(gw: &Gateway, tenant: &str) -> Client {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}
