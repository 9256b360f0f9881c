//! Hostile clients at the edge, round three (privilege boundaries): what a tenant's own
//! database user can make the gateway do outside its database.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::{Gateway, local_session};
use pgwake_testkit::postgres_account;

/// A local tenant's clients log in as the `[local]` superuser, who can run programs as the
/// server account (`COPY … TO PROGRAM`). Links that account plants where the root gateway
/// writes (its run history and lock in `data_dir`, the server log in the tenant's folder) must
/// never make the gateway write a file only root may write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_superuser_cannot_steer_the_gateways_writes_with_links() {
    let Some((uid, _)) = postgres_account() else {
        eprintln!("skipped: the boundary exists only when the gateway runs as root");
        return;
    };
    let gw = tokio::task::spawn_blocking(|| {
        Gateway::start_local(&["f1"], "allow_plaintext = true\n", "", &[])
    })
    .await
    .unwrap();
    let victim = gw.dir.path().join("root-only");
    std::fs::write(&victim, "root only\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let data_dir = gw.dir.path().join("data");

    let client = local_session(&gw, "f1").await;
    // The account reaches its tenants' folders but may not write beside them.
    let meta = std::fs::metadata(&data_dir).unwrap();
    assert_ne!(meta.uid(), uid, "data_dir is the gateway's own");
    assert_eq!(meta.mode() & 0o022, 0, "nobody else may write in data_dir");
    let plants = [
        data_dir.join("pgwake-runs.json.tmp"),
        data_dir.join("pgwake-runs.json"),
        gw.local_dir("f1").join("postgres.log"),
    ];
    let mut planted = Vec::new();
    for link in &plants {
        let command = format!(
            "COPY (SELECT 1) TO PROGRAM 'ln -sfn {} {}'",
            victim.display(),
            link.display()
        );
        let done = client.batch_execute(&command).await;
        if let Err(e) = &done {
            eprintln!("{}: {e:?}", link.display());
        }
        planted.push(done.is_ok());
    }
    // Only the tenant's own folder is the account's to change.
    assert_eq!(
        planted,
        [false, false, true],
        "links the account could plant"
    );
    drop(client);
    gw.wait_idle();

    // A sleep and a new run: the gateway reopens the server log and rewrites the run history.
    let (status, body) = gw.http("POST", "/v1/tenants/f1/sleep").unwrap();
    assert_eq!(status, 200, "{body}");
    gw.wait_state("f1", "asleep", Duration::from_secs(30));
    let client = local_session(&gw, "f1").await;
    client.simple_query("select 1").await.unwrap();
    // The history is written within an idle check (1 s) of the run: the second run's start.
    let history = data_dir.join("pgwake-runs.json");
    let runs = || -> usize {
        let text = std::fs::read_to_string(&history).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&text)
            .map_or(0, |v| v["tenants"]["f1"].as_array().map_or(0, Vec::len))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runs() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no run history written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only\n");
    let log = std::fs::symlink_metadata(gw.local_dir("f1").join("postgres.log")).unwrap();
    assert!(
        log.file_type().is_file(),
        "the planted log link was replaced"
    );
    assert!(gw.log().contains("replacing a link or foreign file"));
}
