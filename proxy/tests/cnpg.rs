//! The `cnpg` backend against a real kube-apiserver: a hibernated Cluster is woken by its
//! annotation when a client connects, a wake storm patches once, idle sleep hibernates it, and
//! labelled Clusters become tenants (with their `-app` Secret as credentials) without a restart.
//!
//! No CloudNativePG operator runs here; a fake operator plays it (see `common/cnpg_operator.rs`).

mod common;

use std::time::{Duration, Instant};

use common::Gateway;
use common::cnpg_operator::{hibernated_cluster, hibernation, write_app_secret};
use pgwake_testkit::TestPostgres;
use pgwake_testkit::kube::KubeLab;
use serde_json::json;
use tokio_postgres::NoTls;

const NAMESPACE: &str = "tenants";

fn gateway_for(lab: &KubeLab, name: &str, pg: &TestPostgres, extra: &str) -> Gateway {
    // Exactly the permissions deploy/ grants the gateway, not admin.
    let token = lab.deploy_rbac_token(NAMESPACE).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let tenants = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\n\
         [[tenant]]\nid = \"{name}\"\n\
         backend = {{ kind = \"cnpg\", cluster = \"{name}\", namespace = \"{NAMESPACE}\", endpoint = \"127.0.0.1:{}\" }}\n",
        kubeconfig.display(),
        pg.port
    );
    Gateway::launch(&format!("allow_plaintext = true\n{extra}"), &tenants, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_storm_wakes_a_hibernated_cluster_with_one_patch() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let (pg, _operator) =
        tokio::task::spawn_blocking(|| hibernated_cluster(lab, NAMESPACE, "storm"))
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
    assert_eq!(hibernation(lab, NAMESPACE, "storm"), "off");
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
    let (pg, _operator) = tokio::task::spawn_blocking(|| hibernated_cluster(lab, NAMESPACE, "nap"))
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
        if round == 0 {
            // psql, as a person would: it waits through the wake like any slow login.
            // The fake operator needs the Postgres handle to start it: do not hold its lock.
            let out = tokio::task::block_in_place(|| {
                std::process::Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
                .args(["-X", "-A", "-t", "-w", "-c", "select 'woken'"])
                .arg(format!(
                    "host=127.0.0.1 port={} user={user} dbname=nap.postgres sslmode=disable connect_timeout=30",
                    gw.port
                ))
                .env("PGPASSWORD", &password)
                .output()
                .expect("run psql")
            });
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "woken",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let (client, conn) = tokio_postgres::connect(&conninfo, NoTls)
                .await
                .expect("wake");
            tokio::spawn(conn);
            let row = client.query_one("select 1::int4", &[]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), 1);
        }
        assert_eq!(hibernation(lab, NAMESPACE, "nap"), "off", "round {round}");
        let gw_ref = &gw;
        tokio::task::block_in_place(|| {
            gw_ref.wait_state("nap", "asleep", Duration::from_secs(15));
        });
        assert_eq!(
            hibernation(lab, NAMESPACE, "nap"),
            "on",
            "round {round}: {}",
            gw.log()
        );
    }
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

/// A gateway with no configured tenant that serves every labelled Cluster in the namespace.
fn discovering_gateway(lab: &KubeLab, extra: &str) -> Gateway {
    // Exactly the permissions deploy/ grants the gateway, not admin.
    let token = lab.deploy_rbac_token(NAMESPACE).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let kube = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\nnamespace = \"{NAMESPACE}\"\ndiscover = true\n",
        kubeconfig.display()
    );
    Gateway::launch(&format!("allow_plaintext = true\n{extra}"), &kube, &[])
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.code().code().to_owned())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelled_clusters_become_tenants_with_their_app_secret() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let gw = tokio::task::spawn_blocking(move || {
        discovering_gateway(lab, "[auth]\nthrottle_free_failures = 100\n")
    })
    .await
    .unwrap();
    let (pg, _operator) =
        tokio::task::spawn_blocking(|| hibernated_cluster(lab, NAMESPACE, "disco"))
            .await
            .unwrap();
    let (user, password) = {
        let pg = pg.lock().unwrap();
        (pg.options.user.clone(), pg.options.password.clone())
    };
    {
        let (user, password) = (user.clone(), password.clone());
        tokio::task::spawn_blocking(move || {
            write_app_secret(lab, NAMESPACE, "disco", &user, &password)
        })
        .await
        .unwrap();
    }
    tokio::task::block_in_place(|| gw.wait_listed("disco", true));

    // Checked against the Secret before anything wakes: a wrong password leaves it hibernated.
    let wrong = gw
        .select_one("disco", &user, "not-the-password")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&wrong), "28P01", "{wrong}");
    assert_eq!(hibernation(lab, NAMESPACE, "disco"), "on");

    assert_eq!(gw.select_one("disco", &user, &password).await.unwrap(), 1);
    assert_eq!(hibernation(lab, NAMESPACE, "disco"), "off");

    // Rotation: the role's password and the Secret change; the gateway follows the Secret.
    let rotated = "rotated-password-2";
    pg.lock()
        .unwrap()
        .psql(&format!("alter role \"{user}\" password '{rotated}'"))
        .unwrap();
    {
        let user = user.clone();
        tokio::task::spawn_blocking(move || {
            write_app_secret(lab, NAMESPACE, "disco", &user, rotated)
        })
        .await
        .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match gw.select_one("disco", &user, rotated).await {
            Ok(v) => {
                assert_eq!(v, 1);
                break;
            }
            Err(e) => {
                // The watch delivers the new Secret a moment after the write.
                assert!(Instant::now() < deadline, "rotated password refused: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let old = gw.select_one("disco", &user, &password).await.unwrap_err();
    assert_eq!(sqlstate(&old), "28P01", "{old}");

    // Taking the label off removes the tenant; it is then refused like an unknown one.
    tokio::task::spawn_blocking(move || {
        lab.merge_patch(
            &common::cnpg_operator::cluster_path(NAMESPACE, "disco"),
            &json!({ "metadata": { "labels": { "pgwake.io/tenant": null } } }),
        )
        .unwrap()
        .success_json()
        .unwrap();
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| gw.wait_listed("disco", false));
    let gone = gw.select_one("disco", &user, rotated).await.unwrap_err();
    // Answered as a wrong password, as for any tenant that does not exist.
    assert_eq!(sqlstate(&gone), "28P01", "{gone}");
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

/// A gateway before this one (a rollout, a crash) can leave a cluster awake; nothing else
/// would ever put it to sleep if no client came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_left_awake_sleeps_after_the_idle_timeout_without_a_client() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let (pg, _operator) = tokio::task::spawn_blocking(|| {
        let (pg, operator) = hibernated_cluster(lab, NAMESPACE, "leftover");
        lab.merge_patch(
            &common::cnpg_operator::cluster_path(NAMESPACE, "leftover"),
            &json!({ "metadata": { "annotations": { "cnpg.io/hibernation": "off" } } }),
        )
        .unwrap()
        .success_json()
        .unwrap();
        while !pg.lock().unwrap().is_running() {
            std::thread::sleep(Duration::from_millis(20));
        }
        (pg, operator)
    })
    .await
    .unwrap();
    let gw = tokio::task::spawn_blocking(move || {
        gateway_for(
            lab,
            "leftover",
            &pg.lock().unwrap(),
            "[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"100ms\"",
        )
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while hibernation(lab, NAMESPACE, "leftover") != "on" {
            assert!(Instant::now() < deadline, "still awake: {}", gw.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert!(gw.log().contains("taking it over"), "{}", gw.log());
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}
