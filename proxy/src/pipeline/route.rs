//! Routing: which tenant a connection names, and that tenant's profile (admission,
//! authentication, backend TLS, caps), looked up once per connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use pgwake_routing::{Tenant, TenantDirectory, TenantId, TenantResolver};

use super::access::AccessList;
use crate::auth::CredentialSource;
use crate::config::{AuthMode, BackendTls, UnknownTenant};

/// Everything the gateway applies to one tenant's connections.
pub struct TenantProfile {
    /// Client networks allowed and denied.
    pub access: AccessList,
    /// Who checks passwords.
    pub auth: AuthMode,
    /// Where users come from, for gateway authentication.
    pub credentials: Option<Arc<dyn CredentialSource>>,
    /// Client connections the tenant may hold at once (`None`: only the gateway's cap).
    pub max_clients: Option<usize>,
    /// TLS towards the tenant's backend.
    pub tls: BackendTls,
    /// Passthrough sessions take part in backend connection reuse where the backend trusts
    /// the gateway (`reuse_passthrough`).
    pub reuse_passthrough: bool,
}

impl TenantProfile {
    /// The credential source, when the gateway checks this tenant's passwords.
    pub fn gateway_credentials(&self) -> Option<&Arc<dyn CredentialSource>> {
        match (self.auth, &self.credentials) {
            (AuthMode::Gateway, Some(source)) => Some(source),
            _ => None,
        }
    }
}

/// Tenants' profiles, shared with tenant discovery, which adds and removes them.
pub type Profiles = Arc<RwLock<HashMap<TenantId, Arc<TenantProfile>>>>;

/// Finds the tenant a connection is for.
pub struct Router {
    /// Tenant rules.
    pub resolver: TenantResolver,
    /// Configured and discovered tenants.
    pub directory: Arc<TenantDirectory>,
    /// Per-tenant profiles; discovered tenants come and go.
    pub profiles: Profiles,
    /// How clients naming a tenant that does not exist (or is forbidden to them) are answered.
    pub unknown_tenant: UnknownTenant,
}

impl Router {
    /// The profile of `tenant`, if it exists.
    pub fn profile(&self, tenant: &TenantId) -> Option<Arc<TenantProfile>> {
        let profiles = self.profiles.read().unwrap_or_else(|p| p.into_inner());
        profiles.get(tenant).cloned()
    }

    /// The tenant `id` and its profile, when it exists and admits `peer`.
    pub fn admit(
        &self,
        id: &TenantId,
        peer: SocketAddr,
    ) -> Option<(Arc<Tenant>, Arc<TenantProfile>)> {
        // A denied address learns no more than about a tenant that does not exist.
        self.directory
            .get(id)
            .and_then(|t| self.profile(&t.id).map(|p| (t, p)))
            .filter(|(_, p)| p.access.permits(peer.ip()))
    }
}
