//! Gateway replicas through a Kubernetes API outage: the awake tenant keeps serving, new
//! sessions included, well past the replicas' activity TTL; no replica puts it to sleep while it
//! cannot confirm that the others are idle; once the API is back it sleeps with one patch.
//!
//! Its own test binary, so stopping this lab's API server disturbs no other test.

mod common;

use std::time::{Duration, Instant};

use common::cnpg_operator::{hibernation, wait_hibernated};
use common::replicas::{Fleet, NAMESPACE, TTL, blocking};
use pgwake_testkit::kube::KubeLab;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_serves_through_an_api_outage_and_nothing_sleeps_until_it_ends() {
    let lab = blocking(KubeLab::shared).await;
    let fleet = blocking(move || Fleet::start(lab, "outage", 2, "1s")).await;
    let a = fleet.connect(0).await;
    a.query_one("select 1::int4", &[]).await.unwrap();
    let b = fleet.connect(1).await;
    b.query_one("select 1::int4", &[]).await.unwrap();
    drop(b);

    blocking(move || lab.stop_apiserver().unwrap()).await;
    let outage = Instant::now();
    // Twice the TTL: every entry in the record has expired by its own clock.
    while outage.elapsed() < 2 * TTL {
        let n: i32 = a.query_one("select 3::int4", &[]).await.unwrap().get(0);
        assert_eq!(n, 3);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A new session on B, whose own clients left before the outage.
    let b = fleet.connect(1).await;
    let n: i32 = b.query_one("select 4::int4", &[]).await.unwrap().get(0);
    assert_eq!(n, 4);
    drop((a, b));
    // Past the idle timeout and another TTL, nobody has started a sleep.
    tokio::time::sleep(Duration::from_secs(1) + TTL).await;
    let logs = fleet.logs();
    for replica in &fleet.replicas {
        assert_eq!(replica.tenant_state("outage").0, "awake", "{logs}");
    }
    assert!(
        logs.contains("cannot confirm that no other replica uses the tenant: not sleeping"),
        "{logs}"
    );
    assert!(!logs.contains("putting it to sleep"), "{logs}");

    blocking(move || lab.start_apiserver().unwrap()).await;
    blocking(move || wait_hibernated(lab, NAMESPACE, "outage")).await;
    assert_eq!(hibernation(lab, NAMESPACE, "outage"), "on");
    assert_eq!(fleet.sleep_patches(), 1, "{}", fleet.logs());
}
