//! Several gateway processes against a real kube-apiserver: warm-pool claims that a killed
//! replica abandoned go back to the pool, and the login throttle counts guesses across replicas.
//!
//! As in `pool.rs`, testkit's fake operator (named as such) writes Cluster status and gives each
//! cluster its own loopback address on one real Postgres.

mod common;

use std::time::{Duration, Instant};

use common::Gateway;
use pgwake_testkit::fake_operator::FakeCnpgOperator;
use pgwake_testkit::kube::{KubeLab, clusters_path};
use pgwake_testkit::{PgOptions, TestPostgres};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

const TEMPLATE: &str = "\
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  labels:
    team: replica-tests
spec:
  instances: 1
";

fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + limit;
    loop {
        let Some(problem) = check() else { return };
        assert!(Instant::now() < deadline, "{what}: {problem}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A gateway with the ServiceAccount token `deploy/` grants, plus `toml` after `[kubernetes]`.
fn kube_gateway(lab: &KubeLab, ns: &str, extra: &str, toml: &str) -> Gateway {
    let token = lab.deploy_rbac_token(ns).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let tenants = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\nnamespace = \"{ns}\"\n{toml}",
        kubeconfig.display()
    );
    Gateway::launch(&format!("allow_plaintext = true\n{extra}"), &tenants, &[])
}

fn cluster(lab: &KubeLab, ns: &str, name: &str) -> Value {
    lab.get(&format!("{}/{name}", clusters_path(ns)))
        .unwrap()
        .success_json()
        .unwrap()
}

fn labels_of(c: &Value) -> (String, Option<String>) {
    let labels = &c["metadata"]["labels"];
    (
        labels["pgwake.io/state"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        labels["pgwake.io/tenant"].as_str().map(str::to_owned),
    )
}

/// Connects through the gateway on `port` to `tenant`: the loopback address of the cluster
/// reached.
async fn reached(port: u16, user: &str, password: &str, tenant: &str) -> String {
    let conninfo = format!(
        "host=127.0.0.1 port={port} user={user} password={password} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60"
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    let row = client
        .query_one("select host(inet_server_addr())", &[])
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_mid_claim_leaves_a_claim_that_returns_to_the_pool() {
    const NS: &str = "replica-claims";
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let operator = tokio::task::spawn_blocking(|| {
        FakeCnpgOperator::start(lab, NS, PgOptions::default()).unwrap()
    })
    .await
    .unwrap();
    let (user, password) = (
        operator.postgres().options.user.clone(),
        operator.postgres().options.password.clone(),
    );
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("cluster.yaml");
    std::fs::write(&template, TEMPLATE).unwrap();
    let toml = format!(
        "[[pool_class]]\nname = \"orph\"\nnamespace = \"{NS}\"\nmin_warm = 2\n\
         release = \"hibernate\"\ntemplate = \"{}\"\nreplenish_interval = \"300ms\"\n\
         lease_duration = \"3s\"\norphan_grace = \"2s\"\n\
         [[tenant]]\nid = \"t1\"\nbackend = {{ kind = \"pool\", class = \"orph\" }}\n",
        template.display()
    );
    // A first, alone, so it holds the replenisher's Lease; then B.
    let (a, b) = tokio::task::spawn_blocking(move || {
        let a = kube_gateway(lab, NS, "", &toml);
        wait_for("A holds the pool lease", Duration::from_secs(20), || {
            (!a.log().contains("acquired lease")).then(|| a.log())
        });
        // A client reaching the pool before its first warm cluster is made would see the
        // tenant fail to start (the pool test covers that); this test is about what follows.
        let warm = format!(
            "{}?labelSelector=pgwake.io%2Fpool%3Dorph%2Cpgwake.io%2Fstate%3Dwarm",
            clusters_path(NS)
        );
        wait_for("a warm cluster", Duration::from_secs(20), || {
            let list = lab.get(&warm).unwrap().success_json().unwrap();
            let n = list["items"].as_array().map_or(0, Vec::len);
            (n == 0).then(|| a.log())
        });
        let b = kube_gateway(lab, NS, "", &toml);
        (a, b)
    })
    .await
    .unwrap();
    // t1 claims and binds a cluster through A: a finished claim, which must stay.
    let t1_addr = reached(a.port, &user, &password, "t1").await;

    // What a replica killed between claim and binding leaves: the claim patch landed (state
    // claimed, tenant label), no binding Lease names the cluster, no bound mark. One for a
    // tenant nobody binds, one for t1 (whose binding names another cluster), and one that was
    // marked bound (its Lease deleted by hand): that one may hold data and must stay claimed.
    tokio::task::spawn_blocking(move || {
        for (name, tenant, marked) in [
            ("orph-lost", "ghost", false),
            ("orph-raced", "t1", false),
            ("orph-marked", "old", true),
        ] {
            let mut manifest = json!({
                "apiVersion": "postgresql.cnpg.io/v1",
                "kind": "Cluster",
                "metadata": {
                    "name": name,
                    "labels": {
                        "pgwake.io/pool": "orph",
                        "pgwake.io/state": "claimed",
                        "pgwake.io/tenant": tenant,
                    }
                },
                "spec": { "instances": 1 }
            });
            if marked {
                manifest["metadata"]["annotations"] =
                    json!({ "pgwake.io/bound": "pgwake-bind-orph-old" });
            }
            lab.create(&clusters_path(NS), &manifest.to_string())
                .unwrap()
                .success_json()
                .unwrap();
        }
    })
    .await
    .unwrap();

    // A, the Lease holder, is killed before the grace is over: B takes over and sweeps.
    let (a, b) = tokio::task::spawn_blocking(move || {
        let mut a = a;
        a.signal("-KILL");
        assert!(a.wait_exit(Duration::from_secs(5)));
        let started = Instant::now();
        wait_for(
            "abandoned claims back in the pool",
            Duration::from_secs(30),
            || {
                let lost = labels_of(&cluster(lab, NS, "orph-lost"));
                let raced = labels_of(&cluster(lab, NS, "orph-raced"));
                let warm = ("warm".to_owned(), None);
                (lost != warm || raced != warm).then(|| format!("{lost:?} {raced:?}\n{}", b.log()))
            },
        );
        eprintln!(
            "abandoned claims returned {:?} after A was killed",
            started.elapsed()
        );
        // B logs each return after its patch lands: the second line may trail the labels.
        let returned = "returned an abandoned claim to the warm pool";
        wait_for("B logged both returns", Duration::from_secs(5), || {
            let log = b.log();
            (log.matches(returned).count() < 2).then_some(log)
        });
        let log = b.log();
        assert!(log.contains("took over lease"), "{log}");
        assert_eq!(
            log.matches("returned an abandoned claim to the warm pool")
                .count(),
            2,
            "{log}"
        );
        // The marked one stays claimed; so does t1's bound cluster.
        assert_eq!(
            labels_of(&cluster(lab, NS, "orph-marked")),
            ("claimed".to_owned(), Some("old".to_owned()))
        );
        let lease = lab
            .get(&format!(
                "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/pgwake-bind-orph-t1"
            ))
            .unwrap()
            .success_json()
            .unwrap();
        let bound = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();
        let c = cluster(lab, NS, &bound);
        assert_eq!(labels_of(&c), ("claimed".to_owned(), Some("t1".to_owned())));
        assert_eq!(
            c["metadata"]["annotations"]["pgwake.io/bound"],
            "pgwake-bind-orph-t1"
        );
        (a, b)
    })
    .await
    .unwrap();
    // t1 reaches the same cluster through B.
    assert_eq!(reached(b.port, &user, &password, "t1").await, t1_addr);
    tokio::task::spawn_blocking(move || {
        drop(a);
        drop(b);
        drop(operator);
    })
    .await
    .unwrap();
}

/// One login attempt through `gw`: Ok, or the SQLSTATE the client got.
async fn login(gw: &Gateway, user: &str, password: &str) -> Result<(), String> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=alpha.postgres \
         sslmode=disable connect_timeout=10",
        gw.port
    );
    match tokio_postgres::connect(&conninfo, NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            client
                .query_one("select 1", &[])
                .await
                .map_err(|e| format!("{e:?}"))?;
            Ok(())
        }
        Err(e) => Err(e
            .code()
            .map(|c| c.code().to_owned())
            .unwrap_or_else(|| format!("{e:?}"))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_throttle_blocks_a_guesser_rotating_over_three_replicas() {
    const NS: &str = "replica-throttle";
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let pg = tokio::task::spawn_blocking(|| TestPostgres::start(PgOptions::default()).unwrap())
        .await
        .unwrap();
    pg.psql("create role app login password 'app-password'")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.txt");
    std::fs::write(&users, "\"app\" \"app-password\"\n").unwrap();
    let tenants = format!(
        "[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n\
         credentials = {{ kind = \"static\", file = \"{}\" }}\n",
        pg.port,
        users.display()
    );
    // Three free failures in all; a 30 s wait after them, so no block ends during the test.
    let extra = "[auth]\nthrottle_free_failures = 3\nthrottle_base = \"30s\"\n\
                 throttle_max = \"60s\"\nthrottle_shared = true\n";
    let gws = tokio::task::spawn_blocking(move || {
        (0..3)
            .map(|_| kube_gateway(lab, NS, extra, &tenants))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    // Everyone gets in with the right password first.
    for gw in &gws {
        login(gw, "app", "app-password").await.unwrap();
    }
    // One guess per replica: each replica alone has seen one failure, under its own limit.
    for gw in &gws {
        assert_eq!(
            login(gw, "app", "wrong").await,
            Err("28P01".to_owned()),
            "{}",
            gw.log()
        );
    }
    // The fourth guess, on any replica, is refused unread; so is the right password.
    for (i, gw) in gws.iter().enumerate() {
        let guess = if i == 0 { "wrong" } else { "app-password" };
        let got = login(gw, "app", guess).await;
        assert_eq!(got, Err("28000".to_owned()), "replica {i}\n{}", gw.log());
        assert_eq!(
            gw.metric("pgwake_auth_attempts_total{outcome=\"failed\"}"),
            1.0,
            "replica {i} evaluated only its one guess"
        );
    }
    // The counts are on the API server, where every replica reads them.
    let leases = tokio::task::spawn_blocking(move || {
        lab.get(&format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases?labelSelector=pgwake.io%2Fthrottle"
        ))
        .unwrap()
        .success_json()
        .unwrap()
    })
    .await
    .unwrap();
    let records: Vec<(String, String)> = leases["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["metadata"]["annotations"]["pgwake.io/throttle-key"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                l["metadata"]["annotations"]["pgwake.io/failures"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    assert!(
        records.contains(&("address 127.0.0.1 alpha".into(), r#"{"app":3}"#.into())),
        "{records:?}"
    );
    assert!(
        records.contains(&("account alpha app".into(), r#"{"127.0.0.1":3}"#.into())),
        "{records:?}"
    );
    tokio::task::spawn_blocking(move || {
        drop(gws);
        drop(pg);
    })
    .await
    .unwrap();
}
