//! The `cnpg` backend against a real kube-apiserver: a hibernated Cluster is woken by its
//! annotation when a client connects, a wake storm patches once, and idle sleep hibernates it.
//!
//! No CloudNativePG operator runs here, so a fake operator (named as such, below) plays its part:
//! it follows the annotation, starts or stops a real Postgres that the tenant's endpoint
//! override points at, and writes the Cluster's status through the status subresource.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{Gateway, backend};
use pgwake_testkit::TestPostgres;
use pgwake_testkit::kube::KubeLab;
use serde_json::json;
use tokio_postgres::NoTls;

const NAMESPACE: &str = "tenants";

fn cluster_path(name: &str) -> String {
    format!("/apis/postgresql.cnpg.io/v1/namespaces/{NAMESPACE}/clusters/{name}")
}

/// Fake CloudNativePG operator for one Cluster: polls it and makes the world match the
/// `cnpg.io/hibernation` annotation, as the real operator would with pods.
struct FakeOperator {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeOperator {
    fn run(
        lab: &'static KubeLab,
        name: &'static str,
        pg: Arc<Mutex<TestPostgres>>,
    ) -> FakeOperator {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let Ok(obj) = lab.get(&cluster_path(name)).and_then(|r| r.success_json()) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let hibernate = obj["metadata"]["annotations"]["cnpg.io/hibernation"] == "on";
                let mut pg = pg.lock().unwrap();
                let ready = obj["status"]["readyInstances"].as_i64().unwrap_or(0) >= 1;
                if hibernate && (pg.is_running() || ready) {
                    pg.stop();
                    let status = json!({ "status": {
                        "readyInstances": null,
                        "phase": "Cluster in healthy state",
                        "conditions": [{ "type": "cnpg.io/hibernation", "status": "True", "reason": "Hibernated" }]
                    }});
                    lab.merge_patch(&format!("{}/status", cluster_path(name)), &status)
                        .unwrap();
                } else if !hibernate && (!pg.is_running() || !ready) {
                    pg.resume().unwrap();
                    let status = json!({ "status": {
                        "readyInstances": 1,
                        "phase": "Cluster in healthy state",
                        "conditions": null
                    }});
                    lab.merge_patch(&format!("{}/status", cluster_path(name)), &status)
                        .unwrap();
                }
                drop(pg);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FakeOperator {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeOperator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A hibernated Cluster `name` whose "primary" is a real Postgres, stopped.
fn hibernated_cluster(
    lab: &'static KubeLab,
    name: &'static str,
) -> (Arc<Mutex<TestPostgres>>, FakeOperator) {
    lab.ensure_namespace(NAMESPACE).unwrap();
    let manifest = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": { "pgwake.io/tenant": name },
            "annotations": { "cnpg.io/hibernation": "on" }
        },
        "spec": { "instances": 1, "storage": { "size": "1Gi" } }
    });
    lab.create(
        &format!("/apis/postgresql.cnpg.io/v1/namespaces/{NAMESPACE}/clusters"),
        &manifest.to_string(),
    )
    .unwrap()
    .success_json()
    .unwrap();
    let mut pg = backend();
    pg.stop();
    let pg = Arc::new(Mutex::new(pg));
    let operator = FakeOperator::run(lab, name, pg.clone());
    (pg, operator)
}

fn gateway_for(lab: &KubeLab, name: &str, pg: &TestPostgres, extra: &str) -> Gateway {
    let kubeconfig = lab.kubeconfig_for_token(lab.admin_token()).unwrap();
    let tenants = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\n\
         [[tenant]]\nid = \"{name}\"\n\
         backend = {{ kind = \"cnpg\", cluster = \"{name}\", namespace = \"{NAMESPACE}\", endpoint = \"127.0.0.1:{}\" }}\n",
        kubeconfig.display(),
        pg.port
    );
    Gateway::launch(&format!("allow_plaintext = true\n{extra}"), &tenants, &[])
}

fn annotation(lab: &KubeLab, name: &str) -> String {
    let obj = lab
        .get(&cluster_path(name))
        .unwrap()
        .success_json()
        .unwrap();
    obj["metadata"]["annotations"]["cnpg.io/hibernation"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_storm_wakes_a_hibernated_cluster_with_one_patch() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let (pg, _operator) = tokio::task::spawn_blocking(|| hibernated_cluster(lab, "storm"))
        .await
        .unwrap();
    let (port, user, password) = {
        let pg = pg.lock().unwrap();
        (
            pg.port,
            pg.options.user.clone(),
            pg.options.password.clone(),
        )
    };
    let gw = {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || gateway_for(lab, "storm", &pg.lock().unwrap(), ""))
            .await
            .unwrap()
    };
    assert_eq!(port, pg.lock().unwrap().port);
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=storm.postgres sslmode=disable connect_timeout=60",
        gw.port
    );
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let c = conninfo.clone();
            tokio::spawn(async move {
                let (client, conn) = tokio_postgres::connect(&c, NoTls).await?;
                tokio::spawn(conn);
                client
                    .query_one("select 1::int4", &[])
                    .await
                    .map(|r| r.get::<_, i32>(0))
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().expect("storm connection"), 1);
    }
    assert_eq!(annotation(lab, "storm"), "off");
    let log = gw.log();
    let patches = log.matches("patched cluster").count();
    assert_eq!(patches, 1, "{log}");
    assert!(log.contains("hibernation=\"off\""), "{log}");
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sleep_hibernates_and_the_next_connection_wakes_again() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let (pg, _operator) = tokio::task::spawn_blocking(|| hibernated_cluster(lab, "nap"))
        .await
        .unwrap();
    let (user, password) = {
        let pg = pg.lock().unwrap();
        (pg.options.user.clone(), pg.options.password.clone())
    };
    let gw = {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || {
            gateway_for(
                lab,
                "nap",
                &pg.lock().unwrap(),
                "[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"100ms\"",
            )
        })
        .await
        .unwrap()
    };
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=nap.postgres sslmode=disable",
        gw.port
    );
    for round in 0..2 {
        let (client, conn) = tokio_postgres::connect(&conninfo, NoTls)
            .await
            .expect("wake");
        tokio::spawn(conn);
        let row = client.query_one("select 1::int4", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 1);
        drop(client);
        assert_eq!(annotation(lab, "nap"), "off", "round {round}");
        let gw_ref = &gw;
        tokio::task::block_in_place(|| {
            gw_ref.wait_state("nap", "asleep", Duration::from_secs(15));
        });
        assert_eq!(annotation(lab, "nap"), "on", "round {round}");
    }
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}
