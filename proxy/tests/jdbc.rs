//! The real PostgreSQL JDBC driver (pgjdbc) keeps its session through a tenant's idle sleep:
//! settings and a server-prepared (named) statement survive the backend being stopped. Needs a
//! JDK and Maven (the driver comes from Maven Central, cached under Cargo's target folder); the
//! test skips with a message when either is missing.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, jdbc_classpath, jdbc_dir};

/// Quick idle sleep and snapshots, as in revive.rs.
const FAST: &str = "allow_plaintext = true
[wake]
idle_timeout = \"1s\"
idle_check_interval = \"100ms\"
[revival]
snapshot_after = \"200ms\"
";

/// The Java process, killed if the test fails before it exits.
struct Java(Child);

impl Drop for Java {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The client's `key=value` lines up to `last` (exclusive).
fn lines_until(rx: &mpsc::Receiver<String>, last: &str) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no {last:?} from the Java client ({e}); got {got:?}"));
        if line == last {
            return got;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("unexpected client line {line:?}"));
        got.push((k.to_owned(), v.to_owned()));
    }
}

fn value<'a>(lines: &'a [(String, String)], key: &str) -> &'a str {
    lines
        .iter()
        .find_map(|(k, v)| (k == key).then_some(v.as_str()))
        .unwrap_or_else(|| panic!("no {key} in {lines:?}"))
}

/// Waits until the gateway's log has `needle`.
fn wait_log(gw: &Gateway, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !gw.log().contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} in the log");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn jdbc_session_survives_tenant_sleep() {
    let Some(classpath) = jdbc_classpath() else {
        return;
    };
    let gw = Gateway::start_local(&["nap"], FAST, "", &[]);
    let pidfile = gw.local_dir("nap").join("data").join("postmaster.pid");
    let child = Command::new("java")
        .arg("-cp")
        .arg(&classpath)
        .arg("Revive.java")
        .arg(format!(
            "jdbc:postgresql://127.0.0.1:{}/nap.postgres",
            gw.port
        ))
        .env("PGWAKE_PASSWORD", LOCAL_PASSWORD)
        .current_dir(jdbc_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run java");
    let mut java = Java(child);
    let mut stdin = java.0.stdin.take().unwrap();
    let stdout = BufReader::new(java.0.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let before = lines_until(&rx, "ready");
    println!("java client before the sleep: {before:?}");
    assert_eq!(value(&before, "before"), "one");
    assert_eq!(value(&before, "server_prepared"), "true");
    // pgjdbc named the statement on the backend (S_1, S_2...), with the int parameter it bound.
    let prepared = value(&before, "prepared_before").to_owned();
    assert!(
        prepared.starts_with("S_") && prepared.ends_with(":{integer}"),
        "{before:?}"
    );
    let backend_pid = value(&before, "pid_before").to_owned();
    let postmaster = std::fs::read_to_string(&pidfile).unwrap();
    let postmaster = postmaster.lines().next().unwrap().trim().to_owned();

    wait_log(&gw, "session state recorded");
    gw.wait_state("nap", "asleep", Duration::from_secs(15));
    assert!(!pidfile.exists(), "postgres stopped");
    for pid in [&postmaster, &backend_pid] {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} is gone"
        );
    }
    assert_eq!(gw.metric("pgwake_sessions_parked"), 1.0);

    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let after = lines_until(&rx, "done");
    println!("java client after the sleep: {after:?}");
    let status = java.0.wait().unwrap();
    let mut err = String::new();
    java.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(value(&after, "after"), "two", "{err}");
    assert_eq!(value(&after, "again"), "one");
    // The same statement name, re-prepared on the new backend by the gateway.
    assert_eq!(value(&after, "prepared_after"), prepared);
    assert_ne!(value(&after, "pid_after"), backend_pid, "a new backend");
    assert_eq!(value(&after, "search_path"), "app, public");
    assert_eq!(value(&after, "statement_timeout"), "5s");
    assert_eq!(value(&after, "app.x"), "hello");
    assert_eq!(gw.tenant_state("nap").0, "awake");
    assert_eq!(
        gw.metric("pgwake_revivals_total{outcome=\"ok\",reason=\"idle_sleep\"}"),
        1.0
    );
    gw.wait_idle();
}
