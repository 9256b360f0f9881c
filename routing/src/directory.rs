//! The tenants this gateway serves and the backend each one runs on.
//!
//! Tenants come from the configuration file and, with Kubernetes discovery, from labelled
//! `Cluster` objects that appear and disappear while the gateway runs; so the directory is
//! shared and changes in place.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::predict::PredictPolicy;
use crate::{ComputeBackend, TenantId};

/// One tenant the gateway serves.
pub struct Tenant {
    /// Its id.
    pub id: TenantId,
    /// Where its database runs.
    pub backend: Arc<dyn ComputeBackend>,
    /// How long it may go without connections before it is put to sleep.
    pub idle_timeout: Duration,
    /// What its run predictions are used for.
    pub predict: PredictPolicy,
}

/// Lookup of tenants by id; safe to change while connections use it.
#[derive(Default)]
pub struct TenantDirectory {
    tenants: RwLock<HashMap<TenantId, Arc<Tenant>>>,
}

impl TenantDirectory {
    /// A directory holding these tenants.
    pub fn new(tenants: impl IntoIterator<Item = Tenant>) -> Self {
        TenantDirectory {
            tenants: RwLock::new(
                tenants
                    .into_iter()
                    .map(|t| (t.id.clone(), Arc::new(t)))
                    .collect(),
            ),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<TenantId, Arc<Tenant>>> {
        self.tenants.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<TenantId, Arc<Tenant>>> {
        self.tenants.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The tenant with this id, if known.
    pub fn get(&self, id: &TenantId) -> Option<Arc<Tenant>> {
        self.read().get(id).cloned()
    }

    /// Adds a tenant or replaces the one with its id; returns the replaced one.
    pub fn insert(&self, tenant: Tenant) -> Option<Arc<Tenant>> {
        self.write().insert(tenant.id.clone(), Arc::new(tenant))
    }

    /// Removes a tenant; connections already admitted keep their backend.
    pub fn remove(&self, id: &TenantId) -> Option<Arc<Tenant>> {
        self.write().remove(id)
    }

    /// Every tenant known now.
    pub fn all(&self) -> Vec<Arc<Tenant>> {
        self.read().values().cloned().collect()
    }

    /// Number of tenants.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when no tenant is known.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }
}
