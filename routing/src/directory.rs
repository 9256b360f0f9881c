//! The tenants this gateway serves and the backend each one runs on.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{ComputeBackend, TenantId};

/// One configured tenant.
pub struct Tenant {
    /// Its id.
    pub id: TenantId,
    /// Where its database runs.
    pub backend: Arc<dyn ComputeBackend>,
}

/// Lookup of configured tenants by id.
#[derive(Default)]
pub struct TenantDirectory {
    tenants: HashMap<TenantId, Arc<Tenant>>,
}

impl TenantDirectory {
    /// A directory holding these tenants.
    pub fn new(tenants: impl IntoIterator<Item = Tenant>) -> Self {
        TenantDirectory {
            tenants: tenants
                .into_iter()
                .map(|t| (t.id.clone(), Arc::new(t)))
                .collect(),
        }
    }

    /// The tenant with this id, if configured.
    pub fn get(&self, id: &TenantId) -> Option<Arc<Tenant>> {
        self.tenants.get(id).cloned()
    }

    /// Every configured tenant.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.tenants.values()
    }

    /// Number of configured tenants.
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    /// True when no tenant is configured.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}
