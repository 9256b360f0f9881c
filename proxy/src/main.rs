//! The `pgwake` command: serve the gateway or check a configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use pgwake::app::StopRequest;
use pgwake::app::quickstart::{self, QuickstartOptions};
use pgwake::config::Config;
use pgwake_routing::TenantId;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// pgwake: a Postgres-protocol gateway that routes each connection to its tenant's database.
///
/// Clients connect with any Postgres driver; the gateway terminates TLS, finds the tenant from the
/// TLS server name, the options parameter, the database or the user name, and relays the session
/// to that tenant's backend. Every config key can be overridden by an environment variable
/// PGWAKE_<SECTION>__<KEY> (for example PGWAKE_LIMITS__STARTUP_TIMEOUT=5s).
/// Log verbosity comes from PGWAKE_LOG (for example PGWAKE_LOG=debug).
#[derive(Parser)]
#[command(name = "pgwake", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway in the foreground until SIGTERM or SIGINT.
    ///
    /// SIGTERM drains: sessions get limits.shutdown_grace to finish. SIGINT (Ctrl-C) ends idle
    /// sessions at once and lets open transactions finish within the grace. A second signal
    /// ends the remaining sessions now.
    Serve {
        /// TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Override listen.postgres.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Override listen.admin.
        #[arg(long)]
        admin: Option<SocketAddr>,
    },
    /// Set up a gateway with local Postgres tenants in a folder (reused on later runs), print how
    /// to connect, and serve in the foreground.
    ///
    /// On a later run the folder's pgwake.toml is used; the options given still apply: ports and
    /// --idle-timeout for this run, --tenants adds the tenants the folder lacks to pgwake.toml.
    Quickstart {
        /// Folder for config, certificate and data directories.
        #[arg(long, default_value = ".pgwake")]
        dir: PathBuf,
        /// Tenants to serve, comma-separated [default in a new folder: alpha]. Tenants the
        /// folder lacks are added to its pgwake.toml; those it has stay.
        #[arg(long, value_delimiter = ',')]
        tenants: Option<Vec<String>>,
        /// Postgres listener port [default in a new folder: 6432].
        #[arg(long)]
        port: Option<u16>,
        /// Admin listener port [default in a new folder: 9090].
        #[arg(long)]
        admin_port: Option<u16>,
        /// HTTPS listener port for POST /sql and WebSocket, for serverless drivers [default in a
        /// new folder: 8443].
        #[arg(long)]
        http_port: Option<u16>,
        /// Idle time before a tenant sleeps, e.g. 30s or 5m [default in a new folder: 60s].
        #[arg(long, value_parser = parse_duration)]
        idle_timeout: Option<std::time::Duration>,
        /// Remove the quickstart in --dir instead of serving it: its data directories (also
        /// those under /var/lib/pgwake) and the folder. Refused while it runs.
        #[arg(long, conflicts_with_all = ["tenants", "port", "admin_port", "http_port", "idle_timeout"])]
        remove: bool,
    },
    /// Print a line for a static credentials file: the user and a SCRAM-SHA-256 verifier of the
    /// password read from standard input (one line), so the file never holds the password.
    Passwd {
        /// The user name.
        user: String,
    },
    /// Validate a configuration (including certificates) without serving.
    CheckConfig {
        /// TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
}

/// A duration option, written as in the configuration ("30s", "5m").
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    pgwake::config::duration::parse(text).map_err(|e| e.to_string())
}

fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Config::load(path).with_context(|| format!("invalid configuration in {}", path.display()))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
}

/// Serves until SIGTERM or SIGINT; `banner` is printed once the listeners are up.
///
/// SIGTERM (an orchestrator) drains: sessions get `limits.shutdown_grace`. SIGINT (Ctrl-C, a
/// person waiting) ends idle sessions at once and lets open transactions finish within the
/// grace. Either signal a second time ends the remaining sessions now.
fn serve(cfg: Config, banner: Option<String>) -> anyhow::Result<()> {
    let runtime = runtime()?;
    runtime.block_on(async {
        let stop = StopRequest::default();
        let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
        let trigger = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM received"),
                _ = int.recv() => {
                    info!("SIGINT received");
                    trigger.end_idle.cancel();
                }
            }
            trigger.drain.cancel();
            tokio::select! {
                _ = term.recv() => info!("SIGTERM received again"),
                _ = int.recv() => info!("SIGINT received again"),
            }
            trigger.now.cancel();
        });
        pgwake::app::run(cfg, stop, banner).await
    })?;
    // The runtime's end waits for its blocking tasks and drops the connections' tasks (the
    // session threads are joined with the last of them): only then is the gateway gone.
    drop(runtime);
    info!("pgwake stopped");
    Ok(())
}

/// Logs to stderr at the PGWAKE_LOG level (default info).
fn init_logs() {
    use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
    use tracing_subscriber::prelude::*;
    let level = EnvFilter::try_from_env("PGWAKE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // The WebSocket library logs frame contents at debug and trace, a client's cleartext
    // password included: never below info, whatever PGWAKE_LOG asks for.
    let no_frames = filter_fn(|meta| {
        let websocket = meta.target().starts_with("tungstenite")
            || meta.target().starts_with("tokio_tungstenite");
        !websocket || *meta.level() <= tracing::Level::INFO
    });
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(level.and(no_frames));
    tracing_subscriber::registry().with(stderr).init();
}

/// A failure prints what went wrong with its causes, and what to do, and nothing more: the
/// errors that reach here are the user's (a config, a busy folder or port), so a stack trace
/// would only bury the message, even with RUST_BACKTRACE set (a panic still prints its trace).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgwake: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logs();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;

    match cli.command {
        Command::CheckConfig { config } => {
            let cfg = load(&config)?;
            runtime()?
                .block_on(pgwake::app::build(
                    &cfg,
                    CancellationToken::new(),
                    CancellationToken::new(),
                ))
                .context("the configuration cannot be served")?;
            let discovery = match cfg.kubernetes.discover {
                true => " plus labelled Clusters",
                false => "",
            };
            println!(
                "configuration OK: {} tenant(s){discovery}, postgres on {}, admin on {}",
                cfg.tenants.len(),
                cfg.listen.postgres,
                cfg.listen
                    .admin
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "(none)".into())
            );
            Ok(())
        }
        Command::Passwd { user } => {
            let mut password = String::new();
            std::io::stdin()
                .read_line(&mut password)
                .context("read the password from standard input")?;
            let password = password.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                anyhow::bail!("no password on standard input");
            }
            let credential = pgwake::auth::Credential::from_password(password);
            let quote = |s: &str| s.replace('"', "\"\"");
            println!("\"{}\" \"{}\"", quote(&user), credential.verifier);
            Ok(())
        }
        Command::Serve {
            config,
            listen,
            admin,
        } => {
            let mut cfg = load(&config)?;
            if let Some(l) = listen {
                cfg.listen.postgres = l;
            }
            if admin.is_some() {
                cfg.listen.admin = admin;
            }
            serve(cfg, None)
        }
        Command::Quickstart {
            dir,
            tenants,
            port,
            admin_port,
            http_port,
            idle_timeout,
            remove,
        } => {
            if remove {
                let removed = runtime()?.block_on(quickstart::remove(&dir))?;
                println!("{removed}");
                return Ok(());
            }
            let tenants = tenants
                .map(|t| t.iter().map(|t| TenantId::parse(t)).collect())
                .transpose()
                .context("--tenants")?;
            let opts = QuickstartOptions {
                dir: dir.clone(),
                tenants,
                port,
                admin_port,
                http_port,
                idle_timeout,
            };
            let cfg = runtime()?.block_on(quickstart::prepare(&opts))?;
            let banner = quickstart::banner(&cfg, &dir);
            serve(cfg, Some(banner))
        }
    }
}
