//! Several gateway replicas serving one CloudNativePG tenant in the Kubernetes lab, and what
//! the API server saw of its hibernation, for the `replica_*` tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use pgwake_testkit::kube::{KubeLab, clusters_path};
use tokio_postgres::NoTls;

use super::Gateway;
use super::cnpg_operator::{FakeOperator, cluster_path, hibernated_cluster, write_app_secret};

pub const NAMESPACE: &str = "replicas";
/// The replicas' `[kubernetes] activity_ttl`.
pub const TTL: Duration = Duration::from_secs(3);

/// One gateway replica for cnpg tenant `name` (gateway-checked passwords from its `-app`
/// Secret, so idle sessions can park), with the permissions deploy/ grants, not admin.
pub fn replica(lab: &KubeLab, name: &str, pg_port: u16, idle_timeout: &str) -> Gateway {
    replica_with_env(lab, name, pg_port, idle_timeout, &[])
}

/// Like [`replica`], with settings overridden from the environment (`PGWAKE_<SECTION>__<KEY>`).
pub fn replica_with_env(
    lab: &KubeLab,
    name: &str,
    pg_port: u16,
    idle_timeout: &str,
    env: &[(&str, &str)],
) -> Gateway {
    let token = lab.deploy_rbac_token(NAMESPACE).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let tenants = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\nactivity_ttl = \"{}s\"\n\
         [[tenant]]\nid = \"{name}\"\n\
         backend = {{ kind = \"cnpg\", cluster = \"{name}\", namespace = \"{NAMESPACE}\", endpoint = \"127.0.0.1:{pg_port}\" }}\n\
         credentials = {{ kind = \"kubernetes_secret\" }}\n",
        kubeconfig.display(),
        TTL.as_secs()
    );
    Gateway::launch(
        &format!(
            "allow_plaintext = true\n[wake]\nidle_timeout = \"{idle_timeout}\"\n\
             idle_check_interval = \"100ms\"\n[revival]\nsnapshot_after = \"200ms\"\n"
        ),
        &tenants,
        env,
    )
}

/// A hibernated Cluster `name` with its `-app` Secret and fake operator, and `count` replicas
/// serving it; the login to use.
pub struct Fleet {
    pub replicas: Vec<Gateway>,
    pub operator: FakeOperator,
    pub user: String,
    pub password: String,
    pub name: &'static str,
    pub pg_port: u16,
}

impl Fleet {
    pub fn start(lab: &'static KubeLab, name: &'static str, count: usize, idle: &str) -> Fleet {
        let (pg, operator) = hibernated_cluster(lab, NAMESPACE, name);
        let (port, user, password) = {
            let pg = pg.lock().unwrap();
            (
                pg.port,
                pg.options.user.clone(),
                pg.options.password.clone(),
            )
        };
        write_app_secret(lab, NAMESPACE, name, &user, &password);
        let replicas = (0..count).map(|_| replica(lab, name, port, idle)).collect();
        Fleet {
            replicas,
            operator,
            user,
            password,
            name,
            pg_port: port,
        }
    }

    pub fn conninfo(&self, replica: usize) -> String {
        format!(
            "host=127.0.0.1 port={} user={} password={} dbname={}.postgres sslmode=disable connect_timeout=60",
            self.replicas[replica].port, self.user, self.password, self.name
        )
    }

    pub async fn connect(&self, replica: usize) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.conninfo(replica), NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to replica {replica}: {e}"));
        tokio::spawn(conn);
        client
    }

    /// Hibernation patches ("on") all replicas have logged.
    pub fn sleep_patches(&self) -> usize {
        self.replicas
            .iter()
            .map(|g| {
                g.log()
                    .lines()
                    .filter(|l| l.contains("patched cluster") && l.contains("hibernation=\"on\""))
                    .count()
            })
            .sum()
    }

    /// Wake patches ("off") replica `i` has logged.
    pub fn wake_patches(&self, i: usize) -> usize {
        self.replicas[i]
            .log()
            .lines()
            .filter(|l| l.contains("patched cluster") && l.contains("hibernation=\"off\""))
            .count()
    }

    pub fn logs(&self) -> String {
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, g)| format!("--- replica {i}\n{}", g.log()))
            .collect()
    }
}

/// Counts the times the Cluster's `cnpg.io/hibernation` annotation turned to `on`, from a watch
/// of the Cluster (the API server's own record of the writes).
pub struct HibernationWatch {
    turned_on: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HibernationWatch {
    pub fn start(lab: &'static KubeLab, name: &str) -> HibernationWatch {
        let obj = lab
            .get(&cluster_path(NAMESPACE, name))
            .unwrap()
            .success_json()
            .unwrap();
        let annotation = |obj: &serde_json::Value| {
            obj["metadata"]["annotations"]["cnpg.io/hibernation"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let mut version = obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut last = annotation(&obj);
        let (turned_on, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (count, stopped) = (turned_on.clone(), stop.clone());
        let collection = clusters_path(NAMESPACE);
        let name = name.to_owned();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let path = format!(
                    "{collection}?watch=1&fieldSelector=metadata.name%3D{name}\
                     &resourceVersion={version}&timeoutSeconds=1"
                );
                let _ = lab.watch(&path, |event| {
                    let obj = &event["object"];
                    if event["type"] != "ERROR" {
                        if let Some(v) = obj["metadata"]["resourceVersion"].as_str() {
                            version = v.to_owned();
                        }
                        let now = annotation(obj);
                        if now == "on" && last != "on" {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        last = now;
                    }
                    !stopped.load(Ordering::Relaxed)
                });
            }
        });
        HibernationWatch {
            turned_on,
            stop,
            thread: Some(thread),
        }
    }

    pub fn turned_on(&self) -> usize {
        self.turned_on.load(Ordering::Relaxed)
    }
}

impl Drop for HibernationWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs blocking test code (lab calls, process starts) off the async workers.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}
