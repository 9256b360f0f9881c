//! The application: building the gateway's stages from its configuration ([`build`]) and
//! running its listeners until shutdown ([`run`]).

mod backends;
pub mod quickstart;
mod run;
mod tenants;

use std::sync::{Arc, RwLock};

use pgwake_routing::backend::{LocalBackend, PoolBackend};
use pgwake_routing::{
    ComputeBackend, ResolverConfig, TenantDirectory, TenantResolver, WakeCoordinator,
};
use tokio_util::sync::CancellationToken;

pub use backends::local_settings;
pub use run::{StopRequest, run};

/// The file in `[local] data_dir` that keeps tenants' run histories across restarts, unless
/// `[wake] predict_history_file` names another.
pub const RUN_HISTORY_FILE: &str = "pgwake-runs.json";

use crate::auth::CredentialError;
use crate::auth::password::PasswordChecker;
use crate::auth::shared_throttle::{SharedSettings, SharedThrottle};
use crate::auth::throttle::{Throttle, ThrottleSettings};
use crate::cancel::CancelMap;
use crate::capacity::Capacity;
use crate::config::Config;
use crate::front::{Front, NegotiateSettings, ProxyProtocol};
use crate::metrics::Metrics;
use crate::peer::{PeerCancels, PeerEndpoints, PeerSettings, RateSettings};
use crate::pipeline::{Authenticator, Pipeline, Profiles, Router};
use crate::session::{RelaySettings, Revival, Sessions};
use crate::tls::{self, ServerCertificates};
use crate::upstream::{BackendLink, Connector, ConnectorSettings, PoolSettings};

/// Why the gateway could not be built from a valid configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Certificates or keys are unusable.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The local backend cannot run here (the message is the whole story: no source, so a
    /// chain of causes does not print it twice).
    #[error("local backend: {0}")]
    Local(pgwake_routing::BackendError),
    /// The Kubernetes client could not be configured.
    #[error("kubernetes: {0}")]
    Kubernetes(String),
    /// The revival keys are unusable.
    #[error("{0}")]
    Revival(String),
    /// A folder for the gateway's own files is unsafe or unusable.
    #[error("{0}")]
    State(String),
    /// A pool class's template is unusable.
    #[error("pool_class {class}: {problem}")]
    Pool {
        /// The class.
        class: String,
        /// What is wrong.
        problem: String,
    },
    /// Cancel forwarding between replicas cannot start.
    #[error("peer: {0}")]
    Peer(String),
    /// A credential source is unusable.
    #[error("tenant {tenant}: credentials: {problem}")]
    Credentials {
        /// The tenant.
        tenant: String,
        /// What is wrong.
        problem: CredentialError,
    },
}

impl From<pgwake_routing::BackendError> for BuildError {
    fn from(e: pgwake_routing::BackendError) -> Self {
        BuildError::Local(e)
    }
}

/// The gateway built from a configuration: the front its listeners share (holding the pipeline
/// and its stages) and the backends that need starting and stopping with it.
pub struct Gateway {
    /// Accepting and negotiating, then the pipeline.
    pub front: Arc<Front>,
    /// The gateway's certificates, for the HTTP listener and their reloading.
    pub certificates: Option<Arc<ServerCertificates>>,
    /// The local backend, when any tenant uses it (stopped with the gateway).
    pub local: Option<Arc<LocalBackend>>,
    /// The pool backend, when any pool class is configured (its replenisher runs with the
    /// gateway).
    pub pool: Option<Arc<PoolBackend>>,
}

impl Gateway {
    /// The pipeline and its stages.
    pub fn pipeline(&self) -> &Pipeline {
        &self.front.pipeline
    }
}

/// The map of the gateway's cancel keys and, when this replica advertises an address to its
/// peers, the forwarding of cancels for keys it does not hold.
fn cancel_keys(
    config: &Config,
    kube: &backends::KubeBackends,
    metrics: &Arc<Metrics>,
    terminate: &CancellationToken,
) -> Result<(Arc<CancelMap>, Option<Arc<PeerCancels>>), BuildError> {
    let advertise = config
        .listen
        .peer
        .and_then(|listen| config.peer.advertised(listen));
    let cancels = Arc::new(CancelMap::default());
    let peers = match advertise {
        Some(addr) => Some(Arc::new(peer_cancels(
            config, addr, kube, &cancels, metrics, terminate,
        )?)),
        None => None,
    };
    Ok((cancels, peers))
}

/// Builds the gateway; fails on unusable certificates, a local backend that cannot run here, or
/// an unreachable Kubernetes configuration. Sessions end when `terminate` fires, and as soon as
/// they are at rest once `end_idle` does.
pub async fn build(
    config: &Config,
    terminate: CancellationToken,
    end_idle: CancellationToken,
) -> Result<Gateway, BuildError> {
    let certificates = match &config.tls {
        Some(t) => Some(Arc::new(ServerCertificates::load(t)?)),
        None => None,
    };
    let local = backends::local_backend(config)?;
    let kube = backends::KubeBackends::build(config).await?;
    let WakeStage {
        directory,
        coordinator,
        metrics,
    } = wake_stage(config, local.as_ref(), &kube)?;
    let mut secrets = tenants::SecretStores::new(config.limits.login_timeout, terminate.clone());
    let profiles = tenants::tenant_profiles(config, &coordinator, &kube, &mut secrets)?;
    let profiles: Profiles = Arc::new(RwLock::new(profiles));
    tenants::start_discovery(
        config,
        &kube,
        &directory,
        &profiles,
        &mut secrets,
        &terminate,
    );
    let router = router(config, directory, profiles);
    let (cancels, peers) = cancel_keys(config, &kube, &metrics, &terminate)?;
    let connector = connector(config, &cancels, &metrics, &coordinator)?;
    let sessions = sessions(
        config,
        &connector,
        &coordinator,
        &cancels,
        &metrics,
        (&terminate, &end_idle),
    )?;
    let pipeline = Arc::new(Pipeline {
        router,
        auth: authenticator(config, &metrics, &kube, &terminate),
        coordinator,
        wake_notice: config.wake.wake_notice,
        connector,
        sessions,
        cancels,
        peers,
        metrics: metrics.clone(),
        draining: CancellationToken::new(),
    });
    Ok(Gateway {
        front: Arc::new(front(
            config,
            certificates.clone(),
            pipeline,
            metrics,
            terminate,
        )),
        certificates,
        local,
        pool: kube.pool,
    })
}

/// The tenants' directory with their backends, the metrics (naming the backend kinds in use)
/// and the wake coordinator over the directory.
struct WakeStage {
    directory: Arc<TenantDirectory>,
    coordinator: Arc<WakeCoordinator>,
    metrics: Arc<Metrics>,
}

fn wake_stage(
    config: &Config,
    local: Option<&Arc<LocalBackend>>,
    kube: &backends::KubeBackends,
) -> Result<WakeStage, BuildError> {
    let tenants = backends::tenant_list(config, local, kube);
    // The backend kinds in use: the configured tenants', and cnpg's when discovery may add
    // tenants on it later.
    let backend_kinds: Vec<&'static str> = tenants
        .iter()
        .map(|t| t.backend.kind())
        .chain(kube.cnpg.as_ref().map(|c| c.kind()))
        .collect();
    let directory = Arc::new(TenantDirectory::new(tenants));
    let metrics = Arc::new(Metrics::new());
    for kind in backend_kinds {
        metrics.backend_in_use(kind);
    }
    let coordinator =
        backends::wake_coordinator(&directory, config, local, kube.activity.clone(), &metrics)?;
    Ok(WakeStage {
        directory,
        coordinator,
        metrics,
    })
}

/// The first stage: the listener's negotiation, PROXY header and caps, handing connections to
/// the pipeline.
fn front(
    config: &Config,
    certificates: Option<Arc<ServerCertificates>>,
    pipeline: Arc<Pipeline>,
    metrics: Arc<Metrics>,
    terminate: CancellationToken,
) -> Front {
    Front {
        negotiate: NegotiateSettings {
            tls: certificates,
            allow_plaintext: config.listen.allow_plaintext,
            max_startup_message: config.limits.max_startup_message.as_u64() as usize,
        },
        proxy_protocol: ProxyProtocol {
            trusted: config.listen.proxy_protocol_from.clone(),
            max_header: config.listen.proxy_protocol_max_header.as_u64() as usize,
        },
        startup_timeout: config.limits.startup_timeout,
        capacity: Capacity::new(run::capacity_settings(config)),
        pipeline,
        metrics,
        terminate,
    }
}

/// The one way to backend connections, naming the sessions the coordinator hears are pinned
/// when they hold a capped tenant's places.
fn connector(
    config: &Config,
    cancels: &Arc<CancelMap>,
    metrics: &Arc<Metrics>,
    coordinator: &WakeCoordinator,
) -> Result<Arc<Connector>, BuildError> {
    Ok(Arc::new(Connector::new(
        connector_settings(config)?,
        cancels.clone(),
        metrics.clone(),
        coordinator.pinned_sessions(),
    )))
}

/// The tenant rules of `[routing]` over the tenants and their profiles.
fn router(config: &Config, directory: Arc<TenantDirectory>, profiles: Profiles) -> Router {
    Router {
        resolver: TenantResolver::new(ResolverConfig {
            rules: config.routing.rules.clone(),
            sni_suffix: config.routing.sni_suffix.clone(),
            default_tenant: config.routing.default_tenant.clone(),
        }),
        directory,
        profiles,
        unknown_tenant: config.routing.unknown_tenant,
    }
}

/// What sessions share: the connector, the wake coordinator, revival keys and relay sizes.
fn sessions(
    config: &Config,
    connector: &Arc<Connector>,
    coordinator: &Arc<WakeCoordinator>,
    cancels: &Arc<CancelMap>,
    metrics: &Arc<Metrics>,
    (terminate, end_idle): (&CancellationToken, &CancellationToken),
) -> Result<Sessions, BuildError> {
    let keys = config
        .revival
        .key_ring()
        .map_err(|e| BuildError::Revival(e.to_string()))?;
    Ok(Sessions {
        connector: connector.clone(),
        coordinator: coordinator.clone(),
        cancels: cancels.clone(),
        revival: Some(Arc::new(Revival {
            keys,
            config: config.revival.clone(),
        })),
        relay: RelaySettings {
            buffer: config.limits.relay_buffer.as_u64() as usize,
            max_message: config.limits.max_message.as_u64() as u32,
            idle_in_transaction: Some(config.limits.idle_in_transaction_timeout)
                .filter(|t| !t.is_zero()),
        },
        snapshot_timeout: config.limits.login_timeout,
        terminate: terminate.clone(),
        end_idle: end_idle.clone(),
        metrics: metrics.clone(),
    })
}

/// The password checker of `[auth]`, its throttle shared through `kube` when configured.
fn authenticator(
    config: &Config,
    metrics: &Arc<Metrics>,
    kube: &backends::KubeBackends,
    terminate: &CancellationToken,
) -> Authenticator {
    let a = &config.auth;
    let settings = ThrottleSettings {
        free_failures: a.throttle_free_failures,
        base: a.throttle_base,
        max: a.throttle_max,
        source_free_failures: a.throttle_source_free_failures,
        capacity: a.throttle_capacity,
    };
    let mut throttle = Throttle::new(settings.clone());
    if let (true, Some(client)) = (a.throttle_shared, &kube.client) {
        let namespace = a
            .throttle_namespace
            .clone()
            .or_else(|| kube.default_ns.clone())
            .unwrap_or_else(|| client.default_namespace().to_owned());
        throttle = throttle.with_shared(SharedThrottle::start(
            client.clone(),
            settings,
            SharedSettings {
                namespace,
                write_timeout: a.throttle_shared_timeout,
                identity: backends::lease_identity(),
            },
            terminate.clone(),
        ));
    }
    Authenticator {
        throttle,
        mock_key: match &a.mock_secret {
            Some(s) => s.as_bytes().to_vec(),
            None => rand::random::<[u8; 32]>().to_vec(),
        },
        passwords: PasswordChecker::new(),
        max_client_message: config.limits.max_startup_message.as_u64() as usize,
        timeout: config.limits.auth_timeout,
        metrics: metrics.clone(),
    }
}

/// Cancel forwarding among the replicas of `[peer] service`, this one advertised at `advertise`.
fn peer_cancels(
    config: &Config,
    advertise: std::net::SocketAddr,
    kube: &backends::KubeBackends,
    cancels: &Arc<CancelMap>,
    metrics: &Arc<Metrics>,
    terminate: &CancellationToken,
) -> Result<PeerCancels, BuildError> {
    let p = &config.peer;
    let problem = |s: String| BuildError::Peer(s);
    let (Some(client), Some(service), Some(token_file)) = (&kube.client, &p.service, &p.token_file)
    else {
        return Err(problem(
            "needs the Kubernetes API, peer.service and peer.token_file".into(),
        ));
    };
    let token = std::fs::read(token_file).map_err(|e| {
        problem(format!(
            "cannot read token_file {}: {e}",
            token_file.display()
        ))
    })?;
    let token = token.trim_ascii().to_vec();
    if token.is_empty() {
        return Err(problem(format!(
            "token_file {} is empty",
            token_file.display()
        )));
    }
    let namespace = p
        .namespace
        .clone()
        .or_else(|| kube.default_ns.clone())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let endpoints = PeerEndpoints::start(
        client.clone(),
        &namespace,
        service,
        &p.port_name,
        terminate.clone(),
    );
    let limit = |rate, burst| RateSettings {
        rate,
        burst,
        capacity: p.limiter_capacity,
    };
    let settings = PeerSettings {
        advertise,
        token,
        forward: limit(p.forward_rate, p.forward_burst),
        serve: limit(p.serve_rate, p.serve_burst),
        max_clock_skew: p.max_clock_skew,
        request_timeout: p.request_timeout,
        backend_connect_timeout: config.limits.connect_timeout,
    };
    Ok(PeerCancels::new(
        settings,
        endpoints,
        cancels.clone(),
        metrics.clone(),
    ))
}

/// How the connector reaches and logs in to backends, keeps connections for reuse and pools
/// them for `/sql`.
fn connector_settings(config: &Config) -> Result<ConnectorSettings, BuildError> {
    let (limits, http) = (&config.limits, &config.http);
    Ok(ConnectorSettings {
        link: BackendLink {
            tls_config: tls::backend_client_config(&config.backend)?,
            max_message: limits.max_message.as_u64() as usize,
            max_client_message: limits.max_startup_message.as_u64() as usize,
            idle_in_transaction: Some(limits.idle_in_transaction_timeout).filter(|t| !t.is_zero()),
        },
        connect_timeout: limits.connect_timeout,
        login_timeout: limits.login_timeout,
        not_ready_wait: config.wake.wake_timeout,
        max_backend_iterations: config.auth.max_backend_iterations,
        reuse: config.reuse.clone(),
        http_pool: PoolSettings {
            max_per_key: http.pool_max_per_key,
            max_total: http.pool_max_total,
            idle_timeout: http.pool_idle_timeout,
            acquire_timeout: http.pool_acquire_timeout,
        },
        caps: config
            .tenants
            .iter()
            .filter_map(|t| Some((t.id.clone(), t.max_backend_connections?)))
            .collect(),
        max_backend_waiters: limits.max_backend_waiters,
        backend_wait_timeout: limits.backend_wait_timeout,
    })
}
