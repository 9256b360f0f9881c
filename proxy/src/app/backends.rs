//! The backends a configuration calls for: the local Postgres, the Kubernetes client with the
//! CloudNativePG and warm-pool backends, the tenant list and the wake coordinator over it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pgwake_routing::activity::{ActivitySettings, SharedActivity};
use pgwake_routing::backend::{
    CnpgBackend, CnpgCluster, CnpgSettings, FixedBackend, LocalBackend, LocalSettings, PoolBackend,
    PoolClass, Release, Route, cluster_template,
};
use pgwake_routing::private_file::check_private_dir;
use pgwake_routing::{
    ComputeBackend, Endpoint, PredictSettings, Tenant, TenantDirectory, TenantId, WakeCoordinator,
    WakeSettings,
};

use pgwake_protocol::scram::ScramSecret;

use super::BuildError;
use crate::auth::SCRAM_ITERATIONS;
use crate::config::{
    Config, CredentialsConfig, KubeRoute, KubernetesConfig, LocalConfig, PoolClassConfig,
    PoolRelease, TenantBackend,
};
use crate::metrics::Metrics;

/// The local backend's settings from `[local]`.
pub fn local_settings(local: &LocalConfig, start_timeout: Duration) -> LocalSettings {
    LocalSettings {
        data_dir: local.data_dir.clone(),
        bin_dir: local.bin_dir.clone(),
        run_as: local.run_as.clone(),
        superuser: local.superuser.clone(),
        password: local.password.clone(),
        owner: local.owner_login().map(|(role, password)| {
            let salt: [u8; 16] = rand::random();
            let verifier = ScramSecret::from_password(password, &salt, SCRAM_ITERATIONS);
            (role.to_owned(), verifier.to_string())
        }),
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
pub(super) async fn kube_client(k: &KubernetesConfig) -> Result<kube::Client, BuildError> {
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
pub(super) fn pool_class(c: &PoolClassConfig, namespace: &str) -> Result<PoolClass, BuildError> {
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
        orphan_grace: c.orphan_grace,
    })
}

/// This process's name in Leases: host name (the pod's, in Kubernetes) and process id.
pub(super) fn lease_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "pgwake".into());
    format!("{host}-{}", std::process::id())
}

/// The local backend, when some tenant runs on it.
pub(super) fn local_backend(config: &Config) -> Result<Option<Arc<LocalBackend>>, BuildError> {
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
pub(super) struct KubeBackends {
    pub(super) client: Option<kube::Client>,
    /// Namespace of objects whose tenant names none.
    pub(super) default_ns: Option<String>,
    pub(super) cnpg: Option<Arc<CnpgBackend>>,
    pub(super) pool: Option<Arc<PoolBackend>>,
    /// The shared activity records of cnpg and pool tenants, through which replicas agree on
    /// when a tenant sleeps.
    pub(super) activity: Option<Arc<SharedActivity>>,
}

impl KubeBackends {
    pub(super) async fn build(config: &Config) -> Result<KubeBackends, BuildError> {
        let k = &config.kubernetes;
        // Discovered tenants are cnpg tenants too.
        let has_cnpg = k.discover
            || config
                .tenants
                .iter()
                .any(|t| matches!(t.backend, TenantBackend::Cnpg { .. }));
        let needs_kube = has_cnpg
            || config.auth.throttle_shared
            || !config.pool_classes.is_empty()
            || config.listen.peer.is_some()
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
            probe_timeout: k.probe_timeout(),
            route: match k.route {
                KubeRoute::PrimaryPod => Route::PrimaryPod,
                KubeRoute::Service => Route::Service,
            },
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
        let activity = match &client {
            Some(client) if has_cnpg || pool.is_some() => Some(Arc::new(SharedActivity::new(
                client.clone(),
                lease_identity(),
                ActivitySettings {
                    ttl: k.activity_ttl(),
                    sleep_timeout: config.wake.wake_timeout,
                },
            ))),
            _ => None,
        };
        Ok(KubeBackends {
            activity,
            client,
            default_ns,
            cnpg,
            pool,
        })
    }
}

/// The configured cnpg tenants' clusters, in `default_ns` unless they name a namespace.
pub(super) fn cnpg_clusters(config: &Config, default_ns: &str) -> HashMap<TenantId, CnpgCluster> {
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

/// The configured tenants with their backends.
pub(super) fn tenant_list(
    config: &Config,
    local: Option<&Arc<LocalBackend>>,
    kube: &KubeBackends,
) -> Vec<Tenant> {
    let mut tenants = Vec::new();
    for t in &config.tenants {
        let backend: Arc<dyn ComputeBackend> = match &t.backend {
            TenantBackend::Fixed { address, .. } => {
                // Addresses were checked when the config was validated.
                let endpoint = Endpoint::parse(address).unwrap_or(Endpoint::new(address, 5432));
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
                Some(p) => p.clone(),
                None => unreachable!("validated: pool tenants name a configured pool class"),
            },
        };
        tenants.push(Tenant {
            id: t.id.clone(),
            backend,
            idle_timeout: t.idle_timeout.unwrap_or(config.wake.idle_timeout),
            predict: t.predict.unwrap_or(config.wake.predict),
        });
    }
    tenants
}

/// The wake coordinator over `directory` with `[wake]`'s settings (and the run history file:
/// by default in the data folder of the local backend when one runs, `local`), reporting each
/// wake to `metrics`. Fails when the history file's folder lets another account change it.
pub(super) fn wake_coordinator(
    directory: &Arc<TenantDirectory>,
    config: &Config,
    local: Option<&Arc<LocalBackend>>,
    activity: Option<Arc<SharedActivity>>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<WakeCoordinator>, BuildError> {
    let w = &config.wake;
    let history_file = match &w.predict_history_file {
        Some(file) => {
            let folder = file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            check_private_dir(folder)
                .map_err(|e| BuildError::State(format!("wake.predict_history_file: {e}")))?;
            Some(file.clone())
        }
        // The local backend made its data folder the gateway's own and checked it.
        None => local.map(|l| l.data_dir().join(super::RUN_HISTORY_FILE)),
    };
    let wake_metrics = metrics.clone();
    Ok(WakeCoordinator::new_shared(
        directory.clone(),
        WakeSettings {
            wake_timeout: w.wake_timeout,
            max_waiters_per_tenant: w.max_waiters_per_tenant,
            max_waiters_total: w.max_waiters_total,
            attempts: w.attempts,
            retry_backoff: w.retry_backoff,
            failed_retry_delay: w.failed_retry_delay,
            idle_check_interval: w.idle_check_interval,
            predict: PredictSettings {
                margin: w.predict_margin,
                sleep_grace: w.predict_sleep_grace,
                run_gap: w.predict_run_gap,
                history_file,
                history_max_bytes: w.predict_history_max_size.as_u64(),
            },
        },
        activity,
        move |event| wake_metrics.wake_finished(event),
    ))
}
