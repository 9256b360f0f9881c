//! A fake CloudNativePG operator (a test double, named as such) for the `Cluster` objects of one
//! namespace in a [`KubeLab`]: tests and benchmarks of the `cnpg` and `pool` backends need
//! someone to play the operator, and no real one runs without a kubelet.
//!
//! It watches the namespace's Clusters and, like the real operator, follows the
//! `cnpg.io/hibernation` annotation by writing `status` through the status subresource: awake
//! clusters get `readyInstances: 1`, hibernated ones the `cnpg.io/hibernation` condition.
//!
//! Cost is what decides how Postgres is played: a pool test has dozens of clusters, and dozens
//! of Postgres servers are too many for a two-core CI machine. So one real Postgres serves every
//! cluster, listening on its own loopback address per cluster (127.0.0.2, 127.0.0.3, ...; Linux
//! routes all of 127/8 to the loopback device). Each cluster gets its address in the
//! `pgwake.io/endpoint` annotation, the gateway's endpoint override, and a session can tell which
//! cluster it reached with `select host(inet_server_addr())`. Hibernating a cluster does not stop
//! that shared server; the gateway only trusts the status, so waking still waits for the
//! operator. Readiness is therefore immediate: the fake operator's time from seeing a wake to
//! writing the status is recorded ([`FakeCnpgOperator::last_wake`]) so benchmarks can subtract it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::kube::{KubeLab, clusters_path};
use crate::{PgOptions, TestPostgres};

/// The annotation the fake operator writes each cluster's address into (the gateway's
/// per-cluster endpoint override).
pub const ENDPOINT_ANNOTATION: &str = "pgwake.io/endpoint";
const HIBERNATION: &str = "cnpg.io/hibernation";
/// Loopback addresses handed to clusters: 127.0.0.2 up to this last octet. Postgres listens on
/// at most 64 sockets (MAXLISTEN), its Unix socket and 127.0.0.1 included.
const LAST_OCTET: u8 = 61;
/// How long one watch call lasts before it is renewed (and the stop flag looked at).
const WATCH_SECONDS: u32 = 1;

/// The condition CloudNativePG puts on a hibernated Cluster's status, with every field the
/// CRD's schema requires of a condition (`reason`, `message`, `lastTransitionTime`).
pub fn hibernated_condition() -> Value {
    json!({
        "type": HIBERNATION,
        "status": "True",
        "reason": "Hibernated",
        "message": "Cluster has been hibernated",
        "lastTransitionTime": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
    })
}

/// One wake the fake operator answered.
#[derive(Clone, Copy, Debug)]
pub struct Readiness {
    /// When the watch delivered the Cluster without hibernation and not ready.
    pub seen: Instant,
    /// When its ready status was written.
    pub ready: Instant,
}

#[derive(Default)]
struct State {
    addresses: HashMap<String, Ipv4Addr>,
    /// Free addresses, oldest-freed first: an address comes back as late as possible, so a
    /// deleted cluster's address is not mistaken for a new cluster's.
    free: VecDeque<Ipv4Addr>,
    wakes: HashMap<String, Readiness>,
    status_writes: usize,
}

/// The fake operator: a thread following one namespace's Clusters, and the shared Postgres.
pub struct FakeCnpgOperator {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    state: Arc<Mutex<State>>,
    postgres: TestPostgres,
}

impl FakeCnpgOperator {
    /// Starts the shared Postgres (with `options`; its listen addresses are set here) and the
    /// operator thread for Clusters in `namespace` (created if missing).
    pub fn start(
        lab: &'static KubeLab,
        namespace: &str,
        mut options: PgOptions,
    ) -> io::Result<FakeCnpgOperator> {
        lab.ensure_namespace(namespace)?;
        let free: Vec<Ipv4Addr> = (2..=LAST_OCTET)
            .map(|o| Ipv4Addr::new(127, 0, 0, o))
            .collect();
        let listen: Vec<String> = std::iter::once("127.0.0.1".to_owned())
            .chain(free.iter().map(Ipv4Addr::to_string))
            .collect();
        options
            .extra_conf
            .push(format!("listen_addresses = '{}'", listen.join(",")));
        let postgres = TestPostgres::start(options)?;
        let state = Arc::new(Mutex::new(State {
            free: free.into_iter().collect(),
            ..State::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let operator = Operator {
            lab,
            namespace: namespace.to_owned(),
            port: postgres.port,
            state: state.clone(),
            stop: stop.clone(),
        };
        let thread = std::thread::spawn(move || operator.run());
        Ok(FakeCnpgOperator {
            stop,
            thread: Some(thread),
            state,
            postgres,
        })
    }

    /// The Postgres that plays every cluster's primary (for its user, password and port).
    pub fn postgres(&self) -> &TestPostgres {
        &self.postgres
    }

    /// The loopback address given to a cluster, once the operator has seen it.
    pub fn address(&self, cluster: &str) -> Option<Ipv4Addr> {
        self.lock().addresses.get(cluster).copied()
    }

    /// Waits until the operator has given `cluster` an address.
    pub fn wait_address(&self, cluster: &str, limit: Duration) -> io::Result<Ipv4Addr> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(a) = self.address(cluster) {
                return Ok(a);
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "the fake operator did not see cluster {cluster} within {limit:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last wake of `cluster` the operator answered.
    pub fn last_wake(&self, cluster: &str) -> Option<Readiness> {
        self.lock().wakes.get(cluster).copied()
    }

    /// Status writes so far (wakes and hibernations).
    pub fn status_writes(&self) -> usize {
        self.lock().status_writes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for FakeCnpgOperator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The operator thread's view.
struct Operator {
    lab: &'static KubeLab,
    namespace: String,
    port: u16,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl Operator {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// List, then watch from the list's resourceVersion; again after each watch ends.
    fn run(self) {
        let path = clusters_path(&self.namespace);
        while !self.stop.load(Ordering::Relaxed) {
            let list = match self.lab.get(&path).and_then(|r| r.success_json()) {
                Ok(l) => l,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let mut live = Vec::new();
            for item in list["items"].as_array().into_iter().flatten() {
                live.push(
                    item["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
                self.reconcile(item);
            }
            let gone: Vec<String> = self
                .lock()
                .addresses
                .keys()
                .filter(|n| !live.contains(n))
                .cloned()
                .collect();
            for name in gone {
                self.forget(&name);
            }
            let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0");
            let watch =
                format!("{path}?watch=1&resourceVersion={rv}&timeoutSeconds={WATCH_SECONDS}");
            let _ = self.lab.watch(&watch, |event| {
                match event["type"].as_str() {
                    Some("ADDED" | "MODIFIED") => self.reconcile(&event["object"]),
                    Some("DELETED") => {
                        self.forget(event["object"]["metadata"]["name"].as_str().unwrap_or(""))
                    }
                    // ERROR (e.g. 410 Gone): start over with a fresh list.
                    Some("ERROR") => return false,
                    _ => {}
                }
                !self.stop.load(Ordering::Relaxed)
            });
        }
    }

    fn forget(&self, name: &str) {
        let mut state = self.lock();
        if let Some(a) = state.addresses.remove(name) {
            state.free.push_back(a);
        }
        state.wakes.remove(name);
    }

    /// Makes the status match the hibernation annotation, as the real operator does with pods.
    fn reconcile(&self, obj: &Value) {
        let Some(name) = obj["metadata"]["name"].as_str() else {
            return;
        };
        if !obj["metadata"]["deletionTimestamp"].is_null() {
            return;
        }
        let seen = Instant::now();
        let object_path = format!("{}/{name}", clusters_path(&self.namespace));
        let annotations = &obj["metadata"]["annotations"];
        if annotations[ENDPOINT_ANNOTATION].is_null() {
            let address = {
                let mut state = self.lock();
                match state.addresses.get(name) {
                    Some(a) => Some(*a),
                    None => state.free.pop_front().inspect(|a| {
                        state.addresses.insert(name.to_owned(), *a);
                    }),
                }
            };
            if let Some(a) = address {
                let patch = json!({ "metadata": { "annotations": {
                    ENDPOINT_ANNOTATION: format!("{a}:{}", self.port)
                } } });
                let _ = self.lab.merge_patch(&object_path, &patch);
            }
        } else if let Some(a) = annotations[ENDPOINT_ANNOTATION]
            .as_str()
            .and_then(|e| e.rsplit_once(':'))
            .and_then(|(h, _)| h.parse::<Ipv4Addr>().ok())
        {
            // Seen before a restart of the watch: keep the address reserved.
            let mut state = self.lock();
            if !state.addresses.contains_key(name) {
                state.free.retain(|f| *f != a);
                state.addresses.insert(name.to_owned(), a);
            }
        }
        let status = &obj["status"];
        let hibernate = annotations[HIBERNATION] == "on";
        let ready = status["readyInstances"].as_i64().unwrap_or(0) >= 1;
        let hibernated = status["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == HIBERNATION && c["status"] == "True")
        });
        let status_path = format!("{object_path}/status");
        if hibernate && (ready || !hibernated) {
            let patch = json!({ "status": {
                "readyInstances": null,
                "phase": "Cluster in healthy state",
                "conditions": [hibernated_condition()]
            }});
            if self
                .lab
                .merge_patch(&status_path, &patch)
                .is_ok_and(|r| (200..300).contains(&r.status))
            {
                self.lock().status_writes += 1;
            }
        } else if !hibernate && (!ready || hibernated) {
            let patch = json!({ "status": {
                "instances": 1,
                "readyInstances": 1,
                "phase": "Cluster in healthy state",
                "conditions": null
            }});
            if self
                .lab
                .merge_patch(&status_path, &patch)
                .is_ok_and(|r| (200..300).contains(&r.status))
            {
                let mut state = self.lock();
                state.status_writes += 1;
                state.wakes.insert(
                    name.to_owned(),
                    Readiness {
                        seen,
                        ready: Instant::now(),
                    },
                );
            }
        }
    }
}
