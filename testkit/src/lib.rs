//! Test and benchmark support for pgwake: throwaway PostgreSQL servers on loopback and
//! self-signed certificates. Synchronous on purpose, so tests, benches and scripts can share it.
//! [`kube::KubeLab`] adds a real Kubernetes API server (etcd + kube-apiserver) on loopback.

use std::fs;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub mod fake_operator;
pub mod kube;
pub mod layout;

/// Where the PostgreSQL server binaries live: `PGWAKE_PG_BIN`, else where the gateway's local
/// backend finds them (the newest `/usr/lib/postgresql/<version>/bin`, else `PATH`).
pub fn pg_bin_dir() -> io::Result<PathBuf> {
    if let Ok(dir) = std::env::var("PGWAKE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    find_bin_dir().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "PostgreSQL server binaries not found: install them (apt-get install -y postgresql) \
             or set PGWAKE_PG_BIN",
        )
    })
}

/// The newest `/usr/lib/postgresql/<version>/bin`, else the folder of `postgres` and `initdb`
/// on `PATH`: the search of the gateway's local backend, repeated so that testkit (and the
/// protocol tests using it) do not build the routing crate and its Kubernetes client. A test
/// of the gateway checks that the two agree.
pub fn find_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .find(|d| d.join("postgres").exists() && d.join("initdb").exists())
        })
    })
}

/// The unprivileged account (uid, gid) that runs `initdb` and `postgres` when we are root,
/// since Postgres refuses to run as root.
pub fn postgres_account() -> Option<(u32, u32)> {
    if effective_uid() != 0 {
        return None;
    }
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 3 && f[0] == "postgres" {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        } else {
            None
        }
    })
}

/// The effective uid of this process, read from /proc to avoid a libc dependency.
fn effective_uid() -> u32 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

/// A command that runs as the Postgres account when we are root.
pub fn pg_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    if let Some((uid, gid)) = postgres_account() {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// Gives a directory to the Postgres account (when we are root) so the server can use it.
pub fn hand_over(dir: &Path) -> io::Result<()> {
    if let Some((uid, gid)) = postgres_account() {
        chown(dir, Some(uid), Some(gid))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server a test starts.
///
/// Ports come from below Linux's ephemeral range (32768-60999), never twice in one process:
/// an ephemeral port that was free when checked can be taken by any outgoing connection
/// before the server binds it, which made gateways fail with "address already in use" while
/// other tests opened hundreds of client connections.
pub fn free_port() -> u16 {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Different test processes start at different places, so concurrent ones rarely meet.
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // 13 shares no factor with SPAN, so the walk visits every port once.
        let port = (LOW + (start + n.wrapping_mul(13)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a port on loopback")
}

/// How to set up a throwaway server.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Superuser name.
    pub user: String,
    /// Superuser password (host connections use SCRAM-SHA-256).
    pub password: String,
    /// Extra `postgresql.conf` lines.
    pub extra_conf: Vec<String>,
    /// Serve TLS with this certificate (the server then accepts both TLS and plaintext).
    pub tls: Option<TestCert>,
    /// Host connections need no password (`trust`), for benchmarks that measure the relay only.
    pub trust: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            user: "pgwake".into(),
            password: "pgwake-test-password".into(),
            extra_conf: Vec::new(),
            tls: None,
            trust: false,
        }
    }
}

/// A PostgreSQL server in a temporary directory on a free loopback port, stopped on drop.
pub struct TestPostgres {
    /// The port it listens on at 127.0.0.1.
    pub port: u16,
    /// The options it was made with.
    pub options: PgOptions,
    /// The Unix socket directory.
    pub socket_dir: PathBuf,
    data_dir: PathBuf,
    child: Option<Child>,
    /// A postmaster `pg_ctl` started (not our child), by PID.
    daemon: Option<u32>,
    _root: tempfile::TempDir,
}

impl TestPostgres {
    /// Runs `initdb` and starts the server; returns once it accepts TCP connections.
    pub fn start(options: PgOptions) -> io::Result<TestPostgres> {
        let bin = pg_bin_dir()?;
        let root = tempfile::Builder::new().prefix("pgwake-pg-").tempdir()?;
        hand_over(root.path())?;
        let data_dir = root.path().join("data");
        let socket_dir = root.path().join("sock");
        fs::create_dir(&socket_dir)?;
        hand_over(&socket_dir)?;
        let pwfile = root.path().join("pw");
        fs::write(&pwfile, &options.password)?;
        if let Some((uid, gid)) = postgres_account() {
            chown(&pwfile, Some(uid), Some(gid))?;
        }
        let host_auth = if options.trust {
            "trust"
        } else {
            "scram-sha-256"
        };
        let out = pg_command(bin.join("initdb"))
            .arg("-D")
            .arg(&data_dir)
            .args(["-U", &options.user, "--auth-local=trust"])
            .arg(format!("--auth-host={host_auth}"))
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-E", "UTF8", "--locale=C", "--no-sync"])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let port = free_port();
        let mut conf = vec![
            format!("port = {port}"),
            "listen_addresses = '127.0.0.1'".into(),
            format!("unix_socket_directories = '{}'", socket_dir.display()),
            "max_connections = 300".into(),
            "shared_buffers = 16MB".into(),
            "fsync = off".into(),
            "synchronous_commit = off".into(),
            "full_page_writes = off".into(),
        ];
        if let Some(cert) = &options.tls {
            let (crt, key) = (data_dir.join("server.crt"), data_dir.join("server.key"));
            fs::write(&crt, &cert.cert_pem)?;
            fs::write(&key, &cert.key_pem)?;
            fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
            if let Some((uid, gid)) = postgres_account() {
                chown(&crt, Some(uid), Some(gid))?;
                chown(&key, Some(uid), Some(gid))?;
            }
            conf.push("ssl = on".into());
        }
        conf.extend(options.extra_conf.iter().cloned());
        let conf_path = data_dir.join("postgresql.conf");
        let mut text = fs::read_to_string(&conf_path)?;
        text.push('\n');
        text.push_str(&conf.join("\n"));
        text.push('\n');
        fs::write(&conf_path, text)?;

        let child = spawn_postgres(&data_dir, root.path())?;
        let mut pg = TestPostgres {
            port,
            options,
            socket_dir,
            data_dir,
            child: Some(child),
            daemon: None,
            _root: root,
        };
        pg.wait_ready(Duration::from_secs(30))?;
        Ok(pg)
    }

    fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        let ready = self.socket_dir.join(format!(".s.PGSQL.{}", self.port));
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(io::Error::other(format!(
                    "postgres exited with {status}: {}",
                    self.log()
                )));
            }
            if ready.exists() && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let ok = Command::new(pg_bin_dir()?.join("pg_isready"))
                    .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(true);
                if ok {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "postgres did not start within {limit:?}: {}",
                    self.log()
                )));
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again after [`TestPostgres::stop`], on the same port and data.
    pub fn resume(&mut self) -> io::Result<()> {
        if !self.is_running() {
            self.child = Some(spawn_postgres(&self.data_dir, self._root.path())?);
            self.wait_ready(Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// True while the server process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some() || self.daemon.is_some_and(pid_alive)
    }

    /// Restarts the server the way an operator would, `pg_ctl restart -m fast` (SIGINT, a
    /// clean checkpoint, a new postmaster on the same port); returns once it accepts
    /// connections again. The new postmaster is `pg_ctl`'s, tracked by PID from then on.
    pub fn pg_ctl_restart_fast(&mut self) -> io::Result<()> {
        let log = fs::OpenOptions::new()
            .append(true)
            .open(self._root.path().join("server.log"))?;
        let out = pg_command(pg_bin_dir()?.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "fast", "-w", "-t", "60", "restart"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::piped())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "pg_ctl restart failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        if let Some(mut old) = self.child.take() {
            let _ = old.wait();
        }
        let pidfile = fs::read_to_string(self.data_dir.join("postmaster.pid"))?;
        let pid = pidfile
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| io::Error::other("postmaster.pid has no PID"))?;
        self.daemon = Some(pid);
        self.wait_ready(Duration::from_secs(30))
    }

    /// The server log so far, for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self._root.path().join("server.log")).unwrap_or_default()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .or(self.daemon.filter(|p| pid_alive(*p)))
    }

    /// A libpq-style connection string to this server over TCP.
    pub fn conn_str(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} password={} dbname={dbname} sslmode=disable",
            self.port, self.options.user, self.options.password
        )
    }

    /// Runs one SQL statement as the superuser over the Unix socket with `psql` and returns its
    /// unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        let out = Command::new(pg_bin_dir()?.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket_dir)
            .args(["-p", &self.port.to_string(), "-U", &self.options.user])
            .args(["-d", "postgres", "-c", sql])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Number of client backends connected right now (excluding the asking one).
    pub fn client_backends(&self) -> io::Result<u32> {
        let n = self.psql(
            "select count(*) from pg_stat_activity \
             where backend_type = 'client backend' and pid <> pg_backend_pid()",
        )?;
        n.parse().map_err(io::Error::other)
    }

    /// Stops the server with a fast shutdown and waits for it.
    pub fn stop(&mut self) {
        if let Some(pid) = self.daemon.take() {
            let _ = Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while pid_alive(pid) && Instant::now() < deadline {
                sleep(Duration::from_millis(10));
            }
            if pid_alive(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// True while a process with this PID exists (and is not a zombie we could reap: `pg_ctl`'s
/// postmaster is not our child, so init reaps it).
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Starts `postgres` on a data directory, logging (appended) to `server.log` beside it.
fn spawn_postgres(data_dir: &Path, root: &Path) -> io::Result<Child> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("server.log"))?;
    pg_command(pg_bin_dir()?.join("postgres"))
        .arg("-D")
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
}

/// A self-signed certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct TestCert {
    /// Certificate PEM (also the trust anchor, being self-signed).
    pub cert_pem: String,
    /// PKCS#8 private key PEM.
    pub key_pem: String,
}

impl TestCert {
    /// An ECDSA P-256 self-signed certificate for these DNS names or IP addresses.
    pub fn new(names: &[&str]) -> TestCert {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let ck = rcgen::generate_simple_self_signed(names).expect("generate a test certificate");
        TestCert {
            cert_pem: ck.cert.pem(),
            key_pem: ck.signing_key.serialize_pem(),
        }
    }

    /// Writes `cert.pem` and `key.pem` into `dir` and returns their paths.
    pub fn write_to(&self, dir: &Path) -> io::Result<(PathBuf, PathBuf)> {
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        fs::write(&c, &self.cert_pem)?;
        fs::write(&k, &self.key_pem)?;
        fs::set_permissions(&k, fs::Permissions::from_mode(0o600))?;
        Ok((c, k))
    }
}
