//! The `cnpg` backend's direct route against a real kube-apiserver: a wake reaches the pod the
//! Cluster's status names primary at the pod's own address, before the operator reports the
//! cluster ready, with the backend's certificate checked against the `-rw` Service's name; and
//! when the primary moves (a failover to another instance, or the pod made again with another
//! address) the gateway notices and the next connection follows it.
//!
//! No kubelet or operator runs here: the test writes the Pods and the Cluster's status the way
//! they would, and one real Postgres listens on every pod address (Linux routes all of 127/8 to
//! the loopback device), so `inet_server_addr()` tells which pod a session reached.

mod common;

use std::time::Duration;

use common::Gateway;
use common::cnpg_operator::{cluster_path, hibernation};
use pgwake_testkit::fake_operator::hibernated_condition;
use pgwake_testkit::kube::{KubeLab, clusters_path};
use pgwake_testkit::{PgOptions, TestCert, TestPostgres};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

const NAMESPACE: &str = "direct";
const CLUSTER: &str = "dir";
/// The name the backend's certificate carries: the cluster's `-rw` Service, not any pod.
const SERVICE_NAME: &str = "dir-rw.direct.svc";
const FIRST_POD_IP: &str = "127.0.0.81";
const SECOND_POD_IP: &str = "127.0.0.82";

fn pods_path() -> String {
    format!("/api/v1/namespaces/{NAMESPACE}/pods")
}

/// An instance pod as CloudNativePG makes it, as far as the gateway reads it: the `postgres`
/// container's port named `postgresql`.
fn create_pod(lab: &KubeLab, name: &str, port: u16) {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "cnpg.io/cluster": CLUSTER } },
        "spec": { "containers": [{
            "name": "postgres",
            "image": "postgres",
            "ports": [{ "name": "postgresql", "containerPort": port, "protocol": "TCP" }]
        }]}
    });
    lab.create(&pods_path(), &pod.to_string())
        .unwrap()
        .success_json()
        .unwrap();
}

/// What the kubelet writes once the pod's sandbox has its network.
fn set_pod_ip(lab: &KubeLab, name: &str, ip: &str) {
    let status = json!({ "status": { "phase": "Running", "podIP": ip, "podIPs": [{ "ip": ip }] } });
    lab.merge_patch(&format!("{}/{name}/status", pods_path()), &status)
        .unwrap()
        .success_json()
        .unwrap();
}

fn set_cluster_status(lab: &KubeLab, status: Value) {
    lab.merge_patch(
        &format!("{}/status", cluster_path(NAMESPACE, CLUSTER)),
        &json!({ "status": status }),
    )
    .unwrap()
    .success_json()
    .unwrap();
}

/// The pod address (and whether TLS carried it) a new session through the gateway reaches.
async fn reached(conninfo: &str) -> (String, bool) {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .expect("connect through the gateway");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "select host(inet_server_addr()), ssl from pg_stat_ssl where pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_reaches_the_primary_pod_directly_and_follows_it_when_it_moves() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    lab.ensure_namespace(NAMESPACE).unwrap();
    let cert = TestCert::new(&[SERVICE_NAME]);
    let pg = TestPostgres::start(PgOptions {
        tls: Some(cert.clone()),
        extra_conf: vec![format!(
            "listen_addresses = '127.0.0.1,{FIRST_POD_IP},{SECOND_POD_IP}'"
        )],
        ..PgOptions::default()
    })
    .expect("start postgres");
    let manifest = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": NAMESPACE,
            "annotations": { "cnpg.io/hibernation": "on" }
        },
        "spec": { "instances": 2, "storage": { "size": "1Gi" } }
    });
    lab.create(&clusters_path(NAMESPACE), &manifest.to_string())
        .unwrap()
        .success_json()
        .unwrap();
    // Hibernated, as the operator leaves it: the primary's name stays, its pod is gone.
    set_cluster_status(
        lab,
        json!({
            "currentPrimary": "dir-1",
            "targetPrimary": "dir-1",
            "conditions": [hibernated_condition()]
        }),
    );

    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), &cert.cert_pem).unwrap();
    let token = lab.deploy_rbac_token(NAMESPACE).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let gw = Gateway::launch(
        &format!(
            "allow_plaintext = true\n\
             [backend]\ntls = \"require\"\nca = \"{}\"\n\
             [wake]\nidle_check_interval = \"100ms\"\nwake_timeout = \"30s\"\n",
            ca.path().display()
        ),
        &format!(
            "[kubernetes]\nkubeconfig = \"{}\"\n\
             [[tenant]]\nid = \"{CLUSTER}\"\n\
             backend = {{ kind = \"cnpg\", cluster = \"{CLUSTER}\", namespace = \"{NAMESPACE}\" }}\n",
            kubeconfig.display()
        ),
        &[],
    );
    let conninfo = format!(
        "host=127.0.0.1 port={} user={} password={} dbname={CLUSTER}.postgres sslmode=disable connect_timeout=30",
        gw.port, pg.options.user, pg.options.password
    );

    // The wake: the pod appears after the annotation is lifted, gets its address later, and
    // the operator never reports the cluster ready.
    let first = tokio::spawn({
        let conninfo = conninfo.clone();
        async move { reached(&conninfo).await }
    });
    let (lab_ref, port) = (lab, pg.port);
    tokio::task::spawn_blocking(move || {
        while hibernation(lab_ref, NAMESPACE, CLUSTER) != "off" {
            std::thread::sleep(Duration::from_millis(20));
        }
        create_pod(lab_ref, "dir-1", port);
        std::thread::sleep(Duration::from_millis(300));
        set_pod_ip(lab_ref, "dir-1", FIRST_POD_IP);
    })
    .await
    .unwrap();
    let (address, tls) = first.await.unwrap();
    assert_eq!(address, FIRST_POD_IP, "{}", gw.log());
    assert!(tls, "the gateway reached the pod over TLS");
    assert!(gw.log().contains("reached the primary pod directly"));

    // A failover: another instance is primary now.
    create_pod(lab, "dir-2", pg.port);
    set_pod_ip(lab, "dir-2", SECOND_POD_IP);
    set_cluster_status(
        lab,
        json!({
            "currentPrimary": "dir-2",
            "targetPrimary": "dir-2",
            "readyInstances": 1,
            "conditions": null
        }),
    );
    tokio::task::block_in_place(|| gw.wait_state(CLUSTER, "asleep", Duration::from_secs(10)));
    assert!(gw.log().contains("database moved"), "{}", gw.log());
    assert_eq!(reached(&conninfo).await.0, SECOND_POD_IP);

    // The primary's pod made again with another address, as the instance manager reports it.
    set_pod_ip(lab, "dir-2", FIRST_POD_IP);
    set_cluster_status(
        lab,
        json!({ "instancesReportedState": { "dir-2": { "ip": FIRST_POD_IP, "isPrimary": true } } }),
    );
    tokio::task::block_in_place(|| gw.wait_state(CLUSTER, "asleep", Duration::from_secs(10)));
    assert_eq!(reached(&conninfo).await.0, FIRST_POD_IP);
    assert_eq!(hibernation(lab, NAMESPACE, CLUSTER), "off");
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}
