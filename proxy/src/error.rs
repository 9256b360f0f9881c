//! Why a connection ended early: what is logged, what kind is counted, what the client is told.

use std::time::Duration;

use pgwake_protocol::{ErrorMessage, StartupError, sqlstate};
use pgwake_routing::{ResolveError, TenantId, WakeError};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info};

use crate::metrics::Metrics;
use crate::stream::Stream;

/// How to name tenants, given to clients that named none or an unknown one.
const TENANT_HINT: &str = "name the tenant with the TLS server name <tenant>.<sni_suffix>, \
     options=endpoint=<tenant> (or --tenant=<tenant>), database <tenant>.<database>, user \
     <user>.<tenant>, or (over TLS) the password endpoint=<tenant>;<password>";

/// A reason to end a client connection before or outside the relay.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The client's first messages broke the protocol or a limit.
    #[error("startup: {0}")]
    Startup(#[from] StartupError),
    /// The client did not finish its startup in time.
    #[error("startup not finished within the time limit")]
    StartupTimeout,
    /// A plaintext startup while plaintext is not allowed.
    #[error("plaintext connection refused")]
    PlaintextRefused,
    /// Direct TLS without ALPN `postgresql`.
    #[error("direct TLS connection without ALPN \"postgresql\"")]
    MissingAlpn,
    /// A second SSL or GSS request, or one inside TLS.
    #[error("unexpected {0} during negotiation")]
    UnexpectedRequest(&'static str),
    /// The TLS handshake with the client failed.
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    /// Rules disagreed or named no tenant.
    #[error("routing: {0}")]
    Route(#[from] ResolveError),
    /// The client named a tenant that is not configured (`forbidden`: one whose access list
    /// refuses the client's address). With `hidden_as`, the client was answered as a wrong
    /// password of that user would be (`routing.unknown_tenant = "password_failed"`), so tenant
    /// names cannot be listed by probing; the log and metrics still say what happened.
    #[error("{} {tenant:?}{}", refused_tenant(*.forbidden), answered_as(.hidden_as.as_deref()))]
    UnknownTenant {
        /// The tenant named.
        tenant: String,
        /// It exists but refuses the client's address.
        forbidden: bool,
        /// The user whose failed password the client was told of, when hidden.
        hidden_as: Option<String>,
        /// When revealed: a configured tenant a typo away from the one named, to suggest.
        nearest: Option<String>,
    },
    /// The client's password was wrong, or the user unknown (the same answer for both).
    #[error("password authentication failed for user {0:?}")]
    AuthFailed(String),
    /// Too many failed attempts from this address for this tenant.
    #[error("throttled for {0:?} after failed authentication attempts")]
    Throttled(std::time::Duration),
    /// A client named tenant {0} in its password, but the gateway does not check that tenant's
    /// passwords (passthrough), so it cannot log in with the rest of it.
    #[error("tenant {0} uses passthrough authentication and cannot be named in the password")]
    PasswordRouteNeedsGateway(TenantId),
    /// The startup message named no user.
    #[error("no user name in the startup message")]
    NoUser,
    /// The credential source could not answer.
    #[error("credentials unavailable: {0}")]
    AuthUnavailable(String),
    /// The gateway cannot log in to the backend with what it holds for this user.
    #[error("cannot log in to the backend on behalf of {user:?}: {reason}")]
    BackendLogin {
        /// The user.
        user: String,
        /// Why, for the log.
        reason: String,
    },
    /// The tenant could not be woken (or the queue was full).
    #[error("tenant {0}: {1}")]
    Wake(TenantId, WakeError),
    /// The backend could not be reached.
    #[error("backend {endpoint} unreachable: {source}")]
    BackendUnreachable {
        /// The address tried.
        endpoint: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The backend requires something the gateway cannot relay or refused TLS when required.
    #[error("backend {0}")]
    BackendUnsupported(String),
    /// The backend broke the protocol or a limit during login.
    #[error("backend protocol error: {0}")]
    BackendProtocol(String),
    /// The backend refused the login (its ErrorResponse was relayed as is).
    #[error("backend refused the login")]
    LoginRefused,
    /// The login exchange took longer than allowed.
    #[error("login not finished within the time limit")]
    LoginTimeout,
    /// The client went away or its socket failed.
    #[error("client I/O: {0}")]
    ClientIo(std::io::Error),
    /// The client sent something other than a password message during login.
    #[error("client protocol error: {0}")]
    ClientProtocol(String),
    /// The gateway is shutting down.
    #[error("gateway shutting down")]
    ShuttingDown,
    /// A connection cap is full.
    #[error("{0}")]
    Full(#[from] crate::capacity::Full),
    /// The client did not finish authenticating within `limits.auth_timeout`.
    #[error("authentication not finished within the time limit")]
    AuthTimeout,
    /// The backend does not accept logins yet (`57P03`: starting up, or in crash recovery) and
    /// did not within the wait.
    #[error("backend not ready: {0}")]
    BackendNotReady(String),
    /// Ended while still logging in, to make room for newer connections.
    #[error("ended while logging in to make room for newer connections")]
    Evicted,
    /// The tenant is at its `max_backend_connections` and `limits.max_backend_waiters`
    /// sessions wait already.
    #[error("too many sessions waiting for a backend connection of tenant {0}")]
    BackendsBusy(TenantId),
    /// No backend connection of the capped tenant became free within the wait.
    #[error("no backend connection of tenant {0} became free within {1:?}")]
    BackendWait(TenantId, std::time::Duration),
    /// No backend connection of the capped tenant became free within the wait, and sessions
    /// pinned to theirs hold `held` of its `max` places.
    #[error(
        "no backend connection of tenant {tenant} became free within {waited:?}: {held} of its \
         {max} max_backend_connections are held by sessions pinned to them ({sessions})"
    )]
    BackendsPinned {
        /// The tenant.
        tenant: TenantId,
        /// How long the session waited.
        waited: std::time::Duration,
        /// Places held by pinned sessions.
        held: usize,
        /// The tenant's `max_backend_connections`.
        max: usize,
        /// The pinned sessions in words: reasons, applications, addresses.
        sessions: String,
    },
}

/// What an [`SessionError::UnknownTenant`] was, for the log.
fn refused_tenant(forbidden: bool) -> &'static str {
    match forbidden {
        true => "access list refuses the client's address for tenant",
        false => "unknown tenant",
    }
}

/// How an [`SessionError::UnknownTenant`] was answered, for the log.
fn answered_as(hidden_as: Option<&str>) -> String {
    hidden_as
        .map(|user| format!(" (answered as a wrong password for user {user:?})"))
        .unwrap_or_default()
}

impl SessionError {
    /// Label for `pgwake_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Startup(_)
            | SessionError::MissingAlpn
            | SessionError::UnexpectedRequest(_) => "client_protocol",
            SessionError::ClientProtocol(_) => "client_protocol",
            SessionError::StartupTimeout => "startup_timeout",
            SessionError::PlaintextRefused => "plaintext_refused",
            SessionError::Handshake(_) => "tls_handshake",
            SessionError::Route(_) | SessionError::PasswordRouteNeedsGateway(_) => "routing",
            SessionError::UnknownTenant {
                forbidden: false, ..
            } => "unknown_tenant",
            SessionError::UnknownTenant {
                forbidden: true, ..
            } => "tenant_forbidden",
            SessionError::AuthFailed(_) => "auth_failed",
            SessionError::Throttled(_) => "auth_throttled",
            SessionError::NoUser => "client_protocol",
            SessionError::AuthUnavailable(_) => "auth_unavailable",
            SessionError::BackendLogin { .. } => "backend_login",
            SessionError::Wake(_, WakeError::QueueFull { .. }) => "wake_queue_full",
            SessionError::Wake(_, WakeError::Timeout(_)) => "wake_timeout",
            SessionError::Wake(_, WakeError::UnknownTenant(_)) => "routing",
            SessionError::Wake(_, _) => "wake_failed",
            SessionError::BackendUnreachable { .. } => "backend_unreachable",
            SessionError::BackendUnsupported(_) | SessionError::BackendProtocol(_) => {
                "backend_protocol"
            }
            SessionError::LoginRefused => "login_refused",
            SessionError::LoginTimeout => "login_timeout",
            SessionError::ClientIo(_) => "client_io",
            SessionError::ShuttingDown => "shutdown",
            SessionError::Full(crate::capacity::Full::Gateway(_)) => "gateway_full",
            SessionError::Full(crate::capacity::Full::Tenant { .. }) => "tenant_full",
            SessionError::AuthTimeout => "auth_timeout",
            SessionError::Evicted => "login_evicted",
            SessionError::BackendNotReady(_) => "backend_not_ready",
            SessionError::BackendsBusy(_) => "backend_queue_full",
            SessionError::BackendWait(..) | SessionError::BackendsPinned { .. } => {
                "backend_wait_timeout"
            }
        }
    }

    /// The client hung up while it was held (`while`: for what, in the log).
    pub fn client_left(while_: &'static str) -> SessionError {
        SessionError::ClientIo(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            format!("the client closed the connection while {while_}"),
        ))
    }

    /// The message for a connection ended by a time limit or a connection cap.
    fn limit_message(&self) -> ErrorMessage {
        use crate::capacity::Full;
        let (code, text) = match self {
            SessionError::StartupTimeout => (
                sqlstate::PROTOCOL_VIOLATION,
                "timeout: the startup message did not arrive in time".to_owned(),
            ),
            SessionError::AuthTimeout => (
                sqlstate::PROTOCOL_VIOLATION,
                "timeout: authentication did not finish in time".to_owned(),
            ),
            SessionError::Full(Full::Tenant { tenant, .. }) => (
                sqlstate::TOO_MANY_CONNECTIONS,
                format!("too many connections for tenant \"{tenant}\""),
            ),
            SessionError::Full(Full::Gateway(_)) => (
                sqlstate::TOO_MANY_CONNECTIONS,
                "sorry, too many clients already".to_owned(),
            ),
            _ => {
                let m = ErrorMessage::fatal(
                    sqlstate::TOO_MANY_CONNECTIONS,
                    "too many connections are logging in; this one took too long",
                );
                return m.with_hint("retry");
            }
        };
        ErrorMessage::fatal(code, text)
    }

    /// The message for the client, or `None` when nothing can or should be sent (the client is
    /// gone, the backend's own error was already relayed, or TLS failed).
    pub fn client_message(&self) -> Option<ErrorMessage> {
        use sqlstate::*;
        let m = match self {
            SessionError::Startup(StartupError::UnsupportedProtocol { .. }) => {
                ErrorMessage::fatal(FEATURE_NOT_SUPPORTED, self.inner_text())
            }
            SessionError::Startup(e) => ErrorMessage::fatal(PROTOCOL_VIOLATION, e.to_string()),
            SessionError::StartupTimeout
            | SessionError::AuthTimeout
            | SessionError::Evicted
            | SessionError::Full(_) => self.limit_message(),
            SessionError::PlaintextRefused => ErrorMessage::fatal(
                INVALID_AUTHORIZATION_SPECIFICATION,
                "this gateway requires TLS: plaintext connections are not accepted",
            )
            .with_hint("connect with sslmode=require"),
            SessionError::MissingAlpn => ErrorMessage::fatal(
                PROTOCOL_VIOLATION,
                "received a direct TLS connection without ALPN protocol \"postgresql\"",
            ),
            SessionError::UnexpectedRequest(what) => {
                ErrorMessage::fatal(PROTOCOL_VIOLATION, format!("unexpected {what}"))
            }
            SessionError::UnknownTenant {
                hidden_as: Some(user),
                ..
            }
            | SessionError::AuthFailed(user) => ErrorMessage::fatal(
                INVALID_PASSWORD,
                format!("password authentication failed for user \"{user}\""),
            ),
            SessionError::Route(_)
            | SessionError::UnknownTenant {
                hidden_as: None, ..
            }
            | SessionError::PasswordRouteNeedsGateway(_) => self.routing_message(),
            SessionError::Throttled(wait) => ErrorMessage::fatal(
                INVALID_AUTHORIZATION_SPECIFICATION,
                format!(
                    "too many failed authentication attempts, retry in {} s",
                    wait.as_secs().max(1)
                ),
            ),
            SessionError::NoUser => ErrorMessage::fatal(
                INVALID_AUTHORIZATION_SPECIFICATION,
                "no PostgreSQL user name specified in startup packet",
            ),
            SessionError::AuthUnavailable(_) => ErrorMessage::fatal(
                CANNOT_CONNECT_NOW,
                "authentication is not available right now",
            )
            .with_hint("retry in a moment"),
            SessionError::BackendLogin { user, .. } => ErrorMessage::fatal(
                INVALID_AUTHORIZATION_SPECIFICATION,
                format!("the gateway cannot log in to the tenant's database as \"{user}\""),
            )
            .with_hint(
                "the database's password for this user differs from the gateway's credentials",
            ),
            SessionError::Wake(t, e) => wake_message(t, e),
            SessionError::BackendUnreachable { .. }
            | SessionError::BackendUnsupported(_)
            | SessionError::BackendProtocol(_)
            | SessionError::LoginTimeout
            | SessionError::BackendNotReady(_) => self.backend_message(),
            SessionError::BackendsBusy(_)
            | SessionError::BackendWait(..)
            | SessionError::BackendsPinned { .. } => self.cap_message(),
            SessionError::ClientProtocol(what) => {
                ErrorMessage::fatal(PROTOCOL_VIOLATION, what.clone())
            }
            SessionError::ShuttingDown => ErrorMessage::fatal(
                ADMIN_SHUTDOWN,
                "terminating connection because the gateway is shutting down",
            ),
            SessionError::Handshake(_) | SessionError::LoginRefused | SessionError::ClientIo(_) => {
                return None;
            }
        };
        Some(m)
    }

    /// The message for a connection whose tenant could not be found or named that way.
    fn routing_message(&self) -> ErrorMessage {
        use sqlstate::*;
        match self {
            SessionError::Route(ResolveError::Conflict { .. }) => ErrorMessage::fatal(
                SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
                format!("conflicting tenant names: {}", self.inner_text()),
            )
            .with_hint("name the tenant one way, or the same way everywhere"),
            // Revealed and not forbidden: the tenant named is told back, and the one a typo
            // away suggested (the answer stays the same as for a forbidden one otherwise).
            SessionError::UnknownTenant {
                tenant,
                forbidden: false,
                hidden_as: None,
                nearest,
            } => ErrorMessage::fatal(
                SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
                "unknown or forbidden tenant",
            )
            .with_detail(format!("no tenant \"{tenant}\" is configured"))
            .with_hint(match nearest {
                Some(near) => format!("did you mean \"{near}\"?"),
                None => TENANT_HINT.to_owned(),
            }),
            SessionError::Route(ResolveError::NotNamed) | SessionError::UnknownTenant { .. } => {
                ErrorMessage::fatal(
                    SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
                    "unknown or forbidden tenant",
                )
                .with_hint(TENANT_HINT)
            }
            SessionError::PasswordRouteNeedsGateway(_) => ErrorMessage::fatal(
                INVALID_AUTHORIZATION_SPECIFICATION,
                "this tenant cannot be named in the password",
            )
            .with_hint("name it with the TLS server name or options=endpoint=<tenant>"),
            // Only the routing variants are sent here.
            other => ErrorMessage::fatal(
                SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
                other.to_string(),
            ),
        }
    }

    /// What a client refused for its tenant's cap on backend connections is told.
    fn cap_message(&self) -> ErrorMessage {
        use sqlstate::*;
        match self {
            SessionError::BackendsBusy(t) => ErrorMessage::fatal(
                TOO_MANY_CONNECTIONS,
                format!("too many sessions are waiting for a connection to the database of tenant \"{t}\""),
            )
            .with_hint("retry in a moment, or raise the tenant's max_backend_connections"),
            SessionError::BackendWait(t, waited) => ErrorMessage::fatal(
                TOO_MANY_CONNECTIONS,
                format!(
                    "no connection to the database of tenant \"{t}\" became free within {} s \
                     (limits.backend_wait_timeout)",
                    waited.as_secs_f64()
                ),
            )
            .with_hint("its max_backend_connections are all in use by busy sessions"),
            SessionError::BackendsPinned {
                tenant,
                waited,
                held,
                max,
                sessions,
            } => ErrorMessage::fatal(
                TOO_MANY_CONNECTIONS,
                format!(
                    "no connection to the database of tenant \"{tenant}\" became free within {} s \
                     (limits.backend_wait_timeout): {held} of its {max} max_backend_connections \
                     are held by sessions pinned to them ({sessions})",
                    waited.as_secs_f64()
                ),
            )
            .with_hint(
                "a pinned session keeps its connection until the pin is released (unlock, \
                 UNLISTEN, CLOSE, DISCARD, COMMIT) or its client disconnects; raise \
                 max_backend_connections or end those sessions",
            ),
            // Only the cap's variants are sent here.
            other => ErrorMessage::fatal(TOO_MANY_CONNECTIONS, other.to_string()),
        }
    }

    /// The message for a backend that could not be reached, logged in to or understood.
    fn backend_message(&self) -> ErrorMessage {
        use sqlstate::*;
        match self {
            SessionError::BackendUnreachable { .. } => ErrorMessage::fatal(
                SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                "could not connect to the tenant's database",
            ),
            SessionError::BackendUnsupported(what) => ErrorMessage::fatal(
                FEATURE_NOT_SUPPORTED,
                format!("the tenant's database {what}"),
            ),
            SessionError::BackendProtocol(_) => ErrorMessage::fatal(
                CONNECTION_FAILURE,
                "the tenant's database sent an invalid response",
            ),
            SessionError::LoginTimeout => ErrorMessage::fatal(
                CONNECTION_FAILURE,
                "timeout: login to the tenant's database did not finish in time",
            ),
            SessionError::BackendNotReady(why) => ErrorMessage::fatal(
                CANNOT_CONNECT_NOW,
                format!("the tenant's database is not accepting connections yet: {why}"),
            )
            .with_hint("retry in a moment"),
            // Only the backend's variants are sent here.
            other => ErrorMessage::fatal(CONNECTION_FAILURE, other.to_string()),
        }
    }

    fn inner_text(&self) -> String {
        match self {
            SessionError::Startup(e) => e.to_string(),
            SessionError::Route(e) => e.to_string(),
            other => other.to_string(),
        }
    }
}

/// The message for a connection whose tenant `t` could not be woken.
fn wake_message(t: &TenantId, e: &WakeError) -> ErrorMessage {
    use sqlstate::*;
    match e {
        WakeError::UnknownTenant(_) => ErrorMessage::fatal(
            SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
            "unknown or forbidden tenant",
        )
        .with_hint(TENANT_HINT),
        WakeError::QueueFull { limit, .. } => ErrorMessage::fatal(
            TOO_MANY_CONNECTIONS,
            format!("too many connections waiting for tenant \"{t}\" to wake (limit {limit})"),
        ),
        WakeError::Timeout(d) => ErrorMessage::fatal(
            CANNOT_CONNECT_NOW,
            format!(
                "the database for tenant \"{t}\" did not start within {} s",
                d.as_secs_f64()
            ),
        )
        .with_hint("retry in a moment"),
        WakeError::Failed { retry_in, .. } => ErrorMessage::fatal(
            CANNOT_CONNECT_NOW,
            format!("the database for tenant \"{t}\" failed to start"),
        )
        .with_detail(format!(
            "the next start is tried in {} s; the gateway log has the reason",
            retry_in.as_secs().max(1)
        )),
        WakeError::Busy(_) | WakeError::ActiveElsewhere | WakeError::Unconfirmed(_) => {
            ErrorMessage::fatal(
                CANNOT_CONNECT_NOW,
                format!("the database for tenant \"{t}\" is not available"),
            )
        }
    }
}

/// Counts, logs and (where possible) tells the client why its connection ends.
pub async fn fail(metrics: &Metrics, stream: Option<Stream>, err: SessionError) {
    metrics.error(err.kind());
    match &err {
        SessionError::ClientIo(_) | SessionError::LoginRefused => {
            debug!(error = %err, "connection ended")
        }
        SessionError::Handshake(e) => crate::tls::log_failed_handshake(e),
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
