//! Routing: which tenant a connection names, and that tenant's profile (admission,
//! authentication, backend TLS, caps), looked up once per connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use pgwake_routing::{Tenant, TenantDirectory, TenantId, TenantResolver};

use super::access::AccessList;
use crate::auth::CredentialSource;
use crate::config::{AuthMode, BackendTls, UnknownTenant};

/// How a client naming a tenant that it may not reach, or that does not exist, is answered.
pub struct TenantRefusal {
    /// `routing.unknown_tenant`.
    pub answer: UnknownTenant,
    /// The tenant exists but its access list refuses the client's address.
    pub forbidden: bool,
    /// In `reveal` mode, for a tenant that does not exist: the configured tenant whose name is
    /// a typo away from it (one or two letters changed, added, dropped or swapped), to suggest.
    pub nearest: Option<TenantId>,
}

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

    /// How to answer a client naming `id`, which [`Router::admit`] refused.
    pub fn refusal(&self, id: &TenantId) -> TenantRefusal {
        let forbidden = self.directory.get(id).is_some();
        // Only a gateway told to reveal unknown tenants may name its others.
        let nearest = match (self.unknown_tenant, forbidden) {
            (UnknownTenant::Reveal, false) => {
                nearest(id, self.directory.all().iter().map(|t| &t.id))
            }
            _ => None,
        };
        TenantRefusal {
            answer: self.unknown_tenant,
            forbidden,
            nearest,
        }
    }
}

/// The one of `tenants` whose name is nearest to `id`, when it is a typo away: at most two
/// edits, and fewer than half of `id`'s letters, so that short names do not match everything.
fn nearest<'a>(id: &TenantId, tenants: impl Iterator<Item = &'a TenantId>) -> Option<TenantId> {
    let name: Vec<char> = id.as_str().chars().collect();
    tenants
        .map(|t| (edits(&name, &t.as_str().chars().collect::<Vec<_>>()), t))
        .filter(|&(d, _)| d <= 2 && d * 2 < name.len())
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.as_str().cmp(b.1.as_str())))
        .map(|(_, t)| t.clone())
}

/// Edits that turn `a` into `b`: a letter changed, added or dropped, or two neighbours swapped
/// (the optimal string alignment distance), so `alpah` is one edit from `alpha`.
fn edits(a: &[char], b: &[char]) -> usize {
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let changed = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + changed);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_finds_the_tenant_meant_and_a_stranger_finds_none() {
        let tenants: Vec<TenantId> = ["alpha", "beta", "gamma", "ab"]
            .iter()
            .map(|n| TenantId::parse(n).unwrap())
            .collect();
        let near =
            |n: &str| nearest(&TenantId::parse(n).unwrap(), tenants.iter()).map(|t| t.to_string());
        assert_eq!(near("alpah").as_deref(), Some("alpha"));
        assert_eq!(near("alph").as_deref(), Some("alpha"));
        assert_eq!(near("betaa").as_deref(), Some("beta"));
        assert_eq!(near("nosuch"), None);
        // One edit in a two-letter name is half of it: another name, not a typo.
        assert_eq!(near("ax"), None);
    }
}
