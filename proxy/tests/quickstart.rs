//! `pgwake quickstart` as a newcomer meets it: run as root inside a closed (mode 700) folder, as
//! a home folder is in a container, then every connection string it prints used unmodified by
//! real clients: psql, psycopg, asyncpg, node-postgres, postgres.js, the serverless driver (with
//! drizzle), pgx and pgjdbc. Clients whose runtime is missing are skipped with a message.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{jdbc_classpath, jdbc_dir, node_project, runs};
use pgwake_testkit::{free_port, pg_bin_dir};

/// A running `pgwake quickstart` in a fresh closed folder; stopped by its PID on drop, and its
/// data directories removed.
struct Quickstart {
    child: Child,
    home: tempfile::TempDir,
    banner: String,
    ports: [u16; 3],
    tenants: String,
}

impl Quickstart {
    /// Starts the quickstart in `<closed folder>/qs` and waits for its banner.
    fn start(tenants: &str) -> Quickstart {
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let ports = [free_port(), free_port(), free_port()];
        let (child, banner) = launch(home.path(), ports, tenants);
        Quickstart {
            child,
            home,
            banner,
            ports,
            tenants: tenants.into(),
        }
    }

    /// Starts the process again on the same folder and ports (after `stop`).
    fn restart(&mut self) {
        self.restart_with(&[]);
    }

    /// Like [`Quickstart::restart`], with `extra` arguments after the usual ones.
    fn restart_with(&mut self, extra: &[&str]) {
        let (child, banner) = launch_with(self.home.path(), self.ports, &self.tenants, extra);
        self.child = child;
        self.banner = banner;
    }

    /// The quickstart's admin API: a tenant's state.
    fn tenant_state(&self, tenant: &str) -> String {
        let out = Command::new("curl")
            .args(["-sS", "--fail-with-body"])
            .arg(format!("http://127.0.0.1:{}/v1/tenants", self.ports[1]))
            .output()
            .expect("curl");
        let list: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("tenants: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        list.as_array()
            .and_then(|a| a.iter().find(|t| t["id"] == tenant))
            .and_then(|t| t["state"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    fn log(&self) -> String {
        log(self.home.path())
    }

    fn dir(&self) -> PathBuf {
        std::fs::canonicalize(self.home.path().join("qs")).unwrap()
    }

    /// The rest of the first banner line that starts (after indentation) with `prefix`.
    fn line(&self, prefix: &str) -> String {
        self.banner
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in\n{}", self.banner))
            .trim()
            .to_owned()
    }

    /// The connection strings printed for `tenant`.
    fn printed(&self, tenant: &str) -> Printed {
        let block: Vec<&str> = self
            .banner
            .lines()
            .skip_while(|l| l.trim() != format!("tenant {tenant}"))
            .skip(1)
            .take_while(|l| l.starts_with("    "))
            .map(str::trim)
            .collect();
        let after = |prefix: &str| {
            block
                .iter()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("no {prefix:?} for {tenant} in\n{}", self.banner))
                .trim()
                .to_owned()
        };
        let psql = after("psql ").trim_matches('"').to_owned();
        let url = after("URL (psycopg, asyncpg, pgx, postgres.js, node-postgres*):");
        assert_eq!(psql, url, "one URL for psql and the drivers");
        Printed {
            url,
            verified: after("verified TLS (libpq, psycopg, asyncpg, pgx, node-postgres):"),
            jdbc: after("JDBC:"),
        }
    }

    /// Where the banner says the data directories are.
    fn data_dir(&self) -> PathBuf {
        let line = self.line("data:");
        PathBuf::from(line.split(" (").next().unwrap())
    }

    fn ca(&self) -> String {
        self.line("export NODE_EXTRA_CA_CERTS=")
    }

    /// The PIDs of the tenants' running postmasters.
    fn postmasters(&self) -> Vec<i32> {
        self.tenants
            .split(',')
            .filter_map(|t| {
                let pidfile = self.data_dir().join(t).join("data/postmaster.pid");
                std::fs::read_to_string(pidfile)
                    .ok()?
                    .lines()
                    .next()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// SIGTERM by PID, then waits for the process to exit.
    fn stop(&mut self) {
        if self.child.try_wait().unwrap().is_some() {
            return;
        }
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the quickstart did not stop on SIGTERM\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Quickstart {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
        let data = self.data_dir();
        if !data.starts_with(self.home.path()) {
            let _ = std::fs::remove_dir_all(data);
        }
    }
}

/// Runs `pgwake quickstart --dir qs` from inside `home`, as a user who typed the README's
/// command there, and returns the process once its banner is complete.
fn launch(home: &Path, ports: [u16; 3], tenants: &str) -> (Child, String) {
    launch_with(home, ports, tenants, &[])
}

/// The quickstart command with the folder, tenants and ports the tests use, run in `home`.
fn quickstart_command(home: &Path, [port, admin, http]: [u16; 3], tenants: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgwake"));
    cmd.arg("quickstart")
        .args(["--dir", "qs", "--tenants", tenants])
        .args(["--port", &port.to_string()])
        .args(["--admin-port", &admin.to_string()])
        .args(["--http-port", &http.to_string()])
        .current_dir(home)
        .env_remove("RUST_BACKTRACE");
    cmd
}

/// Like [`launch`], with `extra` arguments.
fn launch_with(home: &Path, ports: [u16; 3], tenants: &str, extra: &[&str]) -> (Child, String) {
    let mut cmd = quickstart_command(home, ports, tenants);
    cmd.args(extra);
    launch_command(home, cmd)
}

/// Runs `cmd` (a [`quickstart_command`]) and returns the process once its banner is complete.
fn launch_command(home: &Path, mut cmd: Command) -> (Child, String) {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("qs.log"))
        .unwrap();
    let mut child = cmd.stdout(Stdio::piped()).stderr(log_file).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Reads until the process ends, so the pipe never fills.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut banner = String::new();
    while !banner.contains("Stop with Ctrl-C") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                banner.push_str(&line);
                banner.push('\n');
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no banner: {banner}\nlog:\n{}", log(home));
            }
        }
    }
    (child, banner)
}

fn log(home: &Path) -> String {
    std::fs::read_to_string(home.join("qs.log")).unwrap_or_default()
}

/// The strings the banner printed for one tenant.
struct Printed {
    url: String,
    verified: String,
    jdbc: String,
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

fn skipped(what: &str, why: &str) {
    // Straight to stderr, past the test harness's capture, so the skip shows in CI logs.
    let _ = writeln!(std::io::stderr(), "{what} SKIPPED: {why}");
}

fn psql(url: &str, sql: &str) -> String {
    let out = Command::new(pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-c", sql])
        .arg(url)
        .env_remove("PGSSLROOTCERT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "psql {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// What psql printed on stderr for `sql` on `url`, which must fail.
fn psql_refused(url: &str, sql: &str) -> String {
    let out = Command::new(pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .arg(url)
        .env_remove("PGSSLROOTCERT")
        .output()
        .unwrap();
    assert!(!out.status.success(), "psql {url} ran {sql:?}");
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// `url` (one the banner printed) logged in as the superuser instead, as the banner says: its
/// name and `local.password` from the folder's `pgwake.toml`.
fn as_superuser(qs: &Quickstart, url: &str) -> String {
    let config = std::fs::read_to_string(qs.dir().join("pgwake.toml")).unwrap();
    let value = |key: &str| {
        config
            .lines()
            .find_map(|l| {
                l.strip_prefix(key)?
                    .trim()
                    .strip_prefix('=')?
                    .trim()
                    .strip_prefix('"')
            })
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or_else(|| panic!("no {key} in\n{config}"))
            .to_owned()
    };
    let (scheme, rest) = url.split_once("://").unwrap();
    let (_, at) = rest.split_once('@').unwrap();
    format!(
        "{scheme}://{}:{}@{at}",
        value("superuser"),
        value("password")
    )
}

/// Runs a client script and returns its one-line verdict (`ok …` or `error …`).
fn verdict(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default().trim().to_owned();
    assert!(
        out.status.success() && !line.is_empty(),
        "{cmd:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    line
}

fn python(driver: &str, url: &str) -> String {
    verdict(
        Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/clients/connect_from.py"
            ))
            .args([driver, url]),
    )
}

fn node(dir: &Path, driver: &str, url: &str, ca: Option<&str>) -> String {
    let mut cmd = Command::new("node");
    cmd.arg("connect_from.mjs")
        .args([driver, url])
        .current_dir(dir)
        .env_remove("NODE_EXTRA_CA_CERTS");
    if let Some(ca) = ca {
        cmd.env("NODE_EXTRA_CA_CERTS", ca);
    }
    verdict(&mut cmd)
}

#[test]
fn quickstart_as_root_in_a_closed_home_serves_what_it_prints() {
    if !is_root() {
        skipped(
            "quickstart_as_root_in_a_closed_home",
            "needs root (the case where Postgres runs as another account)",
        );
        return;
    }
    let mut qs = Quickstart::start("alpha,beta");
    let home = qs.home.path().to_owned();
    let data = qs.data_dir();
    assert!(
        data.starts_with("/var/lib/pgwake/") && !data.starts_with(&home),
        "the postgres account cannot enter the closed folder, so data lives elsewhere: {data:?}"
    );
    assert_eq!(
        std::fs::metadata(&home).unwrap().permissions().mode() & 0o777,
        0o700,
        "the user's folder is left closed"
    );
    let key_mode = |name: &str| {
        std::fs::metadata(qs.dir().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(
        (key_mode("ca-key.pem"), key_mode("key.pem")),
        (0o600, 0o600)
    );

    for tenant in ["alpha", "beta"] {
        let p = qs.printed(tenant);
        // The printed role may not read the data directory's path; the superuser may.
        let sql = "select current_database() || ' ' || current_setting('data_directory')";
        let want = format!("postgres {}", data.join(tenant).join("data").display());
        assert_eq!(
            psql(&as_superuser(&qs, &p.url), sql),
            want,
            "psql, superuser"
        );
        let sql = "select current_database() || ' ' || current_user";
        assert_eq!(psql(&p.url, sql), "postgres app", "psql, printed URL");
        assert_eq!(psql(&p.verified, sql), "postgres app", "psql, verified URL");
        // A second client, through its own libpq (the psycopg binary wheel bundles one).
        assert_eq!(python("psycopg", &p.url), "ok postgres", "psycopg");
        assert_eq!(python("psycopg", &p.verified), "ok postgres", "psycopg");
    }

    // SQL over HTTPS, verified against the printed CA, with the printed serverless URL.
    let fetch = qs
        .line("neonConfig.fetchEndpoint = () =>")
        .trim_end_matches(';')
        .trim_matches('\'')
        .to_owned();
    let neon_url = qs
        .line("const sql = neon(")
        .trim_end_matches(");")
        .trim_matches('\'')
        .to_owned();
    let superuser_url = as_superuser(&qs, &neon_url);
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "--cacert", &qs.ca(), &fetch])
        .args(["-H", &format!("Neon-Connection-String: {superuser_url}")])
        .args([
            "-d",
            r#"{"query":"select current_setting('data_directory') as d"}"#,
        ])
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && body.contains("/alpha/data"),
        "curl {fetch}: {body}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let postmasters = qs.postmasters();
    assert_eq!(postmasters.len(), 2, "both tenants awake");
    qs.stop();
    for pid in postmasters {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "postmaster {pid} outlived the quickstart"
        );
    }
    assert!(qs.postmasters().is_empty(), "postmaster.pid left behind");

    // A folder from an earlier version: a certificate without a CA and no HTTP listener in the
    // config. It is upgraded in place and serves as before.
    let dir = qs.dir();
    std::fs::remove_file(dir.join("ca.pem")).unwrap();
    let config = std::fs::read_to_string(dir.join("pgwake.toml")).unwrap();
    let old: String = config
        .lines()
        .filter(|l| !l.starts_with("http ="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.join("pgwake.toml"), old).unwrap();
    qs.restart();
    assert!(dir.join("ca.pem").exists(), "a CA for the old folder");
    let p = qs.printed("alpha");
    assert_eq!(python("psycopg", &p.verified), "ok postgres");
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "--cacert", &qs.ca(), &fetch])
        .args(["-H", &format!("Neon-Connection-String: {neon_url}")])
        .args(["-d", r#"{"query":"select 1 as n"}"#])
        .output()
        .expect("curl");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(r#""rows":[{"n":1}]"#),
        "the upgraded folder serves /sql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    qs.stop();
}

#[test]
fn quickstart_refuses_a_data_dir_the_server_account_cannot_reach() {
    if !is_root() {
        skipped("quickstart_refuses_an_unreachable_data_dir", "needs root");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = home.path().join("qs");
    std::fs::create_dir(&dir).unwrap();
    // A config as an earlier quickstart wrote it in a closed home: data inside it.
    std::fs::write(
        dir.join("pgwake.toml"),
        "[listen]\npostgres = \"127.0.0.1:1\"\n[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n\
         [local]\ndata_dir = \"data\"\npassword = \"x\"\n\
         [[tenant]]\nid = \"alpha\"\nbackend = { kind = \"local\" }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .args(["quickstart", "--dir"])
        .arg(&dir)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(!out.status.success());
    assert!(
        first.starts_with("pgwake: the postgres account cannot reach local.data_dir")
            && first.contains(&dir.join("data").display().to_string())
            && first.contains("/var/lib/pgwake"),
        "the first line names the folder and the fix: {stderr}"
    );
    assert!(
        !stderr.contains("Stack backtrace") && !stderr.contains("initdb"),
        "{stderr}"
    );
}

/// A process that is expected to end soon: its output once it has, or a panic (after killing
/// it) when it still runs after `limit`.
fn finished(mut child: Child, limit: Duration, what: &str) -> std::process::Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still running after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_second_quickstart_leaves_a_live_one_alone_and_names_a_busy_port_before_initdb() {
    let qs = Quickstart::start("alpha");
    let p = qs.printed("alpha");
    // A client in the middle of a long query.
    let mut query = Command::new(pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-c", "select pg_sleep(600)"])
        .arg(&p.url)
        .env_remove("PGSSLROOTCERT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while psql(
        &p.url,
        "select count(*) from pg_stat_activity where query = 'select pg_sleep(600)'",
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the long query never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let postmasters = qs.postmasters();
    assert_eq!(postmasters.len(), 1, "alpha awake: {}", qs.log());

    // The same command again in the same folder, as from a second terminal, of a Rust
    // developer who keeps RUST_BACKTRACE set: a refusal is not a crash, so no stack trace.
    let second = quickstart_command(qs.home.path(), qs.ports, "alpha")
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finished(second, Duration::from_secs(60), "the second quickstart");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let first_pid = qs.child.id().to_string();
    assert!(
        stderr.contains("another pgwake")
            && stderr.contains(&format!("kill {first_pid}"))
            && stderr.contains("--dir"),
        "names the live quickstart and the way out: {stderr}"
    );
    assert!(!stderr.contains("stopping a postmaster"), "{stderr}");
    assert!(!stderr.contains("tack backtrace"), "{stderr}");
    // Nor can it be removed while it runs.
    let out = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .args(["quickstart", "--dir", "qs", "--remove"])
        .current_dir(qs.home.path())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nothing removed"), "{stderr}");
    assert!(qs.dir().join("pgwake.toml").exists());
    assert_eq!(
        qs.postmasters(),
        postmasters,
        "alpha's postmaster was replaced"
    );
    if query.try_wait().unwrap().is_some() {
        let out = query.wait_with_output().unwrap();
        panic!(
            "the client's query was ended: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = query.kill();
    let _ = query.wait();
    assert_eq!(
        psql(&p.url, "select 1"),
        "1",
        "the first quickstart serves on"
    );

    // A new folder whose port is taken: refused before anything is written.
    let home = tempfile::tempdir().unwrap();
    let ports = [qs.ports[0], free_port(), free_port()];
    let out = quickstart_command(home.path(), ports, "alpha")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", qs.ports[0])) && stderr.contains("--port"),
        "names the port and the flag: {stderr}"
    );
    assert!(
        !home.path().join("qs").exists(),
        "the refused run made its folder: {stderr}"
    );
}

/// Every file and folder under `dir`, with its size, relative to it.
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(next) = todo.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            found.push((
                entry.path().strip_prefix(dir).unwrap().to_path_buf(),
                meta.len(),
            ));
            if meta.is_dir() {
                todo.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

#[test]
fn busy_ports_are_named_in_one_run_and_the_refused_run_writes_nothing() {
    // Taken by another program: the three ports the quickstart is asked to use.
    let others: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = others
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let ports = [ports[0], ports[1], ports[2]];
    let home = tempfile::tempdir().unwrap();
    // The server account could enter it: data would go inside the folder.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let refused = |what: &str| -> String {
        let out = quickstart_command(home.path(), ports, "alpha")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{what}: {stderr}");
        for (port, key, flag) in [
            (ports[0], "listen.postgres", "--port"),
            (ports[1], "listen.admin", "--admin-port"),
            (ports[2], "listen.http", "--http-port"),
        ] {
            assert!(
                stderr.contains(&format!("127.0.0.1:{port} ({key}, {flag})")),
                "{what}: port {port} not named with {key} and {flag}: {stderr}"
            );
        }
        assert!(stderr.contains("3 ports"), "{what}: {stderr}");
        assert!(!stderr.contains("initdb"), "{what}: {stderr}");
        stderr
    };

    // A folder that is not there yet is not made.
    let stderr = refused("a new folder");
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert!(
        !home.path().join("qs").exists(),
        "the refused run wrote {:?}",
        tree(home.path())
    );

    // One that is there, empty, stays empty.
    std::fs::create_dir(home.path().join("qs")).unwrap();
    refused("an empty folder");
    assert_eq!(tree(&home.path().join("qs")), vec![]);
    // Once the ports are free, the same command serves.
    drop(others);
    let (child, banner) = launch(home.path(), ports, "alpha");
    let qs = Quickstart {
        child,
        home,
        banner,
        ports,
        tenants: "alpha".into(),
    };
    assert!(qs.banner.contains("tenant alpha"), "{}", qs.banner);
}

/// Waits until the quickstart's log holds `text`.
fn wait_logged(qs: &Quickstart, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !qs.log().contains(text) {
        assert!(
            Instant::now() < deadline,
            "never logged {text:?}:\n{}",
            qs.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_lets_a_transaction_finish_and_the_log_says_only_what_happened() {
    use std::os::unix::process::CommandExt;
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let ports = [free_port(), free_port(), free_port()];
    // In a process group of its own, as a terminal runs a command, so that Ctrl-C (SIGINT to
    // the group) reaches whatever the gateway put in its group too.
    let mut cmd = quickstart_command(home.path(), ports, "alpha");
    cmd.env("PGWAKE_LOG", "debug").process_group(0);
    let (child, banner) = launch_command(home.path(), cmd);
    let mut qs = Quickstart {
        child,
        home,
        banner,
        ports,
        tenants: "alpha".into(),
    };

    // Clients that leave during the TLS handshake, on the Postgres listener (after its
    // SSLRequest was answered) and on the HTTPS one: a debug line each, nothing refused.
    let mut pg = std::net::TcpStream::connect(("127.0.0.1", ports[0])).unwrap();
    pg.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).unwrap();
    let mut answer = [0u8; 1];
    std::io::Read::read_exact(&mut pg, &mut answer).unwrap();
    assert_eq!(&answer, b"S");
    drop(pg);
    let mut https = std::net::TcpStream::connect(("127.0.0.1", ports[2])).unwrap();
    https.write_all(&[0x16]).unwrap();
    drop(https);
    let deadline = Instant::now() + Duration::from_secs(10);
    while qs
        .log()
        .matches("client left during the TLS handshake")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "{}", qs.log());
        std::thread::sleep(Duration::from_millis(20));
    }

    // A transaction open when Ctrl-C comes.
    let url = qs.printed("alpha").url;
    let mut client = Command::new(pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .arg(&url)
        .env_remove("PGSSLROOTCERT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sql = client.stdin.take().unwrap();
    writeln!(sql, "begin;\ncreate table t (n int);").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while psql(
        &url,
        "select count(*) from pg_stat_activity where state = 'idle in transaction'",
    ) != "1"
    {
        assert!(Instant::now() < deadline, "the transaction never began");
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-INT", "--", &format!("-{}", qs.child.id())])
        .status()
        .unwrap();
    wait_logged(&qs, "shutting down");
    // Time for a server that took the Ctrl-C as its own to end the transaction.
    std::thread::sleep(Duration::from_millis(500));
    writeln!(sql, "insert into t values (2);\ncommit;").unwrap();
    drop(sql);
    let out = finished(client, Duration::from_secs(30), "psql");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("COMMIT"),
        "the transaction did not finish: {stdout}{stderr}\n{}",
        qs.log()
    );
    qs.stop();

    let log = qs.log();
    assert!(!log.contains("connection refused"), "{log}");
    assert!(!log.contains("stopped on its own"), "{log}");
    for line in log
        .lines()
        .filter(|l| l.contains("client left during the TLS handshake"))
    {
        assert!(
            line.contains("DEBUG") && line.contains("tls handshake eof"),
            "{line}"
        );
    }
    let stopped = log
        .find("postgres stopped")
        .unwrap_or_else(|| panic!("the server's shutdown is not logged:\n{log}"));
    let line = log[stopped..].lines().next().unwrap();
    assert!(
        line.contains("tenant=alpha") && line.contains("shutdown=\"fast\"") && line.contains("ms="),
        "{line}"
    );
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("pgwake stopped") && log.matches("pgwake stopped").count() == 1,
        "`pgwake stopped` is not the last line:\n{log}"
    );
}

#[test]
fn a_later_run_applies_the_tenants_and_idle_timeout_it_is_given() {
    let mut qs = Quickstart::start("alpha");
    qs.stop();
    qs.restart_with(&["--tenants", "alpha,beta", "--idle-timeout", "1s"]);
    qs.tenants = "alpha,beta".into();
    let beta = qs.printed("beta");
    assert_eq!(psql(&beta.url, "select current_database()"), "postgres");
    assert!(
        qs.banner.contains("A tenant sleeps after 1s"),
        "{}",
        qs.banner
    );
    // Kept for later runs: beta is the folder's now.
    let config = std::fs::read_to_string(qs.dir().join("pgwake.toml")).unwrap();
    assert!(config.contains("id = \"beta\""), "{config}");
    // The idle timeout given applies: beta sleeps well before the folder's 60 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    while qs.tenant_state("beta") != "asleep" {
        assert!(
            Instant::now() < deadline,
            "beta still {} 30 s after its client left: {}",
            qs.tenant_state("beta"),
            qs.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    qs.stop();

    // Removed with one command, data directories (wherever they went) included.
    let (dir, data) = (qs.dir(), qs.data_dir());
    let out = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .args(["quickstart", "--dir", "qs", "--remove"])
        .current_dir(qs.home.path())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&data.display().to_string()), "{stdout}");
    assert!(!dir.exists() && !data.exists(), "{stdout}");
}

/// `pgwake check-config` on `text` (written to `dir/pgwake.toml`): its exit status and stderr.
fn check_config(dir: &Path, text: &str) -> (bool, String) {
    std::fs::write(dir.join("pgwake.toml"), text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .args(["check-config", "--config"])
        .arg(dir.join("pgwake.toml"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_errors_are_one_line_each_naming_the_key_as_written() {
    let home = tempfile::tempdir().unwrap();
    let head = "[listen]\npostgres = \"127.0.0.1:6432\"\nallow_plaintext = true\n";
    for (extra, key, problem) in [
        (
            "[wake]\nidle_timout = \"1m\"\n",
            "wake.idle_timout",
            "unknown key",
        ),
        (
            "[wake]\nidle_timeout = \"1 minute\"\n",
            "wake.idle_timeout",
            "invalid duration \"1 minute\"",
        ),
    ] {
        let (ok, stderr) = check_config(home.path(), &format!("{head}{extra}"));
        assert!(!ok, "{extra} accepted");
        let config = home.path().join("pgwake.toml");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "pgwake: invalid configuration in {}: {key}: {problem}",
                config.display(),
            )),
            "{stderr}"
        );
        assert!(
            !stderr.contains("default.") && !stderr.contains('`'),
            "{stderr}"
        );
    }

    if !is_root() {
        skipped("config_errors: unreachable data_dir", "needs root");
        return;
    }
    // A data_dir under a closed folder: said once, and not created.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = home.path().join("nested/data");
    let (ok, stderr) = check_config(
        home.path(),
        &format!(
            "{head}[local]\ndata_dir = \"{}\"\npassword = \"x\"\n\
             [[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"local\" }}\n",
            data.display()
        ),
    );
    assert!(!ok);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(
        stderr.matches("cannot reach local.data_dir").count(),
        1,
        "{stderr}"
    );
    assert!(
        !home.path().join("nested").exists(),
        "the refused folder was created"
    );
}

#[test]
fn every_config_error_comes_in_one_run_in_the_file_s_words_without_a_backtrace() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("pgwake.toml");
    std::fs::write(
        &config,
        "[listen]\npostgres = \"127.0.0.1:6432\"\nallow_plaintext = true\n\
         admn = \"127.0.0.1:9090\"\nsession_threads = \"x\"\n\
         [wake]\nidle_timout = \"1m\"\n[limits]\nstartup_timout = \"5s\"\n",
    )
    .unwrap();
    // Rust developers often keep RUST_BACKTRACE set; a mistake in a file is not a crash.
    let out = Command::new(env!("CARGO_BIN_EXE_pgwake"))
        .args(["check-config", "--config"])
        .arg(&config)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "pgwake: invalid configuration in {}: 4 problems\n",
            config.display()
        )),
        "{stderr}"
    );
    for problem in [
        "listen.admn: unknown key",
        "wake.idle_timout: unknown key",
        "limits.startup_timout: unknown key",
        "listen.session_threads: expected a whole number, 0 or more, found \"x\"",
    ] {
        assert!(
            stderr.lines().any(|l| l.trim_start().starts_with(problem)),
            "{problem} in {stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 5, "{stderr}");
    assert!(!stderr.contains("tack backtrace"), "{stderr}");
}

/// `pgwake check-config` on `text` (written to `dir/pgwake.toml`) under a soft file limit of
/// `open_files`: its exit status and stderr.
fn check_config_under_file_limit(dir: &Path, text: &str, open_files: u32) -> (bool, String) {
    std::fs::write(dir.join("pgwake.toml"), text).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -S -n {open_files} && exec \"$0\" check-config --config \"$1\""
        ))
        .arg(env!("CARGO_BIN_EXE_pgwake"))
        .arg(dir.join("pgwake.toml"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_file_limit_lowering_caps_is_news_only_for_caps_someone_chose() {
    let home = tempfile::tempdir().unwrap();
    let head = "[listen]\npostgres = \"127.0.0.1:6432\"\nallow_plaintext = true\n";
    // The default caps (10,000 clients) are lowered under 256 files, as on most machines: no
    // warning at every start.
    let (ok, stderr) = check_config_under_file_limit(home.path(), head, 256);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("file limit"), "{stderr}");
    // A cap someone set that the process cannot hold is still said.
    let chosen = format!("{head}[limits]\nmax_client_connections = 5000\n");
    let (ok, stderr) = check_config_under_file_limit(home.path(), &chosen, 256);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("the file limit holds fewer connections than configured"),
        "{stderr}"
    );
}

/// Clients log in as an owner role, not as a superuser (as Neon's `<database>_owner` and
/// CloudNativePG's `app`): the printed role owns each tenant's database and can create and
/// drop what it holds there, but cannot run programs on the server (`COPY … TO PROGRAM`) or
/// read its files; the superuser is one login away for whoever holds `pgwake.toml`.
#[test]
fn printed_role_owns_the_database_and_is_no_superuser() {
    let qs = Quickstart::start("alpha");
    let url = qs.printed("alpha").url;
    let role = "select rolname, rolsuper, rolcreaterole, rolcreatedb from pg_roles \
                where rolname = current_user";
    assert_eq!(psql(&url, role), "app|f|f|f");
    let owner =
        "select pg_get_userbyid(datdba) from pg_database where datname = current_database()";
    assert_eq!(psql(&url, owner), "app", "the role owns the database");
    let owns = "do $$ begin create table t(n int); create schema s; create table s.u(n int); \
                drop schema s cascade; drop table t; end $$";
    assert_eq!(
        psql(&url, owns),
        "DO",
        "it creates and drops in its database"
    );
    let refused = psql_refused(&url, "copy (select 1) to program 'cat > /dev/null'");
    assert!(
        refused.contains("pg_execute_server_program"),
        "COPY TO PROGRAM is refused: {refused}"
    );
    let refused = psql_refused(&url, "select pg_read_file('postgresql.conf')");
    assert!(refused.contains("permission denied"), "{refused}");
    assert!(qs.banner.contains("for a superuser"), "{}", qs.banner);
    let superuser = as_superuser(&qs, &url);
    assert_eq!(psql(&superuser, role), "pgwake|t|t|t");
    assert_eq!(
        psql(&superuser, "copy (select 1) to program 'cat > /dev/null'"),
        "COPY 1"
    );
}

#[test]
fn printed_strings_work_in_every_driver() {
    let qs = Quickstart::start("alpha");
    let p = qs.printed("alpha");
    let ca = qs.ca();
    let ok = "ok postgres";

    // libpq-based: sslmode=require encrypts without verifying; verify-full pins the CA.
    assert_eq!(psql(&p.url, "select current_database()"), "postgres");
    assert_eq!(psql(&p.verified, "select current_database()"), "postgres");
    assert_eq!(python("psycopg", &p.url), ok, "psycopg");
    assert_eq!(python("psycopg", &p.verified), ok, "psycopg verified");
    // The sni rule with libpq's separate name and address, verified against the wildcard name.
    let user = p
        .url
        .split("://")
        .nth(1)
        .unwrap()
        .split(':')
        .next()
        .unwrap();
    let password = p.url.split(':').nth(2).unwrap().split('@').next().unwrap();
    let sni = format!(
        "host=alpha.db.localtest hostaddr=127.0.0.1 port={} user={user} password={password} \
         dbname=postgres sslmode=verify-full sslrootcert={ca}",
        qs.ports[0]
    );
    assert_eq!(psql(&sni, "select current_database()"), "postgres");

    if Command::new("python3")
        .args(["-c", "import asyncpg"])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert_eq!(python("asyncpg", &p.url), ok, "asyncpg");
        assert_eq!(python("asyncpg", &p.verified), ok, "asyncpg verified");
    } else {
        skipped("asyncpg", "python3 -m pip install asyncpg");
    }

    // node-postgres reads sslmode=require as verify-full: it needs the CA, from the environment
    // or from sslrootcert. postgres.js verifies only what Node trusts and sends sslrootcert to
    // the server as a setting.
    let clients = node_project("clients", "postgres");
    assert_eq!(node(&clients, "pg", &p.url, Some(&ca)), ok, "node-postgres");
    let refused = node(&clients, "pg", &p.url, None);
    assert!(
        refused.starts_with("error UNABLE_TO_VERIFY_LEAF_SIGNATURE"),
        "node-postgres verifies on sslmode=require: {refused}"
    );
    assert_eq!(
        node(&clients, "pg", &p.verified, None),
        ok,
        "node-postgres, sslrootcert"
    );
    assert_eq!(node(&clients, "postgres", &p.url, None), ok, "postgres.js");
    let verify_full = p.url.replace("sslmode=require", "sslmode=verify-full");
    assert_eq!(
        node(&clients, "postgres", &verify_full, Some(&ca)),
        ok,
        "postgres.js, verify-full with NODE_EXTRA_CA_CERTS"
    );
    let refused = node(&clients, "postgres", &p.verified, Some(&ca));
    assert!(
        refused.contains("sslrootcert"),
        "postgres.js sends sslrootcert as a server setting: {refused}"
    );

    // The serverless-driver snippet as printed, over HTTPS and WebSocket, and through drizzle.
    let serverless = node_project("serverless", "drizzle-orm");
    let strip = |s: String| s.trim_end_matches(';').trim_matches('\'').to_owned();
    let fetch = strip(qs.line("neonConfig.fetchEndpoint = () =>"));
    let ws_proxy = strip(qs.line("neonConfig.wsProxy = () =>"));
    let neon_url = strip(
        qs.line("const sql = neon(")
            .trim_end_matches(");")
            .to_owned(),
    );
    // The README's copy of the snippet is the one tested here (its port the default 8443).
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let http = format!("127.0.0.1:{}", qs.ports[2]);
    for line in [
        format!("neonConfig.fetchEndpoint = () => '{fetch}';"),
        format!("neonConfig.wsProxy = () => '{ws_proxy}';"),
    ] {
        let documented = line.replace(&http, "127.0.0.1:8443");
        assert!(readme.contains(&documented), "README.md lacks {documented}");
    }
    let out = Command::new("node")
        .arg("connect_from.mjs")
        .args([&fetch, &ws_proxy, &neon_url])
        .env("NODE_EXTRA_CA_CERTS", &ca)
        .current_dir(&serverless)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("ok http postgres")
            && stdout.contains("ok drizzle")
            && stdout.contains("ok websocket postgres"),
        "serverless driver: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Found as testkit/k8s/build.sh finds it: PGWAKE_GO, PATH, then Go's default install.
    let go = std::env::var("PGWAKE_GO")
        .ok()
        .into_iter()
        .chain(["go".to_owned(), "/usr/local/go/bin/go".to_owned()])
        .find(|go| runs(go, "version"));
    if let Some(go) = go {
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pgx-connect-from");
        let built = Command::new(go)
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pgx"))
            .status()
            .unwrap();
        assert!(built.success(), "go build of tests/pgx");
        let pgx = |url: &str| verdict(Command::new(&bin).arg(url));
        assert_eq!(pgx(&p.url), ok, "pgx");
        assert_eq!(pgx(&p.verified), ok, "pgx verified");
        let refused = pgx(&verify_full);
        assert!(
            refused.contains("certificate signed by unknown authority"),
            "pgx verify-full needs sslrootcert: {refused}"
        );
    } else {
        skipped("pgx", "no Go toolchain (PGWAKE_GO, PATH or /usr/local/go)");
    }

    if let Some(classpath) = jdbc_classpath() {
        // An empty home, so no ~/.postgresql/root.crt of the machine's takes part.
        let java_home = tempfile::tempdir().unwrap();
        let jdbc = |url: &str| {
            verdict(
                Command::new("java")
                    .arg(format!("-Duser.home={}", java_home.path().display()))
                    .args(["-cp", &classpath, "ConnectFrom.java", url])
                    .current_dir(jdbc_dir()),
            )
        };
        assert_eq!(jdbc(&p.jdbc), ok, "pgjdbc");
        let verified = format!(
            "{}&sslrootcert={ca}",
            p.jdbc.replace("sslmode=require", "sslmode=verify-full")
        );
        assert_eq!(jdbc(&verified), ok, "pgjdbc verified");
        let refused = jdbc(&p.jdbc.replace("sslmode=require", "sslmode=verify-full"));
        assert!(
            refused.contains(".postgresql/root.crt"),
            "pgjdbc verify-full without sslrootcert: {refused}"
        );
    }
}
