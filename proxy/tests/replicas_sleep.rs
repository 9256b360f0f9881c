//! Gateway replicas share the sleep decision through the Kubernetes API: a tenant that one
//! replica still serves stays awake however long the others have been idle, and then sleeps with
//! exactly one hibernation patch; a client reaching one replica while another puts the tenant to
//! sleep waits for the sleep and gets one wake; a killed replica stops holding its tenants awake
//! after its TTL; replicas predict from one history of the tenant's runs.
//!
//! Every replica is a real `pgwake` process with the deploy RBAC's ServiceAccount token, against
//! the real kube-apiserver lab; a fake operator plays CloudNativePG (see
//! `common/cnpg_operator.rs`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cnpg_operator::{hibernation, wait_hibernated, wait_hibernation};
use common::replicas::{
    Fleet, HibernationWatch, NAMESPACE, TTL, blocking, replica, replica_with_env,
};
use futures_util::future::join_all;
use pgwake_testkit::kube::KubeLab;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_with_active_clients_keeps_the_tenant_awake_then_one_patch_sleeps_it() {
    let lab = blocking(KubeLab::shared).await;
    let fleet = Arc::new(blocking(move || Fleet::start(lab, "busy", 2, "1s")).await);
    let watch = blocking(move || HibernationWatch::start(lab, "busy")).await;

    // Replica A wakes the tenant for one query; then it has no session at all.
    let a = fleet.connect(0).await;
    assert_eq!(
        a.query_one("select 1::int4", &[])
            .await
            .unwrap()
            .get::<_, i32>(0),
        1
    );
    drop(a);
    let a_left = Instant::now();

    // Replica B's clients keep querying for more than three of A's idle timeouts.
    let clients = join_all((0..3).map(|_| {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            let client = fleet.connect(1).await;
            let mut queries = 0;
            while a_left.elapsed() < Duration::from_millis(4500) {
                let n: i32 = client
                    .query_one("select 1::int4", &[])
                    .await
                    .expect("B's client got an error")
                    .get(0);
                assert_eq!(n, 1);
                queries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (client, queries)
        })
    }))
    .await;
    let clients: Vec<_> = clients.into_iter().map(|c| c.unwrap()).collect();
    assert!(clients.iter().all(|(_, q)| *q >= 15), "too few queries");
    let logs = fleet.logs();
    assert_eq!(hibernation(lab, NAMESPACE, "busy"), "off", "{logs}");
    assert_eq!(fleet.sleep_patches(), 0, "{logs}");
    // A did look, and left the tenant alone because B uses it.
    assert!(
        fleet.replicas[0]
            .log()
            .contains("another replica uses the tenant: not sleeping"),
        "{logs}"
    );

    // Now every replica's sessions are idle (B's clients stay connected without a query):
    // they park, and the tenant sleeps once.
    let fleet2 = fleet.clone();
    blocking(move || wait_hibernated(lab, NAMESPACE, fleet2.name)).await;
    // Long enough for a second sleeper to act if it were going to: two idle timeouts and a TTL.
    tokio::time::sleep(Duration::from_secs(2) + TTL).await;
    let logs = fleet.logs();
    assert_eq!(fleet.sleep_patches(), 1, "{logs}");
    assert_eq!(watch.turned_on(), 1, "{logs}");
    // The replica that did not decide the sleep learns of it from the record, not as a surprise.
    assert!(!logs.contains("database stopped on its own"), "{logs}");
    let decided: Vec<bool> = fleet
        .replicas
        .iter()
        .map(|g| {
            g.log()
                .contains("no replica uses the tenant: putting it to sleep")
        })
        .collect();
    assert_eq!(decided.iter().filter(|d| **d).count(), 1, "{logs}");
    for (g, decided) in fleet.replicas.iter().zip(&decided) {
        assert!(
            *decided || g.log().contains("another replica put the tenant to sleep"),
            "{logs}"
        );
    }
    let parked: u64 = fleet
        .replicas
        .iter()
        .map(|g| g.tenant("busy")["parked"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(parked, 3, "{logs}");

    // A parked client's next query wakes the tenant again, once.
    let (client, _) = &clients[0];
    let n: i32 = client
        .query_one("select 2::int4", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    assert_eq!(hibernation(lab, NAMESPACE, "busy"), "off");
    drop(clients);
    drop(watch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_reached_during_another_replicas_sleep_waits_and_wakes_once() {
    let lab = blocking(KubeLab::shared).await;
    let fleet = Arc::new(blocking(move || Fleet::start(lab, "handover", 2, "1s")).await);

    // Both replicas serve the tenant, B's client leaves first: B lets go of the tenant while A
    // still uses it, so it is A that puts the tenant to sleep.
    let a = fleet.connect(0).await;
    let b = fleet.connect(1).await;
    a.query_one("select 1::int4", &[]).await.unwrap();
    b.query_one("select 1::int4", &[]).await.unwrap();
    fleet.operator.set_slow_hibernation(true);
    drop(b);
    // A's client stays active (not idle) until B, past its idle timeout, has let go of the
    // tenant because A uses it; then it leaves. (Waiting for B's own word rather than a fixed
    // time: under load B's sleeper may look late, and then it would be B that sleeps.)
    let b_left = Instant::now();
    let b_let_go = "another replica uses the tenant: not sleeping";
    while b_left.elapsed() < Duration::from_millis(1500)
        || !fleet.replicas[1].log().contains(b_let_go)
    {
        assert!(
            b_left.elapsed() < Duration::from_secs(20),
            "B never let go: {}",
            fleet.logs()
        );
        a.query_one("select 1::int4", &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(a);
    let f = fleet.clone();
    blocking(move || f.replicas[0].wait_state("handover", "sleeping", Duration::from_secs(10)))
        .await;
    // "sleeping" shows once A has taken the record's sleeping mark; its hibernation patch is
    // sent just after, from the sleep's own task: wait for it to land.
    blocking(move || wait_hibernation(lab, NAMESPACE, "handover", "on")).await;
    let b_wakes = fleet.wake_patches(1);

    // A client reaches B while A's sleep is under way; the sleep then finishes.
    let f = fleet.clone();
    let client = tokio::spawn(async move {
        let started = Instant::now();
        let client = f.connect(1).await;
        let n: i32 = client.query_one("select 7::int4", &[]).await?.get(0);
        Ok::<_, tokio_postgres::Error>((n, started.elapsed()))
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!client.is_finished(), "answered before the sleep finished");
    assert_eq!(hibernation(lab, NAMESPACE, "handover"), "on");
    fleet.operator.set_slow_hibernation(false);

    let (n, waited) = client.await.unwrap().expect("B's client got an error");
    assert_eq!(n, 7);
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    let logs = fleet.logs();
    assert_eq!(hibernation(lab, NAMESPACE, "handover"), "off", "{logs}");
    // One sleep (A's), then one wake (B's), in that order.
    assert_eq!(fleet.sleep_patches(), 1, "{logs}");
    assert_eq!(fleet.wake_patches(1), b_wakes + 1, "{logs}");
    let a_log = fleet.replicas[0].log();
    let asleep = a_log.find("tenant asleep").expect("A finished its sleep");
    assert!(
        !a_log[asleep..].contains("hibernation=\"off\""),
        "A woke it: {logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_with_sigkill_stops_holding_its_tenant_after_the_ttl() {
    let lab = blocking(KubeLab::shared).await;
    // An idle timeout far beyond the test, so only the record can let the tenant sleep: B
    // (with a short one) waits for A's entry alone.
    let fleet = blocking(move || {
        let mut fleet = Fleet::start(lab, "killed", 1, "1h");
        fleet
            .replicas
            .push(replica(lab, "killed", fleet.pg_port, "1s"));
        fleet
    })
    .await;

    // A holds a session in a long query; B served a client that left.
    let a = fleet.connect(0).await;
    let a_query = tokio::spawn(async move { a.query_one("select pg_sleep(60)", &[]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = fleet.connect(1).await;
    b.query_one("select 1::int4", &[]).await.unwrap();
    drop(b);
    // Well past B's idle timeout, A still holds the tenant awake.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        hibernation(lab, NAMESPACE, "killed"),
        "off",
        "{}",
        fleet.logs()
    );

    let mut fleet = fleet;
    fleet.replicas[0].signal("-KILL");
    assert!(fleet.replicas[0].wait_exit(Duration::from_secs(5)));
    let killed = Instant::now();
    let _ = a_query.await;
    // Renewed at most half the TTL before the kill (due after a third, looked at every sixth):
    // it still counts for at least the other half.
    tokio::time::sleep(TTL / 3).await;
    assert_eq!(
        hibernation(lab, NAMESPACE, "killed"),
        "off",
        "{}",
        fleet.logs()
    );
    let deadline = killed + TTL + Duration::from_secs(3);
    while hibernation(lab, NAMESPACE, "killed") != "on" {
        assert!(
            Instant::now() < deadline,
            "still awake {:?} after the kill: {}",
            killed.elapsed(),
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let slept_after = killed.elapsed();
    assert!(slept_after >= TTL / 3, "{slept_after:?}");
    assert_eq!(fleet.sleep_patches(), 1, "{}", fleet.logs());
    assert!(
        fleet.replicas[1]
            .log()
            .contains("no replica uses the tenant: putting it to sleep")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_tenants_run_history_through_its_record() {
    let lab = blocking(KubeLab::shared).await;
    // Runs seconds apart count as runs (each comes after a sleep anyway).
    const GAP: (&str, &str) = ("PGWAKE_WAKE__PREDICT_RUN_GAP", "1s");
    let fleet = blocking(move || {
        let mut fleet = Fleet::start(lab, "habits", 0, "1s");
        let a = replica_with_env(lab, "habits", fleet.pg_port, "1s", &[GAP]);
        fleet.replicas.push(a);
        fleet
    })
    .await;
    // Three runs through replica A, each after the tenant slept.
    for _ in 0..3 {
        let client = fleet.connect(0).await;
        client.query_one("select 1::int4", &[]).await.unwrap();
        drop(client);
        blocking(move || wait_hibernated(lab, NAMESPACE, "habits")).await;
    }
    let remembered = |t: serde_json::Value| t["runs"]["remembered"].as_u64();
    assert_eq!(
        remembered(fleet.replicas[0].tenant("habits")),
        Some(3),
        "{}",
        fleet.logs()
    );
    // A replica started now reads them from the record before any client reaches it.
    let port = fleet.pg_port;
    let late = blocking(move || replica_with_env(lab, "habits", port, "1s", &[GAP])).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while remembered(late.tenant("habits")) != Some(3) {
        assert!(
            Instant::now() < deadline,
            "the late replica has {}: {}",
            late.tenant("habits"),
            late.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
