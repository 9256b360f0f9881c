//! Logging a parked or moving session back in: its revival token holds the login material and
//! startup parameters; the tenant is woken if needed, a detached login made through the
//! connector, the snapshot restored and the session's cancel key pointed at the new backend.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pgwake_protocol::frontend;
use pgwake_protocol::revival::{
    LoginSecrets, RevivalClaims, RevivalError, RevivalKeys, RevivalToken,
};
use pgwake_protocol::scram::ScramSecret;
use pgwake_protocol::sqlstate;
use pgwake_routing::{Endpoint, TenantId, WakeError};
use tokio::time::{Instant, timeout_at};
use tracing::debug;

use super::snapshot::{Restored, Snapshot, StateError, restore};
use super::{Attached, Sessions};
use crate::auth::{Credential, LoginMaterial};
use crate::cancel::CancelRegistration;
use crate::config::{BackendTls, RevivalConfig};
use crate::error::SessionError;
use crate::stream::Stream;
use crate::upstream::{BackendSlot, OpenError, Returnable, Slot};

/// Pause between attempts while a backend restarts (connection refused, `57P03`).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The gateway's revival settings and token keys.
pub struct Revival {
    /// Token keys.
    pub keys: RevivalKeys,
    /// `[revival]`.
    pub config: RevivalConfig,
}

/// What a session needs to be logged back in: who it is and its sealed token.
pub struct Revivable {
    /// The session's tenant.
    pub tenant: TenantId,
    /// The user it logged in as.
    pub user: String,
    /// TLS towards the tenant's backend.
    pub tls: BackendTls,
    /// Sealed login material and startup parameters.
    pub token: RevivalToken,
}

impl Revivable {
    /// Seals what a gateway-authenticated login left into a token.
    pub fn seal(
        revival: &Revival,
        (tenant, user, tls): (&TenantId, &str, BackendTls),
        params: &[(String, String)],
        material: &LoginMaterial,
    ) -> Revivable {
        let database = params
            .iter()
            .find(|(k, _)| k == "database")
            .map(|(_, v)| v.as_str())
            .unwrap_or(user);
        let claims = RevivalClaims::new(
            tenant.as_str(),
            user,
            database,
            params.to_vec(),
            LoginSecrets {
                keys: Some(material.keys.clone()),
                derived: material.credential.remembered_keys(),
                password: material.credential.password.clone(),
            },
            SystemTime::now(),
            revival.config.token_ttl,
        );
        Revivable {
            tenant: tenant.clone(),
            user: user.to_owned(),
            tls,
            token: revival.keys.seal(&claims),
        }
    }
}

/// Why a revival failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReviveError {
    #[error("revival token refused: {0}")]
    Token(#[from] RevivalError),
    #[error("waking the database: {0}")]
    Wake(WakeError),
    #[error("{0}")]
    Connect(SessionError),
    #[error("login refused: {} {}", .0.code, .0.message)]
    Login(frontend::ErrorFields),
    #[error("restoring the session state: {0}")]
    Restore(StateError),
    #[error("not finished within {0:?}")]
    Timeout(Duration),
}

impl ReviveError {
    /// True when the backend may just be restarting.
    fn retryable(&self) -> bool {
        match self {
            ReviveError::Connect(SessionError::BackendUnreachable { .. }) => true,
            ReviveError::Login(f) => f.code == sqlstate::CANNOT_CONNECT_NOW,
            _ => false,
        }
    }
}

/// The login material a token holds.
fn material(secrets: &LoginSecrets) -> Option<LoginMaterial> {
    let keys = secrets.keys.clone()?;
    let verifier = ScramSecret {
        iterations: keys.iterations,
        salt: keys.salt.clone(),
        stored_key: keys.client_key.stored_key(),
        server_key: keys.server_key.clone(),
    };
    let credential = Credential::new(verifier, secrets.password.clone());
    for k in &secrets.derived {
        credential.remember_keys(k.clone());
    }
    Some(LoginMaterial {
        keys,
        credential: Arc::new(credential),
    })
}

/// Logs the session in to its tenant again (waking it if needed, retrying while the backend
/// restarts), restores its state and points its cancel key at the new backend.
pub(super) async fn revive(
    gw: &Sessions,
    rv: &Revival,
    who: &mut Revivable,
    snap: &Snapshot,
    cancel: Option<&CancelRegistration>,
) -> Result<(Attached, Option<Returnable>, Restored), ReviveError> {
    let limit = rv.config.revive_timeout;
    let deadline = Instant::now() + limit;
    let mut claims = rv
        .keys
        .open(&who.token, who.tenant.as_str(), SystemTime::now())?;
    let material = material(&claims.secrets).ok_or(RevivalError::Malformed)?;
    loop {
        let admission = timeout_at(deadline, gw.coordinator.ensure_awake(&who.tenant))
            .await
            .map_err(|_| ReviveError::Timeout(limit))?
            .map_err(ReviveError::Wake)?;
        let endpoint = admission.endpoint.clone();
        let restore = (snap, rv.config.restore_lock_wait);
        match attempt(
            gw,
            (&endpoint, who.tls),
            &claims,
            &material,
            restore,
            deadline,
        )
        .await
        {
            Ok((stream, returnable, slot, restored)) => {
                if let Some(reg) = cancel {
                    reg.retarget(returnable.target.clone());
                }
                // A fresh expiry: the token now proves a login that just worked.
                let now = SystemTime::now();
                let ttl = Duration::from_secs(claims.expires_at.saturating_sub(claims.issued_at));
                let fresh = RevivalClaims::new(
                    std::mem::take(&mut claims.tenant),
                    std::mem::take(&mut claims.user),
                    std::mem::take(&mut claims.database),
                    std::mem::take(&mut claims.params),
                    std::mem::take(&mut claims.secrets),
                    now,
                    ttl,
                );
                who.token = rv.keys.seal(&fresh);
                let attached = Attached {
                    stream,
                    slot,
                    claim: admission.claim,
                    endpoint,
                };
                return Ok((attached, Some(returnable), restored));
            }
            Err(e) if e.retryable() && Instant::now() + RETRY_PAUSE < deadline => {
                debug!(error = %e, "backend not ready for the revival yet; retrying");
                drop(admission);
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One try at a backend connection with the session's state: a kept connection for the same
/// tenant and startup parameters when there is one, else a fresh login under the tenant's cap.
async fn attempt(
    gw: &Sessions,
    (endpoint, tls): (&Endpoint, BackendTls),
    claims: &RevivalClaims,
    material: &LoginMaterial,
    (snap, lock_wait): (&Snapshot, Duration),
    deadline: Instant,
) -> Result<(Stream, Returnable, BackendSlot, Restored), ReviveError> {
    let tenant = TenantId::parse(&claims.tenant).map_err(|_| RevivalError::Malformed)?;
    let max = (gw.connector.max_message(), lock_wait);
    let slot = gw
        .connector
        .slot_for(&tenant, &claims.params, endpoint, deadline)
        .await
        .map_err(ReviveError::Connect)?;
    let slot = match slot {
        Slot::Kept(mut kept) => match restore(&mut kept.stream, snap, max, deadline).await {
            Ok(restored) => return Ok((kept.stream, kept.returnable, kept.slot, restored)),
            // The kept connection failed under the restore: a fresh login may not.
            Err(e) => {
                debug!(error = %e, "restoring on a kept connection failed");
                kept.slot
            }
        },
        Slot::Fresh(slot) => slot,
    };
    let who = (claims.user.as_str(), material);
    let opened = gw
        .connector
        .detached((endpoint, tls), &claims.params, who, deadline)
        .await;
    let mut detached = opened.map_err(|e| match e {
        OpenError::Session(e) => ReviveError::Connect(e),
        OpenError::Refused(body) => ReviveError::Login(frontend::error_fields(&body)),
    })?;
    let restored = restore(&mut detached.stream, snap, max, deadline)
        .await
        .map_err(ReviveError::Restore)?;
    let returnable = gw.connector.returnable(&tenant, &claims.params, &detached);
    Ok((detached.stream, returnable, slot, restored))
}
