//! Kubernetes tenant discovery: every CloudNativePG `Cluster` carrying the tenant label becomes a
//! tenant on the `cnpg` backend, without a restart, and leaves when the cluster or its label goes.
//!
//! The watch re-lists after an outage; clusters missing from a fresh listing are removed then,
//! so a deletion during an outage is not missed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backend::{CnpgBackend, CnpgCluster, cluster_resource};
use crate::predict::PredictPolicy;
use crate::{Tenant, TenantDirectory, TenantId};

/// What discovered tenants get, and where to look for them.
#[derive(Clone, Debug)]
pub struct DiscoverySettings {
    /// Namespace watched for labelled clusters.
    pub namespace: String,
    /// Label whose value is the tenant id.
    pub label: String,
    /// Idle timeout of discovered tenants.
    pub idle_timeout: Duration,
    /// What discovered tenants' run predictions are used for.
    pub predict: PredictPolicy,
}

/// Why a directory change was made, for the caller's own per-tenant state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiscoveryEvent {
    /// A tenant appeared or moved to another cluster.
    Upserted(TenantId, CnpgCluster),
    /// A tenant is gone.
    Removed(TenantId),
}

/// Keeps the directory in step with labelled clusters.
pub struct ClusterDiscovery {
    client: kube::Client,
    settings: DiscoverySettings,
    backend: Arc<CnpgBackend>,
    directory: Arc<TenantDirectory>,
    /// Tenants from the configuration file: a label never overrides them.
    fixed: HashSet<TenantId>,
    /// Which tenant each discovered cluster (namespace/name) serves.
    known: HashMap<(String, String), TenantId>,
}

impl ClusterDiscovery {
    /// Discovery into `directory`, with clusters served by `backend`; the ids in `fixed` are
    /// configured tenants and are left alone.
    pub fn new(
        client: kube::Client,
        settings: DiscoverySettings,
        backend: Arc<CnpgBackend>,
        directory: Arc<TenantDirectory>,
        fixed: HashSet<TenantId>,
    ) -> ClusterDiscovery {
        ClusterDiscovery {
            client,
            settings,
            backend,
            directory,
            fixed,
            known: HashMap::new(),
        }
    }

    /// Watches until `stop` fires; `on_event` hears of every tenant added, moved or removed.
    pub async fn run(mut self, stop: CancellationToken, on_event: impl Fn(&DiscoveryEvent)) {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.settings.namespace,
            &cluster_resource(),
        );
        let config = watcher::Config::default().labels(&self.settings.label);
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut listing: Option<HashSet<(String, String)>> = None;
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                e = events.next() => e,
            };
            match event {
                None => return,
                Some(Err(e)) => warn!(error = %e, "cluster discovery watch failed; retrying"),
                Some(Ok(watcher::Event::Init)) => listing = Some(HashSet::new()),
                Some(Ok(watcher::Event::InitApply(obj))) => {
                    if let (Some(seen), Some(key)) = (listing.as_mut(), key_of(&obj)) {
                        seen.insert(key);
                    }
                    self.apply(&obj, &on_event);
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    let seen = listing.take().unwrap_or_default();
                    let gone: Vec<_> = self
                        .known
                        .keys()
                        .filter(|k| !seen.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        self.forget(&key, &on_event);
                    }
                    info!(
                        tenants = self.known.len(),
                        namespace = %self.settings.namespace,
                        "cluster discovery listed"
                    );
                }
                Some(Ok(watcher::Event::Apply(obj))) => self.apply(&obj, &on_event),
                Some(Ok(watcher::Event::Delete(obj))) => {
                    if let Some(key) = key_of(&obj) {
                        self.forget(&key, &on_event);
                    }
                }
            }
        }
    }

    fn apply(&mut self, obj: &DynamicObject, on_event: &impl Fn(&DiscoveryEvent)) {
        let Some(key) = key_of(obj) else { return };
        let label = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(&self.settings.label));
        let tenant = match label.map(|v| TenantId::parse(v)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                warn!(cluster = %key.1, namespace = %key.0, error = %e, "cluster label is not a tenant id; ignored");
                self.forget(&key, on_event);
                return;
            }
            None => {
                self.forget(&key, on_event);
                return;
            }
        };
        if self.fixed.contains(&tenant) {
            return;
        }
        if let Some(previous) = self.known.get(&key)
            && *previous != tenant
        {
            self.forget(&key, on_event);
        }
        let Some(cluster) = CnpgCluster::from_object(obj) else {
            return;
        };
        let moved = self.backend.set_cluster(&tenant, cluster.clone());
        self.known.insert(key, tenant.clone());
        if moved || self.directory.get(&tenant).is_none() {
            self.directory.insert(Tenant {
                id: tenant.clone(),
                backend: self.backend.clone(),
                idle_timeout: self.settings.idle_timeout,
                predict: self.settings.predict,
            });
            info!(tenant = %tenant, cluster = %cluster.name, namespace = %cluster.namespace, "tenant discovered");
            on_event(&DiscoveryEvent::Upserted(tenant, cluster));
        }
    }

    fn forget(&mut self, key: &(String, String), on_event: &impl Fn(&DiscoveryEvent)) {
        let Some(tenant) = self.known.remove(key) else {
            return;
        };
        // Another cluster may have taken the label over since; only its own entry goes.
        let still_ours = self
            .backend
            .cluster_of(&tenant)
            .is_some_and(|c| c.namespace == key.0 && c.name == key.1);
        if still_ours {
            self.backend.remove_cluster(&tenant);
            self.directory.remove(&tenant);
            info!(tenant = %tenant, cluster = %key.1, namespace = %key.0, "tenant removed");
            on_event(&DiscoveryEvent::Removed(tenant));
        }
    }
}

fn key_of(obj: &DynamicObject) -> Option<(String, String)> {
    Some((obj.metadata.namespace.clone()?, obj.metadata.name.clone()?))
}
