//! The `pool` backend against a real kube-apiserver: tenants claim pre-warmed Clusters on their
//! first connection, two gateways racing never bind one cluster twice nor one tenant to two
//! clusters, the Lease-elected replenisher keeps `min_warm` (another replica takes over when the
//! holder stops), and sleep releases by the class's policy.
//!
//! No CloudNativePG operator runs here: testkit's fake operator (named as such) writes Cluster
//! status and gives every cluster its own loopback address on one shared, real Postgres, so a
//! session can tell which cluster it reached (`host(inet_server_addr())`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::Gateway;
use pgwake_testkit::PgOptions;
use pgwake_testkit::fake_operator::FakeCnpgOperator;
use pgwake_testkit::kube::{KubeLab, clusters_path};
use serde_json::{Value, json};
use tokio_postgres::NoTls;

const TEMPLATE: &str = "\
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  labels:
    team: pool-tests
spec:
  instances: 1
  storage:
    size: 1Gi
";

/// Clusters of a namespace matching a label selector, as (name, labels, annotations).
fn clusters(lab: &KubeLab, namespace: &str, selector: &str) -> Vec<Value> {
    let path = format!(
        "{}?labelSelector={}",
        clusters_path(namespace),
        selector
            .replace('/', "%2F")
            .replace(',', "%2C")
            .replace('=', "%3D")
    );
    let list = lab.get(&path).unwrap().success_json().unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + limit;
    loop {
        let Some(problem) = check() else { return };
        assert!(Instant::now() < deadline, "{what}: {problem}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A gateway serving `tenants` (id, class) from `classes` (TOML of `[[pool_class]]` tables).
fn pool_gateway(
    lab: &KubeLab,
    ns: &str,
    classes: &str,
    tenants: &[(String, &str)],
    extra: &str,
) -> Gateway {
    // Exactly the permissions deploy/ grants the gateway (bound in the pool's namespace).
    let token = lab.deploy_rbac_token(ns).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let mut toml = format!("[kubernetes]\nkubeconfig = \"{}\"\n", kubeconfig.display());
    toml.push_str(classes);
    for (id, class) in tenants {
        toml.push_str(&format!(
            "[[tenant]]\nid = \"{id}\"\nbackend = {{ kind = \"pool\", class = \"{class}\" }}\n"
        ));
    }
    Gateway::launch(&format!("allow_plaintext = true\n{extra}"), &toml, &[])
}

fn template_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, TEMPLATE).unwrap();
    let p = path.display().to_string();
    (dir, p)
}

/// Connects through the gateway on `port` to `tenant` and returns the loopback address of the
/// cluster the session reached.
async fn reached(port: u16, op_user: &str, password: &str, tenant: &str) -> Result<String, String> {
    let conninfo = format!(
        "host=127.0.0.1 port={port} user={op_user} password={password} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60"
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls)
        .await
        .map_err(|e| format!("{tenant}: {e}"))?;
    tokio::spawn(conn);
    let row = client
        .query_one("select host(inet_server_addr())", &[])
        .await
        .map_err(|e| format!("{tenant}: {e}"))?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_claim_twenty_distinct_clusters_and_the_pool_refills() {
    const NS: &str = "pool-race";
    const MIN_WARM: usize = 8;
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
    // A pool of 25 warm clusters, made before any gateway runs.
    tokio::task::spawn_blocking(move || {
        for i in 0..25 {
            let manifest = json!({
                "apiVersion": "postgresql.cnpg.io/v1",
                "kind": "Cluster",
                "metadata": {
                    "name": format!("race-{i:02}"),
                    "labels": { "pgwake.io/pool": "race", "pgwake.io/state": "warm" }
                },
                "spec": { "instances": 1 }
            });
            lab.create(&clusters_path(NS), &manifest.to_string())
                .unwrap()
                .success_json()
                .unwrap();
        }
    })
    .await
    .unwrap();
    let (_tdir, template) = template_file();
    let classes = format!(
        "[[pool_class]]\nname = \"race\"\nnamespace = \"{NS}\"\nmin_warm = {MIN_WARM}\n\
         release = \"delete\"\ntemplate = \"{template}\"\nreplenish_interval = \"300ms\"\n\
         lease_duration = \"3s\"\n"
    );
    let tenants: Vec<(String, &str)> = (0..20).map(|i| (format!("t{i:02}"), "race")).collect();
    let (a, b) = {
        let (classes, tenants) = (classes.clone(), tenants.clone());
        tokio::task::spawn_blocking(move || {
            let a = pool_gateway(lab, NS, &classes, &tenants, "");
            let b = pool_gateway(lab, NS, &classes, &tenants, "");
            (a, b)
        })
        .await
        .unwrap()
    };
    // Every tenant through both gateways at once: 40 wakes racing for 25 clusters.
    let mut tasks = Vec::new();
    for (tenant, _) in &tenants {
        for port in [a.port, b.port] {
            let (tenant, user, password) = (tenant.clone(), user.clone(), password.clone());
            tasks.push(tokio::spawn(async move {
                let addr = reached(port, &user, &password, &tenant).await;
                (tenant, port, addr)
            }));
        }
    }
    let mut by_tenant: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in tasks {
        let (tenant, port, addr) = t.await.unwrap();
        let addr = addr.unwrap_or_else(|e| {
            panic!("via {port}: {e}\n--- a:\n{}\n--- b:\n{}", a.log(), b.log())
        });
        by_tenant.entry(tenant).or_default().insert(addr);
    }
    // One cluster per tenant, whichever gateway the client came through...
    for (tenant, addrs) in &by_tenant {
        assert_eq!(
            addrs.len(),
            1,
            "tenant {tenant} reached {addrs:?}\n--- a:\n{}\n--- b:\n{}",
            a.log(),
            b.log()
        );
    }
    // ...and a different one for every tenant.
    let distinct: BTreeSet<&String> = by_tenant.values().flatten().collect();
    assert_eq!(distinct.len(), 20, "{by_tenant:?}");

    let claimed = tokio::task::spawn_blocking(move || {
        clusters(lab, NS, "pgwake.io/pool=race,pgwake.io/state=claimed")
    })
    .await
    .unwrap();
    assert_eq!(claimed.len(), 20, "{claimed:#?}");
    // The binding Leases agree with the labels.
    let leases = tokio::task::spawn_blocking(move || {
        (0..20)
            .map(|i| {
                let path = format!(
                    "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/pgwake-bind-race-t{i:02}"
                );
                let lease = lab.get(&path).unwrap().success_json().unwrap();
                (
                    format!("t{i:02}"),
                    lease["spec"]["holderIdentity"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<BTreeMap<String, String>>()
    })
    .await
    .unwrap();
    for c in &claimed {
        let tenant = c["metadata"]["labels"]["pgwake.io/tenant"]
            .as_str()
            .unwrap();
        assert_eq!(
            leases.get(tenant).map(String::as_str),
            c["metadata"]["name"].as_str(),
            "{leases:?}"
        );
    }
    let bound: BTreeMap<String, String> = claimed
        .iter()
        .map(|c| {
            let tenant = c["metadata"]["labels"]["pgwake.io/tenant"]
                .as_str()
                .unwrap()
                .to_owned();
            let endpoint = c["metadata"]["annotations"]["pgwake.io/endpoint"]
                .as_str()
                .unwrap();
            (tenant, endpoint.rsplit_once(':').unwrap().0.to_owned())
        })
        .collect();
    assert_eq!(
        bound.len(),
        20,
        "a tenant is bound to two clusters: {claimed:#?}"
    );
    for (tenant, addrs) in &by_tenant {
        assert_eq!(
            Some(addrs.first().unwrap()),
            bound.get(tenant),
            "tenant {tenant} was routed to a cluster not bound to it"
        );
    }

    // The replenisher brings the warm count back to min_warm (25 - 20 left 5 warm). Only the
    // Lease holder creates clusters. (A claim given back after a cross-gateway race can push
    // the warm count above min_warm: surplus is not trimmed.)
    tokio::task::spawn_blocking(move || {
        let mut all = 0;
        wait_for("min_warm restored", Duration::from_secs(30), || {
            let warm = clusters(lab, NS, "pgwake.io/pool=race,pgwake.io/state=warm").len();
            all = clusters(lab, NS, "pgwake.io/pool=race").len();
            (warm < MIN_WARM).then(|| format!("{warm} warm of {all} clusters"))
        });
        let lease = lab
            .get(&format!(
                "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/pgwake-pool-race"
            ))
            .unwrap()
            .success_json()
            .unwrap();
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();
        let lost = a
            .log()
            .matches("another gateway bound the tenant first")
            .count()
            + b.log()
                .matches("another gateway bound the tenant first")
                .count();
        eprintln!("binding races lost and claims given back: {lost}");
        let (holder_gw, other) = if holder.ends_with(&format!("-{}", a.pid())) {
            (a, b)
        } else {
            assert!(
                holder.ends_with(&format!("-{}", b.pid())),
                "holder {holder}"
            );
            (b, a)
        };
        let created = holder_gw.log().matches("created warm pool cluster").count();
        assert_eq!(created, all - 25, "{}", holder_gw.log());
        assert_eq!(other.log().matches("created warm pool cluster").count(), 0);

        // The holder stops (SIGTERM gives the Lease up); the other replica takes over
        // replenishing when warm clusters are used up.
        drop(holder_gw);
        // Leave two fewer than min_warm (give-backs may have left a surplus).
        let warm = clusters(lab, NS, "pgwake.io/pool=race,pgwake.io/state=warm");
        for c in warm.iter().take(warm.len() + 2 - MIN_WARM) {
            let name = c["metadata"]["name"].as_str().unwrap();
            let path = format!("{}/{name}", clusters_path(NS));
            lab.request("DELETE", &path, None)
                .unwrap()
                .success_json()
                .unwrap();
        }
        wait_for(
            "the other replica replenishes",
            Duration::from_secs(30),
            || {
                let warm = clusters(lab, NS, "pgwake.io/pool=race,pgwake.io/state=warm").len();
                (warm < MIN_WARM).then(|| format!("{warm} warm\n{}", other.log()))
            },
        );
        assert!(other.log().contains("took over lease"), "{}", other.log());
        assert!(other.log().contains("created warm pool cluster"));
        drop(other);
        drop(operator);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_deletes_or_hibernates_by_class_and_an_empty_pool_is_57p03() {
    const NS: &str = "pool-release";
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
    let (_tdir, template) = template_file();
    let class = |name: &str, min_warm: usize, release: &str| {
        format!(
            "[[pool_class]]\nname = \"{name}\"\nnamespace = \"{NS}\"\nmin_warm = {min_warm}\n\
             release = \"{release}\"\ntemplate = \"{template}\"\nreplenish_interval = \"300ms\"\n\
             lease_duration = \"3s\"\n"
        )
    };
    let classes = format!(
        "{}{}{}",
        class("eph", 2, "delete"),
        class("keep", 2, "hibernate"),
        class("empty", 0, "delete")
    );
    let tenants = vec![
        ("e1".to_owned(), "eph"),
        ("k1".to_owned(), "keep"),
        ("x1".to_owned(), "empty"),
    ];
    let gw = tokio::task::spawn_blocking(move || {
        let gw = pool_gateway(
            lab,
            NS,
            &classes,
            &tenants,
            "[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"100ms\"\n\
             retry_backoff = \"50ms\"\n",
        );
        // The replenisher fills both classes from the template, starting from nothing.
        wait_for(
            "warm clusters from the template",
            Duration::from_secs(30),
            || {
                let eph = clusters(lab, NS, "pgwake.io/pool=eph,pgwake.io/state=warm");
                let keep = clusters(lab, NS, "pgwake.io/pool=keep,pgwake.io/state=warm");
                (eph.len() != 2 || keep.len() != 2)
                    .then(|| format!("eph {} keep {}", eph.len(), keep.len()))
            },
        );
        let c = &clusters(lab, NS, "pgwake.io/pool=eph")[0];
        assert_eq!(c["metadata"]["labels"]["team"], "pool-tests");
        assert!(c["metadata"]["name"].as_str().unwrap().starts_with("eph-"));
        gw
    })
    .await
    .unwrap();

    // delete: the cluster goes away when the tenant sleeps; the next wake claims a fresh one.
    let first = reached(gw.port, &user, &password, "e1").await.unwrap();
    let gw_ref = &gw;
    tokio::task::block_in_place(|| {
        gw_ref.wait_state("e1", "asleep", Duration::from_secs(15));
        assert!(clusters(lab, NS, "pgwake.io/tenant=e1").is_empty());
        assert!(
            gw_ref.log().contains("deleted pool cluster"),
            "{}",
            gw_ref.log()
        );
    });
    let second = reached(gw.port, &user, &password, "e1").await.unwrap();
    assert_ne!(
        first, second,
        "a deleted cluster's address came back too soon"
    );

    // hibernate: the binding stays, the next wake wakes the same cluster by annotation.
    let kept = reached(gw.port, &user, &password, "k1").await.unwrap();
    tokio::task::block_in_place(|| {
        gw_ref.wait_state("k1", "asleep", Duration::from_secs(15));
        let bound = clusters(lab, NS, "pgwake.io/tenant=k1");
        assert_eq!(bound.len(), 1, "{bound:#?}");
        assert_eq!(
            bound[0]["metadata"]["annotations"]["cnpg.io/hibernation"],
            "on"
        );
    });
    let again = reached(gw.port, &user, &password, "k1").await.unwrap();
    assert_eq!(kept, again);
    tokio::task::block_in_place(|| {
        let bound = clusters(lab, NS, "pgwake.io/tenant=k1");
        assert_eq!(bound.len(), 1, "{bound:#?}");
        assert_eq!(
            bound[0]["metadata"]["annotations"]["cnpg.io/hibernation"],
            "off"
        );
        assert_eq!(gw_ref.log().matches("claimed pool cluster").count(), 3);
        // Both classes are back at min_warm.
        wait_for("min_warm restored", Duration::from_secs(30), || {
            let eph = clusters(lab, NS, "pgwake.io/pool=eph,pgwake.io/state=warm");
            let keep = clusters(lab, NS, "pgwake.io/pool=keep,pgwake.io/state=warm");
            (eph.len() != 2 || keep.len() != 2)
                .then(|| format!("eph {} keep {}", eph.len(), keep.len()))
        });
    });

    // A class without warm clusters: the client hears 57P03, not a hang.
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=x1.postgres sslmode=disable",
        gw.port
    );
    let e = tokio_postgres::connect(&conninfo, NoTls)
        .await
        .err()
        .unwrap();
    let db = e.as_db_error().expect("an ErrorResponse");
    assert_eq!(
        db.code(),
        &tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW,
        "{db:?}"
    );
    assert!(db.message().contains("failed to start"), "{db:?}");
    tokio::task::block_in_place(|| {
        assert!(
            gw_ref
                .log()
                .contains("pool class empty has no warm cluster"),
            "{}",
            gw_ref.log()
        );
    });
    tokio::task::spawn_blocking(move || {
        drop(gw);
        drop(operator);
    })
    .await
    .unwrap();
}
