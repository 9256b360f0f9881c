//! The other poolers a user would pick instead of pgwake, pgcat and PgDog (both multi-threaded,
//! in Rust), and the floors measured beside it: the bare tokio relay of
//! `examples/relay_floor.rs` and the bare TLS + SCRAM acceptor of `examples/login_floor.rs`.
//!
//! The peers are built from their public source by `benches/peers.sh` into
//! `~/.cache/pgwake/peers/bin` (or found through `PGWAKE_BENCH_PGCAT` and `PGWAKE_BENCH_PGDOG`).
//! A peer whose binary is missing is skipped, with the command that builds it in the reason.
//! Each runs as a child of the harness (same session, so the same autogroup as every other
//! server), on 127.0.0.1, with two worker threads (this machine's two CPUs; pgwake runs one
//! session thread per CPU) and per-connection logging off, as PgBouncer and pgwake are run.

use std::fmt;
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pgwake_testkit::free_port;

use crate::pgbench::{Auth, Endpoint};
use crate::process::Guarded;

/// Worker threads every peer gets: the machine's two CPUs, as pgwake's session threads.
const WORKERS: u32 = 2;

/// One of the Rust poolers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// postgresml/pgcat.
    Pgcat,
    /// pgdogdev/pgdog.
    PgDog,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::Pgcat => "pgcat",
            Peer::PgDog => "PgDog",
        })
    }
}

/// How a peer pools server connections.
#[derive(Clone, Copy, Debug)]
pub struct PeerPool {
    /// `session` or `transaction`.
    pub mode: &'static str,
    /// Server connections for the one database and user.
    pub size: u32,
    /// Whether to turn on the peer's own prepared-statement handling where it has a switch for
    /// it (pgcat's `prepared_statements_cache_size`; PgDog's `prepared_statements` is on by
    /// default).
    pub prepared: bool,
}

impl PeerPool {
    /// The relay and churn scenarios' pool: session mode, room for pgbench's 16 clients, as
    /// the environment's PgBouncer.
    pub const SESSION: PeerPool = PeerPool {
        mode: "session",
        size: 40,
        prepared: false,
    };
}

/// The cache size given to pgcat's prepared-statement handling when it is turned on: room for
/// every statement of the sessions sharing one server connection (as PgBouncer's
/// `max_prepared_statements` in the multiplex scenario).
pub const PGCAT_PREPARED_CACHE: u32 = 1000;

impl Peer {
    /// Both, in table order.
    pub const ALL: [Peer; 2] = [Peer::Pgcat, Peer::PgDog];

    fn file_name(self) -> &'static str {
        match self {
            Peer::Pgcat => "pgcat",
            Peer::PgDog => "pgdog",
        }
    }

    fn env_var(self) -> &'static str {
        match self {
            Peer::Pgcat => "PGWAKE_BENCH_PGCAT",
            Peer::PgDog => "PGWAKE_BENCH_PGDOG",
        }
    }

    /// The peer's binary, or why there is none (the sentence for the report's skipped list).
    pub fn binary(self) -> Result<PathBuf, String> {
        let path = match std::env::var_os(self.env_var()) {
            Some(p) => PathBuf::from(p),
            None => peers_bin_dir().join(self.file_name()),
        };
        if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{self} binary not found at {} (set {} or build it with `bash benches/peers.sh \
                 {}`, see benches/README.md)",
                shown(&path),
                self.env_var(),
                self.file_name()
            ))
        }
    }

    /// What the binary is: the pin `benches/peers.sh` recorded beside it, else its
    /// `--version`.
    pub fn version(self, binary: &Path) -> String {
        let pin = binary.with_extension("pin");
        if let Ok(text) = fs::read_to_string(&pin) {
            return format!("built by benches/peers.sh from {}", text.trim());
        }
        crate::process::command_output(binary, &["--version"])
            .unwrap_or_else(|| format!("{} (version unknown)", binary.display()))
    }

    /// Writes the peer's config into `dir` (files named after `name`) and starts it in front of
    /// `backend`, serving TLS with `cert` and `key`. Returns it and its port once the port
    /// accepts TCP.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        self,
        binary: &Path,
        dir: &Path,
        name: &str,
        pool: PeerPool,
        auth: Auth,
        backend: &Endpoint,
        cert: &Path,
        key: &Path,
    ) -> Result<(Guarded, u16)> {
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(binary);
        match self {
            Peer::Pgcat => {
                let config = dir.join(format!("{name}.toml"));
                fs::write(&config, pgcat_config(port, pool, auth, backend, cert, key))?;
                cmd.arg(&config).args(["--log-level", "warn", "--no-color"]);
            }
            Peer::PgDog => {
                let config = dir.join(format!("{name}.toml"));
                let users = dir.join(format!("{name}-users.toml"));
                fs::write(&config, pgdog_config(port, pool, auth, backend, cert, key))?;
                fs::write(&users, pgdog_users(pool, backend))?;
                cmd.arg("--config").arg(&config).arg("--users").arg(&users);
            }
        }
        // Both read settings from their own environment variables (PGDOG_*, and pgcat's clap
        // `env` names); a developer's shell must not change the run.
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("PGDOG_")
                || [
                    "CONFIG_FILE",
                    "LOG_LEVEL",
                    "LOG_FORMAT",
                    "NO_COLOR",
                    "RUST_LOG",
                ]
                .contains(&k.as_ref())
            {
                cmd.env_remove(key);
            }
        }
        crate::progress(format_args!("starting {self} ({}) ...", binary.display()));
        let log_file = fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        let mut guard = Guarded::new(self.file_name(), child, log);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = guard.exited() {
                bail!("exited with {status} before serving: {}", guard.log_tail(8));
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok((guard, port));
            }
            if Instant::now() > deadline {
                bail!("not listening within 20 s: {}", guard.log_tail(8));
            }
            sleep(Duration::from_millis(50));
        }
    }
}

/// Where `benches/peers.sh` puts the binaries by default: `$PGWAKE_PEERS_DIR/bin`, else
/// `~/.cache/pgwake/peers/bin`.
fn peers_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PGWAKE_PEERS_DIR") {
        return PathBuf::from(dir).join("bin");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/pgwake/peers/bin")
}

/// `path` as the report shows it: under the home folder as `~/…`, so that no machine's home
/// folder lands in the committed results.
fn shown(path: &Path) -> String {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    // A home folder of `/` would turn every path into `~/…`.
    let home = home.filter(|h| h.parent().is_some());
    match home.as_deref().and_then(|h| path.strip_prefix(h).ok()) {
        Some(rest) => format!("~/{}", rest.display()),
        None => path.display().to_string(),
    }
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// pgcat's config: one pool named after the database, one user, one primary. pgcat checks
/// client passwords with MD5 or not at all (`trust`): it has no SCRAM for clients, so with
/// `--auth scram` its clients log in with MD5 while it logs in to Postgres with SCRAM.
fn pgcat_config(
    port: u16,
    pool: PeerPool,
    auth: Auth,
    backend: &Endpoint,
    cert: &Path,
    key: &Path,
) -> String {
    let auth_type = match auth {
        Auth::Trust => "trust",
        Auth::Scram => "md5",
    };
    let prepared = if pool.prepared {
        PGCAT_PREPARED_CACHE
    } else {
        0
    };
    let db = &backend.dbname;
    format!(
        "[general]\n\
         host = \"127.0.0.1\"\n\
         port = {port}\n\
         worker_threads = {WORKERS}\n\
         admin_username = \"pgcat-admin\"\n\
         admin_password = \"pgcat-admin-bench\"\n\
         log_client_connections = false\n\
         log_client_disconnections = false\n\
         tls_certificate = {cert}\n\
         tls_private_key = {key}\n\
         \n\
         [pools.{db}]\n\
         pool_mode = \"{mode}\"\n\
         prepared_statements_cache_size = {prepared}\n\
         \n\
         [pools.{db}.users.0]\n\
         username = {user}\n\
         password = {password}\n\
         pool_size = {size}\n\
         min_pool_size = 0\n\
         auth_type = \"{auth_type}\"\n\
         \n\
         [pools.{db}.shards.0]\n\
         servers = [[\"127.0.0.1\", {backend_port}, \"primary\"]]\n\
         database = {dbq}\n",
        cert = quoted(&cert.to_string_lossy()),
        key = quoted(&key.to_string_lossy()),
        mode = pool.mode,
        user = quoted(&backend.user),
        password = quoted(&backend.password),
        size = pool.size,
        backend_port = backend.port,
        dbq = quoted(db),
    )
}

/// PgDog's main config: one database, logs at `warn` (its `info` level logs every
/// connection). Its prepared-statement handling stays at its default (`extended`: protocol-level
/// statements are tracked and re-prepared on whichever server connection runs them).
fn pgdog_config(
    port: u16,
    pool: PeerPool,
    auth: Auth,
    backend: &Endpoint,
    cert: &Path,
    key: &Path,
) -> String {
    let auth_type = match auth {
        Auth::Trust => "trust",
        Auth::Scram => "scram",
    };
    format!(
        "[general]\n\
         host = \"127.0.0.1\"\n\
         port = {port}\n\
         workers = {WORKERS}\n\
         default_pool_size = {size}\n\
         min_pool_size = 0\n\
         pooler_mode = \"{mode}\"\n\
         auth_type = \"{auth_type}\"\n\
         tls_certificate = {cert}\n\
         tls_private_key = {key}\n\
         log_level = \"warn\"\n\
         \n\
         [[databases]]\n\
         name = {db}\n\
         host = \"127.0.0.1\"\n\
         port = {backend_port}\n",
        size = pool.size,
        mode = pool.mode,
        cert = quoted(&cert.to_string_lossy()),
        key = quoted(&key.to_string_lossy()),
        db = quoted(&backend.dbname),
        backend_port = backend.port,
    )
}

/// PgDog's users file: the one user, whose password it checks clients against and logs in to
/// Postgres with.
fn pgdog_users(pool: PeerPool, backend: &Endpoint) -> String {
    format!(
        "[[users]]\n\
         name = {user}\n\
         database = {db}\n\
         password = {password}\n\
         pool_size = {size}\n",
        user = quoted(&backend.user),
        db = quoted(&backend.dbname),
        password = quoted(&backend.password),
        size = pool.size,
    )
}

/// A bare floor from this crate's examples (`relay_floor`, `login_floor`): its binary in the
/// release target folder, or why there is none.
pub fn floor_binary(example: &str) -> Result<PathBuf, String> {
    let dir = crate::workspace::target_dir().map_err(|e| format!("{e:#}"))?;
    let path = dir.join("release").join("examples").join(example);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found (build it with `cargo build --release -p pgwake-bench --example \
             {example}`)",
            path.display()
        ))
    }
}

/// Builds the floors' examples in release mode (before anything is measured).
pub fn build_floors() -> Result<()> {
    crate::progress(format_args!(
        "building the floors (cargo build --release -p pgwake-bench --example relay_floor \
         --example login_floor) ..."
    ));
    let status = crate::workspace::cargo()
        .args([
            "build",
            "--release",
            "-p",
            "pgwake-bench",
            "--example",
            "relay_floor",
            "--example",
            "login_floor",
        ])
        .status()
        .context("run cargo build")?;
    if !status.success() {
        bail!("building the floor examples failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            port: 5999,
            user: "postgres".into(),
            password: "pw\"1".into(),
            dbname: "postgres".into(),
        }
    }

    #[test]
    fn paths_under_the_home_folder_are_shown_from_it() {
        assert_eq!(
            shown(Path::new("/nonexistent-top/pgdog")),
            "/nonexistent-top/pgdog"
        );
        let home = std::env::var_os("HOME").map(PathBuf::from);
        if let Some(home) = home.filter(|h| h.parent().is_some()) {
            let path = home.join(".cache/pgwake/peers/bin/pgdog");
            assert_eq!(shown(&path), "~/.cache/pgwake/peers/bin/pgdog");
        }
    }

    #[test]
    fn pgcat_config_names_the_pool_user_and_server() {
        let text = pgcat_config(
            7000,
            PeerPool {
                mode: "transaction",
                size: 20,
                prepared: true,
            },
            Auth::Scram,
            &endpoint(),
            Path::new("/x/cert.pem"),
            Path::new("/x/key.pem"),
        );
        assert!(text.contains("port = 7000\n"), "{text}");
        assert!(text.contains("pool_mode = \"transaction\""), "{text}");
        assert!(
            text.contains("prepared_statements_cache_size = 1000"),
            "{text}"
        );
        assert!(text.contains("password = \"pw\\\"1\""), "{text}");
        assert!(text.contains("auth_type = \"md5\""), "{text}");
        assert!(
            text.contains("servers = [[\"127.0.0.1\", 5999, \"primary\"]]"),
            "{text}"
        );
    }

    #[test]
    fn pgdog_config_and_users_agree_on_the_database() {
        let pool = PeerPool::SESSION;
        let main = pgdog_config(
            7001,
            pool,
            Auth::Trust,
            &endpoint(),
            Path::new("/c"),
            Path::new("/k"),
        );
        let users = pgdog_users(pool, &endpoint());
        assert!(main.contains("pooler_mode = \"session\""), "{main}");
        assert!(main.contains("auth_type = \"trust\""), "{main}");
        assert!(main.contains("name = \"postgres\"\n"), "{main}");
        assert!(users.contains("database = \"postgres\"\n"), "{users}");
        assert!(users.contains("pool_size = 40\n"), "{users}");
    }
}
