//! The `fixed` backend: an always-on address, pure routing.

use async_trait::async_trait;

use super::{BackendError, ComputeBackend, ComputeState, Endpoint};
use crate::TenantId;

/// A database that is always awake at one address.
#[derive(Clone, Debug)]
pub struct FixedBackend {
    endpoint: Endpoint,
}

impl FixedBackend {
    /// A backend that always answers with this endpoint.
    pub fn new(endpoint: Endpoint) -> Self {
        FixedBackend { endpoint }
    }
}

#[async_trait]
impl ComputeBackend for FixedBackend {
    fn kind(&self) -> &'static str {
        "fixed"
    }

    async fn wake(&self, _tenant: &TenantId) -> Result<Endpoint, BackendError> {
        Ok(self.endpoint.clone())
    }

    async fn sleep(&self, _tenant: &TenantId) -> Result<(), BackendError> {
        Ok(())
    }

    async fn state(&self, _tenant: &TenantId) -> Result<ComputeState, BackendError> {
        Ok(ComputeState::Awake)
    }
}
