//! The `cnpg` backend: tenants are CloudNativePG `Cluster` objects, woken and put to sleep with
//! the `cnpg.io/hibernation` annotation.
//!
//! A wake merge-patches the annotation to `off`, then probes logins on the primary pod itself
//! ([`super::primary`]) and, beside that, watches (not polls) the Cluster until the operator
//! reports it awake (no hibernation condition, `readyInstances >= 1`) and probes a login through
//! its `-rw` Service: whichever accepts first is where the tenant's connections go.

use std::collections::HashMap;
use std::sync::RwLock;

use async_trait::async_trait;
use kube::api::{Api, ApiResource, DynamicObject};
use tokio::time::Instant;
use tracing::info;

use super::cluster::{
    CnpgCluster, CnpgSettings, api_error, cluster_hibernated, cluster_resource,
    hibernation_requested, probe_until_ready, set_hibernation, wait_awake, watch_until,
};
use super::primary::PrimaryRoutes;
use super::{BackendError, ComputeBackend, ComputeState, Endpoint};
use crate::TenantId;

/// CloudNativePG clusters reached through the Kubernetes API.
pub struct CnpgBackend {
    client: kube::Client,
    resource: ApiResource,
    clusters: RwLock<HashMap<TenantId, CnpgCluster>>,
    settings: CnpgSettings,
    routes: PrimaryRoutes,
}

impl CnpgBackend {
    /// A backend for these tenants' clusters.
    pub fn new(
        client: kube::Client,
        clusters: HashMap<TenantId, CnpgCluster>,
        settings: CnpgSettings,
    ) -> Self {
        CnpgBackend {
            routes: PrimaryRoutes::new(client.clone()),
            client,
            resource: cluster_resource(),
            clusters: RwLock::new(clusters),
            settings,
        }
    }

    /// Points a tenant at a cluster; returns false when it already pointed there.
    pub fn set_cluster(&self, tenant: &TenantId, cluster: CnpgCluster) -> bool {
        let mut clusters = self.clusters.write().unwrap_or_else(|p| p.into_inner());
        if clusters.get(tenant) == Some(&cluster) {
            return false;
        }
        clusters.insert(tenant.clone(), cluster);
        true
    }

    /// Forgets a tenant's cluster.
    pub fn remove_cluster(&self, tenant: &TenantId) -> Option<CnpgCluster> {
        let mut clusters = self.clusters.write().unwrap_or_else(|p| p.into_inner());
        clusters.remove(tenant)
    }

    /// The cluster a tenant is on.
    pub fn cluster_of(&self, tenant: &TenantId) -> Option<CnpgCluster> {
        let clusters = self.clusters.read().unwrap_or_else(|p| p.into_inner());
        clusters.get(tenant).cloned()
    }

    fn cluster(
        &self,
        tenant: &TenantId,
    ) -> Result<(CnpgCluster, Api<DynamicObject>), BackendError> {
        let c = self
            .cluster_of(tenant)
            .ok_or_else(|| BackendError::UnknownTenant(tenant.clone()))?;
        let api = Api::namespaced_with(self.client.clone(), &c.namespace, &self.resource);
        Ok((c, api))
    }

    async fn set_hibernation(
        &self,
        tenant: &TenantId,
        value: &str,
    ) -> Result<DynamicObject, BackendError> {
        let (c, api) = self.cluster(tenant)?;
        let obj = set_hibernation(&api, &c.name, value).await?;
        info!(tenant = %tenant, cluster = %c.name, namespace = %c.namespace, hibernation = value, "patched cluster");
        Ok(obj)
    }
}

#[async_trait]
impl ComputeBackend for CnpgBackend {
    fn kind(&self) -> &'static str {
        "cnpg"
    }

    async fn wake(&self, tenant: &TenantId) -> Result<Endpoint, BackendError> {
        let deadline = Instant::now() + self.settings.start_timeout;
        let (c, api) = self.cluster(tenant)?;
        let obj = self.set_hibernation(tenant, "off").await?;
        let via_service = async {
            wait_awake(api, &c.name, &self.settings, deadline).await?;
            probe_until_ready(&c.endpoint, &self.settings, deadline).await?;
            Ok(c.endpoint.clone())
        };
        self.routes
            .reach(
                tenant,
                &obj,
                c.behind_service().then_some(&c.endpoint),
                &self.settings,
                deadline,
                via_service,
            )
            .await
    }

    /// Returns once the operator reports the cluster hibernated, so a wake that follows starts
    /// from a stopped cluster rather than racing the pods' deletion.
    async fn sleep(&self, tenant: &TenantId) -> Result<(), BackendError> {
        let deadline = Instant::now() + self.settings.start_timeout;
        let (c, api) = self.cluster(tenant)?;
        self.routes.forget(tenant);
        self.set_hibernation(tenant, "on").await?;
        watch_until(api, &c.name, &self.settings, deadline, cluster_hibernated)
            .await
            .map(drop)
    }

    async fn state(&self, tenant: &TenantId) -> Result<ComputeState, BackendError> {
        let (c, api) = self.cluster(tenant)?;
        let obj = api.get(&c.name).await.map_err(api_error)?;
        if hibernation_requested(&obj) {
            return Ok(ComputeState::Asleep);
        }
        self.routes.state(tenant, &obj).await
    }

    fn activity_namespace(&self, tenant: &TenantId) -> Option<String> {
        self.cluster_of(tenant).map(|c| c.namespace)
    }
}
