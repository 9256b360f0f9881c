//! Messages the gateway exchanges with a client or backend during login: the startup it sends a
//! backend, the keys it substitutes, the authentication requests it inspects.

use bytes::{Buf, Bytes, BytesMut};
use pgwire::messages::Message;
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::startup::{BackendKeyData, NegotiateProtocolVersion, SecretKey, Startup};

use crate::startup::{PROTOCOL_3_0, SSL_REQUEST_CODE};

/// Authentication request codes (the first Int32 of an `R` message).
pub mod auth_code {
    /// Authentication succeeded.
    pub const OK: i32 = 0;
    /// Cleartext password requested.
    pub const CLEARTEXT: i32 = 3;
    /// MD5 password requested.
    pub const MD5: i32 = 5;
    /// SASL: the list of mechanisms follows.
    pub const SASL: i32 = 10;
    /// SASL challenge.
    pub const SASL_CONTINUE: i32 = 11;
    /// SASL outcome.
    pub const SASL_FINAL: i32 = 12;
}

/// OIDs of the built-in types a RowDescription names that the gateway gives a JSON form
/// (`/sql` rows in non-raw mode).
pub mod type_oid {
    /// `bool`.
    pub const BOOL: u32 = 16;
    /// `int2`.
    pub const INT2: u32 = 21;
    /// `int4`.
    pub const INT4: u32 = 23;
    /// `float4`.
    pub const FLOAT4: u32 = 700;
    /// `float8`.
    pub const FLOAT8: u32 = 701;
    /// `json`.
    pub const JSON: u32 = 114;
    /// `jsonb`.
    pub const JSONB: u32 = 3802;
}

/// A StartupMessage (protocol 3.0) carrying these parameters.
pub fn startup_packet<'a>(params: impl IntoIterator<Item = &'a (String, String)>) -> BytesMut {
    let mut startup = Startup::new();
    startup.parameters = params.into_iter().cloned().collect();
    let mut buf = BytesMut::new();
    // Startup messages from the client were already capped well below pgwire's limit.
    let _ = startup.encode(&mut buf);
    buf
}

/// An SSLRequest, to ask a backend for TLS.
pub fn ssl_request() -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&8u32.to_be_bytes());
    p[4..].copy_from_slice(&SSL_REQUEST_CODE.to_be_bytes());
    p
}

/// A CancelRequest for a backend process.
pub fn cancel_request(pid: i32, secret: &Bytes) -> BytesMut {
    let mut buf = BytesMut::new();
    let _ = CancelRequest::new(pid, SecretKey::Bytes(secret.clone())).encode(&mut buf);
    buf
}

/// A BackendKeyData message with a protocol 3.0 (4-byte) secret.
pub fn backend_key_data(pid: i32, secret: i32) -> BytesMut {
    let mut buf = BytesMut::new();
    let _ = BackendKeyData::new(pid, SecretKey::I32(secret)).encode(&mut buf);
    buf
}

/// Reads a BackendKeyData body (without tag and length): the backend's pid and secret.
pub fn parse_backend_key_data(body: &[u8]) -> Option<(i32, Bytes)> {
    if body.len() < 8 || body.len() > 4 + 256 {
        return None;
    }
    let mut b = body;
    let pid = b.get_i32();
    Some((pid, Bytes::copy_from_slice(b)))
}

/// NegotiateProtocolVersion: we speak 3.0 and none of the listed protocol extensions.
pub fn negotiate_protocol_version(unsupported: Vec<String>) -> BytesMut {
    let mut buf = BytesMut::new();
    let _ = NegotiateProtocolVersion::new(PROTOCOL_3_0 as i32, unsupported).encode(&mut buf);
    buf
}

/// The request code of an Authentication message body.
pub fn auth_request_code(body: &[u8]) -> Option<i32> {
    (body.len() >= 4).then(|| i32::from_be_bytes([body[0], body[1], body[2], body[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_data_round_trip() {
        let m = backend_key_data(77, -5);
        assert_eq!(m[0], b'K');
        let (pid, secret) = parse_backend_key_data(&m[5..]).unwrap();
        assert_eq!(pid, 77);
        assert_eq!(&secret[..], &(-5i32).to_be_bytes());
    }

    #[test]
    fn startup_and_requests_encode() {
        let params = vec![("user".to_owned(), "bob".to_owned())];
        let p = startup_packet(&params);
        assert_eq!(&p[4..8], &PROTOCOL_3_0.to_be_bytes());
        assert_eq!(&p[8..], b"user\0bob\0\0");
        let c = cancel_request(5, &Bytes::from_static(&[0, 0, 0, 9]));
        assert_eq!(c.len(), 16);
        let n = negotiate_protocol_version(vec!["_pq_.a".into()]);
        assert_eq!(n[0], b'v');
    }
}
