//! Accepting client connections and carrying each through the journey:
//! negotiate → route → connect → login → relay.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pgwake_protocol::backend::backend_key_data;
use pgwake_routing::backend::LocalBackend;
use pgwake_routing::resolver::tenant_in_password;
use pgwake_routing::{
    ResolveError, Tenant, TenantDirectory, TenantId, TenantResolver, WakeClaim, WakeCoordinator,
};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::admit::AccessList;
use crate::auth::CredentialSource;
use crate::auth::NoUsers;
use crate::auth::backend_login::OnBehalf;
use crate::auth::client::{LoginMaterial, authenticate_client};
use crate::auth::password::PasswordChecker;
use crate::auth::throttle::Throttle;
use crate::cancel::{CancelMap, forward_cancel};
use crate::capacity::{Capacity, ClientSlot};
use crate::config::{AuthMode, BackendTls, Limits, UnknownTenant};
use crate::connect::{BackendAuth, BackendLink, connect, login};
use crate::error::SessionError;
use crate::metrics::Metrics;
use crate::negotiate::{NegotiateSettings, Negotiated, negotiate};
use crate::reuse::{Returnable, ReuseKey};
use crate::stream::Stream;
use crate::tls::ServerTls;

/// ReadyForQuery, idle: a kept backend connection is reset and outside any transaction.
const READY_IDLE: [u8; 6] = [b'Z', 0, 0, 0, 5, b'I'];

/// How one tenant's connections are admitted and authenticated.
pub struct TenantPolicy {
    /// Client networks allowed and denied.
    pub access: AccessList,
    /// Who checks passwords.
    pub auth: AuthMode,
    /// Where users come from, for gateway authentication.
    pub credentials: Option<Arc<dyn CredentialSource>>,
    /// Client connections the tenant may hold at once (`None`: only the gateway's cap).
    pub max_clients: Option<usize>,
}

/// Tenants' policies, shared with tenant discovery, which adds and removes them.
pub type Policies = Arc<RwLock<HashMap<TenantId, Arc<TenantPolicy>>>>;

/// Everything a connection needs, shared by all of them.
pub struct Gateway {
    /// Per-tenant admission and authentication; discovered tenants come and go.
    pub policies: Policies,
    /// Failed-authentication throttle.
    pub throttle: Throttle,
    /// Key for mock SCRAM salts of unknown users.
    pub mock_key: Vec<u8>,
    /// Cap on SCRAM iterations when deriving backend keys from a password.
    pub max_backend_iterations: u32,
    /// The gateway's TLS identity (for channel binding).
    pub server_tls: Option<Arc<ServerTls>>,
    /// Negotiation settings (TLS, plaintext policy, startup size).
    pub negotiate: NegotiateSettings,
    /// Tenant rules.
    pub resolver: TenantResolver,
    /// How clients naming a tenant that does not exist (or is forbidden to them) are answered.
    pub unknown_tenant: UnknownTenant,
    /// How long a client is held while its backend answers `57P03` (the wake timeout).
    pub not_ready_wait: Duration,
    /// Configured and discovered tenants.
    pub directory: Arc<TenantDirectory>,
    /// Wakes tenants and holds connections while they wake.
    pub coordinator: Arc<WakeCoordinator>,
    /// Tell authenticated clients that must wait that their database is waking.
    pub wake_notice: bool,
    /// The local backend, when any tenant uses it (stopped with the gateway).
    pub local: Option<Arc<LocalBackend>>,
    /// The pool backend, when any pool class is configured (its replenisher runs with the
    /// gateway).
    pub pool: Option<Arc<pgwake_routing::backend::PoolBackend>>,
    /// TLS mode towards each tenant's backend, where it differs from `default_backend_tls`.
    pub backend_tls: HashMap<TenantId, BackendTls>,
    /// TLS mode towards backends of tenants not in `backend_tls` (`[backend] tls`).
    pub default_backend_tls: BackendTls,
    /// Backend connection settings.
    pub link: BackendLink,
    /// Gateway-issued cancel keys.
    pub cancels: Arc<CancelMap>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Timeouts and sizes.
    pub limits: Limits,
    /// Open client connections against their caps.
    pub capacity: Arc<Capacity>,
    /// Fires when sessions must end (grace period over).
    pub terminate: CancellationToken,
    /// Cleartext password checks (HTTP and WebSocket logins).
    pub passwords: PasswordChecker,
    /// Parking and reviving sessions (token keys and `[revival]`).
    pub revival: Option<Arc<crate::session::Revival>>,
    /// Backend connections kept for reuse (`[reuse]`), when enabled.
    pub reuse: Option<Arc<crate::reuse::Reuse>>,
}

impl Gateway {
    /// How this tenant's connections are admitted and authenticated.
    pub fn policy(&self, tenant: &TenantId) -> Option<Arc<TenantPolicy>> {
        let policies = self.policies.read().unwrap_or_else(|p| p.into_inner());
        policies.get(tenant).cloned()
    }

    /// TLS mode towards this tenant's backend.
    pub fn backend_tls_for(&self, tenant: &TenantId) -> BackendTls {
        self.backend_tls
            .get(tenant)
            .copied()
            .unwrap_or(self.default_backend_tls)
    }
}

/// A client connection's place in the counts (metrics and caps) for its whole life.
pub(crate) struct ActiveGuard {
    metrics: Arc<Metrics>,
    /// Its place against the connection caps.
    pub(crate) slot: ClientSlot,
}

impl ActiveGuard {
    /// Counts a client connection as accepted and active until the guard drops; when too many
    /// connections are still logging in, the oldest of them is ended to make room.
    pub(crate) fn new(gw: &Gateway) -> ActiveGuard {
        gw.metrics.connections_accepted.inc();
        gw.metrics.connections_active.inc();
        let (slot, evicted) = gw.capacity.open();
        if evicted {
            gw.metrics.error("login_evicted");
        }
        ActiveGuard {
            metrics: gw.metrics.clone(),
            slot,
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.metrics.connections_active.dec();
        self.metrics.connections_closed.inc();
    }
}

/// How often a failing accept is logged; the failures in between are counted in the next line.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of file descriptors: wait for some to be freed).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The next accepted connection of `listener` (named `what` in logs), or `None` once `stop`
/// fires; failed accepts are logged and retried after a pause.
pub(crate) async fn accept_next(
    listener: &TcpListener,
    stop: &CancellationToken,
    what: &str,
) -> Option<(TcpStream, SocketAddr)> {
    let mut last_logged: Option<Instant> = None;
    let mut unlogged = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return None,
            a = listener.accept() => a,
        };
        match accepted {
            Ok(a) => return Some(a),
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning, and log
                // once per interval instead of per failure.
                if last_logged.is_none_or(|t| t.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                    warn!(listener = what, error = %e, failures_since_last_line = unlogged, "accept failed");
                    last_logged = Some(Instant::now());
                    unlogged = 0;
                } else {
                    unlogged += 1;
                }
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

/// Accepts connections until `stop` fires; each runs as a task in `tasks`.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    tasks: TaskTracker,
    stop: CancellationToken,
) {
    while let Some((tcp, peer)) = accept_next(&listener, &stop, "postgres").await {
        let gw = gateway.clone();
        let mut guard = ActiveGuard::new(&gw);
        let span = info_span!("conn", %peer, tenant = tracing::field::Empty);
        tasks.spawn(
            async move {
                handle(tcp, peer, &gw, &mut guard.slot).await;
            }
            .instrument(span),
        );
    }
    info!("listener stopped accepting");
}

async fn handle(tcp: TcpStream, peer: SocketAddr, gw: &Gateway, slot: &mut ClientSlot) {
    let accepted_at = Instant::now();
    let _ = tcp.set_nodelay(true);
    let negotiated = tokio::select! {
        n = negotiate(tcp, &gw.negotiate, accepted_at + gw.limits.startup_timeout) => n,
        _ = gw.terminate.cancelled() => return,
        _ = slot.evicted() => {
            debug!("connection ended during negotiation to make room for newer ones");
            return;
        }
    };
    match negotiated {
        Ok(Negotiated::Cancel { key, stream }) => cancel(gw, &key, stream).await,
        Ok(Negotiated::Session { stream, startup }) => {
            run_session(gw, stream, peer, startup, accepted_at, slot).await
        }
        Err((stream, err)) => fail(gw, stream, err).await,
    }
}

/// Forwards a cancel request to the backend its gateway-issued key maps to, then closes the
/// client's connection properly (TLS close_notify: libpq 17 reports a cancel whose TLS session
/// just breaks off as failed).
pub(crate) async fn cancel(gw: &Gateway, key: &pgwake_protocol::CancelKey, mut client: Stream) {
    match gw.cancels.lookup(key) {
        Some(target) => {
            gw.metrics.cancels_forwarded.inc();
            if let Err(e) = forward_cancel(&target, gw.limits.connect_timeout).await {
                warn!(error = %e, backend = %target.endpoint, "cancel not delivered");
            }
        }
        None => debug!("cancel request with an unknown key dropped"),
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), client.shutdown()).await;
}

/// Carries a client stream whose startup message has arrived through login and the relay, over
/// TCP, TLS or a tunnel alike.
pub(crate) async fn run_session(
    gw: &Gateway,
    mut client: Stream,
    peer: SocketAddr,
    startup: pgwake_protocol::StartupMessage,
    accepted_at: Instant,
    slot: &mut ClientSlot,
) {
    if let Err(full) = slot.check_gateway() {
        return fail(gw, Some(client), SessionError::Full(full)).await;
    }
    let evicted = slot.eviction();
    let session = tokio::select! {
        // Boxed: the login's state is freed once it is done instead of sizing every session's
        // task (parked sessions should cost little).
        r = Box::pin(open_session(gw, &mut client, peer, startup, accepted_at, slot)) => r,
        _ = gw.terminate.cancelled() => Err(SessionError::ShuttingDown),
        _ = evicted.cancelled() => Err(SessionError::Evicted),
    };
    slot.logged_in();
    let backend = match session {
        Ok(s) => s,
        Err(err) => return fail(gw, Some(client), err).await,
    };
    gw.metrics
        .startup_duration
        .observe(accepted_at.elapsed().as_secs_f64());
    debug!(peer = %peer, "session ready");
    let attached = crate::session::Attached {
        stream: backend.stream,
        claim: backend.claim,
        endpoint: backend.endpoint,
    };
    crate::session::run(
        gw,
        &mut client,
        attached,
        backend.cancel,
        backend.revivable,
        backend.returnable,
    )
    .await;
}

/// A backend connection that finished login, and the cancel key the client holds for it.
struct BackendSession {
    stream: Stream,
    cancel: Option<crate::cancel::CancelRegistration>,
    claim: WakeClaim,
    endpoint: pgwake_routing::Endpoint,
    /// Set for sessions the gateway can log back in (it authenticated the client).
    revivable: Option<crate::session::Revivable>,
    /// Set for sessions whose backend connection may be kept for reuse when the client leaves.
    returnable: Option<Returnable>,
}

async fn open_session(
    gw: &Gateway,
    client: &mut Stream,
    peer: SocketAddr,
    mut startup: pgwake_protocol::StartupMessage,
    accepted_at: Instant,
    slot: &mut ClientSlot,
) -> Result<BackendSession, SessionError> {
    if startup.needs_negotiation() {
        let msg =
            pgwake_protocol::backend::negotiate_protocol_version(startup.unsupported_options());
        client
            .write_all(&msg)
            .await
            .map_err(SessionError::ClientIo)?;
    }
    let user = startup.get("user").map(str::to_owned);
    let (tenant, material) = admit(gw, client, peer, &mut startup, user.as_deref(), slot).await?;
    // Only a client the gateway authenticated may learn that its database is waking.
    let admission = wake(gw, client, &tenant.id, material.is_some() && gw.wake_notice).await?;
    let endpoint = admission.endpoint;
    let params: Vec<(String, String)> = startup.forwardable_params().cloned().collect();
    let revivable = match (&gw.revival, &material, &user) {
        (Some(rv), Some(m), Some(u)) if rv.config.enabled => Some(crate::session::Revivable::seal(
            rv, &tenant.id, u, &params, m,
        )),
        _ => None,
    };
    // Only clients the gateway authenticated share backend connections: the gateway logged the
    // connection in itself, as the same user with the same startup parameters.
    let reuse = gw.reuse.as_ref().filter(|_| material.is_some());
    let key = reuse.map(|_| ReuseKey::new(&tenant.id, &params));
    if let (Some(reuse), Some(key)) = (reuse, &key)
        && let Some(taken) = reuse.take(key, &endpoint, &gw.metrics)
    {
        let (stream, cancel, returnable) = greet_on_kept(gw, client, taken).await?;
        debug!(elapsed_ms = accepted_at.elapsed().as_millis() as u64, backend = %endpoint, "kept backend connection reused");
        return Ok(BackendSession {
            stream,
            cancel: Some(cancel),
            claim: admission.claim,
            endpoint,
            revivable,
            returnable: Some(returnable),
        });
    }
    let who = material.as_ref().zip(user.as_deref());
    let (stream, cancel, returnable) =
        log_in_fresh(gw, client, &tenant.id, &endpoint, &params, who, key).await?;
    debug!(elapsed_ms = accepted_at.elapsed().as_millis() as u64, backend = %endpoint, "login relayed");
    Ok(BackendSession {
        stream,
        cancel,
        claim: admission.claim,
        endpoint,
        revivable,
        returnable,
    })
}

/// Routes, admits and authenticates a client: its tenant, and what the gateway's check of its
/// password left (none under passthrough).
async fn admit(
    gw: &Gateway,
    client: &mut Stream,
    peer: SocketAddr,
    startup: &mut pgwake_protocol::StartupMessage,
    user: Option<&str>,
    slot: &mut ClientSlot,
) -> Result<Admitted, SessionError> {
    let sni = client.sni().map(str::to_owned);
    let named = match gw.resolver.resolve(sni.as_deref(), &mut startup.params) {
        Ok(resolved) => Some(resolved.tenant),
        // Only where the password travels encrypted may it carry the tenant's name.
        Err(ResolveError::NotNamed)
            if gw.resolver.routes_by_password() && (client.is_tls() || client.is_tunnel()) =>
        {
            None
        }
        Err(e) => return Err(e.into()),
    };
    match named {
        Some(id) => authenticate_named(gw, client, peer, &id, user, slot).await,
        None => {
            let routed = route_by_password(gw, client, peer, user, slot);
            let (tenant, material) = tokio::time::timeout(gw.limits.auth_timeout, routed)
                .await
                .map_err(|_| SessionError::AuthTimeout)??;
            Ok((tenant, Some(material)))
        }
    }
}

/// Waits until `tenant` accepts logins, telling the client first when `notice` is set. A client
/// that hangs up meanwhile leaves the queue at once, instead of holding a place and getting a
/// backend connection nobody reads.
async fn wake(
    gw: &Gateway,
    client: &mut Stream,
    tenant: &TenantId,
    notice: bool,
) -> Result<pgwake_routing::Admission, SessionError> {
    if notice && !gw.coordinator.is_awake(tenant) {
        let notice = pgwake_protocol::ErrorMessage::notice(
            "00000",
            format!("waking database for tenant \"{tenant}\""),
        );
        client
            .write_all(&notice.to_bytes())
            .await
            .map_err(SessionError::ClientIo)?;
        client.flush().await.map_err(SessionError::ClientIo)?;
    }
    tokio::select! {
        a = gw.coordinator.ensure_awake(tenant) => {
            a.map_err(|e| SessionError::Wake(tenant.clone(), e))
        }
        _ = client.hung_up() => Err(SessionError::ClientIo(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the client closed the connection while its database was waking",
        ))),
    }
}

/// Hands a kept backend connection to the client: the parameters the backend once sent, a
/// fresh cancel key for it, and ReadyForQuery.
async fn greet_on_kept(
    gw: &Gateway,
    client: &mut Stream,
    taken: crate::reuse::Taken,
) -> Result<(Stream, crate::cancel::CancelRegistration, Returnable), SessionError> {
    let cancel = gw.cancels.register(taken.returnable.target.clone());
    let mut hello = Vec::with_capacity(taken.returnable.parameters.len() + 32);
    hello.extend_from_slice(&taken.returnable.parameters);
    hello.extend_from_slice(&backend_key_data(cancel.pid, cancel.secret));
    hello.extend_from_slice(&READY_IDLE);
    client
        .write_all(&hello)
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)?;
    Ok((taken.stream, cancel, taken.returnable))
}

/// What admission found for a connection: its tenant, and what the gateway's own
/// authentication of the client left (none under passthrough).
type Admitted = (Arc<Tenant>, Option<LoginMaterial>);

/// The tenant `id`, when it exists and admits `peer`.
pub(crate) fn admitted_tenant(
    gw: &Gateway,
    id: &TenantId,
    peer: SocketAddr,
) -> Option<(Arc<Tenant>, Arc<TenantPolicy>)> {
    // A denied address learns no more than about a tenant that does not exist.
    gw.directory
        .get(id)
        .and_then(|t| gw.policy(&t.id).map(|p| (t, p)))
        .filter(|(_, p)| p.access.permits(peer.ip()))
}

/// Admits and authenticates a client whose startup named tenant `id`.
async fn authenticate_named(
    gw: &Gateway,
    client: &mut Stream,
    peer: SocketAddr,
    id: &TenantId,
    user: Option<&str>,
    slot: &mut ClientSlot,
) -> Result<Admitted, SessionError> {
    tracing::Span::current().record("tenant", id.as_str());
    let Some((tenant, policy)) = admitted_tenant(gw, id, peer) else {
        return Err(refuse_unknown_tenant(gw, client, peer, id, user).await);
    };
    slot.claim_tenant(&tenant.id, policy.max_clients)
        .map_err(SessionError::Full)?;
    // Authenticate first, then wake: a wrong password never starts a database.
    let material = match (policy.auth, &policy.credentials) {
        (AuthMode::Gateway, Some(source)) => {
            let user = user.ok_or(SessionError::NoUser)?;
            let login = authenticate(gw, client, peer, &tenant.id, source.as_ref(), user);
            let material = tokio::time::timeout(gw.limits.auth_timeout, login)
                .await
                .map_err(|_| SessionError::AuthTimeout)??;
            // Proven: from here on a wait (for a wake) is no reason to be evicted.
            slot.logged_in();
            Some(material)
        }
        _ => None,
    };
    Ok((tenant, material))
}

/// Admits and authenticates a client that named no tenant but may name it in its password
/// (`endpoint=<tenant>;<password>` or `endpoint=<tenant>$<password>`, the `password` rule): asks
/// for the password in the clear (the link is encrypted), then checks the rest of it against
/// the tenant's credentials, as Neon does for clients without SNI.
async fn route_by_password(
    gw: &Gateway,
    client: &mut Stream,
    peer: SocketAddr,
    user: Option<&str>,
    slot: &mut ClientSlot,
) -> Result<(Arc<Tenant>, LoginMaterial), SessionError> {
    let user = user.ok_or(SessionError::NoUser)?;
    let password = ask_cleartext_password(gw, client).await?;
    let Some((id, password)) = tenant_in_password(&password) else {
        return Err(SessionError::Route(ResolveError::NotNamed));
    };
    tracing::Span::current().record("tenant", id.as_str());
    let Some((tenant, policy)) = admitted_tenant(gw, &id, peer) else {
        return Err(refuse_unknown_password(gw, peer, &id, user, password).await);
    };
    slot.claim_tenant(&tenant.id, policy.max_clients)
        .map_err(SessionError::Full)?;
    let source = match (policy.auth, &policy.credentials) {
        (AuthMode::Gateway, Some(source)) => source.clone(),
        _ => return Err(SessionError::PasswordRouteNeedsGateway(tenant.id.clone())),
    };
    let material = check_password(gw, peer, &tenant.id, source.as_ref(), user, password).await?;
    client
        .write_all(&pgwake_protocol::auth::authentication_ok())
        .await
        .map_err(SessionError::ClientIo)?;
    slot.logged_in();
    Ok((tenant, material))
}

/// Pause between logins to a backend that answered `57P03`.
const NOT_READY_PAUSE: Duration = Duration::from_millis(50);

/// Connects and logs in to the tenant's backend, as the gateway for `who` or relaying the
/// client's own login; returns the connection, the client's cancel key, and (when `key` says
/// the connection may be kept for reuse) what it takes to hand it to a later client. While the
/// backend answers `57P03` before the client has seen anything of the login (starting up, or in
/// crash recovery) the client is held and the login tried again, as during a wake, for up to
/// `wake.wake_timeout`.
async fn log_in_fresh(
    gw: &Gateway,
    client: &mut Stream,
    tenant: &TenantId,
    endpoint: &pgwake_routing::Endpoint,
    params: &[(String, String)],
    who: Option<(&LoginMaterial, &str)>,
    key: Option<ReuseKey>,
) -> Result<
    (
        Stream,
        Option<crate::cancel::CancelRegistration>,
        Option<Returnable>,
    ),
    SessionError,
> {
    let mode = gw.backend_tls_for(tenant);
    let hold_until = Instant::now() + gw.not_ready_wait;
    let mut parameters = key.as_ref().map(|_| Vec::new());
    loop {
        let connect_deadline = Instant::now() + gw.limits.connect_timeout;
        let mut stream = connect(&gw.link, endpoint, mode, connect_deadline).await?;
        let backend_auth = match who {
            Some((m, u)) => BackendAuth::OnBehalf(OnBehalf::new(u, m, gw.max_backend_iterations)),
            None => BackendAuth::Relay,
        };
        if let Some(p) = parameters.as_mut() {
            p.clear();
        }
        let exchange = login(
            &gw.link,
            client,
            &mut stream,
            params,
            endpoint,
            &gw.cancels,
            backend_auth,
            parameters.as_mut(),
        );
        let login = tokio::time::timeout(gw.limits.login_timeout, exchange)
            .await
            .unwrap_or(Err(SessionError::LoginTimeout));
        match login {
            Ok(cancel) => {
                let returnable = returnable(gw, cancel.as_ref(), key, parameters);
                return Ok((stream, cancel, returnable));
            }
            Err(SessionError::BackendNotReady(why)) if Instant::now() < hold_until => {
                debug!(reason = %why, "backend not ready; holding the client");
                tokio::select! {
                    _ = tokio::time::sleep(NOT_READY_PAUSE) => {}
                    _ = client.hung_up() => {
                        return Err(SessionError::ClientIo(std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            "the client closed the connection while its database was recovering",
                        )));
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// What a later client needs to take over a fresh connection logged in under `key`: the
/// backend's real cancel key and the ParameterStatus messages of its login.
fn returnable(
    gw: &Gateway,
    cancel: Option<&crate::cancel::CancelRegistration>,
    key: Option<ReuseKey>,
    parameters: Option<Vec<u8>>,
) -> Option<Returnable> {
    let target = cancel.and_then(|reg| {
        gw.cancels.lookup(&pgwake_protocol::CancelKey {
            pid: reg.pid,
            secret: bytes::Bytes::copy_from_slice(&reg.secret.to_be_bytes()),
        })
    })?;
    Some(Returnable {
        key: key?,
        parameters: parameters?.into(),
        target,
    })
}

/// The answer to a client naming a tenant that does not exist or is forbidden to it: by default
/// the very exchange and answer of a wrong password (`routing.unknown_tenant`).
async fn refuse_unknown_tenant(
    gw: &Gateway,
    client: &mut Stream,
    peer: SocketAddr,
    tenant: &TenantId,
    user: Option<&str>,
) -> SessionError {
    let reveal = SessionError::UnknownTenant(tenant.to_string());
    if gw.unknown_tenant == UnknownTenant::Reveal {
        return reveal;
    }
    let Some(user) = user else {
        return SessionError::NoUser;
    };
    let login = authenticate(gw, client, peer, tenant, &NoUsers, user);
    match tokio::time::timeout(gw.limits.auth_timeout, login).await {
        Err(_) => SessionError::AuthTimeout,
        Ok(Err(e)) => e,
        // Nobody logs in against no users; refuse all the same.
        Ok(Ok(_)) => reveal,
    }
}

/// Like [`refuse_unknown_tenant`], for a client whose cleartext password is already in hand
/// (`/sql`, a tenant named in the password): by default the work and answer of a wrong one.
pub(crate) async fn refuse_unknown_password(
    gw: &Gateway,
    peer: SocketAddr,
    tenant: &TenantId,
    user: &str,
    password: &str,
) -> SessionError {
    if gw.unknown_tenant == UnknownTenant::PasswordFailed
        && let Err(e) = check_password(gw, peer, tenant, &NoUsers, user, password).await
    {
        return e;
    }
    SessionError::UnknownTenant(tenant.to_string())
}

/// Checks the client's password at the gateway, with the throttle around it.
async fn authenticate(
    gw: &Gateway,
    client: &mut Stream,
    peer: SocketAddr,
    tenant: &TenantId,
    source: &dyn CredentialSource,
    user: &str,
) -> Result<LoginMaterial, SessionError> {
    if let Some(wait) = gw.throttle.blocked_for(peer.ip(), tenant, user) {
        gw.metrics.auth_attempt("throttled");
        return Err(SessionError::Throttled(wait));
    }
    if client.is_tunnel() {
        // WebSocket clients (the serverless driver) send their password in the clear inside
        // the tunnel, often pipelined right behind the startup message.
        let password = ask_cleartext_password(gw, client).await?;
        let material = check_password(gw, peer, tenant, source, user, &password).await?;
        client
            .write_all(&pgwake_protocol::auth::authentication_ok())
            .await
            .map_err(SessionError::ClientIo)?;
        return Ok(material);
    }
    let credential = source.lookup(user).await.map_err(|e| {
        gw.metrics.auth_attempt("error");
        SessionError::AuthUnavailable(e.to_string())
    })?;
    let channel_binding = match (&gw.server_tls, client.is_tls()) {
        (Some(tls), true) => tls.channel_binding(client.sni()),
        _ => None,
    };
    let reserve = || {
        gw.throttle
            .reserve(peer.ip(), tenant, user)
            .map_err(SessionError::Throttled)
    };
    let result = authenticate_client(
        client,
        user,
        credential,
        channel_binding,
        &gw.mock_key,
        gw.link.max_client_message,
        reserve,
    )
    .await;
    attempt_done(gw, peer, tenant, source, user, &result);
    result
}

/// Asks the client for its password in the clear (only over an encrypted link) and reads it.
async fn ask_cleartext_password(gw: &Gateway, client: &mut Stream) -> Result<String, SessionError> {
    client
        .write_all(&pgwake_protocol::auth::authentication_cleartext_password())
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)?;
    read_cleartext_password(client, gw.link.max_client_message).await
}

/// Reads a PasswordMessage holding a cleartext password.
async fn read_cleartext_password(client: &mut Stream, max: usize) -> Result<String, SessionError> {
    let m = crate::connect::read_password_message(client, max).await?;
    let text = pgwake_protocol::auth::parse_password_message(m.body())
        .map_err(|e| SessionError::ClientProtocol(e.to_string()))?;
    String::from_utf8(text.to_vec())
        .map_err(|_| SessionError::ClientProtocol("password is not valid UTF-8".into()))
}

/// Checks a cleartext password for `user` of `tenant` against the tenant's credential source,
/// with the same throttle and metrics as a SCRAM login.
pub(crate) async fn check_password(
    gw: &Gateway,
    peer: SocketAddr,
    tenant: &TenantId,
    source: &dyn CredentialSource,
    user: &str,
    password: &str,
) -> Result<LoginMaterial, SessionError> {
    if let Some(wait) = gw.throttle.blocked_for(peer.ip(), tenant, user) {
        gw.metrics.auth_attempt("throttled");
        return Err(SessionError::Throttled(wait));
    }
    let credential = source.lookup(user).await.map_err(|e| {
        gw.metrics.auth_attempt("error");
        SessionError::AuthUnavailable(e.to_string())
    })?;
    let result = match gw.throttle.reserve(peer.ip(), tenant, user) {
        Err(wait) => Err(SessionError::Throttled(wait)),
        Ok(()) => match credential {
            Some(c) => gw.passwords.check(tenant, user, c, password).await,
            // The same key derivation as for a known user, so timing tells nothing.
            None => {
                gw.passwords
                    .check_unknown(&gw.mock_key, user, password)
                    .await;
                None
            }
        }
        .ok_or_else(|| SessionError::AuthFailed(user.to_owned())),
    };
    attempt_done(gw, peer, tenant, source, user, &result);
    result
}

/// Counts an authentication attempt's outcome and tells the throttle and the credential source.
fn attempt_done<T>(
    gw: &Gateway,
    peer: SocketAddr,
    tenant: &TenantId,
    source: &dyn CredentialSource,
    user: &str,
    result: &Result<T, SessionError>,
) {
    match result {
        Ok(_) => {
            gw.metrics.auth_attempt("ok");
            gw.throttle.success(peer.ip(), tenant, user);
        }
        Err(SessionError::AuthFailed(_)) => {
            gw.metrics.auth_attempt("failed");
            source.failed(user);
        }
        Err(SessionError::Throttled(_)) => gw.metrics.auth_attempt("throttled"),
        Err(_) => gw.metrics.auth_attempt("error"),
    }
}

/// Counts, logs and (where possible) tells the client why its connection ends.
pub(crate) async fn fail(gw: &Gateway, stream: Option<Stream>, err: SessionError) {
    gw.metrics.error(err.kind());
    match &err {
        SessionError::ClientIo(_) | SessionError::LoginRefused => {
            debug!(error = %err, "connection ended")
        }
        _ => info!(error = %err, kind = err.kind(), "connection refused"),
    }
    let Some(mut stream) = stream else {
        return;
    };
    // Closed properly even without a message: TLS close_notify, a WebSocket close frame.
    let write = async {
        if let Some(msg) = err.client_message() {
            stream.write_all(&msg.to_bytes()).await?;
            stream.flush().await?;
        }
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}
