//! Building the gateway from its configuration and running it until shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use pgwake_routing::backend::FixedBackend;
use pgwake_routing::{Endpoint, ResolverConfig, Tenant, TenantDirectory, TenantResolver};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use crate::admin::{self, AdminState};
use crate::cancel::CancelMap;
use crate::config::{Config, TenantBackend};
use crate::connect::BackendLink;
use crate::listener::{self, Gateway};
use crate::metrics::Metrics;
use crate::negotiate::NegotiateSettings;
use crate::tls;

/// How long terminated sessions get to deliver their last message before the process exits.
const TERMINATE_DRAIN: Duration = Duration::from_secs(5);

/// Builds the shared gateway state; fails on unusable certificates.
pub fn build(config: &Config, terminate: CancellationToken) -> Result<Gateway, tls::TlsError> {
    let acceptor = match &config.tls {
        Some(t) => Some(TlsAcceptor::from(tls::server_config(t)?)),
        None => None,
    };
    let mut backend_tls = HashMap::new();
    let tenants = config.tenants.iter().map(|t| {
        let backend = match &t.backend {
            TenantBackend::Fixed { address, tls } => {
                backend_tls.insert(t.id.clone(), tls.unwrap_or(config.backend.tls));
                // Addresses were checked when the config was validated.
                let endpoint = Endpoint::parse(address).unwrap_or(Endpoint {
                    host: address.clone(),
                    port: 5432,
                });
                Arc::new(FixedBackend::new(endpoint))
            }
        };
        Tenant {
            id: t.id.clone(),
            backend,
        }
    });
    let directory = TenantDirectory::new(tenants.collect::<Vec<_>>());
    Ok(Gateway {
        negotiate: NegotiateSettings {
            tls: acceptor,
            allow_plaintext: config.listen.allow_plaintext,
            max_startup_message: config.limits.max_startup_message.as_u64() as usize,
        },
        resolver: TenantResolver::new(ResolverConfig {
            rules: config.routing.rules.clone(),
            sni_suffix: config.routing.sni_suffix.clone(),
            default_tenant: config.routing.default_tenant.clone(),
        }),
        directory,
        backend_tls,
        link: BackendLink {
            tls_config: tls::backend_client_config(&config.backend)?,
            max_message: config.limits.max_message.as_u64() as usize,
            max_client_message: config.limits.max_startup_message.as_u64() as usize,
        },
        cancels: Arc::new(CancelMap::default()),
        metrics: Arc::new(Metrics::new()),
        limits: config.limits.clone(),
        terminate,
    })
}

/// Serves until `shutdown` fires, then drains: stop accepting, `/readyz` 503, sessions get
/// `shutdown_grace`, the rest are ended with FATAL 57P01.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let terminate = CancellationToken::new();
    let gateway = Arc::new(build(&config, terminate.clone())?);
    let listener = TcpListener::bind(config.listen.postgres)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "listen.postgres: cannot listen on {}: {e}",
                config.listen.postgres
            )
        })?;
    let admin_state = Arc::new(AdminState {
        metrics: gateway.metrics.clone(),
        ready: true.into(),
    });
    if let Some(addr) = config.listen.admin {
        let admin_listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listen.admin: cannot listen on {addr}: {e}"))?;
        tokio::spawn(admin::serve(admin_listener, admin_state.clone()));
    }
    info!(
        postgres = %config.listen.postgres,
        admin = ?config.listen.admin,
        tenants = gateway.directory.len(),
        tls = config.tls.is_some(),
        "pgwake serving"
    );
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let accept = tokio::spawn(listener::serve(
        listener,
        gateway.clone(),
        tasks.clone(),
        stop.clone(),
    ));

    shutdown.cancelled().await;
    admin_state.ready.store(false, Ordering::Relaxed);
    stop.cancel();
    let _ = accept.await;
    tasks.close();
    let active = gateway.metrics.connections_active.get();
    info!(active, grace = ?config.limits.shutdown_grace, "shutting down: waiting for sessions");
    if tokio::time::timeout(config.limits.shutdown_grace, tasks.wait())
        .await
        .is_err()
    {
        info!(
            remaining = gateway.metrics.connections_active.get(),
            "grace period over: terminating sessions"
        );
        terminate.cancel();
        let _ = tokio::time::timeout(TERMINATE_DRAIN, tasks.wait()).await;
    }
    info!("pgwake stopped");
    Ok(())
}
