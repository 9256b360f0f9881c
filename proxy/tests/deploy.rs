//! `deploy/` against a real kube-apiserver: every rendered manifest passes a server-side dry run,
//! the gateway Deployment drains gracefully, the ConfigMaps' configurations pass
//! `pgwake check-config`, and the gateway running with exactly deploy's RBAC wakes and hibernates
//! a CloudNativePG tenant while that RBAC grants nothing more than it needs.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::Gateway;
use common::cnpg_operator::{cluster_path, hibernated_cluster, hibernation, wait_hibernated};
use figment::providers::{Format, Toml};
use pgwake::config::Config;
use pgwake_testkit::TestCert;
use pgwake_testkit::kube::{
    KubeLab, deploy_dir, object_label, parse_manifests, render_kustomization,
};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

/// Every kustomization under `deploy/`.
const KUSTOMIZATIONS: &[&str] = &[
    "base",
    "overlay",
    "examples/sidecar",
    "examples/cnpg",
    "examples/pool",
];

fn render(dir: &str) -> Vec<Value> {
    render_kustomization(&deploy_dir().join(dir))
        .unwrap_or_else(|e| panic!("rendering deploy/{dir}: {e}"))
}

fn find<'a>(objects: &'a [Value], kind: &str, name_prefix: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(name_prefix))
        })
        .unwrap_or_else(|| panic!("no {kind} {name_prefix}* rendered"))
}

/// The `pgwake.toml` a rendered ConfigMap holds.
fn config_text(objects: &[Value], configmap_prefix: &str) -> String {
    find(objects, "ConfigMap", configmap_prefix)["data"]["pgwake.toml"]
        .as_str()
        .expect("the ConfigMap holds pgwake.toml")
        .to_owned()
}

#[test]
fn rendered_manifests_pass_a_server_side_dry_run() {
    let lab = KubeLab::shared();
    let mut objects = Vec::new();
    for dir in KUSTOMIZATIONS {
        let rendered = render(dir);
        assert!(!rendered.is_empty(), "deploy/{dir} renders nothing");
        objects.extend(rendered);
    }
    // Manifests shipped inside ConfigMaps (the pool's Cluster template) are manifests too.
    let embedded: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .flat_map(|o| o["data"].as_object().cloned().unwrap_or_default())
        .filter(|(key, _)| key.ends_with(".yaml"))
        .flat_map(|(key, text)| {
            parse_manifests(text.as_str().unwrap_or_default())
                .unwrap_or_else(|e| panic!("{key}: {e}"))
        })
        .collect();
    assert!(
        embedded.iter().any(|o| o["kind"] == "Cluster"),
        "the pool example ships its Cluster template"
    );
    objects.extend(embedded);
    // deploy/ creates no namespaces (README: you create them), so the lab needs them first.
    let mut namespaces: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    for ns in &namespaces {
        lab.ensure_namespace(ns).unwrap();
    }
    lab.dry_run(&objects).unwrap();

    let kinds: Vec<String> = objects.iter().map(object_label).collect();
    for expected in [
        "Deployment/pgwake",
        "Service/pgwake",
        "ServiceAccount/pgwake",
        "Role/pgwake",
        "RoleBinding/pgwake",
        "PodDisruptionBudget/pgwake",
        "Cluster/alpha",
        "Deployment/shop",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }
    // A dry run stores nothing.
    let stored = lab
        .get("/apis/apps/v1/namespaces/pgwake/deployments/pgwake")
        .unwrap();
    assert_eq!(stored.status, 404, "{}", stored.body);
    // And a broken manifest is refused, so the pass above means something.
    let mut broken = find(&objects, "Deployment", "pgwake").clone();
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(0);
    let err = lab.dry_run(&[broken]).unwrap_err().to_string();
    assert!(
        err.contains("Deployment/pgwake") && err.contains("422"),
        "{err}"
    );
    // Field validation is strict: a misspelt key is an error, not silently dropped.
    let mut misspelt = find(&objects, "Deployment", "pgwake").clone();
    misspelt["spec"]["replcas"] = json!(2);
    let err = lab.dry_run(&[misspelt]).unwrap_err().to_string();
    assert!(err.contains("replcas"), "{err}");
    // The same for CloudNativePG Clusters: the lab serves the operator's own CRD, so its schema
    // knows every field, at every depth, and their types.
    let cluster = find(&objects, "Cluster", "alpha");
    for (path, value) in [
        (&["spec", "instancess"][..], json!(1)),
        (&["spec", "storage", "sise"][..], json!("1Gi")),
        (&["spec", "instances"][..], json!("one")),
    ] {
        let mut wrong = cluster.clone();
        let (last, parents) = path.split_last().unwrap();
        let parent = parents.iter().fold(&mut wrong, |v, key| &mut v[*key]);
        parent[*last] = value;
        let err = lab.dry_run(&[wrong]).unwrap_err().to_string();
        assert!(
            err.contains("Cluster/alpha") && err.contains(last),
            "{path:?}: {err}"
        );
    }
}

/// The container's `--config` path, and the ConfigMap mounted at that file's folder.
fn mounted_config<'a>(pod_spec: &'a Value, container: &Value) -> (String, &'a str) {
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let path = args
        .windows(2)
        .find(|w| w[0] == "--config")
        .map(|w| w[1].to_owned())
        .expect("serve --config PATH");
    let folder = Path::new(&path).parent().unwrap().to_str().unwrap();
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == folder)
        .unwrap_or_else(|| panic!("nothing mounted at {folder}"));
    let volume = pod_spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let configmap = volume["configMap"]["name"]
        .as_str()
        .expect("a ConfigMap volume");
    (path, configmap)
}

#[test]
fn every_pgwake_container_reads_the_config_its_configmap_holds() {
    let base = render("base");
    let deployment = find(&base, "Deployment", "pgwake");
    let spec = &deployment["spec"]["template"]["spec"];
    let (path, configmap) = mounted_config(spec, &spec["containers"][0]);
    assert!(path.ends_with("/pgwake.toml"), "{path}");
    assert!(configmap.starts_with("pgwake-config-"), "{configmap}");
    assert!(base.iter().any(|o| o["metadata"]["name"] == configmap));

    let sidecar = render("examples/sidecar");
    let app = find(&sidecar, "Deployment", "shop");
    let spec = &app["spec"]["template"]["spec"];
    let pgwake = &spec["initContainers"][0];
    assert_eq!(pgwake["restartPolicy"], "Always", "a native sidecar");
    let (path, configmap) = mounted_config(spec, pgwake);
    assert!(path.ends_with("/pgwake.toml"), "{path}");
    assert!(sidecar.iter().any(|o| o["metadata"]["name"] == configmap));
    assert_eq!(spec["automountServiceAccountToken"], false);

    // The pool class's template is a file of the same ConfigMap, at the path the config names.
    let pool = render("examples/pool");
    let deployment = find(&pool, "Deployment", "pgwake");
    let spec = &deployment["spec"]["template"]["spec"];
    let (path, configmap) = mounted_config(spec, &spec["containers"][0]);
    let data = &find(&pool, "ConfigMap", configmap)["data"];
    let config: Value = figment::Figment::from(Toml::string(
        data["pgwake.toml"].as_str().expect("pgwake.toml"),
    ))
    .extract()
    .unwrap();
    let class = &config["pool_class"][0];
    assert_eq!(class["name"], "small");
    let template = class["template"].as_str().expect("a template path");
    let folder = Path::new(&path).parent().unwrap();
    let file = Path::new(template)
        .strip_prefix(folder)
        .unwrap_or_else(|_| panic!("{template} is not in the mounted {}", folder.display()));
    let manifest = data[file.to_str().unwrap()]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no {}", file.display()));
    let cluster = &parse_manifests(manifest).unwrap()[0];
    assert_eq!(cluster["kind"], "Cluster");
    assert_eq!(cluster["metadata"]["namespace"], class["namespace"]);
    assert_eq!(cluster["metadata"]["labels"]["pgwake.io/pool"], "small");
    assert!(
        config["tenant"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["backend"]["kind"] == "pool" && t["backend"]["class"] == "small")
    );
}

/// Writes `text` as a config file and loads it the way `pgwake serve` would.
fn load_config(text: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgwake.toml");
    std::fs::write(&path, text).unwrap();
    Config::load(&path).unwrap()
}

fn port_named(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == name))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no port {name} on {container}"))
}

#[test]
fn the_gateway_deployment_matches_its_config_and_drains_gracefully() {
    let objects = render("base");
    let config = load_config(&config_text(&objects, "pgwake-config"));
    let deployment = find(&objects, "Deployment", "pgwake");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        port_named(container, "postgres"),
        u64::from(config.listen.postgres.port())
    );
    let admin = config
        .listen
        .admin
        .expect("the base config has an admin listener");
    assert!(admin.ip().is_unspecified(), "probes come to the pod IP");
    assert_eq!(port_named(container, "admin"), u64::from(admin.port()));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "admin");
    // The kubelet's grace period covers the preStop pause and the gateway's own drain.
    let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap_or(0);
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds is set");
    assert!(
        grace > pre_stop + config.limits.shutdown_grace.as_secs(),
        "terminationGracePeriodSeconds {grace} <= preStop {pre_stop} s + shutdown_grace {:?}",
        config.limits.shutdown_grace
    );
    // The Service and the PodDisruptionBudget select exactly the gateway's pods.
    let labels = &pod["metadata"]["labels"];
    let service = find(&objects, "Service", "pgwake");
    assert_eq!(&service["spec"]["selector"], labels);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "postgres");
    let pdb = find(&objects, "PodDisruptionBudget", "pgwake");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    // The TLS certificate is a Secret the user creates: deploy/ ships none.
    for dir in KUSTOMIZATIONS {
        let objects = render(dir);
        assert!(
            !objects.iter().any(|o| o["kind"] == "Secret"),
            "deploy/{dir} ships a Secret"
        );
    }
}

#[test]
fn the_documented_overlay_applies_with_kubectl_alone_and_serves_http_and_password_routing() {
    // deploy/README.md's install steps apply deploy/overlay, with no tool but kubectl.
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    let install = readme
        .split("## Install\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("an Install section");
    assert!(
        install.contains("kubectl apply -k deploy/overlay"),
        "{install}"
    );
    assert!(!install.contains("kustomize edit"), "{install}");

    let objects = render("overlay");
    let lab = KubeLab::shared();
    lab.ensure_namespace("pgwake").unwrap();
    lab.dry_run(&objects).unwrap();
    let config = load_config(&config_text(&objects, "pgwake-config"));
    let http = config
        .listen
        .http
        .expect("an HTTP listener for serverless drivers");
    assert!(http.ip().is_unspecified(), "{http}");
    assert!(
        config
            .routing
            .rules
            .contains(&pgwake_routing::Rule::Password),
        "{:?}",
        config.routing.rules
    );
    let deployment = find(&objects, "Deployment", "pgwake");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(port_named(container, "http"), u64::from(http.port()));
    assert_eq!(container["image"], "registry.example.com/pgwake:0.1.0");
    let service = find(&objects, "Service", "pgwake");
    let ports = service["spec"]["ports"].as_array().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["targetPort"] == "http" && p["port"] == 443),
        "{ports:?}"
    );
}

/// Runs `pgwake check-config` on `text`, with the certificate paths pointed at a test
/// certificate (the real ones are a mounted Secret) and a kubeconfig for the lab.
fn check_config(text: &str, kubeconfig: &Path) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgwake.toml");
    std::fs::write(&path, text).unwrap();
    let (cert, key) = TestCert::new(&["*.db.example.com"])
        .write_to(dir.path())
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env("PGWAKE_TLS__CERT", &cert)
        .env("PGWAKE_TLS__KEY", &key)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "check-config failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_configmaps_pass_check_config() {
    let lab = KubeLab::shared();
    let kubeconfig = lab.kubeconfig_for_token(lab.gateway_token()).unwrap();
    let base = config_text(&render("base"), "pgwake-config");
    assert_eq!(
        base,
        std::fs::read_to_string(deploy_dir().join("base/pgwake.toml")).unwrap()
    );
    let out = check_config(&base, &kubeconfig);
    assert!(
        out.contains(
            "configuration OK: 0 tenant(s) plus labelled Clusters, postgres on 0.0.0.0:5432"
        ),
        "{out}"
    );
    let sidecar = config_text(&render("examples/sidecar"), "pgwake-sidecar");
    let out = check_config(&sidecar, &kubeconfig);
    assert!(
        out.contains("configuration OK: 1 tenant(s), postgres on 127.0.0.1:5432"),
        "{out}"
    );
    let sidecar = load_config(&sidecar);
    assert!(sidecar.listen.postgres.ip().is_loopback());
    assert_eq!(
        sidecar.routing.default_tenant.as_ref().map(|t| t.as_str()),
        Some("orders")
    );
}

/// Asks the API server whether the token may do something (a SelfSubjectAccessReview).
fn allowed(
    lab: &KubeLab,
    token: &str,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
) -> bool {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": { "resourceAttributes": {
            "verb": verb, "group": group, "resource": resource,
            "subresource": subresource, "namespace": namespace,
        }},
    });
    let answer = lab
        .request_as(
            token,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            Some(("application/json", review.to_string().as_bytes())),
        )
        .unwrap()
        .success_json()
        .unwrap();
    answer["status"]["allowed"] == true
}

#[test]
fn deploy_rbac_grants_what_the_gateway_does_and_nothing_more() {
    let lab = KubeLab::shared();
    let ns = "deploy-rbac-minimal";
    let token = lab.deploy_rbac_token(ns).unwrap();
    let cnpg = "postgresql.cnpg.io";
    let lease = "coordination.k8s.io";
    for verb in ["get", "list", "watch", "patch", "create", "delete"] {
        assert!(
            allowed(lab, &token, verb, cnpg, "clusters", ns),
            "{verb} clusters"
        );
    }
    for verb in ["get", "list", "watch"] {
        assert!(
            allowed(lab, &token, verb, "", "secrets", ns),
            "{verb} secrets"
        );
    }
    // A wake reaches the primary pod directly and checks later that it has not moved.
    for verb in ["get", "list", "watch"] {
        assert!(allowed(lab, &token, verb, "", "pods", ns), "{verb} pods");
    }
    for verb in ["get", "list", "watch", "create", "update", "delete"] {
        assert!(
            allowed(lab, &token, verb, lease, "leases", ns),
            "{verb} leases"
        );
    }
    // Cancel forwarding watches the gateway Service's EndpointSlices.
    let discovery = "discovery.k8s.io";
    for verb in ["list", "watch"] {
        assert!(
            allowed(lab, &token, verb, discovery, "endpointslices", ns),
            "{verb} endpointslices"
        );
    }
    let denied = [
        ("patch", cnpg, "clusters/status", ns),
        ("update", cnpg, "clusters/status", ns),
        ("update", cnpg, "clusters", ns),
        ("deletecollection", cnpg, "clusters", ns),
        ("create", "", "secrets", ns),
        ("patch", "", "secrets", ns),
        ("deletecollection", lease, "leases", ns),
        ("patch", lease, "leases", ns),
        ("create", discovery, "endpointslices", ns),
        ("patch", discovery, "endpointslices", ns),
        ("create", "", "pods", ns),
        ("delete", "", "pods", ns),
        ("get", "", "pods/log", ns),
        ("create", "", "pods/exec", ns),
        ("get", "", "services", ns),
        ("get", "", "configmaps", ns),
        ("get", "", "secrets", "default"),
        ("list", cnpg, "clusters", "default"),
        ("create", "rbac.authorization.k8s.io", "rolebindings", ns),
    ];
    for (verb, group, resource, namespace) in denied {
        assert!(
            !allowed(lab, &token, verb, group, resource, namespace),
            "{verb} {resource} in {namespace} must be denied"
        );
    }

    // The same answers from real requests, not only from the review.
    lab.ensure_namespace("deploy-rbac-other").unwrap();
    let other = lab
        .request_as(
            &token,
            "GET",
            "/api/v1/namespaces/deploy-rbac-other/secrets",
            None,
        )
        .unwrap();
    assert_eq!(other.status, 403, "{}", other.body);
    let own = lab
        .request_as(
            &token,
            "GET",
            &format!("/api/v1/namespaces/{ns}/secrets"),
            None,
        )
        .unwrap();
    assert_eq!(own.status, 200, "{}", own.body);
    let cluster = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": { "name": "rbac-probe", "namespace": ns },
        "spec": { "instances": 1, "storage": { "size": "1Gi" } },
    });
    let created = lab
        .request_as(
            &token,
            "POST",
            &pgwake_testkit::kube::clusters_path(ns),
            Some(("application/json", cluster.to_string().as_bytes())),
        )
        .unwrap();
    assert_eq!(created.status, 201, "{}", created.body);
    let status = lab
        .request_as(
            &token,
            "PATCH",
            &format!("{}/status", cluster_path(ns, "rbac-probe")),
            Some((
                "application/merge-patch+json",
                br#"{"status":{"readyInstances":1}}"#,
            )),
        )
        .unwrap();
    assert_eq!(status.status, 403, "{}", status.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_with_deploy_rbac_wakes_and_hibernates_a_cnpg_tenant() {
    const NS: &str = "deploy-rbac-wake";
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let token = tokio::task::spawn_blocking(|| lab.deploy_rbac_token(NS).unwrap())
        .await
        .unwrap();
    let (pg, _operator) = tokio::task::spawn_blocking(|| hibernated_cluster(lab, NS, "orders"))
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
    let gw = tokio::task::spawn_blocking(move || {
        let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
        let tenants = format!(
            "[kubernetes]\nkubeconfig = \"{}\"\n\
             [[tenant]]\nid = \"orders\"\n\
             backend = {{ kind = \"cnpg\", cluster = \"orders\", namespace = \"{NS}\", endpoint = \"127.0.0.1:{port}\" }}\n",
            kubeconfig.display(),
        );
        Gateway::launch(
            "allow_plaintext = true\n[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"100ms\"",
            &tenants,
            &[],
        )
    })
    .await
    .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=orders.postgres sslmode=disable connect_timeout=60",
        gw.port
    );
    for round in 0..2 {
        let (client, conn) = tokio_postgres::connect(&conninfo, NoTls)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", gw.log()));
        tokio::spawn(conn);
        let row = client.query_one("select 1::int4", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 1);
        drop(client);
        assert_eq!(hibernation(lab, NS, "orders"), "off", "round {round}");
        let gw_ref = &gw;
        tokio::task::block_in_place(|| {
            gw_ref.wait_state("orders", "asleep", Duration::from_secs(15));
        });
        assert_eq!(hibernation(lab, NS, "orders"), "on", "round {round}");
        // The next round starts from a cluster the operator has hibernated, not one it is still
        // about to hibernate.
        tokio::task::block_in_place(|| wait_hibernated(lab, NS, "orders"));
    }
    // Every call the gateway made was allowed: the API server says "forbidden" otherwise.
    let log = gw.log();
    assert!(!log.to_lowercase().contains("forbidden"), "{log}");
    assert_eq!(log.matches("patched cluster").count(), 4, "{log}");
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}
