//! Building the gateway from its configuration and running it until shutdown.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pgwake_routing::backend::{
    CnpgBackend, CnpgCluster, CnpgSettings, FixedBackend, LocalBackend, LocalSettings, PoolBackend,
    PoolClass, Release, cluster_template,
};
use pgwake_routing::discovery::{
    ClusterDiscovery, DiscoveryEvent, DiscoverySettings, TENANT_LABEL,
};
use pgwake_routing::{
    ComputeBackend, Endpoint, ResolverConfig, Tenant, TenantDirectory, TenantId, TenantResolver,
    WakeCoordinator, WakeSettings,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::admin::{self, AdminState};
use crate::admit::AccessList;
use crate::auth::password::PasswordChecker;
use crate::auth::throttle::{Throttle, ThrottleSettings};
use crate::auth::{
    AuthQuerySettings, AuthQuerySource, CredentialError, CredentialSource, KubeSecretSource,
    LocalSource, SecretStore, StaticSource,
};
use crate::cancel::CancelMap;
use crate::capacity::{Capacity, CapacitySettings};
use crate::config::{
    AuthMode, BackendTls, Config, CredentialsConfig, KubernetesConfig, LocalConfig,
    PoolClassConfig, PoolRelease, TenantBackend, TenantConfig, WakeConfig,
};
use crate::connect::BackendLink;
use crate::http;
use crate::listener::{self, Gateway};
use crate::listener::{Policies, TenantPolicy};
use crate::metrics::Metrics;
use crate::negotiate::NegotiateSettings;
use crate::tls;

/// How long terminated sessions get to deliver their last message before the process exits.
const TERMINATE_DRAIN: Duration = Duration::from_secs(5);

/// Why the gateway could not be built from a valid configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Certificates or keys are unusable.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The local backend cannot run here.
    #[error("local backend: {0}")]
    Local(#[from] pgwake_routing::BackendError),
    /// The Kubernetes client could not be configured.
    #[error("kubernetes: {0}")]
    Kubernetes(String),
    /// The revival keys are unusable.
    #[error("{0}")]
    Revival(String),
    /// A pool class's template is unusable.
    #[error("pool_class {class}: {problem}")]
    Pool {
        /// The class.
        class: String,
        /// What is wrong.
        problem: String,
    },
    /// A credential source is unusable.
    #[error("tenant {tenant}: credentials: {source}")]
    Credentials {
        /// The tenant.
        tenant: String,
        /// What is wrong.
        source: CredentialError,
    },
}

/// The local backend's settings from `[local]`.
pub fn local_settings(local: &LocalConfig, start_timeout: Duration) -> LocalSettings {
    LocalSettings {
        data_dir: local.data_dir.clone(),
        bin_dir: local.bin_dir.clone(),
        run_as: local.run_as.clone(),
        superuser: local.superuser.clone(),
        password: local.password.clone(),
        settings: local
            .settings
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        stop_timeout: local.stop_timeout,
        probe_interval: local.probe_interval,
        start_timeout,
    }
}

/// A Kubernetes client from `[kubernetes]`.
async fn kube_client(k: &KubernetesConfig) -> Result<kube::Client, BuildError> {
    let kube_error = |e: &dyn std::fmt::Display| BuildError::Kubernetes(e.to_string());
    let options = kube::config::KubeConfigOptions {
        context: k.context.clone(),
        ..Default::default()
    };
    let config = match &k.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| kube_error(&e))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| kube_error(&e))?
        }
        None if k.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| kube_error(&e))?,
        None => kube::Config::infer().await.map_err(|e| kube_error(&e))?,
    };
    kube::Client::try_from(config).map_err(|e| kube_error(&e))
}

/// Reads a pool class's Cluster template (YAML or JSON).
fn pool_class(c: &PoolClassConfig, namespace: &str) -> Result<PoolClass, BuildError> {
    let problem = |problem: String| BuildError::Pool {
        class: c.name.clone(),
        problem,
    };
    let text = std::fs::read_to_string(&c.template).map_err(|e| {
        problem(format!(
            "cannot read template {}: {e}",
            c.template.display()
        ))
    })?;
    let manifest: serde_json::Value = serde_saphyr::from_str(&text)
        .map_err(|e| problem(format!("template {}: {e}", c.template.display())))?;
    Ok(PoolClass {
        name: c.name.clone(),
        namespace: c.namespace.clone().unwrap_or_else(|| namespace.to_owned()),
        min_warm: c.min_warm,
        release: match c.release {
            PoolRelease::Delete => Release::Delete,
            PoolRelease::Hibernate => Release::Hibernate,
        },
        template: cluster_template(manifest).map_err(|e| problem(e.to_string()))?,
        replenish_interval: c.replenish_interval,
        lease_duration: c.lease_duration,
    })
}

/// This process's name in Leases: host name (the pod's, in Kubernetes) and process id.
fn lease_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "pgwake".into());
    format!("{host}-{}", std::process::id())
}

/// Builds the shared gateway state; fails on unusable certificates, a local backend that cannot
/// run here, or an unreachable Kubernetes configuration.
pub async fn build(config: &Config, terminate: CancellationToken) -> Result<Gateway, BuildError> {
    let server_tls = match &config.tls {
        Some(t) => Some(Arc::new(tls::server_config(t)?)),
        None => None,
    };
    let acceptor = server_tls
        .as_ref()
        .map(|t| TlsAcceptor::from(t.config.clone()));
    let local = local_backend(config)?;
    let kube = KubeBackends::build(config).await?;
    let (tenants, backend_tls) = tenant_list(config, local.as_ref(), &kube);
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
    let coordinator = wake_coordinator(&directory, &config.wake, &metrics);
    let mut secrets = SecretStores::new(config.limits.login_timeout, terminate.clone());
    let policies = tenant_policies(config, &coordinator, &kube, &mut secrets)?;
    let policies: Policies = Arc::new(RwLock::new(policies));
    start_discovery(
        config,
        &kube,
        &directory,
        &policies,
        &mut secrets,
        &terminate,
    );
    let a = &config.auth;
    let mock_key = match &a.mock_secret {
        Some(s) => s.as_bytes().to_vec(),
        None => rand::random::<[u8; 32]>().to_vec(),
    };
    let w = &config.wake;
    Ok(Gateway {
        policies,
        throttle: Throttle::new(ThrottleSettings {
            free_failures: a.throttle_free_failures,
            base: a.throttle_base,
            max: a.throttle_max,
            capacity: a.throttle_capacity,
        }),
        mock_key,
        max_backend_iterations: a.max_backend_iterations,
        server_tls,
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
        unknown_tenant: config.routing.unknown_tenant,
        not_ready_wait: w.wake_timeout,
        directory,
        coordinator,
        local,
        pool: kube.pool,
        wake_notice: w.wake_notice,
        backend_tls,
        default_backend_tls: config.backend.tls,
        link: BackendLink {
            tls_config: tls::backend_client_config(&config.backend)?,
            max_message: config.limits.max_message.as_u64() as usize,
            max_client_message: config.limits.max_startup_message.as_u64() as usize,
        },
        cancels: Arc::new(CancelMap::default()),
        metrics,
        limits: config.limits.clone(),
        capacity: Capacity::new(capacity_settings(&config.limits)),
        terminate,
        passwords: PasswordChecker::new(),
        revival: Some(Arc::new(crate::session::Revival {
            keys: config
                .revival
                .key_ring()
                .map_err(|e| BuildError::Revival(e.to_string()))?,
            config: config.revival.clone(),
        })),
        reuse: crate::reuse::Reuse::new(&config.reuse),
    })
}

/// The local backend, when some tenant runs on it.
fn local_backend(config: &Config) -> Result<Option<Arc<LocalBackend>>, BuildError> {
    let used = config
        .tenants
        .iter()
        .any(|t| matches!(t.backend, TenantBackend::Local));
    match &config.local {
        Some(l) if used => Ok(Some(Arc::new(LocalBackend::new(local_settings(
            l,
            config.wake.wake_timeout,
        ))?))),
        _ => Ok(None),
    }
}

/// What the gateway reaches through the Kubernetes API, when anything in the config needs it.
struct KubeBackends {
    client: Option<kube::Client>,
    /// Namespace of objects whose tenant names none.
    default_ns: Option<String>,
    cnpg: Option<Arc<CnpgBackend>>,
    pool: Option<Arc<PoolBackend>>,
}

impl KubeBackends {
    async fn build(config: &Config) -> Result<KubeBackends, BuildError> {
        let k = &config.kubernetes;
        // Discovered tenants are cnpg tenants too.
        let has_cnpg = k.discover
            || config
                .tenants
                .iter()
                .any(|t| matches!(t.backend, TenantBackend::Cnpg { .. }));
        let needs_kube = has_cnpg
            || !config.pool_classes.is_empty()
            || config.tenants.iter().any(|t| {
                matches!(
                    t.credentials,
                    Some(CredentialsConfig::KubernetesSecret { .. })
                )
            });
        let client = match needs_kube {
            true => Some(kube_client(k).await?),
            false => None,
        };
        let cnpg_settings = CnpgSettings {
            start_timeout: config.wake.wake_timeout,
            probe_interval: Duration::from_millis(10),
            probe_user: k.probe_user.clone().unwrap_or_else(|| "postgres".into()),
        };
        let default_ns = client.as_ref().map(|c| {
            k.namespace
                .clone()
                .unwrap_or_else(|| c.default_namespace().to_owned())
        });
        let ns = default_ns.as_deref().unwrap_or("default");
        let cnpg = match &client {
            Some(client) if has_cnpg => Some(Arc::new(CnpgBackend::new(
                client.clone(),
                cnpg_clusters(config, ns),
                cnpg_settings.clone(),
            ))),
            _ => None,
        };
        let pool = match &client {
            Some(client) if !config.pool_classes.is_empty() => {
                let classes = config
                    .pool_classes
                    .iter()
                    .map(|c| pool_class(c, ns))
                    .collect::<Result<Vec<_>, _>>()?;
                let pool_tenants: HashMap<_, _> = config
                    .tenants
                    .iter()
                    .filter_map(|t| match &t.backend {
                        TenantBackend::Pool { class } => Some((t.id.clone(), class.clone())),
                        _ => None,
                    })
                    .collect();
                Some(Arc::new(PoolBackend::new(
                    client.clone(),
                    classes,
                    pool_tenants,
                    cnpg_settings,
                    lease_identity(),
                )))
            }
            _ => None,
        };
        Ok(KubeBackends {
            client,
            default_ns,
            cnpg,
            pool,
        })
    }
}

/// The configured cnpg tenants' clusters, in `default_ns` unless they name a namespace.
fn cnpg_clusters(config: &Config, default_ns: &str) -> HashMap<TenantId, CnpgCluster> {
    config
        .tenants
        .iter()
        .filter_map(|t| match &t.backend {
            TenantBackend::Cnpg {
                cluster,
                namespace,
                endpoint,
            } => {
                let ns = namespace.as_deref().unwrap_or(default_ns);
                let mut c = CnpgCluster::new(ns, cluster);
                if let Some(e) = endpoint.as_deref().and_then(Endpoint::parse) {
                    c.endpoint = e;
                }
                Some((t.id.clone(), c))
            }
            _ => None,
        })
        .collect()
}

/// The configured tenants with their backends, and the backend TLS mode of those that set one.
fn tenant_list(
    config: &Config,
    local: Option<&Arc<LocalBackend>>,
    kube: &KubeBackends,
) -> (Vec<Tenant>, HashMap<TenantId, BackendTls>) {
    let mut backend_tls = HashMap::new();
    let mut tenants = Vec::new();
    for t in &config.tenants {
        let backend: Arc<dyn ComputeBackend> = match &t.backend {
            TenantBackend::Fixed { address, tls } => {
                backend_tls.insert(t.id.clone(), tls.unwrap_or(config.backend.tls));
                // Addresses were checked when the config was validated.
                let endpoint = Endpoint::parse(address).unwrap_or(Endpoint {
                    host: address.clone(),
                    port: 5432,
                });
                Arc::new(FixedBackend::new(endpoint))
            }
            TenantBackend::Local => match local {
                Some(l) => l.clone(),
                None => unreachable!("validated: local tenants have a [local] section"),
            },
            TenantBackend::Cnpg { .. } => match &kube.cnpg {
                Some(c) => c.clone(),
                None => unreachable!("cnpg tenants built the cnpg backend"),
            },
            TenantBackend::Pool { .. } => match &kube.pool {
                Some(p) => {
                    backend_tls.insert(t.id.clone(), config.backend.tls);
                    p.clone()
                }
                None => unreachable!("validated: pool tenants name a configured pool class"),
            },
        };
        tenants.push(Tenant {
            id: t.id.clone(),
            backend,
            idle_timeout: t.idle_timeout.unwrap_or(config.wake.idle_timeout),
        });
    }
    (tenants, backend_tls)
}

/// The wake coordinator over `directory`, reporting each wake to `metrics`.
fn wake_coordinator(
    directory: &Arc<TenantDirectory>,
    w: &WakeConfig,
    metrics: &Arc<Metrics>,
) -> Arc<WakeCoordinator> {
    let wake_metrics = metrics.clone();
    WakeCoordinator::new(
        directory.clone(),
        WakeSettings {
            wake_timeout: w.wake_timeout,
            max_waiters_per_tenant: w.max_waiters_per_tenant,
            max_waiters_total: w.max_waiters_total,
            attempts: w.attempts,
            retry_backoff: w.retry_backoff,
            failed_retry_delay: w.failed_retry_delay,
            idle_check_interval: w.idle_check_interval,
        },
        move |event| wake_metrics.wake_finished(event),
    )
}

/// One watched copy of a namespace's Secrets, shared by every tenant in it.
struct SecretStores {
    stores: HashMap<String, Arc<SecretStore>>,
    login_timeout: Duration,
    terminate: CancellationToken,
}

impl SecretStores {
    fn new(login_timeout: Duration, terminate: CancellationToken) -> SecretStores {
        SecretStores {
            stores: HashMap::new(),
            login_timeout,
            terminate,
        }
    }

    fn get(&mut self, client: &kube::Client, ns: &str) -> Arc<SecretStore> {
        self.stores
            .entry(ns.to_owned())
            .or_insert_with(|| {
                SecretStore::start(
                    client.clone(),
                    ns,
                    self.login_timeout,
                    self.terminate.clone(),
                )
            })
            .clone()
    }
}

/// Each configured tenant's admission and authentication policy.
fn tenant_policies(
    config: &Config,
    coordinator: &Arc<WakeCoordinator>,
    kube: &KubeBackends,
    secrets: &mut SecretStores,
) -> Result<HashMap<TenantId, Arc<TenantPolicy>>, BuildError> {
    let mut policies = HashMap::new();
    for t in &config.tenants {
        let credentials = credential_source(config, t, coordinator, kube, secrets)?;
        let auth = t.effective_auth();
        if auth == AuthMode::Passthrough {
            info!(tenant = %t.id, "passthrough authentication: the backend checks passwords");
        }
        policies.insert(
            t.id.clone(),
            Arc::new(TenantPolicy {
                access: AccessList {
                    allow: t.allow.clone(),
                    deny: t.deny.clone(),
                },
                auth,
                credentials,
                max_clients: t.max_client_connections,
            }),
        );
    }
    Ok(policies)
}

/// Where tenant `t`'s users and secrets come from, if the gateway checks its passwords.
fn credential_source(
    config: &Config,
    t: &TenantConfig,
    coordinator: &Arc<WakeCoordinator>,
    kube: &KubeBackends,
    secrets: &mut SecretStores,
) -> Result<Option<Arc<dyn CredentialSource>>, BuildError> {
    Ok(match t.effective_credentials() {
        None => None,
        Some(CredentialsConfig::Static { file }) => {
            Some(Arc::new(StaticSource::load(&file).map_err(|source| {
                BuildError::Credentials {
                    tenant: t.id.to_string(),
                    source,
                }
            })?))
        }
        Some(CredentialsConfig::Local) => config
            .local
            .as_ref()
            .map(|l| Arc::new(LocalSource::new(&l.superuser, &l.password)) as _),
        Some(CredentialsConfig::AuthQuery {
            user,
            password,
            database,
            query,
        }) => Some(Arc::new(AuthQuerySource::new(
            t.id.clone(),
            AuthQuerySettings {
                user,
                password,
                database,
                query,
                ttl: config.auth.auth_query_ttl,
                timeout: config.limits.login_timeout,
            },
            coordinator.clone(),
        ))),
        Some(CredentialsConfig::KubernetesSecret { secret, namespace }) => {
            let client = kube
                .client
                .as_ref()
                .expect("kubernetes credentials built a client");
            let cluster = kube.cnpg.as_ref().and_then(|c| c.cluster_of(&t.id));
            let ns = namespace
                .or_else(|| cluster.as_ref().map(|c| c.namespace.clone()))
                .or_else(|| kube.default_ns.clone())
                .unwrap_or_else(|| "default".into());
            // Validated: without a cluster the secret is named.
            let name = secret
                .or_else(|| cluster.map(|c| format!("{}-app", c.name)))
                .unwrap_or_default();
            Some(Arc::new(KubeSecretSource::new(
                secrets.get(client, &ns),
                &name,
            )))
        }
    })
}

/// With `[kubernetes] discover`, watches labelled clusters and keeps the directory and the
/// policies in step with them.
fn start_discovery(
    config: &Config,
    kube: &KubeBackends,
    directory: &Arc<TenantDirectory>,
    policies: &Policies,
    secrets: &mut SecretStores,
    terminate: &CancellationToken,
) {
    let k = &config.kubernetes;
    let (true, Some(client), Some(cnpg)) = (k.discover, &kube.client, &kube.cnpg) else {
        return;
    };
    let namespace = kube.default_ns.clone().unwrap_or_else(|| "default".into());
    let auth = k.discover_auth.unwrap_or(AuthMode::Gateway);
    let secrets = secrets.get(client, &namespace);
    let discovery = ClusterDiscovery::new(
        client.clone(),
        DiscoverySettings {
            namespace,
            label: k
                .discover_label
                .clone()
                .unwrap_or_else(|| TENANT_LABEL.to_owned()),
            idle_timeout: k.discover_idle_timeout.unwrap_or(config.wake.idle_timeout),
        },
        cnpg.clone(),
        directory.clone(),
        config.tenants.iter().map(|t| t.id.clone()).collect(),
    );
    let policies = policies.clone();
    let on_event = move |event: &DiscoveryEvent| {
        let mut policies = policies.write().unwrap_or_else(|p| p.into_inner());
        match event {
            DiscoveryEvent::Upserted(tenant, cluster) => {
                let credentials = (auth == AuthMode::Gateway).then(|| {
                    Arc::new(KubeSecretSource::new(
                        secrets.clone(),
                        &format!("{}-app", cluster.name),
                    )) as Arc<dyn CredentialSource>
                });
                policies.insert(
                    tenant.clone(),
                    Arc::new(TenantPolicy {
                        access: AccessList::default(),
                        auth,
                        credentials,
                        max_clients: None,
                    }),
                );
            }
            DiscoveryEvent::Removed(tenant) => {
                policies.remove(tenant);
            }
        }
    };
    tokio::spawn(discovery.run(terminate.clone(), on_event));
}

/// Serves until `shutdown` fires, then drains: stop accepting, `/readyz` 503, sessions get
/// `shutdown_grace`, the rest are ended with FATAL 57P01.
pub async fn run(
    config: Config,
    shutdown: CancellationToken,
    banner: Option<String>,
) -> anyhow::Result<()> {
    let terminate = CancellationToken::new();
    let gateway = Arc::new(build(&config, terminate.clone()).await?);
    let listener = TcpListener::bind(config.listen.postgres)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "listen.postgres: cannot listen on {}: {e}",
                config.listen.postgres
            )
        })?;
    // Bound before the admin listener, so /readyz never answers for a gateway that then fails.
    let http_listener = match config.listen.http {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("listen.http: cannot listen on {addr}: {e}"))?,
        ),
        None => None,
    };
    if let Some(local) = &gateway.local {
        for t in gateway.directory.all() {
            local.stop_stale(&t.id).await;
        }
    }
    let admin_token = read_admin_token(&config)?;
    let admin_state = Arc::new(AdminState {
        metrics: gateway.metrics.clone(),
        coordinator: gateway.coordinator.clone(),
        ready: true.into(),
        token: admin_token,
        started: std::time::Instant::now(),
    });
    let sleeper_stop = CancellationToken::new();
    let replenisher = start_background_jobs(&gateway, &sleeper_stop);
    if let Some(addr) = config.listen.admin {
        let admin_listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listen.admin: cannot listen on {addr}: {e}"))?;
        tokio::spawn(admin::serve(admin_listener, admin_state.clone()));
    }
    info!(
        postgres = %config.listen.postgres,
        admin = ?config.listen.admin,
        http = ?config.listen.http,
        tenants = gateway.directory.len(),
        tls = config.tls.is_some(),
        "pgwake serving"
    );
    if let Some(b) = banner {
        println!("{b}");
    }
    let tasks = TaskTracker::new();
    let stop = CancellationToken::new();
    let accept = tokio::spawn(listener::serve(
        listener,
        gateway.clone(),
        tasks.clone(),
        stop.clone(),
    ));

    let http_accept = http_listener.map(|l| {
        let state = Arc::new(http::HttpState::new(
            gateway.clone(),
            config.http.clone(),
            config.listen.allow_plaintext,
        ));
        tokio::spawn(http::serve(l, state, tasks.clone(), stop.clone()))
    });

    shutdown.cancelled().await;
    admin_state.ready.store(false, Ordering::Relaxed);
    stop.cancel();
    let _ = accept.await;
    if let Some(h) = http_accept {
        let _ = h.await;
    }
    tasks.close();
    drain(&gateway, &tasks, config.limits.shutdown_grace, &terminate).await;
    sleeper_stop.cancel();
    if let Some(r) = replenisher {
        // It gives its Leases up, so another replica replenishes without waiting them out.
        let _ = tokio::time::timeout(TERMINATE_DRAIN, r).await;
    }
    if let Some(local) = &gateway.local {
        stop_local_servers(&gateway, local).await;
    }
    // Ends the Kubernetes watches.
    gateway.terminate.cancel();
    info!("pgwake stopped");
    Ok(())
}

/// The admin API's bearer token, from `[admin] token_file`.
fn read_admin_token(config: &Config) -> anyhow::Result<Option<String>> {
    let Some(path) = &config.admin.token_file else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("admin.token_file: cannot read {}: {e}", path.display()))?
        .trim()
        .to_owned();
    if token.is_empty() {
        anyhow::bail!("admin.token_file: {} is empty", path.display());
    }
    Ok(Some(token))
}

/// Starts the idle sleeper, the reuse reaper and the warm-pool replenisher until `stop`; the
/// replenisher's task is returned so shutdown can wait for it to give its Leases up.
fn start_background_jobs(
    gateway: &Gateway,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    tokio::spawn(gateway.coordinator.clone().run_idle_sleeper(stop.clone()));
    if let Some(reuse) = &gateway.reuse {
        tokio::spawn(
            reuse
                .clone()
                .run_reaper(gateway.metrics.clone(), stop.clone()),
        );
    }
    gateway
        .pool
        .clone()
        .map(|pool| tokio::spawn(pool.run_replenisher(stop.clone())))
}

/// Lets sessions finish within `grace`, then ends the rest (FATAL 57P01 at their next message
/// boundary) and waits a little for them to go.
async fn drain(
    gateway: &Gateway,
    tasks: &TaskTracker,
    grace: Duration,
    terminate: &CancellationToken,
) {
    let active = gateway.metrics.connections_active.get();
    info!(active, grace = ?grace, "shutting down: waiting for sessions");
    if tokio::time::timeout(grace, tasks.wait()).await.is_err() {
        info!(
            remaining = gateway.metrics.connections_active.get(),
            "grace period over: terminating sessions"
        );
        terminate.cancel();
        let _ = tokio::time::timeout(TERMINATE_DRAIN, tasks.wait()).await;
    }
}

/// Servers this gateway started never outlive it, including one still starting (its wake has
/// not recorded it yet, but its postmaster.pid is there).
async fn stop_local_servers(gateway: &Gateway, local: &LocalBackend) {
    local.stop_all().await;
    for t in gateway.directory.all() {
        if t.backend.kind() == "local" {
            local.stop_stale(&t.id).await;
        }
    }
}

/// The connection caps of `[limits]`, lowered to what the process's file limit can hold.
fn capacity_settings(limits: &crate::config::Limits) -> CapacitySettings {
    let configured = CapacitySettings {
        max_clients: limits.max_client_connections,
        max_unauthenticated: limits.max_unauthenticated_connections,
    };
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return configured;
    };
    let fitted = configured.fitted_to(soft);
    if fitted.max_clients < configured.max_clients
        || fitted.max_unauthenticated < configured.max_unauthenticated
    {
        warn!(
            open_files = soft,
            max_client_connections = fitted.max_clients,
            max_unauthenticated_connections = fitted.max_unauthenticated,
            "the file limit holds fewer connections than configured: caps lowered (raise it with ulimit -n)"
        );
    }
    fitted
}
