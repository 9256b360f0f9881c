//! What pgbench is pointed at — Postgres itself, PgBouncer, the peers pgcat and PgDog, the bare
//! tokio relay (a floor) and pgwake — set up on loopback with configs written into one temporary
//! directory, and torn down by PID on drop.

use std::fmt;
use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use pgwake_testkit::{
    PgOptions, TestCert, TestPostgres, free_port, hand_over, pg_bin_dir, pg_command,
};

use crate::peers::{Peer, PeerPool};
use crate::pgbench::{Auth, Endpoint, Pgbench, write_scripts};
use crate::process::{Guarded, command_output};
use crate::workspace::{cargo, target_dir};

/// What pgbench talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetKind {
    /// Postgres directly: the baseline.
    Direct,
    /// PgBouncer in session pool mode: the proxy to beat.
    PgBouncer,
    /// pgcat (a multi-threaded Rust pooler) in session mode.
    Pgcat,
    /// PgDog (a multi-threaded Rust pooler) in session mode.
    PgDog,
    /// The bare tokio relay of `examples/relay_floor.rs`: copies bytes and nothing else, the
    /// floor of a relay's CPU per transaction.
    BareRelay,
    /// The gateway under test.
    Pgwake,
    /// The bare TLS + SCRAM acceptor of `examples/login_floor.rs` (churn only, not a relay
    /// target): the floor of a login's CPU.
    LoginFloor,
}

impl TargetKind {
    /// All targets of the relay table, in table order.
    pub const ALL: [TargetKind; 6] = [
        TargetKind::Direct,
        TargetKind::PgBouncer,
        TargetKind::Pgcat,
        TargetKind::PgDog,
        TargetKind::BareRelay,
        TargetKind::Pgwake,
    ];

    /// The target a peer is measured as.
    pub fn of_peer(peer: Peer) -> TargetKind {
        match peer {
            Peer::Pgcat => TargetKind::Pgcat,
            Peer::PgDog => TargetKind::PgDog,
        }
    }
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetKind::Direct => "direct",
            TargetKind::PgBouncer => "PgBouncer",
            TargetKind::Pgcat => "pgcat",
            TargetKind::PgDog => "PgDog",
            TargetKind::BareRelay => "bare tokio relay",
            TargetKind::Pgwake => "pgwake",
            TargetKind::LoginFloor => "bare TLS + SCRAM acceptor",
        })
    }
}

/// A running target: where to connect, and the proxy process whose CPU and memory are sampled
/// (none for direct Postgres, whose work is spread over one forked backend per connection).
#[derive(Clone, Debug)]
pub struct Target {
    /// Which one.
    pub kind: TargetKind,
    /// Where pgbench connects.
    pub endpoint: Endpoint,
    /// PID of the proxy process.
    pub proxy_pid: Option<u32>,
}

/// How to find pgwake.
#[derive(Clone, Debug)]
pub struct PgwakeSource {
    /// Use this binary instead of the workspace's release build.
    pub binary: Option<PathBuf>,
    /// Run `cargo build --release -p pgwake` first.
    pub build: bool,
}

/// Everything the harness started. Field order is drop order: the proxies stop before the
/// Postgres they talk to, and the config directory goes last.
pub struct Environment {
    pgwake: Option<Guarded>,
    /// Further pgwake instances with their own config (see [`Environment::start_pgwake_variant`]).
    variants: Vec<Guarded>,
    pgbouncer: Option<Guarded>,
    /// The peers and the bare relay, by target.
    others: Vec<(TargetKind, Guarded)>,
    postgres: TestPostgres,
    dir: tempfile::TempDir,
    /// Targets that started and may be measured, in table order.
    pub targets: Vec<Target>,
    /// Why a target is missing, for the report.
    pub skipped: Vec<(TargetKind, String)>,
    /// The pgbench of the server's PostgreSQL installation.
    pub pgbench: Pgbench,
    /// `postgres --version`.
    pub postgres_version: String,
    /// `pgbouncer --version` (first line), when installed.
    pub pgbouncer_version: Option<String>,
    /// What each peer binary found is (see [`Peer::version`]).
    pub peer_versions: Vec<(Peer, String)>,
    /// The certificate and key files the proxies serve.
    tls_files: (PathBuf, PathBuf),
}

/// How a PgBouncer pools server connections.
#[derive(Clone, Copy, Debug)]
pub struct BouncerPool {
    /// `pool_mode`: `session` or `transaction`.
    pub mode: &'static str,
    /// `default_pool_size`: server connections per database and user.
    pub size: u32,
    /// `max_client_conn`.
    pub max_clients: u32,
    /// `max_prepared_statements` (PgBouncer 1.21 and later), when set.
    pub max_prepared_statements: Option<u32>,
}

impl BouncerPool {
    /// The pool of the environment's own PgBouncer: session mode, room for pgbench's clients.
    const DEFAULT: BouncerPool = BouncerPool {
        mode: "session",
        size: 40,
        max_clients: 200,
        max_prepared_statements: None,
    };
}

/// A pgwake instance started beside the environment's own.
#[derive(Clone, Debug)]
pub struct Variant {
    /// Where pgbench connects, and the process to sample.
    pub target: Target,
    /// Its admin port (metrics).
    pub admin: u16,
}

impl Environment {
    /// Starts Postgres with TLS and initializes pgbench data at `scale`, then PgBouncer and pgwake
    /// (`pgwake`: its binary, or why there is none) in front of it. A proxy that cannot start is
    /// recorded in `skipped`; Postgres failing is an error.
    pub fn start(scale: u32, auth: Auth, pgwake: Result<&Path, &str>) -> Result<Environment> {
        let bin = pg_bin_dir().context("find the PostgreSQL binaries")?;
        let postgres_version = command_output(bin.join("postgres"), &["--version"])
            .unwrap_or_else(|| "unknown".into());

        // One certificate for all three, so TLS costs compare like for like (ECDSA P-256).
        let cert = TestCert::new(&["localhost", "127.0.0.1"]);
        let dir = tempfile::Builder::new()
            .prefix("pgwake-bench-")
            .tempdir()
            .context("create the harness directory")?;
        // PgBouncer runs as the postgres account when we are root and must read its files here.
        hand_over(dir.path()).context("hand the harness directory to the postgres account")?;
        write_scripts(dir.path())?;
        let pgbench = Pgbench {
            program: bin.join("pgbench"),
            workdir: dir.path().to_path_buf(),
        };
        let (cert_path, key_path) = cert.write_to(dir.path())?;
        give_to_postgres(&cert_path)?;
        give_to_postgres(&key_path)?;

        crate::progress(format_args!("starting PostgreSQL ({postgres_version}) ..."));
        let postgres = TestPostgres::start(PgOptions {
            tls: Some(cert),
            // Large enough to hold the pgbench data at the default scale, so runs read from
            // shared buffers rather than racing the page cache.
            extra_conf: vec!["shared_buffers = 256MB".into()],
            trust: auth == Auth::Trust,
            ..PgOptions::default()
        })
        .context("start PostgreSQL")?;
        let direct = Endpoint {
            port: postgres.port,
            user: postgres.options.user.clone(),
            password: postgres.options.password.clone(),
            dbname: "postgres".into(),
        };
        crate::progress(format_args!(
            "initializing pgbench data (pgbench -i -s {scale}) ..."
        ));
        pgbench.initialize(&direct, scale)?;

        let mut env = Environment {
            pgwake: None,
            variants: Vec::new(),
            tls_files: (cert_path.clone(), key_path.clone()),
            pgbouncer: None,
            others: Vec::new(),
            postgres,
            dir,
            targets: vec![Target {
                kind: TargetKind::Direct,
                endpoint: direct.clone(),
                proxy_pid: None,
            }],
            skipped: Vec::new(),
            pgbench,
            postgres_version,
            pgbouncer_version: None,
            peer_versions: Vec::new(),
        };

        match find_pgbouncer() {
            None => env.skipped.push((
                TargetKind::PgBouncer,
                "PgBouncer is not installed: apt-get install -y pgbouncer".into(),
            )),
            Some(program) => {
                env.pgbouncer_version = command_output(&program, &["--version"])
                    .and_then(|v| v.lines().next().map(str::to_owned));
                crate::progress(format_args!("starting PgBouncer ..."));
                match start_pgbouncer(
                    &program,
                    env.dir.path(),
                    "pgbouncer",
                    BouncerPool::DEFAULT,
                    auth,
                    &direct,
                    &cert_path,
                    &key_path,
                ) {
                    Ok((guard, port)) => {
                        env.targets.push(Target {
                            kind: TargetKind::PgBouncer,
                            endpoint: Endpoint {
                                port,
                                ..direct.clone()
                            },
                            proxy_pid: Some(guard.pid()),
                        });
                        env.pgbouncer = Some(guard);
                    }
                    Err(e) => env.skipped.push((
                        TargetKind::PgBouncer,
                        format!("PgBouncer did not start: {e:#}"),
                    )),
                }
            }
        }

        // With SCRAM, pgwake authenticates clients itself against the backend's own verifier
        // (a static credentials file), then logs in with the recovered ClientKey: the
        // gateway-auth path, not a relay.
        let credentials = match auth {
            Auth::Trust => Ok(None),
            Auth::Scram => env
                .postgres
                .psql(&format!(
                    "select rolpassword from pg_authid where rolname = '{}'",
                    direct.user
                ))
                .context("read the backend's SCRAM verifier")
                .and_then(|verifier| {
                    let path = env.dir.path().join("pgwake-users.txt");
                    fs::write(&path, format!("\"{}\" \"{verifier}\"\n", direct.user))?;
                    Ok(Some(path))
                }),
        };
        let started = pgwake
            .map_err(|e| anyhow!("{e}"))
            .and_then(|binary| Ok((binary, credentials?)))
            .and_then(|(binary, credentials)| {
                start_pgwake(
                    binary,
                    env.dir.path(),
                    &direct,
                    &cert_path,
                    &key_path,
                    credentials.as_deref(),
                )
            });
        match started {
            Ok((guard, port)) => {
                env.targets.push(Target {
                    kind: TargetKind::Pgwake,
                    endpoint: Endpoint { port, ..direct },
                    proxy_pid: Some(guard.pid()),
                });
                env.pgwake = Some(guard);
            }
            Err(e) => env.skipped.push((TargetKind::Pgwake, format!("{e:#}"))),
        }
        Ok(env)
    }

    /// Starts one more pgwake in front of the same Postgres, named `name` (its config and log
    /// files), with `extra` TOML appended to the config the environment's own pgwake gets
    /// (gateway SCRAM authentication when the environment uses `scram`).
    pub fn start_pgwake_variant(
        &mut self,
        binary: &Path,
        name: &str,
        extra: &str,
    ) -> Result<Variant> {
        let direct = self.direct()?;
        let credentials = self.dir.path().join("pgwake-users.txt");
        let (guard, port, admin) = start_pgwake_named(
            binary,
            self.dir.path(),
            name,
            &direct,
            &self.tls_files.0,
            &self.tls_files.1,
            credentials.exists().then_some(credentials.as_path()),
            extra,
        )?;
        let variant = Variant {
            target: Target {
                kind: TargetKind::Pgwake,
                endpoint: Endpoint { port, ..direct },
                proxy_pid: Some(guard.pid()),
            },
            admin,
        };
        self.variants.push(guard);
        Ok(variant)
    }

    /// Starts one more PgBouncer in front of the same Postgres, named `name` (its config and log
    /// files), pooling as `pool`, with the environment's auth.
    pub fn start_pgbouncer_variant(
        &mut self,
        name: &str,
        pool: BouncerPool,
        auth: Auth,
    ) -> Result<Target> {
        let program = find_pgbouncer()
            .ok_or_else(|| anyhow!("PgBouncer is not installed: apt-get install -y pgbouncer"))?;
        let direct = self.direct()?;
        let (guard, port) = start_pgbouncer(
            &program,
            self.dir.path(),
            name,
            pool,
            auth,
            &direct,
            &self.tls_files.0,
            &self.tls_files.1,
        )?;
        let target = Target {
            kind: TargetKind::PgBouncer,
            endpoint: Endpoint { port, ..direct },
            proxy_pid: Some(guard.pid()),
        };
        self.variants.push(guard);
        Ok(target)
    }

    /// Starts pgcat and PgDog in session mode in front of the same Postgres, with the
    /// environment's auth, as measured targets. A peer whose binary is missing or that does not
    /// start is recorded in `skipped` with the reason.
    pub fn start_peers(&mut self, auth: Auth) -> Result<()> {
        let direct = self.direct()?;
        for peer in Peer::ALL {
            let kind = TargetKind::of_peer(peer);
            let binary = match peer.binary() {
                Ok(b) => b,
                Err(why) => {
                    self.skipped.push((kind, why));
                    continue;
                }
            };
            self.peer_versions.push((peer, peer.version(&binary)));
            match peer.start(
                &binary,
                self.dir.path(),
                &peer.to_string().to_lowercase(),
                PeerPool::SESSION,
                auth,
                &direct,
                &self.tls_files.0,
                &self.tls_files.1,
            ) {
                Ok((guard, port)) => {
                    self.targets.push(Target {
                        kind,
                        endpoint: Endpoint {
                            port,
                            ..direct.clone()
                        },
                        proxy_pid: Some(guard.pid()),
                    });
                    self.others.push((kind, guard));
                }
                Err(e) => self
                    .skipped
                    .push((kind, format!("{peer} did not start: {e:#}"))),
            }
        }
        self.sort_targets();
        Ok(())
    }

    /// Starts the bare tokio relay of `examples/relay_floor.rs` in front of the same Postgres,
    /// as a measured target (the floor of relaying). TLS passes through it to Postgres.
    pub fn start_bare_relay(&mut self) -> Result<()> {
        let direct = self.direct()?;
        let binary = match crate::peers::floor_binary("relay_floor") {
            Ok(b) => b,
            Err(why) => {
                self.skipped.push((TargetKind::BareRelay, why));
                return Ok(());
            }
        };
        let port = free_port();
        let log = self.dir.path().join("relay-floor.log");
        crate::progress(format_args!("starting the bare tokio relay ..."));
        let log_file = fs::File::create(&log)?;
        let child = Command::new(&binary)
            .args(["tokio", &port.to_string(), &direct.port.to_string()])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        let mut guard = Guarded::new("relay_floor", child, log);
        match wait_until(&mut guard, Duration::from_secs(10), || {
            Ok(TcpStream::connect(("127.0.0.1", port)).is_ok())
        }) {
            Ok(()) => {
                self.targets.push(Target {
                    kind: TargetKind::BareRelay,
                    endpoint: Endpoint { port, ..direct },
                    proxy_pid: Some(guard.pid()),
                });
                self.others.push((TargetKind::BareRelay, guard));
            }
            Err(e) => self.skipped.push((
                TargetKind::BareRelay,
                format!("the bare relay did not start: {e:#}"),
            )),
        }
        self.sort_targets();
        Ok(())
    }

    /// Starts one more instance of `peer` in front of the same Postgres, named `name` (its
    /// config and log files), pooling as `pool`.
    pub fn start_peer_variant(
        &mut self,
        peer: Peer,
        name: &str,
        pool: PeerPool,
        auth: Auth,
    ) -> Result<Target> {
        let binary = peer.binary().map_err(|e| anyhow!("{e}"))?;
        if !self.peer_versions.iter().any(|(p, _)| *p == peer) {
            self.peer_versions.push((peer, peer.version(&binary)));
        }
        let direct = self.direct()?;
        let (guard, port) = peer.start(
            &binary,
            self.dir.path(),
            name,
            pool,
            auth,
            &direct,
            &self.tls_files.0,
            &self.tls_files.1,
        )?;
        let target = Target {
            kind: TargetKind::of_peer(peer),
            endpoint: Endpoint { port, ..direct },
            proxy_pid: Some(guard.pid()),
        };
        self.variants.push(guard);
        Ok(target)
    }

    /// The TLS certificate and key files every proxy serves.
    pub fn tls_files(&self) -> (&Path, &Path) {
        (&self.tls_files.0, &self.tls_files.1)
    }

    /// The harness's temporary directory (configs and logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Keeps the measured targets in table order.
    fn sort_targets(&mut self) {
        self.targets.sort_by_key(|t| t.kind);
    }

    /// Stops a variant started by [`Environment::start_pgwake_variant`] or
    /// [`Environment::start_pgbouncer_variant`], so its server connections close before the
    /// next one is measured.
    pub fn stop_variant(&mut self, pid: u32) {
        self.variants.retain(|g| g.pid() != pid);
    }

    /// Postgres itself, as clients reach it.
    pub fn direct(&self) -> Result<Endpoint> {
        self.targets
            .iter()
            .find(|t| t.kind == TargetKind::Direct)
            .map(|t| t.endpoint.clone())
            .ok_or_else(|| anyhow!("no direct target"))
    }

    /// The measured servers' processes (Postgres's postmaster and the proxies), named for the
    /// report's scheduling check.
    pub fn server_pids(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = self
            .postgres
            .pid()
            .map(|p| ("direct Postgres".to_owned(), p))
            .into_iter()
            .collect();
        out.extend(
            self.targets
                .iter()
                .filter_map(|t| Some((t.kind.to_string(), t.proxy_pid?))),
        );
        out
    }

    /// Takes a target out of the measured set, e.g. when its warm-up run fails.
    pub fn drop_target(&mut self, kind: TargetKind, reason: String) {
        self.targets.retain(|t| t.kind != kind);
        self.skipped.push((kind, reason));
    }

    /// The last lines of a proxy's log, to explain a failure.
    pub fn proxy_log_tail(&self, kind: TargetKind) -> String {
        let guard = match kind {
            TargetKind::Direct => return tail_lines(&self.postgres.log(), 5),
            TargetKind::PgBouncer => self.pgbouncer.as_ref(),
            TargetKind::Pgwake => self.pgwake.as_ref(),
            other => self
                .others
                .iter()
                .find(|(k, _)| *k == other)
                .map(|(_, g)| g),
        };
        guard.map(|g| g.log_tail(5)).unwrap_or_default()
    }
}

fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Makes a file readable by the postgres account when we are root (it runs PgBouncer).
fn give_to_postgres(path: &Path) -> Result<()> {
    if let Some((uid, gid)) = pgwake_testkit::postgres_account() {
        chown(path, Some(uid), Some(gid)).with_context(|| format!("chown {}", path.display()))?;
    }
    Ok(())
}

/// `PGWAKE_BENCH_PGBOUNCER`, else the Debian package's path, else `pgbouncer` on PATH.
fn find_pgbouncer() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGWAKE_BENCH_PGBOUNCER") {
        return Some(PathBuf::from(p));
    }
    let debian = PathBuf::from("/usr/sbin/pgbouncer");
    if debian.exists() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("pgbouncer"))
            .find(|p| p.exists())
    })
}

/// Writes PgBouncer's config (`name`.ini) and auth file and starts it in the foreground (as the
/// postgres account when we are root, since PgBouncer refuses to run as root). Returns it and its
/// port.
#[allow(clippy::too_many_arguments)]
fn start_pgbouncer(
    program: &Path,
    dir: &Path,
    name: &str,
    pool: BouncerPool,
    auth: Auth,
    backend: &Endpoint,
    cert: &Path,
    key: &Path,
) -> Result<(Guarded, u16)> {
    let port = free_port();
    let auth_file = dir.join("userlist.txt");
    // Plain password in the auth file: PgBouncer checks the client's SCRAM against it and can
    // log in to the server with SCRAM using it. With `trust` the user must still be listed.
    fs::write(
        &auth_file,
        format!("\"{}\" \"{}\"\n", backend.user, backend.password),
    )?;
    give_to_postgres(&auth_file)?;
    let ini = dir.join(format!("{name}.ini"));
    let log = dir.join(format!("{name}.log"));
    fs::write(
        &ini,
        format!(
            "[databases]\n\
             * = host=127.0.0.1 port={backend_port}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = {auth}\n\
             auth_file = {auth_file}\n\
             pool_mode = {mode}\n\
             max_client_conn = {max_clients}\n\
             default_pool_size = {size}\n\
             client_tls_sslmode = allow\n\
             client_tls_cert_file = {cert}\n\
             client_tls_key_file = {key}\n\
             logfile = {log}\n\
             ; Per-connection log lines would put disk writes in the churn scenarios' path.\n\
             log_connections = 0\n\
             log_disconnections = 0\n\
             {prepared}",
            backend_port = backend.port,
            mode = pool.mode,
            max_clients = pool.max_clients,
            size = pool.size,
            prepared = pool
                .max_prepared_statements
                .map(|n| format!("max_prepared_statements = {n}\n"))
                .unwrap_or_default(),
            auth_file = auth_file.display(),
            cert = cert.display(),
            key = key.display(),
            log = log.display(),
        ),
    )?;
    give_to_postgres(&ini)?;
    let child = pg_command(program)
        .arg(&ini)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawn {}", program.display()))?;
    let mut guard = Guarded::new("pgbouncer", child, log);
    wait_until(&mut guard, Duration::from_secs(10), || {
        Ok(TcpStream::connect(("127.0.0.1", port)).is_ok())
    })?;
    Ok((guard, port))
}

/// The pgwake binary to run: the given one, or the workspace's release build (built first unless
/// told not to).
pub fn locate_pgwake(source: &PgwakeSource) -> Result<PathBuf> {
    let binary = match &source.binary {
        Some(b) => b.clone(),
        None => {
            if source.build {
                build_pgwake()?;
            }
            target_dir()?.join("release").join("pgwake")
        }
    };
    if !binary.exists() {
        bail!(
            "pgwake binary {} not found (build it with cargo build --release -p pgwake)",
            binary.display()
        );
    }
    Ok(binary)
}

/// Writes pgwake's config and starts `pgwake serve`. Returns it and its Postgres port once the
/// port accepts TCP and `/readyz` answers 200.
fn start_pgwake(
    binary: &Path,
    dir: &Path,
    backend: &Endpoint,
    cert: &Path,
    key: &Path,
    credentials: Option<&Path>,
) -> Result<(Guarded, u16)> {
    // Without credentials logins pass through to a backend that trusts everyone on loopback:
    // the case `reuse_passthrough` is for, as PgBouncer keeps its server connections too.
    let extra = match credentials {
        None => "reuse_passthrough = true\n",
        Some(_) => "",
    };
    let (guard, port, _) = start_pgwake_named(
        binary,
        dir,
        "pgwake",
        backend,
        cert,
        key,
        credentials,
        extra,
    )?;
    Ok((guard, port))
}

/// [`start_pgwake`] with config and log named `name`, `extra` TOML appended; also returns the
/// admin port.
#[allow(clippy::too_many_arguments)]
fn start_pgwake_named(
    binary: &Path,
    dir: &Path,
    name: &str,
    backend: &Endpoint,
    cert: &Path,
    key: &Path,
    credentials: Option<&Path>,
    extra: &str,
) -> Result<(Guarded, u16, u16)> {
    let port = free_port();
    let admin = free_port();
    let config = dir.join(format!("{name}.toml"));
    let credentials = credentials
        .map(|f| {
            format!(
                "credentials = {{ kind = \"static\", file = \"{}\" }}\n",
                f.display()
            )
        })
        .unwrap_or_default();
    fs::write(
        &config,
        format!(
            "[listen]\n\
             postgres = \"127.0.0.1:{port}\"\n\
             admin = \"127.0.0.1:{admin}\"\n\
             allow_plaintext = true\n\
             \n\
             [tls]\n\
             cert = \"{cert}\"\n\
             key = \"{key}\"\n\
             \n\
             [routing]\n\
             rules = [\"sni\", \"options\", \"database\", \"user\"]\n\
             default_tenant = \"bench\"\n\
             \n\
             [[tenant]]\n\
             id = \"bench\"\n\
             backend = {{ kind = \"fixed\", address = \"127.0.0.1:{backend_port}\" }}\n\
             {credentials}\
             {extra}",
            cert = cert.display(),
            key = key.display(),
            backend_port = backend.port,
        ),
    )?;
    let guard = serve_pgwake(
        binary,
        &config,
        &dir.join(format!("{name}.log")),
        port,
        admin,
    )?;
    Ok((guard, port, admin))
}

/// Starts `pgwake serve --config CONFIG` with its output in `log`, and returns it once its
/// Postgres port accepts TCP and `/readyz` on the admin port answers 200.
pub fn serve_pgwake(
    binary: &Path,
    config: &Path,
    log: &Path,
    port: u16,
    admin: u16,
) -> Result<Guarded> {
    let mut cmd = Command::new(binary);
    cmd.args(["serve", "--config"]).arg(config);
    // PGWAKE_<SECTION>__<KEY> variables override config keys; a developer's shell must not
    // change the run. PGWAKE_LOG only sets log verbosity and is kept.
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("PGWAKE_") && key_text != "PGWAKE_LOG" {
            cmd.env_remove(key);
        }
    }
    // Per-connection log lines would be in the measured paths; PgBouncer's are off too.
    if std::env::var_os("PGWAKE_LOG").is_none() {
        cmd.env("PGWAKE_LOG", "warn");
    }
    crate::progress(format_args!("starting pgwake ({}) ...", binary.display()));
    let log_file = fs::File::create(log)?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("spawn {}", binary.display()))?;
    let mut guard = Guarded::new("pgwake", child, log.to_path_buf());
    wait_until(&mut guard, Duration::from_secs(20), || {
        Ok(TcpStream::connect(("127.0.0.1", port)).is_ok()
            && crate::http::status(admin, "/readyz") == Some(200))
    })
    .context("pgwake did not start")?;
    Ok(guard)
}

/// Polls `ready` until it holds, failing early if the child exits.
fn wait_until(
    guard: &mut Guarded,
    limit: Duration,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = guard.exited() {
            bail!("exited with {status} before serving: {}", guard.log_tail(5));
        }
        if ready()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("not ready within {limit:?}: {}", guard.log_tail(5));
        }
        sleep(Duration::from_millis(50));
    }
}

fn build_pgwake() -> Result<()> {
    crate::progress(format_args!(
        "building pgwake (cargo build --release -p pgwake) ..."
    ));
    let status = cargo()
        .args(["build", "--release", "-p", "pgwake"])
        .status()
        .context("run cargo build")?;
    if !status.success() {
        bail!("cargo build --release -p pgwake failed ({status})");
    }
    Ok(())
}
