//! Opening a backend connection and relaying the login: the client's startup goes to the
//! backend, authentication is relayed message by message, and the backend's cancel key is
//! replaced by a gateway-issued one before the client sees it.

use std::sync::Arc;

use pgwake_protocol::backend::{
    auth_code, auth_request_code, backend_key_data, parse_backend_key_data, ssl_request,
    startup_packet,
};
use pgwake_routing::Endpoint;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use crate::auth::backend_login::OnBehalf;
use crate::cancel::{CancelMap, CancelRegistration, CancelTarget};
use crate::config::BackendTls;
use crate::error::SessionError;
use crate::stream::Stream;

/// How to reach and log in to backends.
pub struct BackendLink {
    /// TLS client configuration for backends.
    pub tls_config: Arc<ClientConfig>,
    /// Largest message accepted from a backend during login.
    pub max_message: usize,
    /// Largest message accepted from a client during login (password, SASL).
    pub max_client_message: usize,
}

/// Opens TCP (and TLS, per `mode`) to `endpoint` by `deadline`.
pub async fn connect(
    link: &BackendLink,
    endpoint: &Endpoint,
    mode: BackendTls,
    deadline: Instant,
) -> Result<Stream, SessionError> {
    let unreachable = |source| SessionError::BackendUnreachable {
        endpoint: endpoint.to_string(),
        source,
    };
    let timed_out = || unreachable(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let mut tcp = timeout_at(
        deadline,
        TcpStream::connect((endpoint.host.as_str(), endpoint.port)),
    )
    .await
    .map_err(|_| timed_out())?
    .map_err(unreachable)?;
    tcp.set_nodelay(true).map_err(unreachable)?;
    if mode == BackendTls::Disable {
        return Ok(Stream::Plain(tcp));
    }
    let answer = timeout_at(deadline, async {
        tcp.write_all(&ssl_request()).await?;
        let mut b = [0u8; 1];
        tcp.read_exact(&mut b).await?;
        Ok::<u8, std::io::Error>(b[0])
    })
    .await
    .map_err(|_| timed_out())?
    .map_err(unreachable)?;
    match (answer, mode) {
        (b'S', _) => {}
        (b'N', BackendTls::Prefer) => return Ok(Stream::Plain(tcp)),
        (b'N', _) => {
            return Err(SessionError::BackendUnsupported(
                "does not accept TLS, and [backend] tls = \"require\"".into(),
            ));
        }
        (other, _) => {
            return Err(SessionError::BackendProtocol(format!(
                "unexpected answer {other:#x} to SSLRequest"
            )));
        }
    }
    let name = ServerName::try_from(endpoint.host.clone())
        .map_err(|e| SessionError::BackendUnsupported(format!("host name is invalid: {e}")))?;
    let tls = timeout_at(
        deadline,
        TlsConnector::from(link.tls_config.clone()).connect(name, tcp),
    )
    .await
    .map_err(|_| timed_out())?
    .map_err(unreachable)?;
    Ok(Stream::ClientTls(Box::new(tls)))
}

/// One framed message read whole during login: header included, so it can be forwarded as is.
pub(crate) struct RawMessage {
    pub(crate) bytes: Vec<u8>,
}

impl RawMessage {
    pub(crate) fn tag(&self) -> u8 {
        self.bytes[0]
    }
    pub(crate) fn body(&self) -> &[u8] {
        &self.bytes[5..]
    }
}

/// Reads one tagged message whole, or `None` when its length is out of range.
pub(crate) async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<RawMessage>> {
    let mut header = [0u8; 5];
    r.read_exact(&mut header).await?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len < 4 || len - 4 > max {
        return Ok(None);
    }
    let mut bytes = vec![0u8; len + 1];
    bytes[..5].copy_from_slice(&header);
    r.read_exact(&mut bytes[5..]).await?;
    Ok(Some(RawMessage { bytes }))
}

/// Who answers the backend's authentication requests.
pub enum BackendAuth<'a> {
    /// The client, through the gateway (passthrough).
    Relay,
    /// The gateway, with what the client's login at the gateway left.
    OnBehalf(OnBehalf<'a>),
}

/// Logs in to `backend` and carries the login to the client until the backend's first
/// ReadyForQuery has reached it; the caller bounds it with `limits.login_timeout`. Returns the
/// cancel registration backing the key the client was given. With `parameters`, the backend's ParameterStatus messages are also copied there
/// (a connection kept for reuse hands them to its next client).
#[allow(clippy::too_many_arguments)]
pub async fn login(
    link: &BackendLink,
    client: &mut Stream,
    backend: &mut Stream,
    params: &[(String, String)],
    endpoint: &Endpoint,
    cancels: &Arc<CancelMap>,
    mut auth: BackendAuth<'_>,
    mut parameters: Option<&mut Vec<u8>>,
) -> Result<Option<CancelRegistration>, SessionError> {
    let backend_io = |e: std::io::Error| SessionError::BackendUnreachable {
        endpoint: endpoint.to_string(),
        source: e,
    };
    // A connection that a crash restart of Postgres ends mid-login (the postmaster stops every
    // child, new ones included) is, for a client that has seen nothing yet, a server not ready.
    let cut_short = |e: std::io::Error| {
        SessionError::BackendNotReady(format!("the connection ended during the login: {e}"))
    };
    backend
        .write_all(&startup_packet(params))
        .await
        .map_err(cut_short)?;
    let mut to_client: Vec<u8> = Vec::with_capacity(512);
    let mut registration = None;
    // Whether the client has seen anything of this login yet: until then a refusal can be
    // retried on a new connection without the client noticing.
    let mut relayed = false;
    loop {
        let msg = read_message(backend, link.max_message)
            .await
            .map_err(|e| if relayed { backend_io(e) } else { cut_short(e) })?
            .ok_or_else(|| SessionError::BackendProtocol("message length out of range".into()))?;
        match msg.tag() {
            b'R' => {
                let code = auth_request_code(msg.body()).ok_or_else(|| {
                    SessionError::BackendProtocol("short authentication request".into())
                })?;
                if let BackendAuth::OnBehalf(on_behalf) = &mut auth {
                    // The client already has the gateway's AuthenticationOk.
                    if let Some(reply) = on_behalf.answer(code, msg.body()).await? {
                        backend.write_all(&reply).await.map_err(backend_io)?;
                    }
                    continue;
                }
                if relay_auth_request(client, &msg, code, &mut to_client).await? {
                    relayed = true;
                    let answer = read_password_message(client, link.max_client_message).await?;
                    backend.write_all(&answer.bytes).await.map_err(backend_io)?;
                }
            }
            b'K' => {
                let (pid, secret) = parse_backend_key_data(msg.body()).ok_or_else(|| {
                    SessionError::BackendProtocol("malformed BackendKeyData".into())
                })?;
                let reg = cancels.register(CancelTarget {
                    endpoint: endpoint.clone(),
                    pid,
                    secret,
                });
                to_client.extend_from_slice(&backend_key_data(reg.pid, reg.secret));
                registration = Some(reg);
            }
            b'Z' | b'E' => {
                return finish_login(client, &mut to_client, &msg, relayed)
                    .await
                    .map(|()| registration);
            }
            b'S' => {
                if let Some(p) = parameters.as_deref_mut() {
                    p.extend_from_slice(&msg.bytes);
                }
                to_client.extend_from_slice(&msg.bytes)
            }
            b'N' => to_client.extend_from_slice(&msg.bytes),
            // The gateway asks the backend for plain 3.0 without extensions, so a negotiation
            // answer carries nothing the client needs (it got the gateway's own).
            b'v' => {}
            other => {
                return Err(SessionError::BackendProtocol(format!(
                    "unexpected message type {:?} during login",
                    other as char
                )));
            }
        }
    }
}

/// Ends a login on its last message: ReadyForQuery, or an ErrorResponse, sent to the client
/// with what was held back. A `57P03` the client has not seen any of the login before is kept
/// from it, so the caller may hold the client and try again, as during a wake.
async fn finish_login(
    client: &mut Stream,
    to_client: &mut Vec<u8>,
    msg: &RawMessage,
    relayed: bool,
) -> Result<(), SessionError> {
    if msg.tag() == b'E' && !relayed {
        let fields = pgwake_protocol::frontend::error_fields(msg.body());
        if fields.code == pgwake_protocol::sqlstate::CANNOT_CONNECT_NOW {
            return Err(SessionError::BackendNotReady(fields.message));
        }
    }
    to_client.extend_from_slice(&msg.bytes);
    client
        .write_all(to_client)
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)?;
    // After an ErrorResponse (the backend's own, relayed as is) the login is over.
    match msg.tag() {
        b'Z' => Ok(()),
        _ => Err(SessionError::LoginRefused),
    }
}

/// Passes a backend's authentication request on to the client (passthrough): an outcome joins
/// the messages still to send, a challenge is sent at once. True when the client must answer.
async fn relay_auth_request(
    client: &mut Stream,
    msg: &RawMessage,
    code: i32,
    to_client: &mut Vec<u8>,
) -> Result<bool, SessionError> {
    match code {
        auth_code::OK | auth_code::SASL_FINAL => {
            to_client.extend_from_slice(&msg.bytes);
            Ok(false)
        }
        auth_code::SASL | auth_code::SASL_CONTINUE | auth_code::CLEARTEXT | auth_code::MD5 => {
            to_client.extend_from_slice(&msg.bytes);
            client
                .write_all(to_client)
                .await
                .map_err(SessionError::ClientIo)?;
            to_client.clear();
            Ok(true)
        }
        other => Err(SessionError::BackendUnsupported(format!(
            "asks for authentication method {other}, which the gateway cannot relay"
        ))),
    }
}

/// Reads the client's answer to an authentication request: a password-family message (`p`).
pub(crate) async fn read_password_message(
    client: &mut Stream,
    max: usize,
) -> Result<RawMessage, SessionError> {
    let answer = read_message(client, max)
        .await
        .map_err(SessionError::ClientIo)?
        .ok_or_else(|| {
            SessionError::ClientProtocol("password message length out of range".into())
        })?;
    if answer.tag() != b'p' {
        return Err(SessionError::ClientProtocol(format!(
            "expected a password message, got message type {:?}",
            answer.tag() as char
        )));
    }
    Ok(answer)
}

/// Logs in to `backend` on the user's behalf with no client attached (a revival, a pooled
/// connection): the backend's ParameterStatus and notices are dropped. Returns the backend's
/// cancel key, or the body of the ErrorResponse it refused the login with.
pub async fn login_detached(
    link: &BackendLink,
    backend: &mut Stream,
    params: &[(String, String)],
    endpoint: &Endpoint,
    mut auth: OnBehalf<'_>,
) -> Result<Result<(i32, bytes::Bytes), Vec<u8>>, SessionError> {
    let backend_io = |e: std::io::Error| SessionError::BackendUnreachable {
        endpoint: endpoint.to_string(),
        source: e,
    };
    backend
        .write_all(&startup_packet(params))
        .await
        .map_err(backend_io)?;
    let mut key = None;
    loop {
        let msg = read_message(backend, link.max_message)
            .await
            .map_err(backend_io)?
            .ok_or_else(|| SessionError::BackendProtocol("message length out of range".into()))?;
        match msg.tag() {
            b'R' => {
                let code = auth_request_code(msg.body()).ok_or_else(|| {
                    SessionError::BackendProtocol("short authentication request".into())
                })?;
                if let Some(reply) = auth.answer(code, msg.body()).await? {
                    backend.write_all(&reply).await.map_err(backend_io)?;
                }
            }
            b'K' => {
                key = Some(parse_backend_key_data(msg.body()).ok_or_else(|| {
                    SessionError::BackendProtocol("malformed BackendKeyData".into())
                })?);
            }
            b'Z' => {
                return key
                    .map(Ok)
                    .ok_or_else(|| SessionError::BackendProtocol("no BackendKeyData".into()));
            }
            b'E' => return Ok(Err(msg.body().to_vec())),
            b'S' | b'N' | b'v' => {}
            other => {
                return Err(SessionError::BackendProtocol(format!(
                    "unexpected message type {:?} during login",
                    other as char
                )));
            }
        }
    }
}
