//! The Kubernetes lab end to end: CRD served, status subresource, ServiceAccount tokens, RBAC.
//!
//! Runs always. The first run on a machine builds kube-apiserver and etcd (10-18 minutes on two
//! cores, cached afterwards); without a Go toolchain it fails at once with a message saying so.

use pgwake_testkit::kube::{KubeLab, clusters_path};
use serde_json::json;

#[test]
fn cluster_status_round_trip_and_service_account_without_rbac() {
    let lab = KubeLab::shared();
    let ns = "smoke";
    lab.ensure_namespace(ns).unwrap();

    let cluster = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "pg-a", "namespace": ns},
        "spec": {"instances": 1, "storage": {"size": "1Gi"}},
    });
    let created = lab
        .create(&clusters_path(ns), &cluster.to_string())
        .unwrap()
        .success_json()
        .unwrap();
    assert_eq!(created["spec"]["instances"], 1);

    // Status is a subresource: a write to the main resource ignores it, so the operator's part
    // (played here by the test) goes through /status.
    let object = format!("{}/pg-a", clusters_path(ns));
    let ignored = lab
        .merge_patch(&object, &json!({"status": {"phase": "ignored"}}))
        .unwrap()
        .success_json()
        .unwrap();
    assert!(ignored.get("status").is_none(), "{ignored}");

    let status = json!({"status": {
        "phase": "Cluster in healthy state",
        "readyInstances": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": "ClusterIsReady",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""}],
    }});
    lab.merge_patch(&format!("{object}/status"), &status)
        .unwrap()
        .success_json()
        .unwrap();
    let read = lab.get(&object).unwrap().success_json().unwrap();
    assert_eq!(read["status"]["readyInstances"], 1);
    assert_eq!(read["status"]["phase"], "Cluster in healthy state");
    assert_eq!(read["spec"]["storage"]["size"], "1Gi");

    // A ServiceAccount token authenticates, but no Role grants it anything yet.
    let token = lab.service_account_token(ns, "pgwake-gateway").unwrap();
    let who = lab
        .request_as(
            &token,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some((
                "application/json",
                br#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#,
            )),
        )
        .unwrap()
        .success_json()
        .unwrap();
    assert_eq!(
        who["status"]["userInfo"]["username"],
        format!("system:serviceaccount:{ns}:pgwake-gateway")
    );
    let denied = lab
        .request_as(&token, "GET", "/api/v1/namespaces/default/secrets", None)
        .unwrap();
    assert_eq!(denied.status, 403, "{}", denied.body);

    // The static gateway identity is likewise subject to RBAC; admin is not.
    let denied = lab
        .request_as(lab.gateway_token(), "GET", &clusters_path(ns), None)
        .unwrap();
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert_eq!(
        lab.get("/api/v1/namespaces/default/secrets")
            .unwrap()
            .status,
        200
    );

    // A kubeconfig for the token points at this server and trusts its CA.
    let kubeconfig = std::fs::read_to_string(lab.kubeconfig_for_token(&token).unwrap()).unwrap();
    assert!(kubeconfig.contains(&lab.api_url()) && kubeconfig.contains(&token));
    assert!(lab.kubeconfig_path().exists());
}

#[test]
fn an_unknown_token_is_unauthorized() {
    let lab = KubeLab::shared();
    let r = lab
        .request_as("not-a-token", "GET", "/api/v1/namespaces", None)
        .unwrap();
    assert_eq!(r.status, 401, "{}", r.body);
}

#[test]
fn a_private_lab_stops_its_servers_by_pid() {
    let lab = KubeLab::start().unwrap();
    let pids = [lab.pid("apiserver").unwrap(), lab.pid("etcd").unwrap()];
    assert_eq!(lab.get("/readyz").unwrap().status, 200);
    let workdir = lab.workdir().to_path_buf();
    lab.stop();
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "process {pid} still runs after stop()"
        );
    }
    lab.stop();
    drop(lab);
    assert!(!workdir.exists(), "the work dir is removed on drop");
}
