//! Upstream: the one way to a logged-in backend connection. The [`Connector`] opens TCP and
//! TLS in the tenant's mode, logs in (relaying a passthrough login, greeting a client the
//! gateway authenticated, or detached for revivals and `/sql`), registers cancel keys and keeps
//! connections for reuse; every path that needs a backend goes through it.

mod cap;
pub mod connect;
mod login;
mod on_behalf;
pub mod pool;
pub mod reuse;
mod statements;

use std::sync::Arc;
use std::time::Duration;

use pgwake_protocol::auth::authentication_ok;
use pgwake_protocol::backend::backend_key_data;
use pgwake_routing::wake::{PinnedSession, PinnedSessions};
use pgwake_routing::{Endpoint, TenantId};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tracing::{debug, warn};

pub use cap::BackendSlot;
pub use connect::BackendLink;
pub use pool::{BackendConn, PoolError, PoolKey, PoolSettings, PoolStats, Pooled};
pub use reuse::Returnable;
pub use statements::{CacheLimits, Prepared};

use self::cap::Caps;
use self::login::{LoggedIn, ToClient, log_in};
use self::on_behalf::OnBehalf;
use self::pool::Pool;
use self::reuse::{Reuse, ReuseKey};
use crate::auth::LoginMaterial;
use crate::cancel::{CancelMap, CancelRegistration, CancelTarget};
use crate::config::{BackendTls, ReuseConfig};
use crate::error::SessionError;
use crate::metrics::Metrics;
use crate::stream::Stream;

/// ReadyForQuery, idle: a kept backend connection is reset and outside any transaction.
const READY_IDLE: [u8; 6] = [b'Z', 0, 0, 0, 5, b'I'];
/// Pause between logins to a backend that answered `57P03`.
const NOT_READY_PAUSE: Duration = Duration::from_millis(50);

/// Why a backend connection could not be opened without a client.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Connecting or logging in failed at the gateway's end, or the backend broke the protocol.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The backend refused the login with this ErrorResponse body (e.g. an unknown database).
    #[error("the backend refused the login")]
    Refused(Vec<u8>),
}

impl From<OpenError> for SessionError {
    fn from(e: OpenError) -> SessionError {
        match e {
            OpenError::Session(e) => e,
            OpenError::Refused(_) => SessionError::LoginRefused,
        }
    }
}

/// What the connector is built from.
pub struct ConnectorSettings {
    /// TCP, TLS and size settings.
    pub link: BackendLink,
    /// Time for TCP (and TLS).
    pub connect_timeout: Duration,
    /// Time for a login exchange.
    pub login_timeout: Duration,
    /// How long a client is held while its backend answers `57P03` (the wake timeout).
    pub not_ready_wait: Duration,
    /// Cap on SCRAM iterations when deriving backend keys from a password.
    pub max_backend_iterations: u32,
    /// `[reuse]`.
    pub reuse: ReuseConfig,
    /// Bounds of the pool `/sql` runs on.
    pub http_pool: PoolSettings,
    /// Tenants with a cap on their backend connections (`max_backend_connections`).
    pub caps: Vec<(TenantId, usize)>,
    /// Sessions that may wait for a backend connection of one capped tenant at once.
    pub max_backend_waiters: usize,
    /// How long a session waits for one.
    pub backend_wait_timeout: Duration,
}

/// Opens, logs in, keeps and hands out backend connections.
pub struct Connector {
    link: BackendLink,
    connect_timeout: Duration,
    login_timeout: Duration,
    not_ready_wait: Duration,
    max_backend_iterations: u32,
    cancels: Arc<CancelMap>,
    metrics: Arc<Metrics>,
    reuse: Option<Arc<Reuse>>,
    http_pool: Arc<Pool<PoolKey, BackendConn>>,
    caps: Caps,
    /// Sessions pinned to their backend connections, named when they hold a capped tenant's
    /// places and a wait for one runs out.
    pinned: Arc<PinnedSessions>,
}

/// A client session's login: who, where, and with what.
pub struct ClientLogin<'a> {
    /// The tenant.
    pub tenant: &'a TenantId,
    /// Its database's address now.
    pub endpoint: &'a Endpoint,
    /// TLS towards it.
    pub tls: BackendTls,
    /// Startup parameters forwarded to the backend.
    pub params: &'a [(String, String)],
    /// The user and what the gateway's check of the password left; `None` under passthrough,
    /// where the client logs in to the backend itself.
    pub checked: Option<(&'a str, &'a LoginMaterial)>,
    /// Under passthrough, keep the connection for reuse when the backend let the client in
    /// without a password (the tenant's `reuse_passthrough`).
    pub reuse_passthrough: bool,
}

/// A backend connection logged in with no client attached.
pub struct Detached {
    /// The connection.
    pub stream: Stream,
    /// The backend's cancel key.
    pub target: CancelTarget,
    /// The ParameterStatus messages of its login.
    pub parameters: bytes::Bytes,
}

/// A backend connection whose login reached the client.
pub struct Upstream {
    /// The connection.
    pub stream: Stream,
    /// Its place under the tenant's cap.
    pub slot: BackendSlot,
    /// Whether it was a kept connection rather than a fresh login.
    pub reused: bool,
    /// The key the client holds for it.
    pub cancel: Option<CancelRegistration>,
    /// Set when the connection may be kept for reuse once the client leaves.
    pub returnable: Option<Returnable>,
}

/// A way to a backend connection under the tenant's cap: a kept connection, or room for a
/// fresh login.
pub enum Slot {
    /// A kept connection (reset and idle) with its slot.
    Kept(Box<reuse::Taken>),
    /// A slot for a fresh login.
    Fresh(BackendSlot),
}

impl Connector {
    /// A connector registering cancel keys in `cancels`; `pinned` says which sessions cannot
    /// give their backend connections up.
    pub fn new(
        s: ConnectorSettings,
        cancels: Arc<CancelMap>,
        metrics: Arc<Metrics>,
        pinned: Arc<PinnedSessions>,
    ) -> Self {
        Connector {
            pinned,
            reuse: Reuse::new(&s.reuse),
            http_pool: Pool::new(s.http_pool),
            caps: Caps::new(s.caps, s.max_backend_waiters, s.backend_wait_timeout),
            link: s.link,
            connect_timeout: s.connect_timeout,
            login_timeout: s.login_timeout,
            not_ready_wait: s.not_ready_wait,
            max_backend_iterations: s.max_backend_iterations,
            cancels,
            metrics,
        }
    }

    /// Largest message accepted from a backend outside the relay.
    pub fn max_message(&self) -> usize {
        self.link.max_message
    }

    /// Largest message accepted from a client during a login.
    pub fn max_client_message(&self) -> usize {
        self.link.max_client_message
    }

    /// Time for TCP (and TLS); also bounds delivering a cancel request.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Whether departing clients may leave their backend connections for reuse.
    pub fn reuses(&self) -> bool {
        self.reuse.is_some()
    }

    /// A backend connection for a client session: a kept one for the same tenant, user and
    /// startup parameters when there is one (greeting the client as its login would have), else
    /// a fresh login carried to the client. While the backend answers `57P03` before the client
    /// saw anything of the login (starting up, crash recovery) the client is held and the login
    /// tried again for up to the wake timeout.
    pub async fn for_client(
        &self,
        client: &mut Stream,
        login: ClientLogin<'_>,
    ) -> Result<Upstream, SessionError> {
        let key = self.reuse_key(&login);
        let deadline = Instant::now() + self.caps.wait;
        let waited = self.slot(login.tenant, key.as_ref(), login.endpoint, deadline);
        let slot = tokio::select! {
            s = waited => s?,
            _ = client.hung_up() => {
                return Err(SessionError::client_left("waiting for a backend connection"));
            }
        };
        let slot = match slot {
            Slot::Kept(taken) => return self.greet_on_kept(client, *taken).await,
            Slot::Fresh(slot) => slot,
        };
        let hold_until = Instant::now() + self.not_ready_wait;
        loop {
            match self.log_in_fresh(client, &login, key.is_some()).await {
                Ok(done) => return Ok(self.upstream(done, key, slot).await),
                Err(SessionError::BackendNotReady(why)) if Instant::now() < hold_until => {
                    debug!(reason = %why, "backend not ready; holding the client");
                    tokio::select! {
                        _ = tokio::time::sleep(NOT_READY_PAUSE) => {}
                        _ = client.hung_up() => {
                            return Err(SessionError::client_left("its database was recovering"));
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The key a client's backend connection may be kept under, if any. Clients the gateway
    /// authenticated share connections the gateway logged in as the same user with the same
    /// startup parameters. A passthrough client (its tenant opted in) shares only with clients
    /// of the identical startup, and only once a fresh login of it showed that the backend asks
    /// no password for it: anyone reaching the gateway with that startup gets in anyway.
    fn reuse_key(&self, login: &ClientLogin<'_>) -> Option<ReuseKey> {
        self.reuse.as_ref()?;
        match login.checked {
            Some(_) => Some(ReuseKey::new(login.tenant, login.params)),
            None if login.reuse_passthrough => {
                Some(ReuseKey::passthrough(login.tenant, login.params))
            }
            None => None,
        }
    }

    /// One fresh login carried to the client, within the login timeout.
    async fn log_in_fresh(
        &self,
        client: &mut Stream,
        login: &ClientLogin<'_>,
        keep_parameters: bool,
    ) -> Result<(Stream, LoggedIn), SessionError> {
        let deadline = Instant::now() + self.connect_timeout;
        let mut stream = connect::connect(&self.link, login.endpoint, login.tls, deadline).await?;
        let auth = login
            .checked
            .map(|(user, m)| OnBehalf::new(user, m, self.max_backend_iterations));
        let to_client = ToClient {
            stream: client,
            cancels: &self.cancels,
        };
        let exchange = log_in(
            &self.link,
            &mut stream,
            login.endpoint,
            login.params,
            auth,
            Some(to_client),
            keep_parameters,
        );
        let done = tokio::time::timeout(self.login_timeout, exchange)
            .await
            .map_err(|_| SessionError::LoginTimeout)??;
        Ok((stream, done))
    }

    /// A fresh login's connection, returnable when `key` says it may be kept (for a passthrough
    /// key, only when the backend asked the client for no password).
    async fn upstream(
        &self,
        (stream, done): (Stream, LoggedIn),
        key: Option<ReuseKey>,
        slot: BackendSlot,
    ) -> Upstream {
        let key = match key {
            Some(key) if key.is_passthrough() => self.trusted(key, done.asked_client).await,
            key => key,
        };
        let returnable = match (key, done.parameters, done.target) {
            (Some(key), Some(parameters), Some(target)) => Some(Returnable {
                key,
                parameters: parameters.into(),
                target,
            }),
            _ => None,
        };
        Upstream {
            stream,
            cancel: done.cancel,
            returnable,
            reused: false,
            slot,
        }
    }

    /// `key` of a passthrough login when the backend let the client in without a password
    /// (counted a miss: a kept connection would have served it); `None` when it asked for one,
    /// counted `untrusted`, and connections kept for the key before are closed (the backend's
    /// rules changed since).
    async fn trusted(&self, key: ReuseKey, asked_client: bool) -> Option<ReuseKey> {
        if !asked_client {
            self.metrics.reuse("miss");
            return Some(key);
        }
        debug!(
            tenant = %key.tenant(),
            "passthrough login asked for a password: its backend connection is not kept for reuse"
        );
        self.metrics.reuse("untrusted");
        if let Some(reuse) = &self.reuse {
            reuse.forget(&key, &self.metrics).await;
        }
        None
    }

    /// Hands a kept backend connection to the client: AuthenticationOk for a passthrough
    /// client (which has seen nothing of a login yet), the parameters the backend once sent, a
    /// fresh cancel key for it, and ReadyForQuery.
    async fn greet_on_kept(
        &self,
        client: &mut Stream,
        taken: reuse::Taken,
    ) -> Result<Upstream, SessionError> {
        let cancel = self.cancels.register(taken.returnable.target.clone());
        let mut hello = Vec::with_capacity(taken.returnable.parameters.len() + 48);
        if taken.returnable.key.is_passthrough() {
            hello.extend_from_slice(&authentication_ok());
        }
        hello.extend_from_slice(&taken.returnable.parameters);
        hello.extend_from_slice(&backend_key_data(cancel.pid, cancel.secret));
        hello.extend_from_slice(&READY_IDLE);
        client
            .write_all(&hello)
            .await
            .map_err(SessionError::ClientIo)?;
        client.flush().await.map_err(SessionError::ClientIo)?;
        Ok(Upstream {
            stream: taken.stream,
            cancel: Some(cancel),
            returnable: Some(taken.returnable),
            reused: true,
            slot: taken.slot,
        })
    }

    /// A kept connection for `key` at `endpoint`, else a slot under `tenant`'s cap for a fresh
    /// login: a free one, one a kept connection of another key gives up, or one a session hands
    /// back before `deadline`. FATAL `53300` when too many sessions wait already or none comes.
    pub async fn slot(
        &self,
        tenant: &TenantId,
        key: Option<&ReuseKey>,
        endpoint: &Endpoint,
        deadline: Instant,
    ) -> Result<Slot, SessionError> {
        let fresh = |slot| {
            // A passthrough login's miss is counted once it shows whether it may be kept.
            if key.is_some_and(|k| !k.is_passthrough()) && self.reuse.is_some() {
                self.metrics.reuse("miss");
            }
            Ok(Slot::Fresh(slot))
        };
        let cap = self.caps.get(tenant);
        let mut waiting = None;
        loop {
            // Registered before looking, so a connection kept meanwhile still wakes this wait.
            let mut kept = cap.map(|c| Box::pin(c.kept.notified()));
            if let Some(k) = &mut kept {
                k.as_mut().enable();
            }
            if let (Some(reuse), Some(key)) = (&self.reuse, key)
                && let Some(taken) = reuse.take(key, endpoint, &self.metrics)
            {
                self.metrics.backend_wait(waiting.is_some(), "kept");
                return Ok(Slot::Kept(Box::new(taken)));
            }
            let (Some(cap), Some(kept)) = (cap, kept) else {
                return fresh(None);
            };
            if let Some(slot) = cap.try_slot() {
                self.metrics.backend_wait(waiting.is_some(), "slot");
                return fresh(Some(slot));
            }
            if let Some(reuse) = &self.reuse
                && reuse.close_one_of(tenant, &self.metrics).await
            {
                continue;
            }
            if waiting.is_none() {
                let place = cap.join(self.caps.max_waiters);
                if place.is_none() {
                    self.metrics.backend_wait(true, "queue_full");
                    return Err(SessionError::BackendsBusy(tenant.clone()));
                }
                waiting = place;
            }
            tokio::select! {
                slot = cap.slots.clone().acquire_owned() => {
                    if let Ok(slot) = slot {
                        self.metrics.backend_wait(true, "slot");
                        return fresh(Some(slot));
                    }
                }
                _ = kept => {}
                _ = tokio::time::sleep_until(deadline) => {
                    self.metrics.backend_wait(true, "timeout");
                    return Err(self.wait_ran_out(tenant, cap.max));
                }
            }
        }
    }

    /// Why no backend connection of `tenant` (capped at `max`) came within the wait: pinned
    /// sessions hold places no one else can have until their pins are released, so they are
    /// named when there are any.
    fn wait_ran_out(&self, tenant: &TenantId, max: usize) -> SessionError {
        let waited = self.caps.wait;
        let pinned = self.pinned.of(tenant);
        match PinnedSession::describe_all(&pinned) {
            Some(sessions) => {
                let held = pinned.len().min(max);
                warn!(tenant = %tenant, held, max, sessions, "pinned sessions hold the tenant's backend connections");
                SessionError::BackendsPinned {
                    tenant: tenant.clone(),
                    waited,
                    held,
                    max,
                    sessions,
                }
            }
            None => SessionError::BackendWait(tenant.clone(), waited),
        }
    }

    /// A backend connection logged in as `user` with no client attached (a revival), by
    /// `deadline` and within the connect and login timeouts; with the backend's cancel key and
    /// the ParameterStatus messages of its login.
    pub async fn detached(
        &self,
        (endpoint, tls): (&Endpoint, BackendTls),
        params: &[(String, String)],
        (user, material): (&str, &LoginMaterial),
        deadline: Instant,
    ) -> Result<Detached, OpenError> {
        let connect_by = deadline.min(Instant::now() + self.connect_timeout);
        let mut stream = connect::connect(&self.link, endpoint, tls, connect_by).await?;
        let auth = OnBehalf::new(user, material, self.max_backend_iterations);
        let login = log_in(
            &self.link,
            &mut stream,
            endpoint,
            params,
            Some(auth),
            None,
            // A revival's connection may be kept for reuse later: its next client is greeted
            // with these.
            true,
        );
        let login_by = deadline.min(Instant::now() + self.login_timeout);
        let done = tokio::time::timeout_at(login_by, login)
            .await
            .map_err(|_| SessionError::LoginTimeout)??;
        let target = done
            .target
            .ok_or_else(|| SessionError::BackendProtocol("no BackendKeyData".into()))?;
        Ok(Detached {
            stream,
            target,
            parameters: done.parameters.unwrap_or_default().into(),
        })
    }

    /// [`Connector::slot`] for a session of `tenant` with these startup parameters (a revival):
    /// a kept connection of the same key, or room for a fresh login, by `deadline` at the
    /// latest.
    pub async fn slot_for(
        &self,
        tenant: &TenantId,
        params: &[(String, String)],
        endpoint: &Endpoint,
        deadline: Instant,
    ) -> Result<Slot, SessionError> {
        let key = self.reuse.as_ref().map(|_| ReuseKey::new(tenant, params));
        let deadline = deadline.min(Instant::now() + self.caps.wait);
        self.slot(tenant, key.as_ref(), endpoint, deadline).await
    }

    /// What a session that logged in on `detached` needs to hand the connection on: the key of
    /// its tenant and startup parameters, the login's parameters and cancel key.
    pub fn returnable(
        &self,
        tenant: &TenantId,
        params: &[(String, String)],
        detached: &Detached,
    ) -> Returnable {
        Returnable {
            key: ReuseKey::new(tenant, params),
            parameters: detached.parameters.clone(),
            target: detached.target.clone(),
        }
    }

    /// A pooled connection for `key` at `endpoint` (`/sql`), opened and logged in as the key's
    /// user when none is free; `PoolError::Exhausted` when the pool's bounds held past its
    /// acquire timeout.
    pub async fn pooled(
        &self,
        key: &PoolKey,
        (endpoint, tls): (&Endpoint, BackendTls),
        material: &LoginMaterial,
    ) -> Result<Pooled<PoolKey, BackendConn>, PoolError<OpenError>> {
        let open = || async {
            // Built only when a connection is opened, not for each reuse.
            let params = [
                ("user".to_owned(), key.user.clone()),
                ("database".to_owned(), key.database.clone()),
            ];
            let deadline = Instant::now() + self.connect_timeout + self.login_timeout;
            let who = (key.user.as_str(), material);
            let d = self
                .detached((endpoint, tls), &params, who, deadline)
                .await?;
            let cancel = self.cancels.register(d.target);
            Ok(BackendConn::new(d.stream, endpoint.clone(), cancel))
        };
        loop {
            let conn = self.http_pool.get(key, open).await?;
            // A tenant that slept and woke elsewhere leaves connections to its old address.
            if conn.endpoint == *endpoint {
                return Ok(conn);
            }
        }
    }

    /// Closes `/sql` pool connections past their idle timeout.
    pub fn reap_pool(&self) {
        self.http_pool.reap();
    }

    /// Counts of the `/sql` pool.
    pub fn pool_stats(&self) -> PoolStats {
        self.http_pool.stats()
    }

    /// Takes back a departed client's backend connection: reset and kept for reuse when it is
    /// `returnable` and was left at a safe point, else closed.
    pub async fn give_back(
        &self,
        (stream, slot): (Stream, BackendSlot),
        endpoint: Endpoint,
        returnable: Option<Returnable>,
        safe: bool,
    ) {
        match (returnable, self.reuse.as_deref()) {
            (Some(back), Some(reuse)) if safe => {
                let (max, tenant) = (self.link.max_message, back.key.tenant().clone());
                let conn = (stream, slot);
                if reuse
                    .give_back(conn, endpoint, back, max, &self.metrics)
                    .await
                {
                    self.caps.kept(&tenant);
                }
            }
            _ => {
                self.metrics.reuse_return("not_safe");
                close((stream, slot)).await;
            }
        }
    }

    /// Closes kept connections past their idle timeout, until `stop` fires (none to do without
    /// `[reuse]`).
    pub async fn run_reaper(&self, stop: tokio_util::sync::CancellationToken) {
        if let Some(reuse) = &self.reuse {
            reuse.clone().run_reaper(self.metrics.clone(), stop).await;
        }
    }
}

/// Closes a session's backend connection, giving up its place under the tenant's cap first: the
/// place belongs to the connection, and the session (parked, or waiting for its revival) may
/// live on long after it.
pub async fn close((stream, slot): (Stream, BackendSlot)) {
    reuse::close(stream).await;
    // Given up once the backend has gone: a session waiting for the slot would otherwise start
    // a new backend while the old process still counts against the server's connections.
    drop(slot);
}
