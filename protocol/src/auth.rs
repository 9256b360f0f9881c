//! Authentication messages: the requests the gateway sends a client and reads from a backend,
//! the answers it reads from a client and sends a backend, and the md5 password hash.
//!
//! Message bodies are checked here before pgwire decodes them: pgwire's decoders read fields
//! without bounds checks and would panic on a short or lying body from a peer.

use bytes::{BufMut, Bytes, BytesMut};
use md5::{Digest, Md5};
use pgwire::messages::startup::{Authentication, SASLInitialResponse, SASLResponse};
use pgwire::messages::{DecodeContext, Message};
use thiserror::Error;

use crate::backend::auth_code;

/// A login message that does not have its documented layout (SQLSTATE `08P01`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AuthMessageError {
    /// The body is cut short or has bytes left over.
    #[error("invalid {0} message layout")]
    Malformed(&'static str),
    /// An authentication request the gateway cannot answer (Kerberos, GSSAPI, SSPI, ...).
    #[error("unsupported authentication request code {0}")]
    UnsupportedRequest(i32),
}

fn encode(message: impl Message) -> BytesMut {
    let mut buf = BytesMut::new();
    // Encoding only fails past pgwire's size limits (10,000 bytes for frontend messages, 30,000
    // for Authentication), which the short SCRAM messages and mechanism lists here stay far below.
    let _ = message.encode(&mut buf);
    buf
}

/// AuthenticationSASL offering these mechanisms (see [`crate::scram::mechanisms`]).
pub fn authentication_sasl(mechanisms: &[&str]) -> BytesMut {
    encode(Authentication::SASL(
        mechanisms.iter().map(|m| m.to_string()).collect(),
    ))
}

/// AuthenticationSASLContinue carrying the server-first message.
pub fn authentication_sasl_continue(data: &[u8]) -> BytesMut {
    encode(Authentication::SASLContinue(Bytes::copy_from_slice(data)))
}

/// AuthenticationSASLFinal carrying the server-final message.
pub fn authentication_sasl_final(data: &[u8]) -> BytesMut {
    encode(Authentication::SASLFinal(Bytes::copy_from_slice(data)))
}

/// AuthenticationOk.
pub fn authentication_ok() -> BytesMut {
    encode(Authentication::Ok)
}

/// AuthenticationCleartextPassword (only inside TLS or a WebSocket).
pub fn authentication_cleartext_password() -> BytesMut {
    encode(Authentication::CleartextPassword)
}

/// Reads a client's SASLInitialResponse body (after tag and length): the mechanism and the
/// client-first data (`None` when the client sent length -1).
pub fn parse_sasl_initial_response(body: &[u8]) -> Result<SASLInitialResponse, AuthMessageError> {
    const WHAT: &str = "SASLInitialResponse";
    let nul = body
        .iter()
        .position(|&c| c == 0)
        .ok_or(AuthMessageError::Malformed(WHAT))?;
    let rest = &body[nul + 1..];
    let len_bytes: [u8; 4] = rest
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(AuthMessageError::Malformed(WHAT))?;
    let data_len = i32::from_be_bytes(len_bytes);
    let consistent = match usize::try_from(data_len) {
        Ok(n) => n == rest.len() - 4,
        Err(_) => data_len == -1 && rest.len() == 4,
    };
    // An empty mechanism name would come back as "" from pgwire; Postgres rejects it as unknown.
    if nul == 0 || !consistent {
        return Err(AuthMessageError::Malformed(WHAT));
    }
    decode(body, WHAT)
}

/// Reads a client's PasswordMessage body: the password bytes, without the terminating NUL.
///
/// Kept as bytes rather than pgwire's `Password`, whose lossy UTF-8 conversion would change a
/// password that is not UTF-8 (Postgres accepts those and uses them raw).
pub fn parse_password_message(body: &[u8]) -> Result<&[u8], AuthMessageError> {
    match body.split_last() {
        Some((0, password)) if !password.contains(&0) => Ok(password),
        _ => Err(AuthMessageError::Malformed("password")),
    }
}

/// Reads an Authentication message body from a backend (after tag and length).
pub fn parse_authentication(body: &[u8]) -> Result<Authentication, AuthMessageError> {
    const WHAT: &str = "authentication request";
    let code = body
        .get(..4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(AuthMessageError::Malformed(WHAT))?;
    let rest = &body[4..];
    let valid = match code {
        auth_code::OK | auth_code::CLEARTEXT => rest.is_empty(),
        auth_code::MD5 => rest.len() == 4,
        auth_code::SASL => rest.ends_with(&[0, 0]) || rest == [0],
        auth_code::SASL_CONTINUE | auth_code::SASL_FINAL => true,
        _ => return Err(AuthMessageError::UnsupportedRequest(code)),
    };
    if !valid {
        return Err(AuthMessageError::Malformed(WHAT));
    }
    decode(body, WHAT)
}

/// Decodes a body whose layout was checked with pgwire's decoder for `M`.
fn decode<M: Message>(body: &[u8], what: &'static str) -> Result<M, AuthMessageError> {
    let mut buf = BytesMut::from(body);
    M::decode_body(&mut buf, body.len() + 4, &DecodeContext::default())
        .map_err(|_| AuthMessageError::Malformed(what))
}

/// SASLInitialResponse to a backend: the chosen mechanism and the client-first data.
pub fn sasl_initial_response(mechanism: &str, data: &[u8]) -> BytesMut {
    encode(SASLInitialResponse::new(
        mechanism.to_owned(),
        Some(Bytes::copy_from_slice(data)),
    ))
}

/// SASLResponse to a backend carrying the client-final data.
pub fn sasl_response(data: &[u8]) -> BytesMut {
    encode(SASLResponse::new(Bytes::copy_from_slice(data)))
}

/// PasswordMessage to a backend: a cleartext password or an [`md5_password`] answer.
pub fn password_message(password: &[u8]) -> BytesMut {
    // Written by hand: pgwire's `Password` converts to UTF-8 lossily, and its encoder refuses
    // messages over 10,000 bytes, while the gateway accepts longer passwords if so configured.
    let mut buf = BytesMut::with_capacity(password.len() + 6);
    buf.put_u8(b'p');
    buf.put_u32((password.len() + 5) as u32);
    buf.put_slice(password);
    buf.put_u8(0);
    buf
}

/// The answer to AuthenticationMD5Password:
/// `"md5" + hex(md5(hex(md5(password + user)) + salt))`, as libpq computes it.
pub fn md5_password(user: &str, password: impl AsRef<[u8]>, salt: [u8; 4]) -> String {
    let inner = hex(&Md5::new()
        .chain_update(password)
        .chain_update(user)
        .finalize());
    let outer = hex(&Md5::new().chain_update(inner).chain_update(salt).finalize());
    format!("md5{outer}")
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_python_hashlib() {
        // Expected values computed with Python's hashlib, as libpq's pg_md5_encrypt does it.
        assert_eq!(
            md5_password("alice", "secret", [1, 2, 3, 4]),
            "md598a0412b9c31436fc53776e863350083"
        );
        assert_eq!(
            md5_password("postgres", "p\u{e4}ss", [0xff, 0, 0x7f, 0x80]),
            "md5c19fc34e02d5aeb5413b7d53dc5518fe"
        );
    }

    #[test]
    fn gateway_requests_encode() {
        let sasl = authentication_sasl(&["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]);
        assert_eq!(
            &sasl[..],
            b"R\0\0\0\x2a\0\0\0\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"
        );
        assert_eq!(&authentication_ok()[..], b"R\0\0\0\x08\0\0\0\0");
        assert_eq!(
            &authentication_cleartext_password()[..],
            b"R\0\0\0\x08\0\0\0\x03"
        );
        assert_eq!(
            &authentication_sasl_continue(b"r=x")[..],
            b"R\0\0\0\x0b\0\0\0\x0br=x"
        );
        assert_eq!(
            &authentication_sasl_final(b"v=y")[..],
            b"R\0\0\0\x0b\0\0\0\x0cv=y"
        );
    }

    #[test]
    fn backend_requests_round_trip() {
        let messages = [
            authentication_ok(),
            authentication_cleartext_password(),
            authentication_sasl(&["SCRAM-SHA-256"]),
            authentication_sasl_continue(b"r=abc"),
            authentication_sasl_final(b"v=abc"),
            encode(Authentication::MD5Password(vec![1, 2, 3, 4])),
        ];
        let expected = [
            Authentication::Ok,
            Authentication::CleartextPassword,
            Authentication::SASL(vec!["SCRAM-SHA-256".into()]),
            Authentication::SASLContinue(Bytes::from_static(b"r=abc")),
            Authentication::SASLFinal(Bytes::from_static(b"v=abc")),
            Authentication::MD5Password(vec![1, 2, 3, 4]),
        ];
        for (m, e) in messages.iter().zip(expected) {
            assert_eq!(parse_authentication(&m[5..]).unwrap(), e);
        }
        assert_eq!(
            parse_authentication(&[0, 0, 0, 7]),
            Err(AuthMessageError::UnsupportedRequest(7))
        );
        for bad in [
            &b""[..],
            b"\0\0\0",
            b"\0\0\0\x05\x01",
            b"\0\0\0\x0aSCRAM",
            b"\0\0\0\0x",
        ] {
            assert!(parse_authentication(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn client_answers_round_trip() {
        let m = sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=abc");
        let parsed = parse_sasl_initial_response(&m[5..]).unwrap();
        assert_eq!(parsed.auth_method, "SCRAM-SHA-256");
        assert_eq!(parsed.data.as_deref(), Some(&b"n,,n=,r=abc"[..]));
        let none = parse_sasl_initial_response(b"SCRAM-SHA-256\0\xff\xff\xff\xff").unwrap();
        assert_eq!(none.data, None);
        let bad: [&[u8]; 7] = [
            b"",
            b"SCRAM-SHA-256",
            b"SCRAM-SHA-256\0\0\0",
            b"SCRAM-SHA-256\0\0\0\0\x05abc",
            b"SCRAM-SHA-256\0\x7f\xff\xff\xffabc",
            b"SCRAM-SHA-256\0\xff\xff\xff\xfeabc",
            b"\0\0\0\0\0",
        ];
        for body in bad {
            assert!(parse_sasl_initial_response(body).is_err(), "{body:?}");
        }
        assert_eq!(&sasl_response(b"c=biws")[..], b"p\0\0\0\x0ac=biws");
        let p = password_message(b"p\xffss");
        assert_eq!(&p[..], b"p\0\0\0\x09p\xffss\0");
        assert_eq!(parse_password_message(&p[5..]), Ok(&b"p\xffss"[..]));
        assert!(parse_password_message(b"").is_err());
        assert!(parse_password_message(b"abc").is_err());
        assert!(parse_password_message(b"a\0b\0").is_err());
        let long = password_message(&[b'x'; 20_000]);
        assert_eq!(&long[1..5], &20_005u32.to_be_bytes());
        assert_eq!(parse_password_message(&long[5..]).unwrap().len(), 20_000);
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let mut state = 0x0bad_cafe_f00d_1234u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 24) as usize;
            let mut body: Vec<u8> = (0..len)
                .map(|i| (state.rotate_left(i as u32 * 8) & 0xff) as u8)
                .collect();
            if body.len() >= 4 && state.is_multiple_of(2) {
                body[..4].copy_from_slice(&[
                    0,
                    0,
                    0,
                    [0, 3, 5, 10, 11, 12][(state >> 8) as usize % 6],
                ]);
            }
            let _ = parse_authentication(&body);
            let _ = parse_sasl_initial_response(&body);
            let _ = parse_password_message(&body);
        }
    }
}
