//! The `pgwake` command: serve the gateway or check a configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use pgwake::config::Config;
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
    /// Validate a configuration (including certificates) without serving.
    CheckConfig {
        /// TOML configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Config::load(path).with_context(|| format!("invalid configuration in {}", path.display()))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGWAKE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;

    match cli.command {
        Command::CheckConfig { config } => {
            let cfg = load(&config)?;
            pgwake::server::build(&cfg, CancellationToken::new())
                .context("invalid TLS material")?;
            println!(
                "configuration OK: {} tenant(s), postgres on {}, admin on {}",
                cfg.tenants.len(),
                cfg.listen.postgres,
                cfg.listen
                    .admin
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "(none)".into())
            );
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
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("start the async runtime")?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                let mut term =
                    signal(SignalKind::terminate()).context("install SIGTERM handler")?;
                let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
                let trigger = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = term.recv() => info!("SIGTERM received"),
                        _ = int.recv() => info!("SIGINT received"),
                    }
                    trigger.cancel();
                });
                pgwake::server::run(cfg, shutdown).await
            })
        }
    }
}
