//! Kubernetes wake latency: a `cnpg` tenant woken by its hibernation annotation against a `pool`
//! tenant that claims a pre-warmed cluster, both through a real kube-apiserver (testkit's
//! `KubeLab`) with testkit's fake CloudNativePG operator playing the operator.
//!
//! The fake operator makes a cluster ready as soon as it sees the request (one status write; no
//! pod, no Postgres start: every cluster is an address of one running Postgres), so what the
//! client waits for here is the gateway's own path through the API server: patches, watches,
//! the readiness probe. A real operator adds its pod start to the annotation wake only; a pool
//! claim finds the cluster already running.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use pgwake_testkit::fake_operator::FakeCnpgOperator;
use pgwake_testkit::kube::{KubeLab, clusters_path};
use pgwake_testkit::{PgOptions, free_port};
use serde_json::{Value, json};

use crate::client::{Login, Transport, connect_select1};
use crate::gateway::parse_status;
use crate::http;
use crate::process::load_average;
use crate::report::{Facts, fmt_ms, percentile};
use crate::targets::serve_pgwake;

/// How many cycles to run.
#[derive(Clone, Copy, Debug)]
pub struct KubeOptions {
    /// Sleep/wake cycles per backend, alternating.
    pub cycles: u32,
}

const NAMESPACE: &str = "bench";
const CLASS: &str = "bench";
/// Warm clusters the pool keeps; every pool cycle consumes one and the replenisher refills.
const MIN_WARM: usize = 3;
/// Pause after the world is back in its sleeping state, before the timed connection.
const SETTLE: Duration = Duration::from_millis(300);
const WARM_SAMPLES: usize = 3;
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// Time allowed for the fake operator and replenisher to restore the sleeping state.
const RESTORE_LIMIT: Duration = Duration::from_secs(30);

/// One measured wake.
#[derive(Clone, Debug)]
pub struct KubeCycle {
    /// "annotation" or "pool claim".
    pub path: &'static str,
    /// Client's connect start until the answer to `select 1`.
    pub e2e_ms: f64,
    /// The gateway's `last_wake_ms` for this wake.
    pub wake_ms: f64,
    /// The fake operator's own time: from seeing the wake request to its status write (0 for a
    /// claim: the cluster is ready before it is claimed).
    pub operator_ms: f64,
    /// Median warm connect + `select 1` right after.
    pub warm_ms: f64,
}

impl KubeCycle {
    /// End-to-end minus the operator's work minus a warm login: the gateway's wake path,
    /// API server round trips and watch delivery included.
    pub fn overhead_ms(&self) -> f64 {
        self.e2e_ms - self.operator_ms - self.warm_ms
    }
}

/// Everything measured.
pub struct KubeResults {
    /// Cycles in the order run.
    pub cycles: Vec<KubeCycle>,
    /// Load average before and after.
    pub load: (String, String),
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + RESTORE_LIMIT;
    while !done()? {
        if Instant::now() > deadline {
            bail!("{what} did not happen within {RESTORE_LIMIT:?}");
        }
        sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn hibernated(obj: &Value) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "cnpg.io/hibernation" && c["status"] == "True")
    })
}

/// Ready warm clusters of the pool class.
fn ready_warm(lab: &KubeLab) -> Result<usize> {
    let path = format!(
        "{}?labelSelector=pgwake.io%2Fpool%3D{CLASS}%2Cpgwake.io%2Fstate%3Dwarm",
        clusters_path(NAMESPACE)
    );
    let list = lab.get(&path)?.success_json()?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["metadata"]["deletionTimestamp"].is_null()
                && c["status"]["readyInstances"].as_i64().unwrap_or(0) >= 1
                && c["metadata"]["annotations"]["pgwake.io/endpoint"].is_string()
        })
        .count())
}

/// Runs the scenario with the pgwake binary at `binary`.
pub fn run(binary: &Path, opts: KubeOptions) -> Result<KubeResults> {
    let load_before = load_average();
    crate::progress("kube: starting the Kubernetes lab (builds kube-apiserver on first use) ...");
    let lab = KubeLab::shared();
    let operator = FakeCnpgOperator::start(
        lab,
        NAMESPACE,
        PgOptions {
            trust: true,
            ..PgOptions::default()
        },
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    // The annotation tenant's cluster, hibernated.
    let manifest = json!({
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": { "name": "anno", "annotations": { "cnpg.io/hibernation": "on" } },
        "spec": { "instances": 1 }
    });
    let created = lab.create(&clusters_path(NAMESPACE), &manifest.to_string())?;
    if created.status != 409 {
        created.success_json()?;
    }
    let address = operator.wait_address("anno", RESTORE_LIMIT)?;
    let anno_path = format!("{}/anno", clusters_path(NAMESPACE));

    let dir = tempfile::Builder::new()
        .prefix("pgwake-bench-kube-")
        .tempdir()?;
    fs::write(
        dir.path().join("cluster.yaml"),
        "apiVersion: postgresql.cnpg.io/v1\nkind: Cluster\nspec:\n  instances: 1\n",
    )?;
    let kubeconfig = lab.kubeconfig_for_token(lab.admin_token())?;
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        "[listen]\npostgres = \"127.0.0.1:{port}\"\nadmin = \"127.0.0.1:{admin}\"\n\
         allow_plaintext = true\n\
         [routing]\nrules = [\"database\"]\n\
         [wake]\nidle_timeout = \"1h\"\n\
         [kubernetes]\nkubeconfig = \"{kubeconfig}\"\n\
         [[pool_class]]\nname = \"{CLASS}\"\nnamespace = \"{NAMESPACE}\"\nmin_warm = {MIN_WARM}\n\
         release = \"delete\"\ntemplate = \"cluster.yaml\"\nreplenish_interval = \"200ms\"\n\
         lease_duration = \"3s\"\n\
         [[tenant]]\nid = \"anno\"\nbackend = {{ kind = \"cnpg\", cluster = \"anno\", \
         namespace = \"{NAMESPACE}\", endpoint = \"{address}:{pg}\" }}\n\
         [[tenant]]\nid = \"claim\"\nbackend = {{ kind = \"pool\", class = \"{CLASS}\" }}\n",
        kubeconfig = kubeconfig.display(),
        pg = operator.postgres().port,
    );
    let config_path = dir.path().join("pgwake.toml");
    fs::write(&config_path, config)?;
    let mut gateway = serve_pgwake(
        binary,
        &config_path,
        &dir.path().join("pgwake.log"),
        port,
        admin,
    )?;
    crate::progress("kube: waiting for the replenisher to fill the pool ...");
    wait_until("a full pool", || Ok(ready_warm(lab)? >= MIN_WARM))
        .with_context(|| gateway.log_tail(10))?;

    let login = |tenant: &str| Login {
        port,
        user: "pgwake".into(),
        password: "unused: the fake operator's Postgres trusts loopback".into(),
        dbname: format!("{tenant}.postgres"),
    };
    let status = |tenant: &str| -> Result<(String, Option<f64>)> {
        let r = http::request(admin, "GET", "/v1/tenants", Duration::from_secs(5))?;
        let s = parse_status(&r.body, tenant)?;
        Ok((s.state, s.last_wake_ms))
    };
    let put_to_sleep = |tenant: &str| -> Result<()> {
        let path = format!("/v1/tenants/{tenant}/sleep");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = http::request(admin, "POST", &path, Duration::from_secs(60))?;
            match r.status {
                200 => return Ok(()),
                409 if Instant::now() < deadline => sleep(Duration::from_millis(10)),
                _ => bail!("POST {path} answered {}: {}", r.status, r.body),
            }
        }
    };
    let plain = Transport::Plain;
    let one = |tenant: &'static str| -> Result<KubeCycle> {
        // Back to the sleeping state, as the operator and the replenisher see it.
        put_to_sleep(tenant)?;
        if tenant == "anno" {
            wait_until("hibernation", || {
                Ok(hibernated(&lab.get(&anno_path)?.json()?))
            })?;
        } else {
            wait_until("a refilled pool", || Ok(ready_warm(lab)? >= MIN_WARM))?;
        }
        sleep(SETTLE);
        let asked = Instant::now();
        let e2e = rt
            .block_on(connect_select1(&login(tenant), &plain, CONNECT_LIMIT))
            .with_context(|| format!("wake {tenant}: {}", gateway.log_tail(5)))?;
        let (state, wake_ms) = status(tenant)?;
        if state != "awake" {
            bail!("tenant {tenant} is {state} after its wake");
        }
        let operator_ms = if tenant == "anno" {
            let r = operator
                .last_wake("anno")
                .filter(|r| r.seen >= asked)
                .ok_or_else(|| anyhow!("the fake operator saw no wake of anno"))?;
            ms(r.ready - r.seen)
        } else {
            0.0
        };
        let mut warm = Vec::new();
        for _ in 0..WARM_SAMPLES {
            warm.push(ms(rt.block_on(connect_select1(
                &login(tenant),
                &plain,
                CONNECT_LIMIT,
            ))?));
        }
        warm.sort_by(f64::total_cmp);
        Ok(KubeCycle {
            path: if tenant == "anno" {
                "annotation"
            } else {
                "pool claim"
            },
            e2e_ms: ms(e2e),
            wake_ms: wake_ms.ok_or_else(|| anyhow!("no last_wake_ms for {tenant}"))?,
            operator_ms,
            warm_ms: warm[warm.len() / 2],
        })
    };
    // First wakes (kube client connections, caches) are not measured.
    for tenant in ["anno", "claim"] {
        rt.block_on(connect_select1(&login(tenant), &plain, CONNECT_LIMIT))
            .with_context(|| format!("first connection to {tenant}: {}", gateway.log_tail(10)))?;
        one(tenant)?;
    }
    let mut cycles = Vec::new();
    for i in 0..opts.cycles * 2 {
        let tenant = if i % 2 == 0 { "anno" } else { "claim" };
        let c = one(tenant)?;
        crate::progress(format_args!(
            "kube: {:<10} end-to-end {:.1} ms, gateway wake {:.1} ms, operator {:.1} ms",
            c.path, c.e2e_ms, c.wake_ms, c.operator_ms
        ));
        cycles.push(c);
    }
    gateway.stop();
    drop(operator);
    Ok(KubeResults {
        cycles,
        load: (load_before, load_average()),
    })
}

/// The report section.
pub fn render(facts: &Facts, opts: KubeOptions, outcome: &Result<KubeResults, String>) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(
        &mut out,
        "Kubernetes wake latency (cnpg annotation vs pool claim)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| method | {} cycles per backend, alternating, after one unmeasured cycle each, through a \
         real kube-apiserver (testkit KubeLab, admin token) with testkit's fake CNPG operator \
         (status write only, no Postgres start); client: tokio-postgres, plaintext, `select 1`, \
         backend login `trust` (passthrough) |",
        opts.cycles
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| measure (ms) | n | p50 | p95 | max |\n|---|---:|---:|---:|---:|"
    );
    for path in ["annotation", "pool claim"] {
        let cs: Vec<&KubeCycle> = r.cycles.iter().filter(|c| c.path == path).collect();
        let rows: [(&str, Vec<f64>); 5] = [
            ("end-to-end", cs.iter().map(|c| c.e2e_ms).collect()),
            (
                "gateway wake (`last_wake_ms`)",
                cs.iter().map(|c| c.wake_ms).collect(),
            ),
            (
                "fake operator: request seen → status written",
                cs.iter().map(|c| c.operator_ms).collect(),
            ),
            (
                "warm connect + select 1",
                cs.iter().map(|c| c.warm_ms).collect(),
            ),
            (
                "overhead = end-to-end − operator − warm",
                cs.iter().map(|c| c.overhead_ms()).collect(),
            ),
        ];
        for (name, values) in rows {
            let p = |q| percentile(&values, q).map_or("—".into(), fmt_ms);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let _ = writeln!(
                out,
                "| {path}: {name} | {} | {} | {} | {} |",
                values.len(),
                p(50.0),
                p(95.0),
                fmt_ms(max)
            );
        }
    }
    out
}
