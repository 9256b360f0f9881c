//! The first message of a connection: SSLRequest, GSSENCRequest, CancelRequest or StartupMessage.
//!
//! These messages carry no type byte, only a length and a code, and arrive before the client is
//! known, so every length is checked against a limit before any allocation.

use bytes::{Bytes, BytesMut};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::startup::Startup;
use pgwire::messages::{DecodeContext, Message, ProtocolVersion};
use thiserror::Error;

/// Request code of an SSLRequest.
pub const SSL_REQUEST_CODE: u32 = 80_877_103;
/// Request code of a GSSENCRequest.
pub const GSSENC_REQUEST_CODE: u32 = 80_877_104;
/// Request code of a CancelRequest.
pub const CANCEL_REQUEST_CODE: u32 = 80_877_102;
/// Protocol 3.0 as a version number, the only version the gateway speaks.
pub const PROTOCOL_3_0: u32 = 196_608;
/// Prefix of protocol-extension parameters (`_pq_.name`), which the gateway does not support.
pub const PROTOCOL_EXTENSION_PREFIX: &str = "_pq_.";

/// Why the first message of a connection was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StartupError {
    /// The length field cannot hold a length and a code.
    #[error("invalid length of startup packet: {0}")]
    TooShort(u32),
    /// The length field exceeds the configured limit.
    #[error("startup packet of {len} bytes is over the limit of {max} bytes")]
    TooLarge {
        /// The length as sent.
        len: u32,
        /// The configured limit.
        max: usize,
    },
    /// A major version other than 3, or a request code the gateway does not know.
    #[error("unsupported frontend protocol {major}.{minor}: server supports 3.0")]
    UnsupportedProtocol {
        /// Major version (high 16 bits of the code).
        major: u16,
        /// Minor version (low 16 bits).
        minor: u16,
    },
    /// The message body does not have the documented layout.
    #[error("invalid startup packet layout: {0}")]
    Malformed(&'static str),
}

/// The secret pair a client presents to cancel a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelKey {
    /// Process id as issued in BackendKeyData.
    pub pid: i32,
    /// Secret key bytes (4 for protocol 3.0, up to 256 for 3.2).
    pub secret: Bytes,
}

/// A StartupMessage: protocol version and the parameters in the order the client sent them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartupMessage {
    /// Major protocol version (always 3 once parsed).
    pub major: u16,
    /// Minor protocol version requested by the client.
    pub minor: u16,
    /// Parameters such as `user`, `database`, `options`, `application_name`.
    pub params: Vec<(String, String)>,
}

impl StartupMessage {
    /// The value of a parameter.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets a parameter, replacing any earlier value.
    pub fn set(&mut self, key: &str, value: String) {
        match self.params.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.params.push((key.to_owned(), value)),
        }
    }

    /// Removes a parameter.
    pub fn remove(&mut self, key: &str) {
        self.params.retain(|(k, _)| k != key);
    }

    /// Protocol-extension options (`_pq_.*`) the client asked for; the gateway supports none.
    pub fn unsupported_options(&self) -> Vec<String> {
        self.params
            .iter()
            .filter(|(k, _)| k.starts_with(PROTOCOL_EXTENSION_PREFIX))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// True when the client must be told, with NegotiateProtocolVersion, that we speak 3.0 only.
    pub fn needs_negotiation(&self) -> bool {
        self.minor > 0
            || self
                .params
                .iter()
                .any(|(k, _)| k.starts_with(PROTOCOL_EXTENSION_PREFIX))
    }

    /// Parameters to forward to a backend: everything except protocol extensions.
    pub fn forwardable_params(&self) -> impl Iterator<Item = &(String, String)> {
        self.params
            .iter()
            .filter(|(k, _)| !k.starts_with(PROTOCOL_EXTENSION_PREFIX))
    }
}

/// What a connection's first (or, after SSL/GSS negotiation, next) message asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitialMessage {
    /// Wants TLS.
    SslRequest,
    /// Wants GSSAPI encryption.
    GssEncRequest,
    /// Wants a running query cancelled.
    Cancel(CancelKey),
    /// Wants a session.
    Startup(StartupMessage),
}

/// Checks the 4-byte length field of an initial message and returns the whole packet length.
pub fn initial_length(len_field: [u8; 4], max: usize) -> Result<usize, StartupError> {
    let len = u32::from_be_bytes(len_field);
    if len < 8 {
        return Err(StartupError::TooShort(len));
    }
    if len as usize > max {
        return Err(StartupError::TooLarge { len, max });
    }
    Ok(len as usize)
}

/// Parses a whole initial packet, length field included.
pub fn parse_initial(packet: &[u8]) -> Result<InitialMessage, StartupError> {
    if packet.len() < 8 {
        return Err(StartupError::TooShort(packet.len() as u32));
    }
    let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
    match code {
        SSL_REQUEST_CODE | GSSENC_REQUEST_CODE if packet.len() != 8 => {
            Err(StartupError::Malformed("SSL or GSS request with a body"))
        }
        SSL_REQUEST_CODE => Ok(InitialMessage::SslRequest),
        GSSENC_REQUEST_CODE => Ok(InitialMessage::GssEncRequest),
        CANCEL_REQUEST_CODE => {
            if packet.len() < 16 || packet.len() > 12 + 256 {
                return Err(StartupError::Malformed("cancel request of the wrong size"));
            }
            let ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_2);
            let req = CancelRequest::decode(&mut BytesMut::from(packet), &ctx)
                .ok()
                .flatten()
                .ok_or(StartupError::Malformed("cancel request"))?;
            Ok(InitialMessage::Cancel(CancelKey {
                pid: req.pid,
                secret: req.secret_key.to_bytes(),
            }))
        }
        _ => {
            let (major, minor) = ((code >> 16) as u16, code as u16);
            if major != 3 {
                return Err(StartupError::UnsupportedProtocol { major, minor });
            }
            if packet.last() != Some(&0) {
                return Err(StartupError::Malformed("parameter list is not terminated"));
            }
            let mut body = BytesMut::from(&packet[4..]);
            let ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
            let startup = Startup::decode_body(&mut body, packet.len(), &ctx)
                .map_err(|_| StartupError::Malformed("startup message"))?;
            Ok(InitialMessage::Startup(StartupMessage {
                major,
                minor,
                params: startup.parameters.into_iter().collect(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: u32, body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn parses_startup() {
        let p = packet(PROTOCOL_3_0, b"user\0bob\0database\0alpha.db\0\0");
        let InitialMessage::Startup(s) = parse_initial(&p).unwrap() else {
            panic!("not a startup")
        };
        assert_eq!(s.get("user"), Some("bob"));
        assert_eq!(s.get("database"), Some("alpha.db"));
        assert!(!s.needs_negotiation());
    }

    #[test]
    fn newer_minor_and_extensions_need_negotiation() {
        let p = packet(PROTOCOL_3_0 + 2, b"user\0bob\0_pq_.x\0y\0\0");
        let InitialMessage::Startup(s) = parse_initial(&p).unwrap() else {
            panic!("not a startup")
        };
        assert!(s.needs_negotiation());
        assert_eq!(s.unsupported_options(), vec!["_pq_.x".to_owned()]);
        assert_eq!(s.forwardable_params().count(), 1);
    }

    #[test]
    fn parses_requests() {
        assert_eq!(
            parse_initial(&packet(SSL_REQUEST_CODE, b"")),
            Ok(InitialMessage::SslRequest)
        );
        assert_eq!(
            parse_initial(&packet(GSSENC_REQUEST_CODE, b"")),
            Ok(InitialMessage::GssEncRequest)
        );
        let mut body = 42i32.to_be_bytes().to_vec();
        body.extend_from_slice(&7i32.to_be_bytes());
        assert_eq!(
            parse_initial(&packet(CANCEL_REQUEST_CODE, &body)),
            Ok(InitialMessage::Cancel(CancelKey {
                pid: 42,
                secret: Bytes::from(7i32.to_be_bytes().to_vec()),
            }))
        );
    }

    #[test]
    fn refuses_bad_input() {
        assert_eq!(
            initial_length([0, 0, 0, 4], 10240),
            Err(StartupError::TooShort(4))
        );
        assert!(matches!(
            initial_length([0, 0x10, 0, 0], 10240),
            Err(StartupError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_initial(&packet(2 << 16, b"\0")),
            Err(StartupError::UnsupportedProtocol { major: 2, .. })
        ));
        assert!(parse_initial(&packet(PROTOCOL_3_0, b"user\0bob")).is_err());
        assert!(parse_initial(&packet(SSL_REQUEST_CODE, b"xx")).is_err());
        assert!(parse_initial(&packet(CANCEL_REQUEST_CODE, b"1")).is_err());
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 64) as usize;
            let mut p: Vec<u8> = (0..len)
                .map(|i| (state.rotate_left(i as u32 * 8) & 0xff) as u8)
                .collect();
            if p.len() >= 8 && state.is_multiple_of(3) {
                p[4..8].copy_from_slice(&PROTOCOL_3_0.to_be_bytes());
            }
            let _ = parse_initial(&p);
        }
    }
}
