//! Each tenant's profile from the configuration (and, with discovery, from labelled
//! clusters): admission lists, who checks passwords and against which credential source, caps
//! and backend TLS.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pgwake_routing::backend::TENANT_LABEL;
use pgwake_routing::discovery::{ClusterDiscovery, DiscoveryEvent, DiscoverySettings};
use pgwake_routing::{TenantDirectory, TenantId, WakeCoordinator};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::BuildError;
use super::backends::KubeBackends;
use crate::auth::{
    AuthQuerySettings, AuthQuerySource, CredentialSource, KubeSecretSource, LocalSource,
    SecretStore, StaticSource,
};
use crate::config::{AuthMode, Config, CredentialsConfig, TenantBackend, TenantConfig};
use crate::pipeline::{AccessList, Profiles, TenantProfile};

/// One watched copy of a namespace's Secrets, shared by every tenant in it.
pub(super) struct SecretStores {
    stores: HashMap<String, Arc<SecretStore>>,
    login_timeout: Duration,
    terminate: CancellationToken,
}

impl SecretStores {
    pub(super) fn new(login_timeout: Duration, terminate: CancellationToken) -> SecretStores {
        SecretStores {
            stores: HashMap::new(),
            login_timeout,
            terminate,
        }
    }

    pub(super) fn get(&mut self, client: &kube::Client, ns: &str) -> Arc<SecretStore> {
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

/// Each configured tenant's profile.
pub(super) fn tenant_profiles(
    config: &Config,
    coordinator: &Arc<WakeCoordinator>,
    kube: &KubeBackends,
    secrets: &mut SecretStores,
) -> Result<HashMap<TenantId, Arc<TenantProfile>>, BuildError> {
    let mut profiles = HashMap::new();
    for t in &config.tenants {
        let credentials = credential_source(config, t, coordinator, kube, secrets)?;
        let auth = t.effective_auth();
        if auth == AuthMode::Passthrough {
            info!(tenant = %t.id, "passthrough authentication: the backend checks passwords");
        }
        let tls = match &t.backend {
            TenantBackend::Fixed { tls: Some(tls), .. } => *tls,
            _ => config.backend.tls,
        };
        profiles.insert(
            t.id.clone(),
            Arc::new(TenantProfile {
                access: AccessList {
                    allow: t.allow.clone(),
                    deny: t.deny.clone(),
                },
                auth,
                credentials,
                max_clients: t.max_client_connections,
                tls,
                reuse_passthrough: t.reuse_passthrough,
            }),
        );
    }
    Ok(profiles)
}

/// Where tenant `t`'s users and secrets come from, if the gateway checks its passwords.
pub(super) fn credential_source(
    config: &Config,
    t: &TenantConfig,
    coordinator: &Arc<WakeCoordinator>,
    kube: &KubeBackends,
    secrets: &mut SecretStores,
) -> Result<Option<Arc<dyn CredentialSource>>, BuildError> {
    Ok(match t.effective_credentials() {
        None => None,
        Some(CredentialsConfig::Static { file }) => {
            Some(Arc::new(StaticSource::load(&file).map_err(|problem| {
                BuildError::Credentials {
                    tenant: t.id.to_string(),
                    problem,
                }
            })?))
        }
        Some(CredentialsConfig::Local) => config.local.as_ref().map(|l| {
            let superuser = (l.superuser.as_str(), l.password.as_str());
            let users: Vec<_> = std::iter::once(superuser).chain(l.owner_login()).collect();
            Arc::new(LocalSource::new(&users)) as _
        }),
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
/// profiles in step with them.
pub(super) fn start_discovery(
    config: &Config,
    kube: &KubeBackends,
    directory: &Arc<TenantDirectory>,
    profiles: &Profiles,
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
            predict: config.wake.predict,
        },
        cnpg.clone(),
        directory.clone(),
        config.tenants.iter().map(|t| t.id.clone()).collect(),
    );
    let profiles = profiles.clone();
    let tls = config.backend.tls;
    let on_event = move |event: &DiscoveryEvent| {
        let mut profiles = profiles.write().unwrap_or_else(|p| p.into_inner());
        match event {
            DiscoveryEvent::Upserted(tenant, cluster) => {
                let credentials = (auth == AuthMode::Gateway).then(|| {
                    Arc::new(KubeSecretSource::new(
                        secrets.clone(),
                        &format!("{}-app", cluster.name),
                    )) as Arc<dyn CredentialSource>
                });
                profiles.insert(
                    tenant.clone(),
                    Arc::new(TenantProfile {
                        access: AccessList::default(),
                        auth,
                        credentials,
                        max_clients: None,
                        tls,
                        reuse_passthrough: false,
                    }),
                );
            }
            DiscoveryEvent::Removed(tenant) => {
                profiles.remove(tenant);
            }
        }
    };
    tokio::spawn(discovery.run(terminate.clone(), on_event));
}
