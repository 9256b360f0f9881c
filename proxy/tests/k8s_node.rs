//! End to end on a real one-node Kubernetes cluster (testkit/k8s/node): the real CloudNativePG
//! operator runs real Postgres pods, and the gateway runs from deploy/ as its two-replica
//! Deployment. Clients are psql, through the gateway's Service address.
//!
//! Opt-in, because the lab needs root, minutes to start and more than CI's two cores:
//!
//! ```sh
//! testkit/k8s/node/up.sh && testkit/k8s/node/cnpg.sh
//! PGWAKE_K8S_NODE=1 testkit/k8s/node/exec.sh cargo test -p pgwake --test k8s_node -- --ignored --test-threads=1
//! ```
//!
//! Every test here is `#[ignore]`d, so an ordinary `cargo test` lists them as ignored rather
//! than passed; run with `--ignored` but without `PGWAKE_K8S_NODE=1` (outside the lab), each
//! fails at once saying so. The tests share the lab's one gateway Deployment and reconfigure it,
//! so they run one at a time (a lock, as well).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test at a time: they all deploy to the same namespaces.
static LAB: Mutex<()> = Mutex::new(());

/// The gateway's idle timeout in the lab, short so that a test sees a tenant go back to sleep.
const IDLE_TIMEOUT: &str = "20s";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Why the tests are ignored, and how to run them.
const NEEDS_LAB: &str = "needs the one-node lab: PGWAKE_K8S_NODE=1 testkit/k8s/node/exec.sh \
    cargo test -p pgwake --test k8s_node -- --ignored --test-threads=1";

/// Stops a test asked for outside the lab with the way to run it: a test that was asked for and
/// did nothing must not count as passed.
fn in_lab() {
    assert!(
        std::env::var("PGWAKE_K8S_NODE").as_deref() == Ok("1"),
        "{NEEDS_LAB} (after testkit/k8s/node/up.sh && testkit/k8s/node/cnpg.sh)"
    );
}

/// The measurements take minutes each, so inside the lab they also need PGWAKE_K8S_NODE_BENCH=1
/// (the lab's test command runs the other tests without them).
fn measuring() -> bool {
    in_lab();
    if std::env::var("PGWAKE_K8S_NODE_BENCH").as_deref() == Ok("1") {
        return true;
    }
    eprintln!("not measured: set PGWAKE_K8S_NODE_BENCH=1 as well");
    false
}

/// `kubectl ARGS`, its stdout; panics with stderr when it fails.
fn kubectl(args: &[&str]) -> String {
    try_kubectl(args).unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
}

fn try_kubectl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("kubectl")
        .arg("--request-timeout=30s")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Runs a lab script (deploy.sh, ...) with the given environment; panics when it fails.
fn script(name: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new(repo().join("testkit/k8s/node").join(name))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run a lab script");
    assert!(
        out.status.success(),
        "{name} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

fn jsonpath(kind_name: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(kind_name);
    let jp = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &jp]);
    try_kubectl(&args).unwrap_or_default()
}

fn secret_password(namespace: &str, name: &str) -> String {
    let b64 = kubectl(&[
        "-n",
        namespace,
        "get",
        "secret",
        name,
        "-o",
        "jsonpath={.data.password}",
    ]);
    let out = Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(b64.as_bytes())?;
            c.wait_with_output()
        })
        .expect("base64 -d");
    String::from_utf8(out.stdout).unwrap()
}

fn gateway_address() -> String {
    kubectl(&[
        "-n",
        "pgwake",
        "get",
        "svc",
        "pgwake",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
}

/// A libpq connection string to tenant `tenant` through the gateway Service.
fn conninfo(tenant: &str) -> String {
    format!(
        "host={} port=5432 user=app dbname=app sslmode=require options=endpoint={tenant} connect_timeout=120",
        gateway_address()
    )
}

/// One psql run of `sql`; its unaligned output, or its error text.
fn psql(conninfo: &str, password: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql, conninfo])
        .env("PGPASSWORD", password)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// A psql process holding one session open; statements go to its stdin, answers come back a
/// line at a time (each statement is followed by a marker line so an answer's end is known).
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Session {
    fn open(conninfo: &str, password: &str) -> Session {
        let mut child = Command::new("psql")
            .args(["-X", "-At", "-q", conninfo])
            .env("PGPASSWORD", password)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn psql");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Session {
            child,
            stdin,
            stdout,
        }
    }

    /// Runs one statement; the lines it printed before the marker.
    fn query(&mut self, sql: &str) -> Vec<String> {
        let pid = self.pid();
        self.try_query(sql)
            .unwrap_or_else(|| panic!("psql {pid} ended before answering {sql}"))
    }

    /// As `query`, or None when psql has ended (its connection broke).
    fn try_query(&mut self, sql: &str) -> Option<Vec<String>> {
        writeln!(self.stdin, "{sql};\n\\echo __done__").ok()?;
        self.stdin.flush().ok()?;
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end().to_owned();
            if line == "__done__" {
                return Some(lines);
            }
            lines.push(line);
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hibernation(namespace: &str, cluster: &str) -> String {
    jsonpath(
        &["-n", namespace, "cluster", cluster],
        "{.metadata.annotations.cnpg\\.io/hibernation}",
    )
}

fn instance_pods(namespace: &str, cluster: &str) -> Vec<String> {
    let names = jsonpath(
        &[
            "-n",
            namespace,
            "pods",
            "-l",
            &format!("cnpg.io/cluster={cluster},cnpg.io/podRole=instance"),
        ],
        "{.items[*].metadata.name}",
    );
    names.split_whitespace().map(str::to_owned).collect()
}

/// deploy/base and deploy/examples/cnpg, with the lab's idle timeout and cancel forwarding
/// between the replicas enabled as deploy/README.md describes.
fn deploy_cnpg_tenant() {
    script(
        "deploy.sh",
        &["base", "examples/cnpg"],
        &[
            ("PGWAKE_NODE_IDLE_TIMEOUT", IDLE_TIMEOUT),
            ("PGWAKE_NODE_PEER", "1"),
        ],
    );
    wait_for("the alpha-app Secret", Duration::from_secs(120), || {
        try_kubectl(&["-n", "pgwake", "get", "secret", "alpha-app"]).is_ok()
    });
}

#[test]
#[ignore = "needs the one-node lab: PGWAKE_K8S_NODE=1 testkit/k8s/node/exec.sh … -- --ignored"]
fn a_client_wakes_a_hibernated_cluster_which_sleeps_again_under_an_idle_session() {
    in_lab();
    let _lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
    deploy_cnpg_tenant();
    let password = secret_password("pgwake", "alpha-app");
    wait_for("alpha hibernated", Duration::from_secs(300), || {
        hibernation("pgwake", "alpha") == "on" && instance_pods("pgwake", "alpha").is_empty()
    });

    // The first connection wakes it: the operator starts a real pod, and the gateway answers
    // once Postgres in it does.
    let woke = Instant::now();
    let answer = psql(
        &conninfo("alpha"),
        &password,
        "select current_user || ' on ' || current_setting('server_version')",
    )
    .expect("the first connection to a hibernated cluster");
    eprintln!("alpha woke and answered in {:?}", woke.elapsed());
    assert!(answer.starts_with("app on 15."), "{answer}");
    assert_eq!(hibernation("pgwake", "alpha"), "off");
    assert_eq!(instance_pods("pgwake", "alpha").len(), 1);

    // An idle session stays open while the tenant goes back to sleep.
    let mut session = Session::open(&conninfo("alpha"), &password);
    let before = session.query("select pg_backend_pid()");
    assert_eq!(before.len(), 1, "{before:?}");
    let slept = wait_for(
        "alpha hibernated again under an idle session",
        Duration::from_secs(300),
        || hibernation("pgwake", "alpha") == "on" && instance_pods("pgwake", "alpha").is_empty(),
    );
    eprintln!("alpha slept {slept:?} after the session went idle");

    // Its next query wakes the tenant and is answered, in the same psql session.
    let after = session.query("select 40 + 2");
    assert_eq!(after, vec!["42".to_owned()], "psql {}", session.pid());
    assert_eq!(hibernation("pgwake", "alpha"), "off");
}

/// A `kubectl get -w` running in the background: every event it prints, with when it arrived.
struct Watch {
    child: Child,
    events: std::sync::Arc<Mutex<Vec<(std::time::SystemTime, serde_json::Value)>>>,
}

impl Watch {
    fn start(args: &[&str]) -> Watch {
        let mut child = Command::new("kubectl")
            .arg("get")
            .args(args)
            .args(["--watch", "--output-watch-events", "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kubectl get --watch");
        let stdout = child.stdout.take().unwrap();
        let events = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        std::thread::spawn(move || {
            let stream = serde_json::Deserializer::from_reader(BufReader::new(stdout))
                .into_iter::<serde_json::Value>();
            for event in stream.map_while(Result::ok) {
                let at = std::time::SystemTime::now();
                sink.lock().unwrap().push((at, event));
            }
        });
        // The watch lists what exists first; give it a moment to get there.
        std::thread::sleep(Duration::from_millis(500));
        Watch { child, events }
    }

    /// When an event after `since` first satisfied `test`.
    fn first(
        &self,
        since: std::time::SystemTime,
        test: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<std::time::SystemTime> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .find(|(at, e)| *at >= since && test(&e["object"]))
            .map(|(at, _)| *at)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn condition_true(obj: &serde_json::Value, kind: &str) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

fn container_running(obj: &serde_json::Value, name: &str) -> bool {
    obj["status"]["containerStatuses"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["name"] == name && c["state"]["running"].is_object())
        })
}

/// The wall-clock time Postgres in `pod` logged that it accepts connections, after `since`.
fn postgres_accepting(
    namespace: &str,
    pod: &str,
    since: std::time::SystemTime,
) -> Option<std::time::SystemTime> {
    let logs = try_kubectl(&["-n", namespace, "logs", pod, "-c", "postgres"]).ok()?;
    logs.lines()
        .filter(|l| l.contains("ready to accept connections"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["ts"].as_str().map(str::to_owned))
        .filter_map(|ts| parse_rfc3339(&ts))
        .find(|t| *t >= since)
}

/// True when the pod's Postgres replayed WAL at its start: the shutdown before it did not end
/// with its checkpoint.
fn postgres_recovered(namespace: &str, pod: &str) -> bool {
    try_kubectl(&["-n", namespace, "logs", pod, "-c", "postgres"])
        .is_ok_and(|logs| logs.contains("redo starts at"))
}

/// `2026-11-26T23:39:09.40597491Z` as a SystemTime (UTC, as the operator logs it).
fn parse_rfc3339(ts: &str) -> Option<std::time::SystemTime> {
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days from the civil date (proleptic Gregorian), as in Howard Hinnant's algorithm.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    let nanos: u32 = format!("{frac:0<9}")[..9].parse().ok()?;
    Some(std::time::UNIX_EPOCH + Duration::new(u64::try_from(secs).ok()?, nanos))
}

fn ms_between(a: std::time::SystemTime, b: Option<std::time::SystemTime>) -> Option<f64> {
    b.and_then(|b| b.duration_since(a).ok())
        .map(|d| d.as_secs_f64() * 1000.0)
}

/// p50, p90 and max of `xs`, in ms.
fn summary(xs: &mut [f64]) -> String {
    if xs.is_empty() {
        return "n/a".to_owned();
    }
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    format!("{:.0} / {:.0} / {:.0}", at(0.5), at(0.9), xs[xs.len() - 1])
}

/// Cycles each measurement makes (PGWAKE_K8S_NODE_CYCLES, default 10).
fn cycles() -> usize {
    std::env::var("PGWAKE_K8S_NODE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// Patches the Cluster alpha for a side-by-side run (`kind`: json or merge).
fn patch_alpha(kind: &str, patch: &str) {
    let kind = format!("--type={kind}");
    kubectl(&[
        "-n",
        "pgwake",
        "patch",
        "clusters.postgresql.cnpg.io",
        "alpha",
        &kind,
        "-p",
        patch,
    ]);
}

/// The wake of a hibernated cluster, measured the way a client sees it (first row) and broken
/// down by what the cluster's watchers saw. Prints a table; opt-in with PGWAKE_K8S_NODE_BENCH=1
/// as well, since it takes minutes.
#[test]
#[ignore = "a measurement in the one-node lab: PGWAKE_K8S_NODE=1 PGWAKE_K8S_NODE_BENCH=1 testkit/k8s/node/exec.sh … -- --ignored"]
fn measure_hibernation_wake() {
    if !measuring() {
        return;
    }
    let _lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
    deploy_cnpg_tenant();
    // For a side-by-side run: the operator's default probes instead of the example's
    // one-second ones (the next deploy puts the example's back).
    if std::env::var("PGWAKE_K8S_NODE_DEFAULT_PROBES").as_deref() == Ok("1") {
        patch_alpha("json", r#"[{"op":"remove","path":"/spec/probes"}]"#);
    }
    // For a side-by-side run: a stop delay too short for the shutdown checkpoint, so that the
    // kubelet kills Postgres and the next start replays WAL (the next deploy puts it back).
    if let Ok(delay) = std::env::var("PGWAKE_K8S_NODE_STOP_DELAY") {
        let spec = format!(r#"{{"spec":{{"stopDelay":{delay},"smartShutdownTimeout":0}}}}"#);
        patch_alpha("merge", &spec);
    }
    // Each cycle writes this much after its first row, so the sleep that follows has dirty
    // buffers and WAL to checkpoint.
    let write_mb: u32 = std::env::var("PGWAKE_K8S_NODE_WRITE_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let password = secret_password("pgwake", "alpha-app");
    let pods = Watch::start(&["-n", "pgwake", "pods", "-l", "cnpg.io/cluster=alpha"]);
    let clusters = Watch::start(&["-n", "pgwake", "clusters.postgresql.cnpg.io", "alpha"]);
    let (mut first_row, mut patched, mut scheduled, mut started, mut accepting, mut status) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut pod_ready = vec![];
    let mut initialized = vec![];
    let mut postgres_start = vec![];
    let mut recoveries = 0;
    let mut pod_and_postgres = vec![];
    for cycle in 0..cycles() {
        wait_for("alpha asleep", Duration::from_secs(300), || {
            hibernation("pgwake", "alpha") == "on" && instance_pods("pgwake", "alpha").is_empty()
        });
        let t0 = std::time::SystemTime::now();
        let answer = psql(&conninfo("alpha"), &password, "select 1").expect("wake");
        let row = ms_between(t0, Some(std::time::SystemTime::now())).unwrap();
        assert_eq!(answer, "1");
        let pod = instance_pods("pgwake", "alpha")
            .pop()
            .expect("a running instance");
        // The first row can come before the pod's Ready and the operator's status: wait for
        // them, so that their times are in the table too.
        wait_for("alpha ready in its status", Duration::from_secs(60), || {
            jsonpath(
                &["-n", "pgwake", "clusters.postgresql.cnpg.io", "alpha"],
                "{.status.readyInstances}",
            ) == "1"
        });
        std::thread::sleep(Duration::from_millis(500));
        if write_mb > 0 {
            let sql = format!(
                "create table if not exists wake_load (id int, pad text); truncate wake_load; \
                 insert into wake_load select g, repeat('x', 1000) from generate_series(1, {write_mb}000) g"
            );
            psql(&conninfo("alpha"), &password, &sql).expect("write");
        }
        if postgres_recovered("pgwake", &pod) {
            recoveries += 1;
        }
        let p = ms_between(
            t0,
            clusters.first(t0, |c| {
                c["metadata"]["annotations"]["cnpg.io/hibernation"] == "off"
            }),
        );
        let s = ms_between(
            t0,
            pods.first(t0, |o| {
                o["metadata"]["name"] == pod.as_str() && condition_true(o, "PodScheduled")
            }),
        );
        let init = ms_between(
            t0,
            pods.first(t0, |o| {
                o["metadata"]["name"] == pod.as_str() && condition_true(o, "Initialized")
            }),
        );
        let c = ms_between(
            t0,
            pods.first(t0, |o| {
                o["metadata"]["name"] == pod.as_str() && container_running(o, "postgres")
            }),
        );
        let a = ms_between(t0, postgres_accepting("pgwake", &pod, t0));
        let ready = ms_between(
            t0,
            pods.first(t0, |o| {
                o["metadata"]["name"] == pod.as_str() && condition_true(o, "Ready")
            }),
        );
        let r = ms_between(
            t0,
            clusters.first(t0, |c| {
                c["status"]["readyInstances"] == 1 && condition_true(c, "Ready")
            }),
        );
        eprintln!(
            "cycle {cycle}: first row {row:.0} ms; patched {p:?} scheduled {s:?} initialized {init:?} started {c:?} accepting {a:?} pod ready {ready:?} status {r:?}"
        );
        first_row.push(row);
        patched.extend(p);
        scheduled.extend(s);
        initialized.extend(init);
        started.extend(c);
        if let (Some(s), Some(a)) = (s, a) {
            pod_and_postgres.push(a - s);
        }
        if let (Some(c), Some(a)) = (c, a) {
            postgres_start.push(a - c);
        }
        accepting.extend(a);
        pod_ready.extend(ready);
        status.extend(r);
    }
    println!("| step (ms after the client connects) | p50 / p90 / max |");
    println!("| --- | --- |");
    println!("| annotation patched to off | {} |", summary(&mut patched));
    println!("| pod scheduled | {} |", summary(&mut scheduled));
    println!(
        "| init container done (pod Initialized) | {} |",
        summary(&mut initialized)
    );
    println!("| postgres container started | {} |", summary(&mut started));
    println!(
        "| Postgres accepting (its log) | {} |",
        summary(&mut accepting)
    );
    println!(
        "| pod Ready (readiness probe) | {} |",
        summary(&mut pod_ready)
    );
    println!("| operator status Ready | {} |", summary(&mut status));
    println!("| client's first row | {} |", summary(&mut first_row));
    println!(
        "| (pod start + Postgres start: scheduled to accepting) | {} |",
        summary(&mut pod_and_postgres)
    );
    println!(
        "| (Postgres start: container started to accepting) | {} |",
        summary(&mut postgres_start)
    );
    println!(
        "| starts that replayed WAL | {recoveries} of {} |",
        cycles()
    );
}

/// The password every cluster of the pool class "small" is bootstrapped with (deploy/README.md
/// has the user create this Secret before applying deploy/examples/pool).
fn ensure_pool_secret() -> String {
    if try_kubectl(&["-n", "pool", "get", "secret", "small-app"]).is_err() {
        let out = Command::new("openssl")
            .args(["rand", "-hex", "16"])
            .output()
            .expect("openssl rand");
        let password = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let _ = try_kubectl(&["create", "namespace", "pool"]);
        kubectl(&[
            "-n",
            "pool",
            "create",
            "secret",
            "generic",
            "small-app",
            "--type=kubernetes.io/basic-auth",
            "--from-literal=username=app",
            &format!("--from-literal=password={password}"),
        ]);
    }
    secret_password("pool", "small-app")
}

fn warm_clusters() -> usize {
    let names = jsonpath(
        &[
            "-n",
            "pool",
            "clusters.postgresql.cnpg.io",
            "-l",
            "pgwake.io/pool=small,pgwake.io/state=warm",
        ],
        "{range .items[?(@.status.readyInstances==1)]}{.metadata.name} {end}",
    );
    names.split_whitespace().count()
}

fn claimed_by(tenant: &str) -> Vec<String> {
    jsonpath(
        &[
            "-n",
            "pool",
            "clusters.postgresql.cnpg.io",
            "-l",
            &format!("pgwake.io/pool=small,pgwake.io/tenant={tenant}"),
        ],
        "{.items[*].metadata.name}",
    )
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}

fn deploy_pool() -> String {
    let password = ensure_pool_secret();
    script(
        "deploy.sh",
        &["examples/pool"],
        &[
            ("PGWAKE_NODE_IDLE_TIMEOUT", IDLE_TIMEOUT),
            ("PGWAKE_NODE_PEER", "1"),
        ],
    );
    password
}

#[test]
#[ignore = "needs the one-node lab: PGWAKE_K8S_NODE=1 testkit/k8s/node/exec.sh … -- --ignored"]
fn a_pool_tenant_claims_a_warm_cluster_and_releases_it() {
    in_lab();
    let _lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let password = deploy_pool();
    wait_for("three warm clusters", Duration::from_secs(600), || {
        warm_clusters() >= 3
    });
    wait_for("beta holds no cluster", Duration::from_secs(300), || {
        claimed_by("beta").is_empty()
    });

    let t0 = Instant::now();
    let answer = psql(&conninfo("beta"), &password, "select current_database()").expect("claim");
    eprintln!("beta's first row after {:?}", t0.elapsed());
    assert_eq!(answer, "app");
    let claimed = claimed_by("beta");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let state = jsonpath(
        &["-n", "pool", "clusters.postgresql.cnpg.io", &claimed[0]],
        "{.metadata.labels.pgwake\\.io/state}",
    );
    assert_eq!(state, "claimed");
    // The claimed cluster was running already: its instance pod is older than the claim.
    let pod_started = jsonpath(
        &["-n", "pool", "pod", &format!("{}-1", claimed[0])],
        "{.status.startTime}",
    );
    let started = parse_rfc3339(&pod_started).expect("the claimed cluster's pod start time");
    assert!(
        started + t0.elapsed() < std::time::SystemTime::now(),
        "the pod started before the claim"
    );

    // Idle: released (deleted, release = "delete"), and the pool is refilled.
    wait_for("beta's cluster released", Duration::from_secs(300), || {
        try_kubectl(&[
            "-n",
            "pool",
            "get",
            "clusters.postgresql.cnpg.io",
            &claimed[0],
        ])
        .is_err()
    });
    assert!(claimed_by("beta").is_empty());
    wait_for("the pool refilled", Duration::from_secs(600), || {
        warm_clusters() >= 3
    });
}

#[test]
#[ignore = "needs the one-node lab: PGWAKE_K8S_NODE=1 testkit/k8s/node/exec.sh … -- --ignored"]
fn the_sidecar_pods_application_reaches_its_database_on_loopback() {
    in_lab();
    let _lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let _ = try_kubectl(&["create", "namespace", "shop"]);
    // The sidecar's tenant: deploy/examples/cnpg's cluster, named orders, in the app's namespace.
    let cluster = std::fs::read_to_string(repo().join("deploy/examples/cnpg/cluster.yaml"))
        .unwrap()
        .replace("name: alpha", "name: orders")
        .replace("pgwake.io/tenant: alpha", "pgwake.io/tenant: orders");
    let mut apply = Command::new("kubectl")
        .args(["-n", "shop", "apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(cluster.as_bytes())
        .unwrap();
    assert!(apply.wait().unwrap().success());
    wait_for("the orders-app Secret", Duration::from_secs(300), || {
        try_kubectl(&["-n", "shop", "get", "secret", "orders-app"]).is_ok()
    });
    script(
        "deploy.sh",
        &["examples/sidecar"],
        &[("PGWAKE_NODE_IDLE_TIMEOUT", IDLE_TIMEOUT)],
    );
    kubectl(&[
        "-n",
        "shop",
        "rollout",
        "status",
        "deployment/shop",
        "--timeout=300s",
    ]);

    // The application container runs psql with the example's DATABASE_URL (127.0.0.1:5432) and
    // the password the Deployment maps from orders-app; pgwake in the same pod wakes orders.
    let answer = kubectl(&[
        "-n",
        "shop",
        "exec",
        "deploy/shop",
        "-c",
        "app",
        "--",
        "sh",
        "-c",
        "psql \"$DATABASE_URL\" -XAtc 'select current_user, current_database(), inet_server_addr() is not null'",
    ]);
    assert_eq!(answer, "app|app|t");
    assert_eq!(hibernation("shop", "orders"), "off");
    assert_eq!(instance_pods("shop", "orders").len(), 1);
}

#[test]
#[ignore = "needs the one-node lab: PGWAKE_K8S_NODE=1 testkit/k8s/node/exec.sh … -- --ignored"]
fn killing_a_gateway_replica_moves_clients_to_the_other_and_keeps_the_tenant_awake() {
    in_lab();
    let _lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
    deploy_cnpg_tenant();
    let password = secret_password("pgwake", "alpha-app");
    psql(&conninfo("alpha"), &password, "select 1").expect("wake alpha");

    // Clients that query every 200 ms for longer than the idle timeout, reconnecting when their
    // connection breaks.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, info, password) = (stop.clone(), conninfo("alpha"), password.clone());
            std::thread::spawn(move || {
                let (mut ok, mut reconnects) = (0u32, 0u32);
                let mut session = Session::open(&info, &password);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match session.try_query("select 1") {
                        Some(lines) if lines == ["1"] => ok += 1,
                        _ => {
                            reconnects += 1;
                            session = Session::open(&info, &password);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                // The last query, after everything, must be answered.
                let last = session.query("select 2");
                (ok, reconnects, last)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let gateways = jsonpath(
        &[
            "-n",
            "pgwake",
            "pods",
            "-l",
            "app.kubernetes.io/name=pgwake",
        ],
        "{.items[*].metadata.name}",
    );
    let victim = gateways
        .split_whitespace()
        .next()
        .expect("a gateway pod")
        .to_owned();
    kubectl(&[
        "-n",
        "pgwake",
        "delete",
        "pod",
        &victim,
        "--grace-period=0",
        "--force",
    ]);
    // Longer than the idle timeout: the survivors' clients keep the tenant awake.
    let until = Instant::now() + Duration::from_secs(35);
    while Instant::now() < until {
        assert_eq!(
            hibernation("pgwake", "alpha"),
            "off",
            "slept under active clients"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total_reconnects = 0;
    for client in clients {
        let (ok, reconnects, last) = client.join().expect("a client thread");
        assert!(ok > 10, "{ok} answers");
        assert_eq!(last, vec!["2".to_owned()]);
        total_reconnects += reconnects;
    }
    eprintln!("clients reconnected {total_reconnects} times after {victim} was killed");

    // Cancels land whichever replica the cancel's connection reaches: psql sends one on SIGINT
    // (and, reading a script, then exits).
    for attempt in 0..6 {
        let child = Command::new("psql")
            .args(["-X", "-At", "-c", "select pg_sleep(60)", &conninfo("alpha")])
            .env("PGPASSWORD", &password)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Past the login: the query runs once the backend is there.
        wait_for("the pg_sleep running", Duration::from_secs(30), || {
            psql(
                &conninfo("alpha"),
                &password,
                "select count(*) from pg_stat_activity where query = 'select pg_sleep(60)' and state = 'active'",
            )
            .as_deref()
                == Ok("1")
        });
        let sent = Instant::now();
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("canceling statement due to user request"),
            "attempt {attempt}: {stderr}"
        );
        assert!(
            sent.elapsed() < Duration::from_secs(30),
            "attempt {attempt}: the query ran on"
        );
    }
}

/// A pool claim's first row, each cycle from a tenant holding no cluster to its first row, with
/// the claim's own steps (claim label, status) seen by a watch. Opt-in like the other measure.
#[test]
#[ignore = "a measurement in the one-node lab: PGWAKE_K8S_NODE=1 PGWAKE_K8S_NODE_BENCH=1 testkit/k8s/node/exec.sh … -- --ignored"]
fn measure_pool_claim() {
    if !measuring() {
        return;
    }
    let _lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let password = deploy_pool();
    let clusters = Watch::start(&["-n", "pool", "clusters.postgresql.cnpg.io"]);
    let (mut first_row, mut claimed) = (vec![], vec![]);
    for cycle in 0..cycles() {
        let tenant = if cycle % 2 == 0 { "alpha" } else { "beta" };
        // A claim as in steady state: the pool full (min_warm running clusters), each of
        // them up for a while. PGWAKE_K8S_NODE_POOL_BACK_TO_BACK=1 claims as soon as one is up.
        let want = if std::env::var("PGWAKE_K8S_NODE_POOL_BACK_TO_BACK").as_deref() == Ok("1") {
            1
        } else {
            3
        };
        wait_for("warm clusters", Duration::from_secs(600), || {
            warm_clusters() >= want
        });
        wait_for("the tenant released", Duration::from_secs(300), || {
            claimed_by(tenant).is_empty()
        });
        let t0 = std::time::SystemTime::now();
        let answer = psql(&conninfo(tenant), &password, "select 1").expect("claim");
        let row = ms_between(t0, Some(std::time::SystemTime::now())).unwrap();
        assert_eq!(answer, "1");
        let c = ms_between(
            t0,
            clusters.first(t0, |c| {
                c["metadata"]["labels"]["pgwake.io/tenant"] == tenant
            }),
        );
        eprintln!("cycle {cycle} ({tenant}): first row {row:.0} ms; claim label {c:?}");
        first_row.push(row);
        claimed.extend(c);
    }
    println!("| step (ms after the client connects) | p50 / p90 / max |");
    println!("| --- | --- |");
    println!(
        "| cluster labelled claimed for the tenant | {} |",
        summary(&mut claimed)
    );
    println!("| client's first row | {} |", summary(&mut first_row));
}
