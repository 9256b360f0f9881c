//! Logging in to a backend on the user's behalf with what the client's login left: SCRAM with
//! the recovered keys when the backend's verifier matches the gateway's, else keys derived from
//! the password for the backend's salt; cleartext and md5 backends need the password.

use pgwake_protocol::auth as msg;
use pgwake_protocol::backend::auth_code;
use pgwake_protocol::scram::{AwaitingServerFinal, Nonce, SCRAM_SHA_256, ScramClient, ScramKeys};
use pgwire::messages::startup::Authentication;

use crate::auth::client::LoginMaterial;
use crate::error::SessionError;

/// The gateway's side of one backend login.
pub struct OnBehalf<'a> {
    user: &'a str,
    material: &'a LoginMaterial,
    max_iterations: u32,
    scram: Option<ScramClient>,
    awaiting: Option<AwaitingServerFinal>,
}

impl<'a> OnBehalf<'a> {
    /// A login as `user` with `material`, deriving keys for at most `max_iterations`.
    pub fn new(user: &'a str, material: &'a LoginMaterial, max_iterations: u32) -> Self {
        OnBehalf {
            user,
            material,
            max_iterations,
            scram: None,
            awaiting: None,
        }
    }

    fn refused(&self, reason: impl Into<String>) -> SessionError {
        SessionError::BackendLogin {
            user: self.user.to_owned(),
            reason: reason.into(),
        }
    }

    fn password(&self, method: &str) -> Result<&str, SessionError> {
        self.material.credential.password.as_deref().ok_or_else(|| {
            self.refused(format!(
                "the backend asks for {method} authentication and the gateway holds no password"
            ))
        })
    }

    /// The answer to an authentication request (`body` is the `R` message body), if it needs
    /// one.
    pub async fn answer(
        &mut self,
        code: i32,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, SessionError> {
        let data = &body[4..];
        match code {
            auth_code::SASL => {
                let offered = match msg::parse_authentication(body) {
                    Ok(Authentication::SASL(mechanisms)) => mechanisms,
                    _ => {
                        return Err(SessionError::BackendProtocol(
                            "malformed SASL request".into(),
                        ));
                    }
                };
                if !offered.iter().any(|m| m == SCRAM_SHA_256) {
                    return Err(self.refused(format!(
                        "the backend offers none of the gateway's SASL mechanisms ({offered:?})"
                    )));
                }
                let client = ScramClient::new(Nonce::from_random(rand::random()));
                let first = msg::sasl_initial_response(SCRAM_SHA_256, &client.client_first());
                self.scram = Some(client);
                Ok(Some(first.to_vec()))
            }
            auth_code::SASL_CONTINUE => {
                let client = self.scram.take().ok_or_else(|| {
                    SessionError::BackendProtocol("SASL continue out of order".into())
                })?;
                let challenge = client
                    .handle_server_first(data)
                    .map_err(|e| SessionError::BackendProtocol(e.to_string()))?;
                let credential = &self.material.credential;
                let (salt, iterations) = (challenge.salt().to_vec(), challenge.iterations());
                let keys = if challenge.matches(&self.material.keys) {
                    self.material.keys.clone()
                } else if let Some(keys) = credential.derived_keys(&salt, iterations) {
                    keys
                } else if iterations > self.max_iterations {
                    return Err(self.refused(format!(
                        "the backend asks for {iterations} SCRAM iterations, over \
                         auth.max_backend_iterations ({})",
                        self.max_iterations
                    )));
                } else {
                    let password = credential.password.clone().ok_or_else(|| {
                        self.refused(
                            "the backend's SCRAM verifier has another salt or iteration count \
                             than the gateway's, and the gateway holds no password",
                        )
                    })?;
                    // PBKDF2 stays off the runtime's threads.
                    let keys = tokio::task::spawn_blocking(move || {
                        ScramKeys::from_password(password, &salt, iterations)
                    })
                    .await
                    .map_err(|e| self.refused(e.to_string()))?;
                    credential.remember_keys(keys.clone());
                    keys
                };
                let (awaiting, client_final) = challenge
                    .client_final(&keys)
                    .map_err(|e| SessionError::BackendProtocol(e.to_string()))?;
                self.awaiting = Some(awaiting);
                Ok(Some(msg::sasl_response(&client_final).to_vec()))
            }
            auth_code::SASL_FINAL => {
                let awaiting = self.awaiting.take().ok_or_else(|| {
                    SessionError::BackendProtocol("SASL final out of order".into())
                })?;
                awaiting
                    .verify_server_final(data)
                    .map_err(|e| self.refused(format!("the backend's SCRAM signature: {e}")))?;
                Ok(None)
            }
            auth_code::CLEARTEXT => Ok(Some(
                msg::password_message(self.password("password")?.as_bytes()).to_vec(),
            )),
            auth_code::MD5 => {
                let salt: [u8; 4] = data
                    .get(..4)
                    .and_then(|s| s.try_into().ok())
                    .ok_or_else(|| SessionError::BackendProtocol("short md5 request".into()))?;
                let hashed = msg::md5_password(self.user, self.password("md5")?, salt);
                Ok(Some(msg::password_message(hashed.as_bytes()).to_vec()))
            }
            auth_code::OK => Ok(None),
            other => Err(SessionError::BackendUnsupported(format!(
                "asks for authentication method {other}, which the gateway cannot answer"
            ))),
        }
    }
}
