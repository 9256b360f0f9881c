//! CloudNativePG in the Kubernetes lab: Cluster objects, their `-app` Secrets, and a fake
//! operator (named as such) that plays the real one.
//!
//! No CloudNativePG operator runs here. The fake operator follows the `cnpg.io/hibernation`
//! annotation: it starts or stops a real Postgres that the tenant's endpoint points at, and
//! writes the Cluster's status through the status subresource, as the operator would with pods.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pgwake_testkit::TestPostgres;
use pgwake_testkit::kube::KubeLab;
use serde_json::json;

use crate::common::backend;

pub const NAMESPACE: &str = "tenants";

pub fn cluster_path(name: &str) -> String {
    format!("/apis/postgresql.cnpg.io/v1/namespaces/{NAMESPACE}/clusters/{name}")
}

pub fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/{NAMESPACE}/secrets/{name}")
}

/// Fake CloudNativePG operator for one Cluster: polls it and makes the world match the
/// `cnpg.io/hibernation` annotation. It keeps polling through API outages.
pub struct FakeOperator {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeOperator {
    pub fn run(lab: &'static KubeLab, name: &str, pg: Arc<Mutex<TestPostgres>>) -> FakeOperator {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let name = name.to_owned();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let Ok(obj) = lab.get(&cluster_path(&name)).and_then(|r| r.success_json()) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let hibernate = obj["metadata"]["annotations"]["cnpg.io/hibernation"] == "on";
                let mut pg = pg.lock().unwrap();
                let ready = obj["status"]["readyInstances"].as_i64().unwrap_or(0) >= 1;
                let status = if hibernate && (pg.is_running() || ready) {
                    pg.stop();
                    json!({ "status": {
                        "readyInstances": null,
                        "phase": "Cluster in healthy state",
                        "conditions": [{ "type": "cnpg.io/hibernation", "status": "True", "reason": "Hibernated" }]
                    }})
                } else if !hibernate && (!pg.is_running() || !ready) {
                    pg.resume().unwrap();
                    json!({ "status": {
                        "readyInstances": 1,
                        "phase": "Cluster in healthy state",
                        "conditions": null
                    }})
                } else {
                    serde_json::Value::Null
                };
                drop(pg);
                if !status.is_null() {
                    // Fails while the API is down; the next round writes it again.
                    let _ = lab.merge_patch(&format!("{}/status", cluster_path(&name)), &status);
                }
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

/// A hibernated Cluster `name` labelled as tenant `name`, whose "primary" is a real Postgres,
/// stopped, that the `pgwake.io/endpoint` annotation points at.
pub fn hibernated_cluster(
    lab: &'static KubeLab,
    name: &str,
) -> (Arc<Mutex<TestPostgres>>, FakeOperator) {
    lab.ensure_namespace(NAMESPACE).unwrap();
    let mut pg = backend();
    let manifest = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": { "pgwake.io/tenant": name },
            "annotations": {
                "cnpg.io/hibernation": "on",
                "pgwake.io/endpoint": format!("127.0.0.1:{}", pg.port)
            }
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
    pg.stop();
    let pg = Arc::new(Mutex::new(pg));
    let operator = FakeOperator::run(lab, name, pg.clone());
    (pg, operator)
}

/// Writes the `<cluster>-app` Secret as CloudNativePG makes it (basic-auth, username/password).
pub fn write_app_secret(lab: &KubeLab, cluster: &str, user: &str, password: &str) {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let name = format!("{cluster}-app");
    let data = json!({ "username": b64(user), "password": b64(password) });
    let existing = lab.get(&secret_path(&name)).unwrap();
    if existing.status == 200 {
        lab.merge_patch(&secret_path(&name), &json!({ "data": data }))
            .unwrap()
            .success_json()
            .unwrap();
    } else {
        let manifest = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/basic-auth",
            "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "cnpg.io/cluster": cluster } },
            "data": data
        });
        lab.create(
            &format!("/api/v1/namespaces/{NAMESPACE}/secrets"),
            &manifest.to_string(),
        )
        .unwrap()
        .success_json()
        .unwrap();
    }
}

/// The Cluster's `cnpg.io/hibernation` annotation.
pub fn annotation(lab: &KubeLab, name: &str) -> String {
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
