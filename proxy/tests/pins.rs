//! Sessions pinned to their backend connections, as the operator sees them: `GET /v1/tenants`
//! says which sessions keep an awake tenant from sleeping and why, `pgwake_sessions_pinned`
//! counts them, the log says once that the tenant cannot sleep, and a client refused for a
//! capped tenant whose places pinned sessions hold is told so. Real Postgres, real clients.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD};

/// Idle timeout 1 s, snapshots after 200 ms of quiet, waits for a backend slot of 2 s.
const CONFIG: &str = "allow_plaintext = true
[wake]
idle_timeout = \"1s\"
idle_check_interval = \"100ms\"
[revival]
snapshot_after = \"200ms\"
[limits]
backend_wait_timeout = \"2s\"
";

/// The log line the idle sleeper writes once per episode.
const CANNOT_SLEEP: &str = "past its idle timeout, the tenant cannot sleep";

fn conninfo(gw: &Gateway, application: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=capped.postgres \
         sslmode=disable connect_timeout=30 application_name={application}",
        gw.port
    )
}

/// The tenant's pinned sessions as `/v1/tenants` lists them, once `n` are listed.
fn wait_pinned(gw: &Gateway, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = gw.tenant("capped");
        let pinned = t["awake_because"]["pinned"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if pinned.len() == n {
            return pinned;
        }
        assert!(
            Instant::now() < deadline,
            "{n} pinned sessions expected: {t}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pinned_gauge(gw: &Gateway, reason: &str) -> f64 {
    gw.labelled_metric("pgwake_sessions_pinned", &[("reason", reason)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_sessions_say_why_their_tenant_is_awake_and_hold_its_backend_cap() {
    let tenants = format!(
        "{}max_backend_connections = 2\n",
        Gateway::local_tenants(&["capped"], "")
    );
    let gw = common::blocking(move || Gateway::launch(CONFIG, &tenants, &[]))
        .await
        .unwrap();
    let locker = common::connect_plain(&conninfo(&gw, "lock-holder")).await;
    locker
        .query_one("select pg_advisory_lock(1)", &[])
        .await
        .unwrap();
    let temps = common::connect_plain(&conninfo(&gw, "temp-maker")).await;
    temps
        .batch_execute("create temp table scratch (x int)")
        .await
        .unwrap();

    // Both are pinned once they have been quiet for the snapshot: the tenant stays awake past
    // its idle timeout and says why.
    let gw = common::blocking(move || {
        let pinned = wait_pinned(&gw, 2);
        std::thread::sleep(Duration::from_secs(2));
        let t = gw.tenant("capped");
        assert_eq!(t["state"], "awake", "{t}");
        let because = &t["awake_because"];
        assert_eq!(because["active_sessions"], 0, "{t}");
        assert_eq!(because["open_transactions"], 0, "{t}");
        assert_eq!(because["other_replica"], false, "{t}");
        let by_app = |app: &str| {
            pinned
                .iter()
                .find(|p| p["application_name"] == app)
                .unwrap_or_else(|| panic!("no pinned session of {app}: {t}"))
                .clone()
        };
        let lock = by_app("lock-holder");
        assert_eq!(lock["reasons"], serde_json::json!(["advisory_lock"]));
        assert_eq!(lock["description"], "session advisory lock");
        assert!(
            lock["client"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{lock}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let since = lock["since"].as_f64().unwrap();
        assert!(since > now - 30.0 && since <= now, "{lock}");
        let temp = by_app("temp-maker");
        assert_eq!(temp["reasons"], serde_json::json!(["temp_objects"]));

        assert_eq!(pinned_gauge(&gw, "advisory_lock"), 1.0);
        assert_eq!(pinned_gauge(&gw, "temp_objects"), 1.0);
        assert_eq!(pinned_gauge(&gw, "listen"), 0.0);

        // Said once in this episode, with the reasons.
        let log = gw.log();
        let said: Vec<&str> = log.lines().filter(|l| l.contains(CANNOT_SLEEP)).collect();
        assert_eq!(said.len(), 1, "{said:#?}");
        println!("the log said: {}", said[0]);
        assert!(
            said[0].contains("session advisory lock") && said[0].contains("lock-holder"),
            "{}",
            said[0]
        );
        gw
    })
    .await
    .unwrap();

    // Both places under the cap are held by the pinned sessions: a new client waits out
    // backend_wait_timeout and is told which sessions hold them.
    let refused = tokio_postgres::connect(&conninfo(&gw, "newcomer"), tokio_postgres::NoTls).await;
    let err = refused.err().expect("no place for a third session");
    let db = err.as_db_error().unwrap_or_else(|| panic!("{err}"));
    assert_eq!(db.code().code(), "53300");
    let message = db.message();
    println!("the newcomer was told: {message}");
    for part in [
        "2 of its 2 max_backend_connections are held by sessions pinned to them",
        "session advisory lock",
        "application \"lock-holder\"",
        "temporary objects",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }

    // Released pins let the sessions move again: both park and the tenant sleeps.
    locker
        .query_one("select pg_advisory_unlock(1)", &[])
        .await
        .unwrap();
    temps.batch_execute("drop table scratch").await.unwrap();
    let gw = common::blocking(move || {
        gw.wait_state("capped", "asleep", Duration::from_secs(20));
        assert_eq!(pinned_gauge(&gw, "advisory_lock"), 0.0);
        assert_eq!(pinned_gauge(&gw, "temp_objects"), 0.0);
        assert_eq!(
            gw.tenant("capped")["awake_because"],
            serde_json::Value::Null
        );
        gw
    })
    .await
    .unwrap();
    let row = locker.query_one("select 1::int4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    drop(gw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_idle_in_a_transaction_is_counted_as_an_open_transaction() {
    let tenants = Gateway::local_tenants(&["capped"], "");
    let gw = common::blocking(move || Gateway::launch(CONFIG, &tenants, &[]))
        .await
        .unwrap();
    let client = common::connect_plain(&conninfo(&gw, "open-tx")).await;
    client.batch_execute("begin; select 1").await.unwrap();
    let gw = common::blocking(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let t = gw.tenant("capped");
        assert_eq!(t["state"], "awake", "{t}");
        assert_eq!(t["awake_because"]["open_transactions"], 1, "{t}");
        assert_eq!(t["awake_because"]["active_sessions"], 0, "{t}");
        gw
    })
    .await
    .unwrap();
    client.batch_execute("commit").await.unwrap();
    common::blocking(move || {
        gw.wait_state("capped", "asleep", Duration::from_secs(20));
    })
    .await
    .unwrap();
}

/// A session parked on its own comes back to a capped tenant whose places pinned sessions took
/// meanwhile: its revival waits out backend_wait_timeout and the client is told which sessions
/// hold the places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revival_that_finds_every_place_pinned_names_the_pins() {
    let config = "allow_plaintext = true
[wake]
idle_timeout = \"1h\"
[revival]
snapshot_after = \"200ms\"
park_session_after = \"300ms\"
[limits]
backend_wait_timeout = \"2s\"
";
    let tenants = format!(
        "{}max_backend_connections = 2\n",
        Gateway::local_tenants(&["capped"], "")
    );
    let gw = common::blocking(move || Gateway::launch(config, &tenants, &[]))
        .await
        .unwrap();
    let parked = common::connect_plain(&conninfo(&gw, "parked-one")).await;
    parked.query_one("select 1::int4", &[]).await.unwrap();
    let gw = common::blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while gw.tenant("capped")["parked"] != 1 {
            assert!(Instant::now() < deadline, "{}", gw.tenant("capped"));
            std::thread::sleep(Duration::from_millis(50));
        }
        gw
    })
    .await
    .unwrap();
    // The parked session's kept connection gives its place up to the second of these.
    let locker = common::connect_plain(&conninfo(&gw, "lock-holder")).await;
    locker
        .query_one("select pg_advisory_lock(7)", &[])
        .await
        .unwrap();
    let temps = common::connect_plain(&conninfo(&gw, "temp-maker")).await;
    temps
        .batch_execute("create temp table scratch (x int)")
        .await
        .unwrap();
    let gw = common::blocking(move || {
        wait_pinned(&gw, 2);
        gw
    })
    .await
    .unwrap();

    let err = parked
        .query_one("select 1::int4", &[])
        .await
        .expect_err("no place for the revival");
    let db = err.as_db_error().unwrap_or_else(|| panic!("{err}"));
    println!("the parked session was told: {}", db.message());
    assert_eq!(db.code().code(), "08006");
    for part in [
        "could not restore this session",
        "2 of its 2 max_backend_connections are held by sessions pinned to them",
        "session advisory lock (application \"lock-holder\"",
    ] {
        assert!(db.message().contains(part), "{part:?} not in {db:?}");
    }
    drop((locker, temps, gw));
}
