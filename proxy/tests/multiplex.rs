//! Many sessions, few backends: a session quiet for `revival.park_session_after` parks on its
//! own while its tenant stays awake, its backend connection is kept for the next session of the
//! same user and startup parameters, and each session keeps its own settings and prepared
//! statements wherever it is revived. A real local Postgres and real tokio-postgres clients.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, show};
use tokio_postgres::{Client, NoTls, Statement};

/// The tenant never sleeps here; sessions park on their own after half a second of quiet.
const PARK_ON_OWN: &str = "allow_plaintext = true
[wake]
idle_timeout = \"1h\"
[revival]
snapshot_after = \"100ms\"
park_session_after = \"300ms\"
";

async fn connect(gw: &Gateway) -> Client {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=busy.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

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
        let client = connect(gw).await;
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
    let mut pids = BTreeSet::new();
    pids.insert(a.check(0).await);
    pids.insert(b.check(0).await);
    let mut parks = 2.0;
    wait_parked(&gw, parks).await;
    assert_eq!(gw.tenant_state("busy").0, "awake", "the tenant stays awake");
    for round in 1..=3 {
        // One at a time: each revival finds the other's (or its own) kept connection.
        pids.insert(a.check(round).await);
        parks += 1.0;
        wait_parked(&gw, parks).await;
        pids.insert(b.check(round).await);
        parks += 1.0;
        wait_parked(&gw, parks).await;
    }
    assert!(
        pids.len() <= 2,
        "two sessions used {} backend processes: {pids:?}",
        pids.len()
    );
    let hits = gw.labelled_metric("pgwake_backend_reuse_total", &[("outcome", "hit")]);
    assert!(hits >= 6.0, "revivals took kept connections: {hits}");
    let revived = gw.labelled_metric(
        "pgwake_revivals_total",
        &[("reason", "session_idle"), ("outcome", "ok")],
    );
    assert_eq!(revived, 6.0);
    drop((a, b));
    gw.wait_idle();
}
