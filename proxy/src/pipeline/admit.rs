//! Admission: the tenant a client names (in its startup, or in its password), checked against
//! the tenant's address lists and connection cap, then the client's password when the gateway
//! checks it. A wrong password never starts a database.

use std::net::SocketAddr;
use std::sync::Arc;

use pgwake_protocol::StartupMessage;
use pgwake_routing::resolver::tenant_in_password;
use pgwake_routing::{ResolveError, Tenant, TenantId};

use super::authenticate::Authenticator;
use super::route::{Router, TenantProfile};
use crate::auth::LoginMaterial;
use crate::capacity::ClientSlot;
use crate::error::SessionError;
use crate::stream::Stream;

/// What admission found for a connection: its tenant and profile, and what the gateway's own
/// authentication of the client left (none under passthrough).
pub struct Admitted {
    /// The tenant.
    pub tenant: Arc<Tenant>,
    /// Its profile.
    pub profile: Arc<TenantProfile>,
    /// The user the client named, as it named it.
    pub user: Option<String>,
    /// What the gateway's check of the password left.
    pub material: Option<LoginMaterial>,
}

/// A tenant that admitted a client, and what checking its password left.
type Checked = (Arc<Tenant>, Arc<TenantProfile>, Option<LoginMaterial>);

/// Routes, admits and authenticates a client.
pub async fn admit(
    router: &Router,
    auth: &Authenticator,
    client: &mut Stream,
    peer: SocketAddr,
    startup: &mut StartupMessage,
    slot: &mut ClientSlot,
) -> Result<Admitted, SessionError> {
    let sni = client.sni().map(str::to_owned);
    let user = startup.get("user").map(str::to_owned);
    let named = match router.resolver.resolve(sni.as_deref(), &mut startup.params) {
        Ok(resolved) => Some(resolved.tenant),
        // Only where the password travels encrypted may it carry the tenant's name.
        Err(ResolveError::NotNamed)
            if router.resolver.routes_by_password() && (client.is_tls() || client.is_tunnel()) =>
        {
            None
        }
        Err(e) => return Err(e.into()),
    };
    let (tenant, profile, material) = match named {
        Some(id) => {
            authenticate_named(router, auth, client, peer, &id, user.as_deref(), slot).await?
        }
        None => {
            let routed = route_by_password(router, auth, client, peer, user.as_deref(), slot);
            tokio::time::timeout(auth.timeout, routed)
                .await
                .map_err(|_| SessionError::AuthTimeout)??
        }
    };
    Ok(Admitted {
        tenant,
        profile,
        user,
        material,
    })
}

/// Admits and authenticates a client whose startup named tenant `id`.
async fn authenticate_named(
    router: &Router,
    auth: &Authenticator,
    client: &mut Stream,
    peer: SocketAddr,
    id: &TenantId,
    user: Option<&str>,
    slot: &mut ClientSlot,
) -> Result<Checked, SessionError> {
    tracing::Span::current().record("tenant", id.as_str());
    let Some((tenant, profile)) = router.admit(id, peer) else {
        let refusal = router.refusal(id);
        return Err(auth
            .refuse_unknown_tenant(&refusal, client, peer, id, user, slot)
            .await);
    };
    slot.claim_tenant(&tenant.id, profile.max_clients)
        .map_err(SessionError::Full)?;
    let material = match profile.gateway_credentials() {
        Some(source) => {
            let user = user.ok_or(SessionError::NoUser)?;
            let source = source.as_ref();
            let login = auth.authenticate(client, peer, &tenant.id, source, user, slot);
            let material = tokio::time::timeout(auth.timeout, login)
                .await
                .map_err(|_| SessionError::AuthTimeout)??;
            // Proven: from here on a wait (for a wake) is no reason to be evicted.
            slot.logged_in();
            Some(material)
        }
        None => None,
    };
    Ok((tenant, profile, material))
}

/// Admits and authenticates a client that named no tenant but may name it in its password
/// (`endpoint=<tenant>;<password>` or `endpoint=<tenant>$<password>`, the `password` rule): asks
/// for the password in the clear (the link is encrypted), then checks the rest of it against
/// the tenant's credentials, as Neon does for clients without SNI.
async fn route_by_password(
    router: &Router,
    auth: &Authenticator,
    client: &mut Stream,
    peer: SocketAddr,
    user: Option<&str>,
    slot: &mut ClientSlot,
) -> Result<Checked, SessionError> {
    let user = user.ok_or(SessionError::NoUser)?;
    let password = auth.ask_cleartext_password(client).await?;
    let Some((id, password)) = tenant_in_password(&password) else {
        return Err(SessionError::Route(ResolveError::NotNamed));
    };
    tracing::Span::current().record("tenant", id.as_str());
    let Some((tenant, profile)) = router.admit(&id, peer) else {
        let refusal = router.refusal(&id);
        return Err(auth
            .refuse_unknown_password(&refusal, peer, &id, user, password)
            .await);
    };
    slot.claim_tenant(&tenant.id, profile.max_clients)
        .map_err(SessionError::Full)?;
    let Some(source) = profile.gateway_credentials() else {
        return Err(SessionError::PasswordRouteNeedsGateway(tenant.id.clone()));
    };
    let checked = auth
        .check_password(peer, &tenant.id, source.as_ref(), user, password)
        .await?;
    let material = auth.accept(client, checked).await?;
    slot.logged_in();
    Ok((tenant, profile, Some(material)))
}
