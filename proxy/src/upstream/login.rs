//! Carrying out a backend login that `pgwake_protocol::login` decides: the startup goes to the
//! backend, authentication requests are answered by the gateway or relayed to the client, and
//! a client is given a gateway-issued cancel key in place of the backend's.

use std::sync::Arc;

use pgwake_protocol::backend::{backend_key_data, startup_packet};
use pgwake_protocol::login::{BackendLogin, LoginMode, Step};
use pgwake_routing::Endpoint;
use tokio::io::AsyncWriteExt;

use super::OpenError;
use super::connect::BackendLink;
use super::on_behalf::OnBehalf;
use crate::cancel::{CancelMap, CancelRegistration, CancelTarget};
use crate::error::SessionError;
use crate::stream::Stream;
use crate::wire::{read_message, read_password_message};

/// The client a login is carried to, and where its cancel key is registered.
pub(super) struct ToClient<'a> {
    /// The client's stream.
    pub stream: &'a mut Stream,
    /// Gateway-issued cancel keys.
    pub cancels: &'a Arc<CancelMap>,
}

/// What a finished login left.
#[derive(Default)]
pub(super) struct LoggedIn {
    /// The backend's cancel key.
    pub target: Option<CancelTarget>,
    /// The key the client was given for it (logins carried to a client).
    pub cancel: Option<CancelRegistration>,
    /// The backend's ParameterStatus messages, when asked to keep them.
    pub parameters: Option<Vec<u8>>,
    /// Whether the backend asked the client for a password (or any exchange) before letting it
    /// in: then the gateway cannot vouch for the next client with the same startup.
    pub asked_client: bool,
}

/// The startup parameters with the settings the gateway imposes on every backend session: the
/// idle-in-transaction limit (`limits.idle_in_transaction_timeout`) after anything the client
/// asked for under that name, so that the gateway's value is the one Postgres keeps.
fn with_gateway_settings(link: &BackendLink, params: &[(String, String)]) -> Vec<(String, String)> {
    const IDLE_IN_TRANSACTION: &str = "idle_in_transaction_session_timeout";
    let mut out: Vec<_> = params
        .iter()
        .filter(|(k, _)| link.idle_in_transaction.is_none() || k != IDLE_IN_TRANSACTION)
        .cloned()
        .collect();
    if let Some(t) = link.idle_in_transaction {
        out.push((
            IDLE_IN_TRANSACTION.to_owned(),
            format!("{}ms", t.as_millis()),
        ));
    }
    out
}

/// Logs in to `backend` with `params`: the gateway answers authentication requests when it has
/// `auth`, else the client does; with a client the login is carried to it until the backend's
/// first ReadyForQuery has reached it. A refusal the client saw nothing of and that may pass
/// (`57P03`, or the connection cut mid-login by a crash restart) is `BackendNotReady`, to be
/// retried; a detached login's refusal is the backend's ErrorResponse body. Callers bound it
/// in time.
///
/// One loop over the backend's messages with an arm per step of `protocol::login`'s decisions:
/// the arms share the backend stream, the client and the result being built, and the login
/// reads best as that one conversation.
pub(super) async fn log_in(
    link: &BackendLink,
    backend: &mut Stream,
    endpoint: &Endpoint,
    params: &[(String, String)],
    mut auth: Option<OnBehalf<'_>>,
    mut client: Option<ToClient<'_>>,
    keep_parameters: bool,
) -> Result<LoggedIn, OpenError> {
    let mode = match (&auth, &client) {
        (_, None) => LoginMode::Detached,
        (Some(_), Some(_)) => LoginMode::Greet,
        (None, Some(_)) => LoginMode::Relay,
    };
    let mut login = BackendLogin::new(mode, keep_parameters);
    let io = |login: &BackendLogin, e| connection_lost(login, mode, endpoint, e);
    let params = with_gateway_settings(link, params);
    backend
        .write_all(&startup_packet(params.iter()))
        .await
        .map_err(|e| io(&login, e))?;
    let mut done = LoggedIn::default();
    loop {
        let msg = read_message(backend, link.max_message)
            .await
            .map_err(|e| io(&login, e))?
            .ok_or_else(|| SessionError::BackendProtocol("message length out of range".into()))?;
        let step = login
            .step(&msg.bytes)
            .map_err(|e| SessionError::BackendProtocol(e.to_string()))?;
        match step {
            Step::Next => {}
            Step::Answer { code, body } => {
                let Some(on_behalf) = auth.as_mut() else {
                    return Err(out_of_mode());
                };
                if let Some(reply) = on_behalf.answer(code, body).await? {
                    backend.write_all(&reply).await.map_err(|e| io(&login, e))?;
                }
            }
            Step::AskClient => {
                let Some(c) = client.as_mut() else {
                    return Err(out_of_mode());
                };
                done.asked_client = true;
                let answer = ask_client(c.stream, &mut login, link.max_client_message).await?;
                backend
                    .write_all(&answer)
                    .await
                    .map_err(|e| io(&login, e))?;
            }
            Step::Key { pid, secret } => {
                let target = CancelTarget {
                    endpoint: endpoint.clone(),
                    pid,
                    secret,
                };
                keep_key(target, client.as_ref(), &mut login, &mut done);
            }
            Step::Ready => {
                if let Some(c) = client.as_mut() {
                    send_held(c.stream, &mut login).await?;
                }
                done.parameters = login.take_parameters();
                return Ok(done);
            }
            Step::Refused { retry: true, body } if client.is_some() => {
                let fields = pgwake_protocol::frontend::error_fields(body);
                return Err(SessionError::BackendNotReady(fields.message).into());
            }
            Step::Refused { body, .. } => {
                let Some(c) = client.as_mut() else {
                    return Err(OpenError::Refused(body.to_vec()));
                };
                // The backend's own ErrorResponse, relayed as is, ends the login.
                send_held(c.stream, &mut login).await?;
                return Err(SessionError::LoginRefused.into());
            }
        }
    }
}

/// What a connection cut during the login is: the backend unreachable once the client has seen
/// part of the login (or for a detached login), else a server not ready yet.
fn connection_lost(
    login: &BackendLogin,
    mode: LoginMode,
    endpoint: &Endpoint,
    e: std::io::Error,
) -> SessionError {
    if login.relayed() || mode == LoginMode::Detached {
        SessionError::BackendUnreachable {
            endpoint: endpoint.to_string(),
            source: e,
        }
    } else {
        // A crash restart of Postgres ends every child, new ones mid-login included: for a
        // client that has seen nothing yet, a server not ready.
        SessionError::BackendNotReady(format!("the connection ended during the login: {e}"))
    }
}

/// Keeps the backend's cancel key; with a client, registers a gateway-issued key for it and
/// holds that key's BackendKeyData for the client in place of the backend's.
fn keep_key(
    target: CancelTarget,
    client: Option<&ToClient<'_>>,
    login: &mut BackendLogin,
    done: &mut LoggedIn,
) {
    if let Some(c) = client {
        let reg = c.cancels.register(target.clone());
        login.hold(&backend_key_data(reg.pid, reg.secret));
        done.cancel = Some(reg);
    }
    done.target = Some(target);
}

/// A step the login's mode rules out (the mode follows from `auth` and the client, so this
/// would be the gateway's own mistake), refused rather than trusted.
fn out_of_mode() -> OpenError {
    SessionError::BackendProtocol("a login step its mode rules out".into()).into()
}

/// Sends the client the authentication request (and what came before it) and reads its answer
/// for the backend.
async fn ask_client(
    client: &mut Stream,
    login: &mut BackendLogin,
    max: usize,
) -> Result<Vec<u8>, SessionError> {
    send_held(client, login).await?;
    Ok(read_password_message(client, max).await?.bytes)
}

/// Sends the client what the login held back for it.
async fn send_held(client: &mut Stream, login: &mut BackendLogin) -> Result<(), SessionError> {
    let held = login.take_held();
    client
        .write_all(&held)
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)
}
