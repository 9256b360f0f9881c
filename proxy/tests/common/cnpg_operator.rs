//! A fake CloudNativePG operator for tests against the Kubernetes lab, where no real operator
//! runs: it follows a Cluster's `cnpg.io/hibernation` annotation, starts or stops a real Postgres
//! that the tenant's endpoint override points at, and writes the Cluster's status through the
//! status subresource, as the operator would with pods. It keeps polling through API outages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pgwake_testkit::TestPostgres;
use pgwake_testkit::fake_operator::hibernated_condition;
use pgwake_testkit::kube::{KubeLab, clusters_path};
use serde_json::json;

/// API path of Cluster `name` in `namespace`.
pub fn cluster_path(namespace: &str, name: &str) -> String {
    format!("{}/{name}", clusters_path(namespace))
}

/// The fake operator for one Cluster; stops following it on drop.
pub struct FakeOperator {
    stop: Arc<AtomicBool>,
    /// While set, a hibernation request is left pending (Postgres keeps running, no hibernated
    /// status), as when real pods take long to stop.
    slow_hibernation: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeOperator {
    /// Polls Cluster `namespace/name` and makes `pg` and the status match its annotation.
    pub fn run(
        lab: &'static KubeLab,
        namespace: &str,
        name: &str,
        pg: Arc<Mutex<TestPostgres>>,
    ) -> FakeOperator {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let slow_hibernation = Arc::new(AtomicBool::new(false));
        let slow = slow_hibernation.clone();
        let path = cluster_path(namespace, name);
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let Ok(obj) = lab.get(&path).and_then(|r| r.success_json()) else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let hibernate = obj["metadata"]["annotations"]["cnpg.io/hibernation"] == "on";
                if hibernate && slow.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let ready = obj["status"]["readyInstances"].as_i64().unwrap_or(0) >= 1;
                let mut pg = pg.lock().unwrap();
                let status = if hibernate && (pg.is_running() || ready) {
                    pg.stop();
                    Some(json!({ "status": {
                        "readyInstances": null,
                        "phase": "Cluster in healthy state",
                        "conditions": [hibernated_condition()]
                    }}))
                } else if !hibernate && (!pg.is_running() || !ready) {
                    pg.resume().unwrap();
                    Some(json!({ "status": {
                        "readyInstances": 1,
                        "phase": "Cluster in healthy state",
                        "conditions": null
                    }}))
                } else {
                    None
                };
                drop(pg);
                if let Some(status) = status {
                    // Fails while the API is down (outage tests); the next round writes it again.
                    let _ = lab.merge_patch(&format!("{path}/status"), &status);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FakeOperator {
            stop,
            slow_hibernation,
            thread: Some(thread),
        }
    }

    /// Leaves hibernation requests pending while `slow` is set; see `slow_hibernation`.
    pub fn set_slow_hibernation(&self, slow: bool) {
        self.slow_hibernation.store(slow, Ordering::Relaxed);
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

/// Creates a hibernated Cluster `namespace/name` labelled as tenant `name` (as admin), whose
/// "primary" is a real Postgres, stopped, that its `pgwake.io/endpoint` annotation points at,
/// and starts the fake operator for it.
pub fn hibernated_cluster(
    lab: &'static KubeLab,
    namespace: &str,
    name: &str,
) -> (Arc<Mutex<TestPostgres>>, FakeOperator) {
    lab.ensure_namespace(namespace).unwrap();
    let mut pg = super::backend();
    let manifest = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { "pgwake.io/tenant": name },
            "annotations": {
                "cnpg.io/hibernation": "on",
                "pgwake.io/endpoint": format!("127.0.0.1:{}", pg.port)
            }
        },
        "spec": { "instances": 1, "storage": { "size": "1Gi" } }
    });
    lab.create(&clusters_path(namespace), &manifest.to_string())
        .unwrap()
        .success_json()
        .unwrap();
    pg.stop();
    let pg = Arc::new(Mutex::new(pg));
    let operator = FakeOperator::run(lab, namespace, name, pg.clone());
    (pg, operator)
}

/// The Cluster's `cnpg.io/hibernation` annotation ("" when unset).
pub fn hibernation(lab: &KubeLab, namespace: &str, name: &str) -> String {
    let obj = lab
        .get(&cluster_path(namespace, name))
        .unwrap()
        .success_json()
        .unwrap();
    obj["metadata"]["annotations"]["cnpg.io/hibernation"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until the Cluster's `cnpg.io/hibernation` annotation reads `value`: a replica's
/// admin API shows the tenant "sleeping" as soon as it decides to, and its patch follows.
pub fn wait_hibernation(lab: &KubeLab, namespace: &str, name: &str, value: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = hibernation(lab, namespace, name);
        if now == value {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Cluster {namespace}/{name}: cnpg.io/hibernation is {now:?}, not {value:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the fake operator reports the Cluster hibernated (its `cnpg.io/hibernation`
/// condition is `True`, so its Postgres is stopped).
pub fn wait_hibernated(lab: &KubeLab, namespace: &str, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let obj = lab
            .get(&cluster_path(namespace, name))
            .unwrap()
            .success_json()
            .unwrap();
        let hibernated = obj["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "cnpg.io/hibernation" && c["status"] == "True");
        if hibernated {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Cluster {namespace}/{name} not hibernated: {obj}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes the `<cluster>-app` Secret as CloudNativePG makes it (basic-auth, `username` and
/// `password`), or updates it (a rotation).
pub fn write_app_secret(lab: &KubeLab, namespace: &str, cluster: &str, user: &str, password: &str) {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let name = format!("{cluster}-app");
    let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
    let data = json!({ "username": b64(user), "password": b64(password) });
    if lab.get(&path).unwrap().status == 200 {
        lab.merge_patch(&path, &json!({ "data": data }))
            .unwrap()
            .success_json()
            .unwrap();
        return;
    }
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/basic-auth",
        "metadata": { "name": name, "namespace": namespace, "labels": { "cnpg.io/cluster": cluster } },
        "data": data
    });
    lab.create(
        &format!("/api/v1/namespaces/{namespace}/secrets"),
        &manifest.to_string(),
    )
    .unwrap()
    .success_json()
    .unwrap();
}
