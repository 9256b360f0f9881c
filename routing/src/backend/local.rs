//! The `local` backend, the embedded default: one Postgres data directory per tenant under one
//! folder, created with `initdb` when missing, woken by spawning `postgres` directly and put to
//! sleep with a fast shutdown (a clean checkpoint makes the next start fast).
//!
//! Postgres refuses to run as root, so when the gateway is root the servers run as `run_as`
//! (the `postgres` account by default), which owns each tenant's folder. `data_dir` itself
//! stays the gateway's, writable by it alone: it holds the gateway's lock and run history, and
//! a tenant's superuser, who can run programs as the server account, must not be able to plant
//! links there. Inside the account's folders the gateway follows no link
//! ([`crate::private_file`]).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, lchown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::{Mutex, RwLock};
use tokio::time::{Instant, sleep};
use tracing::{debug, info, warn};

use super::probe::{Probe, probe};
use super::{BackendError, ComputeBackend, ComputeState, Endpoint};
use crate::TenantId;
use crate::private_file::{self, check_private_dir};

/// Settings of the local backend.
#[derive(Clone, Debug)]
pub struct LocalSettings {
    /// Folder holding one subfolder per tenant.
    pub data_dir: PathBuf,
    /// Folder with `initdb` and `postgres`; found on PATH or under `/usr/lib/postgresql/*/bin`
    /// when unset.
    pub bin_dir: Option<PathBuf>,
    /// Account the servers run as when the gateway is root.
    pub run_as: Option<String>,
    /// Superuser created by `initdb`.
    pub superuser: String,
    /// Its password (host connections use SCRAM-SHA-256).
    pub password: String,
    /// A role created with each cluster, not a superuser, that owns its `postgres` database:
    /// its name and the SCRAM-SHA-256 verifier of its password (so no password reaches the
    /// server in the clear).
    pub owner: Option<(String, String)>,
    /// Extra `postgresql.conf` settings, after the fast-wake defaults.
    pub settings: Vec<(String, String)>,
    /// How long a fast shutdown may take before an immediate one (for a server still starting:
    /// an immediate one before the postmaster is killed).
    pub stop_timeout: Duration,
    /// Time between readiness probes while a server starts.
    pub probe_interval: Duration,
    /// How long a server may take to accept logins.
    pub start_timeout: Duration,
}

/// Settings that shorten start-up or keep a sleeping tenant cheap; later settings win.
const FAST_WAKE_CONF: &[(&str, &str)] = &[
    ("listen_addresses", "'127.0.0.1'"),
    ("shared_buffers", "'16MB'"),
    ("max_connections", "100"),
    ("shared_preload_libraries", "'pg_prewarm'"),
    ("pg_prewarm.autoprewarm", "on"),
    ("max_wal_senders", "0"),
    ("wal_level", "minimal"),
    ("huge_pages", "off"),
    ("jit", "off"),
    ("log_min_messages", "warning"),
];

struct Running {
    child: Child,
    port: u16,
}

/// The servers this backend started, and whether it may start more.
#[derive(Default)]
struct Servers {
    /// Servers whose wake finished: they accept logins.
    ready: HashMap<TenantId, Running>,
    /// Servers spawned whose wake has not finished: kept here so a shutdown in the middle of a
    /// wake stops them too.
    starting: HashMap<TenantId, Running>,
    /// Set by [`LocalBackend::stop_all`]: no server starts once the gateway is stopping.
    closed: bool,
}

/// Postgres servers on this machine, one per tenant.
pub struct LocalBackend {
    settings: LocalSettings,
    bin: PathBuf,
    account: Option<(u32, u32)>,
    servers: Mutex<Servers>,
    /// Held shared while a data directory is created, and exclusively by `stop_all`: the
    /// gateway does not exit with `initdb` still running (it would finish alone and leave a
    /// data directory without the settings written after it).
    initializing: RwLock<()>,
    /// The lock on `data_dir` taken by [`LocalBackend::claim`], held until the backend is
    /// dropped (or the process ends, however it ends).
    claim: std::sync::Mutex<Option<Flock<fs::File>>>,
}

/// Name of the lock file in `data_dir`, held by the gateway that serves its tenants.
const LOCK_FILE: &str = "pgwake.lock";

/// Why [`LocalBackend::claim`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another live gateway process serves the tenants of this `data_dir`.
    #[error("another pgwake{} is serving the tenants in {}", pid_text(*.pid), .data_dir.display())]
    InUse {
        /// That process, as it wrote itself in the lock file.
        pid: Option<u32>,
        /// The folder.
        data_dir: PathBuf,
    },
    /// The lock file could not be opened, locked or written.
    #[error("{0}")]
    Io(String),
}

fn pid_text(pid: Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

/// The server account cannot enter `data_dir` or a folder above it.
fn unreachable_data_dir(settings: &LocalSettings) -> BackendError {
    let name = settings.run_as.as_deref().unwrap_or("postgres");
    BackendError::Unavailable(format!(
        "the {name} account cannot reach local.data_dir {} (a folder above it, such as a home \
         folder with mode 700, is closed to it): set local.data_dir to a folder outside it, for \
         example /var/lib/pgwake/<name>",
        settings.data_dir.display()
    ))
}

fn io_error(context: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::StartFailed(format!("{context}: {e}"))
}

/// How much of a server's log is read for the lines an error quotes.
const LOG_TAIL_BYTES: u64 = 8192;

/// Makes `data_dir` the gateway's own, mode 0755 (the server account passes through to its
/// tenants' folders), taking it back from an account an earlier version gave it to, and checks
/// that no other account can change what it holds.
fn take_data_dir(data_dir: &Path) -> Result<(), BackendError> {
    let meta = fs::symlink_metadata(data_dir).map_err(|e| io_error("examine local.data_dir", e))?;
    if !meta.file_type().is_dir() {
        return Err(BackendError::Unavailable(format!(
            "local.data_dir {} is not a folder",
            data_dir.display()
        )));
    }
    let me = nix::unistd::geteuid();
    if meta.uid() != me.as_raw() {
        lchown(
            data_dir,
            Some(me.as_raw()),
            Some(nix::unistd::getegid().as_raw()),
        )
        .map_err(|e| io_error("take back local.data_dir", e))?;
    }
    fs::set_permissions(data_dir, fs::Permissions::from_mode(0o755))
        .map_err(|e| io_error("chmod local.data_dir", e))?;
    check_private_dir(data_dir)
        .map_err(|e| BackendError::Unavailable(format!("local.data_dir: {e}")))
}

/// Creates a folder, or accepts an existing one; a link or file at its name is refused.
fn create_folder(path: &Path) -> std::io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if fs::symlink_metadata(path)?.file_type().is_dir() {
                Ok(())
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "something other than a folder stands there",
                ))
            }
        }
        other => other,
    }
}

impl LocalBackend {
    /// Finds the Postgres binaries and the account to run them as.
    pub fn new(settings: LocalSettings) -> Result<LocalBackend, BackendError> {
        let bin = match &settings.bin_dir {
            Some(b) => b.clone(),
            None => find_bin_dir().ok_or_else(|| {
                BackendError::Unavailable(
                    "PostgreSQL server binaries (initdb, postgres) not found on PATH or under \
                     /usr/lib/postgresql: install them with `apt-get install -y postgresql` or \
                     set local.bin_dir"
                        .into(),
                )
            })?,
        };
        let account = server_account(settings.run_as.as_deref())?;
        // Looked at before anything is created, so a refused folder is not left behind.
        let existing = settings
            .data_dir
            .ancestors()
            .find(|a| a.exists())
            .unwrap_or(Path::new("/"));
        if let Some(account) = account
            && !can_enter(account, existing)
        {
            return Err(unreachable_data_dir(&settings));
        }
        fs::create_dir_all(&settings.data_dir).map_err(|e| io_error("create local.data_dir", e))?;
        let backend = LocalBackend {
            settings,
            bin,
            account,
            servers: Mutex::new(Servers::default()),
            initializing: RwLock::new(()),
            claim: std::sync::Mutex::new(None),
        };
        let data_dir = backend.settings.data_dir.clone();
        take_data_dir(&data_dir)?;
        if let Some(account) = account
            && !can_enter(account, &data_dir)
        {
            return Err(unreachable_data_dir(&backend.settings));
        }
        Ok(backend)
    }

    /// The folder holding the tenants' folders, the gateway's own (see the module's text).
    pub fn data_dir(&self) -> &Path {
        &self.settings.data_dir
    }

    fn tenant_dir(&self, tenant: &TenantId) -> PathBuf {
        self.settings.data_dir.join(tenant.as_str())
    }

    /// The tenant's Postgres log file.
    pub fn log_path(&self, tenant: &TenantId) -> PathBuf {
        self.tenant_dir(tenant).join("postgres.log")
    }

    fn data_path(&self, tenant: &TenantId) -> PathBuf {
        self.tenant_dir(tenant).join("data")
    }

    /// Hands a folder (never a link) to the server account, with this mode.
    fn give(&self, path: &Path, mode: u32) -> Result<(), BackendError> {
        private_file::give_dir(path, self.account, mode)
            .map_err(|e| io_error(&format!("hand {} to the server account", path.display()), e))
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.account {
            cmd.uid(uid).gid(gid);
        }
        // initdb changes back to its starting folder, which must be one the account can enter:
        // the gateway's own may be a closed home folder.
        cmd.current_dir(&self.settings.data_dir)
            .stdin(Stdio::null())
            .kill_on_drop(false);
        // A process group of its own: a terminal's Ctrl-C goes to the gateway alone, which lets
        // open transactions finish before it stops the server (the server would take the
        // terminal's SIGINT as a fast shutdown of its own and end them at once).
        cmd.process_group(0);
        cmd
    }

    /// Creates the tenant's data directory with `initdb` if it does not exist yet.
    pub async fn ensure_initialized(&self, tenant: &TenantId) -> Result<(), BackendError> {
        let dir = self.tenant_dir(tenant);
        let data = self.data_path(tenant);
        if data.join("PG_VERSION").exists() {
            return Ok(());
        }
        let _initializing = self.initializing.read().await;
        if self.servers.lock().await.closed {
            return Err(stopping());
        }
        // data_dir is the gateway's alone, so nothing but a folder of ours stands at `dir`;
        // one left by an earlier run may be the account's, and a link inside it is refused.
        create_folder(&dir).map_err(|e| io_error("create tenant folder", e))?;
        let sock = dir.join("sock");
        create_folder(&sock).map_err(|e| io_error("create socket folder", e))?;
        self.give(&sock, 0o700)?;
        let pwfile = dir.join("initdb.pw");
        match fs::remove_file(&pwfile) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_error("remove an old password file", e));
            }
            _ => {}
        }
        private_file::create_for(&pwfile, self.account, self.settings.password.as_bytes())
            .map_err(|e| io_error("write password", e))?;
        self.give(&dir, 0o700)?;
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", &self.settings.superuser])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args([
                "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ])
            .stdout(Stdio::null())
            .output()
            .await;
        let _ = fs::remove_file(&pwfile);
        let out = out.map_err(|e| io_error("run initdb", e))?;
        if !out.status.success() {
            return Err(BackendError::StartFailed(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        if let Some(owner) = &self.settings.owner
            && let Err(e) = self.create_owner(&data, owner).await
        {
            // A cluster without its owner would be taken as ready by the next wake: made again.
            let _ = fs::remove_dir_all(&data);
            return Err(e);
        }
        let mut conf = String::from("\n# pgwake: fast wake\n");
        let sock_dir = format!("'{}'", sock.display());
        let defaults = FAST_WAKE_CONF
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("unix_socket_directories".to_string(), sock_dir)])
            .chain(self.settings.settings.iter().cloned());
        for (k, v) in defaults {
            conf.push_str(&format!("{k} = {v}\n"));
        }
        // initdb wrote the file as the account, in the account's folder: appended to only
        // while it is still that file.
        private_file::append_existing(&data.join("postgresql.conf"), self.account)
            .and_then(|mut f| std::io::Write::write_all(&mut f, conf.as_bytes()))
            .map_err(|e| io_error("append to postgresql.conf", e))?;
        info!(tenant = %tenant, data = %data.display(), "initialized data directory");
        Ok(())
    }

    /// Creates the `owner` role (name, verifier) in the new cluster at `data` and gives it the
    /// `postgres` database, in single-user mode: no server listens yet, so nothing else can log
    /// in before the role exists.
    async fn create_owner(
        &self,
        data: &Path,
        (role, verifier): &(String, String),
    ) -> Result<(), BackendError> {
        let role = format!("\"{}\"", role.replace('"', "\"\""));
        let verifier = verifier.replace('\'', "''");
        // One statement per line: single-user mode runs each line as it reads it.
        let sql = format!(
            "CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{verifier}'\n\
             ALTER DATABASE postgres OWNER TO {role}\n"
        );
        let mut child = self
            .command("postgres")
            .arg("--single")
            .arg("-D")
            .arg(data)
            .arg("postgres")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io_error("run postgres --single", e))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let written = tokio::io::AsyncWriteExt::write_all(&mut stdin, sql.as_bytes()).await;
        drop(stdin);
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| io_error("run postgres --single", e))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Single-user mode reports a failed statement on stderr and still exits with 0. Only
        // the errors are told: the STATEMENT lines beside them hold the verifier.
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR:")).collect();
        if written.is_err() || !out.status.success() || !errors.is_empty() {
            return Err(BackendError::StartFailed(format!(
                "creating the owner role failed ({}): {}",
                out.status,
                errors.join("; ")
            )));
        }
        Ok(())
    }

    /// Takes the lock that says this process serves the tenants of `data_dir`, so that a second
    /// gateway on the same folder stops before it touches anything; fails when another live
    /// process holds it. Only with the lock held may [`LocalBackend::stop_stale`] run: then a
    /// postmaster found in a data directory was left by a gateway that is gone.
    pub fn claim(&self) -> Result<(), ClaimError> {
        use std::io::{Read, Seek, Write};
        let mut held = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_some() {
            return Ok(());
        }
        let path = self.settings.data_dir.join(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&path)
            .map_err(|e| ClaimError::Io(format!("open {}: {e}", path.display())))?;
        // flock: released by the kernel when the process ends, even by SIGKILL.
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(ClaimError::InUse {
                    pid: text.trim().parse().ok(),
                    data_dir: self.settings.data_dir.clone(),
                });
            }
            Err((_, e)) => {
                return Err(ClaimError::Io(format!("lock {}: {e}", path.display())));
            }
        };
        // The holder's pid, for the message the next process shows.
        let written = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        written.map_err(|e| ClaimError::Io(format!("write {}: {e}", path.display())))?;
        *held = Some(file);
        Ok(())
    }

    /// Stops a postmaster left running by an earlier gateway (found through `postmaster.pid`),
    /// so every server this backend reports on is one it started. Call it only after
    /// [`LocalBackend::claim`]: without the lock the postmaster may be a live gateway's.
    pub async fn stop_stale(&self, tenant: &TenantId) {
        let pidfile = self.data_path(tenant).join("postmaster.pid");
        let Some(pid) = fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse::<i32>().ok())
        else {
            return;
        };
        let pid = Pid::from_raw(pid);
        if kill(pid, None).is_err() {
            return;
        }
        // The file is the account's to write: signal only a process of the account's.
        if let Some((uid, _)) = self.account
            && !fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid)
        {
            warn!(tenant = %tenant, pid = pid.as_raw(), "postmaster.pid names a process of another account; not signalling it");
            return;
        }
        warn!(tenant = %tenant, pid = pid.as_raw(), "stopping a postmaster left by an earlier run");
        let _ = kill(pid, Signal::SIGINT);
        let deadline = Instant::now() + self.settings.stop_timeout;
        while kill(pid, None).is_ok() && Instant::now() < deadline {
            sleep(Duration::from_millis(20)).await;
        }
        if kill(pid, None).is_ok() {
            let _ = kill(pid, Signal::SIGQUIT);
        }
    }

    /// Stops every server this backend started, those whose wake is still under way included,
    /// and starts none after (gateway shutdown).
    pub async fn stop_all(&self) {
        let (starting, ready) = {
            let mut servers = self.servers.lock().await;
            servers.closed = true;
            (
                std::mem::take(&mut servers.starting),
                std::mem::take(&mut servers.ready),
            )
        };
        drop(self.initializing.write().await);
        for (t, r) in starting {
            let stopped = self.stop_starting(&t, r).await;
            info!(tenant = %t, shutdown = stopped.shutdown, ms = stopped.ms(), "postgres stopped");
        }
        for (t, r) in ready {
            let stopped = self.stop_fast(&t, r).await;
            info!(tenant = %t, shutdown = stopped.shutdown, ms = stopped.ms(), "postgres stopped");
        }
    }

    /// Stops a server whose wake has not finished with an immediate shutdown: no client has used
    /// it, and a fast shutdown waits for every backend to exit, which one still before
    /// authentication can hold up (with `pre_auth_delay` the readiness probe's backend leaves the
    /// fast shutdown's SIGTERM pending until its delay is over; the immediate shutdown's SIGQUIT
    /// ends it at once, as seen with Postgres 15).
    async fn stop_starting(&self, tenant: &TenantId, mut r: Running) -> Stopped {
        let began = Instant::now();
        if let Some(pid) = r.child.id() {
            info!(tenant = %tenant, pid, "stopping a server whose wake has not finished");
        }
        signal(&r, Signal::SIGQUIT);
        if !self.exits_in_time(&mut r).await {
            warn!(tenant = %tenant, "immediate shutdown too slow: killing the postmaster");
            let _ = r.child.start_kill();
            let _ = r.child.wait().await;
            return Stopped::after(began, "killed");
        }
        Stopped::after(began, "immediate")
    }

    /// Stops a ready server with a fast shutdown, then an immediate one after `stop_timeout`.
    async fn stop_fast(&self, tenant: &TenantId, mut r: Running) -> Stopped {
        let began = Instant::now();
        // SIGINT is Postgres's fast shutdown: it checkpoints cleanly, so the next start skips
        // crash recovery.
        signal(&r, Signal::SIGINT);
        if !self.exits_in_time(&mut r).await {
            warn!(tenant = %tenant, "fast shutdown too slow: immediate shutdown");
            signal(&r, Signal::SIGQUIT);
            let _ = r.child.wait().await;
            return Stopped::after(began, "immediate");
        }
        Stopped::after(began, "fast")
    }

    /// Whether the server's postmaster exits within `stop_timeout`.
    async fn exits_in_time(&self, r: &mut Running) -> bool {
        tokio::time::timeout(self.settings.stop_timeout, r.child.wait())
            .await
            .is_ok()
    }

    fn log_tail(&self, tenant: &TenantId) -> String {
        let bytes = private_file::read_tail(&self.log_path(tenant), LOG_TAIL_BYTES);
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Spawns the tenant's server and records it as starting, unless the backend is closed.
    /// Spawning and recording under one lock leaves no moment in which `stop_all` could miss it.
    async fn spawn(&self, tenant: &TenantId) -> Result<u16, BackendError> {
        self.ensure_initialized(tenant).await?;
        let port = free_port().map_err(|e| io_error("find a free port", e))?;
        let log = private_file::append_for(&self.log_path(tenant), self.account)
            .map_err(|e| io_error("open postgres.log", e))?;
        let mut servers = self.servers.lock().await;
        if servers.closed {
            return Err(stopping());
        }
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_path(tenant))
            .args(["-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| io_error("spawn postgres", e))?;
        servers
            .starting
            .insert(tenant.clone(), Running { child, port });
        Ok(port)
    }

    /// Fails the wake when its server exited or was stopped by `stop_all`.
    async fn check_starting(&self, tenant: &TenantId) -> Result<(), BackendError> {
        let mut servers = self.servers.lock().await;
        let Some(r) = servers.starting.get_mut(tenant) else {
            return Err(stopping());
        };
        if let Ok(Some(status)) = r.child.try_wait() {
            servers.starting.remove(tenant);
            return Err(BackendError::StartFailed(format!(
                "postgres exited with {status} during start-up: {}",
                self.log_tail(tenant)
            )));
        }
        Ok(())
    }
}

/// Sends `signal` to the server's postmaster, unless it has already been reaped.
fn signal(r: &Running, signal: Signal) {
    if let Some(pid) = r.child.id() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}

/// Why a wake failed that the gateway's shutdown interrupted.
fn stopping() -> BackendError {
    BackendError::Unavailable("the gateway is shutting down".into())
}

#[async_trait]
impl ComputeBackend for LocalBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    async fn wake(&self, tenant: &TenantId) -> Result<Endpoint, BackendError> {
        // The coordinator runs one wake per tenant at a time, so the map is locked only to look
        // and to record: one tenant's slow start never holds up another's.
        {
            let mut servers = self.servers.lock().await;
            if let Some(r) = servers.ready.get_mut(tenant) {
                if matches!(r.child.try_wait(), Ok(None)) {
                    return Ok(endpoint(r.port));
                }
                servers.ready.remove(tenant);
            }
        }
        let ep = endpoint(self.spawn(tenant).await?);
        let pidfile = self.data_path(tenant).join("postmaster.pid");
        let deadline = Instant::now() + self.settings.start_timeout;
        loop {
            self.check_starting(tenant).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let r = self.servers.lock().await.starting.remove(tenant);
                if let Some(mut r) = r {
                    let _ = r.child.start_kill();
                    let _ = r.child.wait().await;
                }
                return Err(BackendError::Timeout(self.settings.start_timeout));
            }
            // Reading postmaster.pid costs far less than a probe (which makes the postmaster
            // fork a backend just to answer 57P03), so look there often and probe only once
            // Postgres reports itself ready.
            if postmaster_status(&pidfile).await == PostmasterStatus::Starting {
                sleep(STATUS_POLL.min(left)).await;
                continue;
            }
            match probe(&ep, &self.settings.superuser, "postgres", left).await {
                Probe::Ready => break,
                Probe::NotYet(_) => sleep(self.settings.probe_interval.min(left)).await,
            }
        }
        let mut servers = self.servers.lock().await;
        let r = servers.starting.remove(tenant).ok_or_else(stopping)?;
        servers.ready.insert(tenant.clone(), r);
        Ok(ep)
    }

    async fn sleep(&self, tenant: &TenantId) -> Result<(), BackendError> {
        let Some(r) = self.servers.lock().await.ready.remove(tenant) else {
            return Ok(());
        };
        let stopped = self.stop_fast(tenant, r).await;
        debug!(tenant = %tenant, shutdown = stopped.shutdown, ms = stopped.ms(), "postgres stopped");
        Ok(())
    }

    async fn state(&self, tenant: &TenantId) -> Result<ComputeState, BackendError> {
        let mut servers = self.servers.lock().await;
        let alive = servers
            .ready
            .get_mut(tenant)
            .is_some_and(|r| matches!(r.child.try_wait(), Ok(None)));
        Ok(if alive {
            ComputeState::Awake
        } else {
            ComputeState::Asleep
        })
    }
}

/// How a server was stopped, and how long it took to exit.
struct Stopped {
    /// The shutdown that ended it: `fast`, `immediate` or `killed`.
    shutdown: &'static str,
    took: Duration,
}

impl Stopped {
    fn after(began: Instant, shutdown: &'static str) -> Stopped {
        Stopped {
            shutdown,
            took: began.elapsed(),
        }
    }

    fn ms(&self) -> u64 {
        self.took.as_millis() as u64
    }
}

/// How often `postmaster.pid` is read while a server starts.
const STATUS_POLL: Duration = Duration::from_millis(1);

/// What the status line of `postmaster.pid` says.
#[derive(Debug, PartialEq, Eq)]
enum PostmasterStatus {
    /// Not ready yet (`starting`, or the file or its line is not written yet).
    Starting,
    /// `ready`, `stopping`, `standby`, or an unreadable file: a probe decides.
    Other,
}

/// The postmaster's own start-up status: since Postgres 10 the eighth line of
/// `postmaster.pid` reads `starting` until it accepts connections, then `ready`. A file not
/// written yet means starting; the caller's deadline and exit check cover a postmaster that
/// never writes it.
async fn postmaster_status(pidfile: &Path) -> PostmasterStatus {
    match tokio::fs::read_to_string(pidfile).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => PostmasterStatus::Starting,
        Err(_) => PostmasterStatus::Other,
        Ok(text) => match text.lines().nth(7).map(str::trim) {
            None | Some("") | Some("starting") => PostmasterStatus::Starting,
            Some(_) => PostmasterStatus::Other,
        },
    }
}

/// The (uid, gid) the servers run as: `run_as` (default `postgres`) when this process is root,
/// none otherwise, since Postgres refuses to run as root.
pub fn server_account(run_as: Option<&str>) -> Result<Option<(u32, u32)>, BackendError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let name = run_as.unwrap_or("postgres");
    let user = nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .ok_or_else(|| {
            BackendError::Unavailable(format!(
                "Postgres refuses to run as root and account {name:?} does not exist: \
                 set local.run_as to an unprivileged account"
            ))
        })?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// Whether `account` can make `dir` its current folder, tried for real (a child process as that
/// account) so ACLs and supplementary groups count as the kernel counts them.
pub fn can_enter((uid, gid): (u32, u32), dir: &Path) -> bool {
    std::process::Command::new("/bin/sh")
        .args(["-c", "exit 0"])
        .current_dir(dir)
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn endpoint(port: u16) -> Endpoint {
    Endpoint::new("127.0.0.1", port)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The newest `/usr/lib/postgresql/<version>/bin`, else the folder of `postgres` and `initdb`
/// on PATH.
pub fn find_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b).or_else(|| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .find(|d| d.join("postgres").exists() && d.join("initdb").exists())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_the_postmaster_status_line() {
        let dir = std::env::temp_dir().join(format!("pgwake-pidfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("postmaster.pid");
        assert_eq!(postmaster_status(&file).await, PostmasterStatus::Starting);
        let head = "4242\n/data\n1700000000\n5432\n/tmp\n*\n  1234     5678\n";
        for (status, want) in [
            ("", PostmasterStatus::Starting),
            ("starting\n", PostmasterStatus::Starting),
            ("ready   \n", PostmasterStatus::Other),
            ("stopping\n", PostmasterStatus::Other),
        ] {
            std::fs::write(&file, format!("{head}{status}")).unwrap();
            assert_eq!(postmaster_status(&file).await, want, "{status:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
