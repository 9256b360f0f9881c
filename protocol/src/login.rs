//! Sans-io backend login: the gateway hands over each message a backend sends while a login
//! runs and learns what to do next. The same machine serves a login carried to a client
//! (passthrough relays the authentication exchange, the gateway's own login greets the client
//! with the backend's parameters) and a detached one (a revival, a pooled connection), where
//! nothing reaches a client.

use bytes::Bytes;

use crate::backend::{auth_code, auth_request_code, parse_backend_key_data};
use crate::frontend::error_fields;
use crate::sqlstate;

/// Who answers the backend's authentication requests, and who sees the login's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginMode {
    /// The client answers (passthrough); it sees every message.
    Relay,
    /// The gateway answers for an authenticated client, which sees parameters, notices, its
    /// cancel key and ReadyForQuery.
    Greet,
    /// The gateway answers and no client sees anything.
    Detached,
}

/// What the caller does after a backend message.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Read the backend's next message.
    Next,
    /// Answer this authentication request on the user's behalf (`body` is the `R` body).
    Answer {
        /// The request's code ([`auth_code`]).
        code: i32,
        /// The whole message body.
        body: &'a [u8],
    },
    /// Send the held bytes to the client and pass its password message on to the backend.
    AskClient,
    /// The backend's cancel key: a client gets a key of the gateway's instead
    /// ([`BackendLogin::hold`]).
    Key {
        /// Backend process id.
        pid: i32,
        /// Backend secret.
        secret: Bytes,
    },
    /// The backend is ready: the login is done (send what is held to a client).
    Ready,
    /// The backend refused the login with this ErrorResponse body. With `retry`, nobody has
    /// seen any of the login and the server is starting up or recovering (`57P03`): the caller
    /// may try again on a new connection; otherwise a client gets the held bytes.
    Refused {
        /// The ErrorResponse body.
        body: &'a [u8],
        /// Whether a new attempt is invisible to the client.
        retry: bool,
    },
}

/// A backend that broke the login protocol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    /// An authentication request without its code.
    #[error("short authentication request")]
    ShortAuthRequest,
    /// A BackendKeyData message that does not parse.
    #[error("malformed BackendKeyData")]
    MalformedKey,
    /// An authentication method the gateway cannot relay.
    #[error("asks for authentication method {0}, which the gateway cannot relay")]
    Unrelayable(i32),
    /// A message that has no place in a login.
    #[error("unexpected message type {:?} during login", *.0 as char)]
    Unexpected(u8),
}

/// One backend login in progress.
#[derive(Debug)]
pub struct BackendLogin {
    mode: LoginMode,
    /// Bytes for the client, sent when it must answer or when the login ends.
    held: Vec<u8>,
    /// The backend's ParameterStatus messages, when asked to keep them.
    parameters: Option<Vec<u8>>,
    /// Whether the client has been sent anything of this login yet.
    relayed: bool,
}

impl BackendLogin {
    /// A login in `mode`; with `keep_parameters` the backend's ParameterStatus messages are
    /// also kept whole (a connection kept for reuse replays them to its next client).
    pub fn new(mode: LoginMode, keep_parameters: bool) -> BackendLogin {
        BackendLogin {
            mode,
            held: Vec::with_capacity(if mode == LoginMode::Detached { 0 } else { 512 }),
            parameters: keep_parameters.then(Vec::new),
            relayed: false,
        }
    }

    /// Takes in one whole backend message (`raw`: tag, length and body) and says what to do.
    pub fn step<'a>(&mut self, raw: &'a [u8]) -> Result<Step<'a>, LoginError> {
        let (tag, body) = (raw[0], &raw[5..]);
        let for_client = self.mode != LoginMode::Detached;
        match tag {
            b'R' => {
                let code = auth_request_code(body).ok_or(LoginError::ShortAuthRequest)?;
                if self.mode != LoginMode::Relay {
                    return Ok(Step::Answer { code, body });
                }
                self.held.extend_from_slice(raw);
                match code {
                    auth_code::OK | auth_code::SASL_FINAL => Ok(Step::Next),
                    auth_code::SASL
                    | auth_code::SASL_CONTINUE
                    | auth_code::CLEARTEXT
                    | auth_code::MD5 => {
                        self.relayed = true;
                        Ok(Step::AskClient)
                    }
                    other => Err(LoginError::Unrelayable(other)),
                }
            }
            b'K' => {
                let (pid, secret) = parse_backend_key_data(body).ok_or(LoginError::MalformedKey)?;
                Ok(Step::Key { pid, secret })
            }
            b'S' => {
                if let Some(p) = self.parameters.as_mut() {
                    p.extend_from_slice(raw);
                }
                if for_client {
                    self.held.extend_from_slice(raw);
                }
                Ok(Step::Next)
            }
            b'N' => {
                if for_client {
                    self.held.extend_from_slice(raw);
                }
                Ok(Step::Next)
            }
            // The gateway asks for plain 3.0 without extensions, so a negotiation answer
            // carries nothing a client needs (it got the gateway's own).
            b'v' => Ok(Step::Next),
            b'Z' => {
                if for_client {
                    self.held.extend_from_slice(raw);
                }
                Ok(Step::Ready)
            }
            b'E' => {
                let retry =
                    !self.relayed && error_fields(body).code == sqlstate::CANNOT_CONNECT_NOW;
                if for_client && !retry {
                    self.held.extend_from_slice(raw);
                }
                Ok(Step::Refused { body, retry })
            }
            other => Err(LoginError::Unexpected(other)),
        }
    }

    /// Adds bytes for the client (the gateway's own cancel key).
    pub fn hold(&mut self, bytes: &[u8]) {
        self.held.extend_from_slice(bytes);
    }

    /// The bytes for the client held so far; afterwards the client counts as having seen the
    /// login.
    pub fn take_held(&mut self) -> Vec<u8> {
        self.relayed = true;
        std::mem::take(&mut self.held)
    }

    /// Whether the client has been sent anything of this login (a broken connection before
    /// that can be retried unseen).
    pub fn relayed(&self) -> bool {
        self.relayed
    }

    /// The backend's ParameterStatus messages, when kept; without the room they grew by, as
    /// they are held for as long as the backend connection is kept.
    pub fn take_parameters(&mut self) -> Option<Vec<u8>> {
        let mut kept = self.parameters.take()?;
        kept.shrink_to_fit();
        Some(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorMessage;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn auth(code: i32) -> Vec<u8> {
        msg(b'R', &code.to_be_bytes())
    }

    fn key() -> Vec<u8> {
        let mut body = 42i32.to_be_bytes().to_vec();
        body.extend_from_slice(&7u32.to_be_bytes());
        msg(b'K', &body)
    }

    #[test]
    fn a_relayed_login_asks_the_client_and_holds_the_rest() {
        let mut login = BackendLogin::new(LoginMode::Relay, true);
        let sasl = auth(auth_code::SASL);
        assert_eq!(login.step(&sasl), Ok(Step::AskClient));
        assert_eq!(login.take_held(), sasl);
        assert_eq!(login.step(&auth(auth_code::OK)), Ok(Step::Next));
        let param = msg(b'S', b"server_version\x0017\x00");
        assert_eq!(login.step(&param), Ok(Step::Next));
        assert!(matches!(login.step(&key()), Ok(Step::Key { pid: 42, .. })));
        login.hold(b"KEY");
        let ready = msg(b'Z', b"I");
        assert_eq!(login.step(&ready), Ok(Step::Ready));
        let held = login.take_held();
        assert!(held.starts_with(&auth(auth_code::OK)));
        assert!(held.ends_with(&ready));
        assert_eq!(login.take_parameters(), Some(param));
    }

    #[test]
    fn the_gateway_answers_for_greeted_and_detached_logins() {
        for mode in [LoginMode::Greet, LoginMode::Detached] {
            let mut login = BackendLogin::new(mode, false);
            let md5 = msg(b'R', &[0, 0, 0, 5, 1, 2, 3, 4]);
            assert_eq!(
                login.step(&md5),
                Ok(Step::Answer {
                    code: auth_code::MD5,
                    body: &md5[5..]
                })
            );
            login.step(&msg(b'N', b"")).unwrap();
            login.step(&msg(b'Z', b"I")).unwrap();
            let held = login.take_held();
            assert_eq!(held.is_empty(), mode == LoginMode::Detached);
            assert_eq!(login.take_parameters(), None);
        }
    }

    #[test]
    fn not_ready_is_retried_only_while_the_client_saw_nothing() {
        let not_ready = ErrorMessage::fatal(sqlstate::CANNOT_CONNECT_NOW, "starting").to_bytes();
        let mut fresh = BackendLogin::new(LoginMode::Relay, false);
        assert!(matches!(
            fresh.step(&not_ready),
            Ok(Step::Refused { retry: true, .. })
        ));
        assert!(fresh.take_held().is_empty());

        let mut seen = BackendLogin::new(LoginMode::Relay, false);
        seen.step(&auth(auth_code::CLEARTEXT)).unwrap();
        seen.take_held();
        assert!(matches!(
            seen.step(&not_ready),
            Ok(Step::Refused { retry: false, .. })
        ));
        assert_eq!(seen.take_held(), not_ready);
    }

    #[test]
    fn protocol_breaks_are_errors() {
        let mut login = BackendLogin::new(LoginMode::Relay, false);
        assert_eq!(
            login.step(&msg(b'R', b"")),
            Err(LoginError::ShortAuthRequest)
        );
        assert_eq!(login.step(&auth(9)), Err(LoginError::Unrelayable(9)));
        assert_eq!(login.step(&msg(b'K', b"x")), Err(LoginError::MalformedKey));
        assert_eq!(
            login.step(&msg(b'D', b"")),
            Err(LoginError::Unexpected(b'D'))
        );
    }
}
