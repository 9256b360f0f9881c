//! The gateway through a Kubernetes API outage: tenants already awake keep serving (their
//! credentials come from the watched copy of the Secrets), a wake fails with a clear 57P03, and
//! once the API server is back, wakes work again and tenant discovery has caught up.
//!
//! Its own test binary, so stopping this lab's API server disturbs no other test.

mod common;

use std::time::{Duration, Instant};

use common::Gateway;
use common::cnpg_operator::{hibernated_cluster, hibernation, write_app_secret};
use pgwake_testkit::kube::KubeLab;

const NAMESPACE: &str = "tenants";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awake_tenants_ride_out_an_api_outage_and_wakes_recover() {
    let lab = tokio::task::spawn_blocking(KubeLab::shared).await.unwrap();
    let mut clusters = Vec::new();
    for name in ["steady", "sleepy"] {
        let (pg, operator) =
            tokio::task::spawn_blocking(move || hibernated_cluster(lab, NAMESPACE, name))
                .await
                .unwrap();
        let (user, password) = {
            let pg = pg.lock().unwrap();
            (pg.options.user.clone(), pg.options.password.clone())
        };
        let (u, p) = (user.clone(), password.clone());
        tokio::task::spawn_blocking(move || write_app_secret(lab, NAMESPACE, name, &u, &p))
            .await
            .unwrap();
        clusters.push((pg, operator, user, password));
    }
    // Exactly the permissions deploy/ grants the gateway, not admin.
    let token = lab.deploy_rbac_token(NAMESPACE).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::launch(
            "allow_plaintext = true\n[wake]\nattempts = 1\nfailed_retry_delay = \"200ms\"\nwake_timeout = \"10s\"\n",
            &format!(
                "[kubernetes]\nkubeconfig = \"{}\"\nnamespace = \"{NAMESPACE}\"\ndiscover = true\n",
                kubeconfig.display()
            ),
            &[],
        )
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| {
        gw.wait_listed("steady", true);
        gw.wait_listed("sleepy", true);
    });
    let (steady_user, steady_pw) = (&clusters[0].2, &clusters[0].3);
    let (sleepy_user, sleepy_pw) = (&clusters[1].2, &clusters[1].3);
    assert_eq!(
        gw.select_one("steady", steady_user, steady_pw)
            .await
            .unwrap(),
        1
    );

    tokio::task::spawn_blocking(move || lab.stop_apiserver().unwrap())
        .await
        .unwrap();

    // The awake tenant serves new logins from cached credentials and state.
    for _ in 0..3 {
        assert_eq!(
            gw.select_one("steady", steady_user, steady_pw)
                .await
                .unwrap(),
            1
        );
    }
    // The sleeping one cannot be woken: a clear "cannot connect now", not a hang.
    let started = Instant::now();
    let err = gw
        .select_one("sleepy", sleepy_user, sleepy_pw)
        .await
        .unwrap_err();
    let db = err.as_db_error().expect("an ErrorResponse");
    assert_eq!(db.code().code(), "57P03", "{err}");
    assert!(db.message().contains("sleepy"), "{}", db.message());
    assert!(started.elapsed() < Duration::from_secs(10));

    tokio::task::spawn_blocking(move || lab.start_apiserver().unwrap())
        .await
        .unwrap();

    // Wakes work again once the retry delay has passed.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match gw.select_one("sleepy", sleepy_user, sleepy_pw).await {
            Ok(v) => {
                assert_eq!(v, 1);
                break;
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no wake after the API returned: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(hibernation(lab, NAMESPACE, "sleepy"), "off");

    // The discovery watch resumed: a cluster labelled after the outage becomes a tenant.
    let (late_pg, _late_operator) =
        tokio::task::spawn_blocking(move || hibernated_cluster(lab, NAMESPACE, "late"))
            .await
            .unwrap();
    let (late_user, late_pw) = {
        let pg = late_pg.lock().unwrap();
        (pg.options.user.clone(), pg.options.password.clone())
    };
    {
        let (u, p) = (late_user.clone(), late_pw.clone());
        tokio::task::spawn_blocking(move || write_app_secret(lab, NAMESPACE, "late", &u, &p))
            .await
            .unwrap();
    }
    tokio::task::block_in_place(|| gw.wait_listed("late", true));
    assert_eq!(
        gw.select_one("late", &late_user, &late_pw).await.unwrap(),
        1
    );
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}
