//! The SCRAM exchange with the client, run by the gateway itself, and the login material it
//! leaves behind for logging in to the backend on the user's behalf.

use std::sync::Arc;

use pgwake_protocol::scram::{Nonce, ScramErrorKind, ScramKeys, ScramServer, mechanisms};
use tokio::io::AsyncWriteExt;

use super::Credential;
use crate::error::SessionError;
use crate::stream::Stream;
use pgwake_protocol::auth as msg;

/// What a successful client login leaves for logging in to backends as that user: never the
/// password where SCRAM keys suffice.
#[derive(Clone)]
pub struct LoginMaterial {
    /// Keys valid for backends whose verifier equals the gateway's (same salt and iterations).
    pub keys: ScramKeys,
    /// The user's credential, holding the password when the source knows it (for other salts,
    /// md5, cleartext) and the keys derived from it.
    pub credential: Arc<Credential>,
}

/// Reads one password-family message (`p`) from the client: its body.
async fn read_password_message(client: &mut Stream, max: usize) -> Result<Vec<u8>, SessionError> {
    let m = crate::wire::read_password_message(client, max).await?;
    Ok(m.body().to_vec())
}

/// Authenticates `user` with SCRAM-SHA-256 (or -PLUS when `channel_binding` is given, i.e. the
/// client link is TLS). An unknown user (`credential` is `None`) goes through a mock exchange
/// that fails exactly like a wrong password. Of the two `steps`, the first is called when the
/// client's first SASL message arrives (its login got further than a startup message), the
/// second when the proof arrives, before it is checked (the throttle's reservation, which may
/// wait on another attempt's outcome).
pub async fn authenticate_client(
    client: &mut Stream,
    user: &str,
    credential: Option<Arc<Credential>>,
    channel_binding: Option<Vec<u8>>,
    mock_key: &[u8],
    max_message: usize,
    steps: (
        impl FnOnce(),
        impl AsyncFnOnce() -> Result<(), SessionError>,
    ),
) -> Result<LoginMaterial, SessionError> {
    let (progressed, reserve) = steps;
    let scram_error = |e: pgwake_protocol::scram::ScramError| match e.kind() {
        ScramErrorKind::InvalidPassword => SessionError::AuthFailed(user.to_owned()),
        ScramErrorKind::ProtocolViolation => SessionError::ClientProtocol(e.to_string()),
    };
    let cb = channel_binding.as_deref();
    client
        .write_all(&msg::authentication_sasl(mechanisms(cb.is_some())))
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)?;

    let initial = read_password_message(client, max_message).await?;
    let initial = msg::parse_sasl_initial_response(&initial)
        .map_err(|e| SessionError::ClientProtocol(e.to_string()))?;
    let (mechanism, client_first) = (initial.auth_method, initial.data.unwrap_or_default());
    progressed();
    let nonce = Nonce::from_random(rand::random());
    let (server, server_first) = match &credential {
        Some(c) => ScramServer::start(&c.verifier, cb, nonce, &mechanism, &client_first),
        None => ScramServer::start_mock(mock_key, user, cb, nonce, &mechanism, &client_first),
    }
    .map_err(scram_error)?;
    client
        .write_all(&msg::authentication_sasl_continue(&server_first))
        .await
        .map_err(SessionError::ClientIo)?;
    client.flush().await.map_err(SessionError::ClientIo)?;

    let response = read_password_message(client, max_message).await?;
    // The proof is here: it counts against the throttle before it is checked.
    reserve().await?;
    let (server_final, client_key) = server.finish(&response).map_err(scram_error)?;
    let credential = credential.ok_or_else(|| SessionError::AuthFailed(user.to_owned()))?;
    let mut out = msg::authentication_sasl_final(&server_final);
    out.extend_from_slice(&msg::authentication_ok());
    client
        .write_all(&out)
        .await
        .map_err(SessionError::ClientIo)?;
    Ok(LoginMaterial {
        keys: credential.verifier.keys(client_key),
        credential,
    })
}
