//! Cancel requests one gateway replica forwards to another, and the one-byte answers.
//!
//! A replica that receives a cancel key issued by another replica passes the whole key (pid and
//! secret of any length up to protocol 3.2's 256 bytes) to the owner over an internal listener.
//! Each request carries its issue time, a random nonce and an HMAC-SHA256 over all of it made
//! with the replicas' shared token, so the token never crosses the network and a captured request
//! is only good within the receiver's clock-skew window.
//!
//! Layout: `PGWK`, version (1 byte), secret length (u16), issued at (u64 ms since the Unix
//! epoch), nonce (16 bytes), pid (i32), secret, HMAC (32 bytes). All integers big-endian.

use bytes::Bytes;
use ring::hmac;
use thiserror::Error;

use crate::startup::CancelKey;

/// First bytes of every forwarded cancel.
pub const PEER_MAGIC: [u8; 4] = *b"PGWK";
/// The layout version this code writes and reads.
pub const PEER_VERSION: u8 = 1;
/// Bytes before the variable part: magic, version and secret length.
pub const PEER_HEADER_LEN: usize = 7;
/// The longest secret a cancel key can hold (protocol 3.2).
pub const MAX_SECRET_LEN: usize = 256;
const NONCE_LEN: usize = 16;
const MAC_LEN: usize = 32;
/// Bytes after the header that do not depend on the secret's length.
const FIXED_BODY_LEN: usize = 8 + NONCE_LEN + 4 + MAC_LEN;

/// A cancel key forwarded by a peer replica, authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCancel {
    /// The key the client presented, whole.
    pub key: CancelKey,
    /// When the sending replica made the request, in milliseconds since the Unix epoch.
    pub issued_ms: u64,
}

/// Why a forwarded cancel was refused before its key was looked at.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PeerError {
    /// Not a forwarded cancel of a version this replica reads.
    #[error("not a forwarded cancel request")]
    NotPeerCancel,
    /// The secret is empty or longer than protocol 3.2 allows.
    #[error("cancel secret of {0} bytes")]
    SecretLength(usize),
    /// The packet's length does not match its header.
    #[error("forwarded cancel of the wrong size")]
    WrongSize,
    /// The HMAC does not match: the sender does not hold the shared token.
    #[error("forwarded cancel not signed with the shared token")]
    BadSignature,
}

/// What the owner did with a forwarded cancel, sent back as one byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAnswer {
    /// The key is live here and the cancel was sent to its backend.
    Cancelled,
    /// No live key matches (forged, or its session has ended).
    UnknownKey,
    /// The sender is over this replica's rate limit; the key was not looked at.
    RateLimited,
    /// Not authenticated, or too old or too far in the future.
    Refused,
}

impl PeerAnswer {
    /// The byte on the wire.
    pub fn to_byte(self) -> u8 {
        match self {
            PeerAnswer::Cancelled => b'C',
            PeerAnswer::UnknownKey => b'U',
            PeerAnswer::RateLimited => b'L',
            PeerAnswer::Refused => b'R',
        }
    }

    /// Reads an answer byte; `None` for a byte no replica sends.
    pub fn from_byte(b: u8) -> Option<PeerAnswer> {
        Some(match b {
            b'C' => PeerAnswer::Cancelled,
            b'U' => PeerAnswer::UnknownKey,
            b'L' => PeerAnswer::RateLimited,
            b'R' => PeerAnswer::Refused,
            _ => return None,
        })
    }
}

/// Total length of a forwarded cancel, read from its first [`PEER_HEADER_LEN`] bytes, so a
/// reader knows how much to read before any allocation beyond the fixed maximum.
pub fn peer_cancel_len(header: &[u8; PEER_HEADER_LEN]) -> Result<usize, PeerError> {
    if header[..4] != PEER_MAGIC || header[4] != PEER_VERSION {
        return Err(PeerError::NotPeerCancel);
    }
    let secret_len = u16::from_be_bytes([header[5], header[6]]) as usize;
    if secret_len == 0 || secret_len > MAX_SECRET_LEN {
        return Err(PeerError::SecretLength(secret_len));
    }
    Ok(PEER_HEADER_LEN + FIXED_BODY_LEN + secret_len)
}

/// Builds a signed forwarded cancel for `key`, made at `issued_ms` with a fresh random `nonce`.
pub fn encode_peer_cancel(
    key: &CancelKey,
    issued_ms: u64,
    nonce: [u8; NONCE_LEN],
    token: &[u8],
) -> Result<Vec<u8>, PeerError> {
    let secret_len = key.secret.len();
    if secret_len == 0 || secret_len > MAX_SECRET_LEN {
        return Err(PeerError::SecretLength(secret_len));
    }
    let mut out = Vec::with_capacity(PEER_HEADER_LEN + FIXED_BODY_LEN + secret_len);
    out.extend_from_slice(&PEER_MAGIC);
    out.push(PEER_VERSION);
    out.extend_from_slice(&(secret_len as u16).to_be_bytes());
    out.extend_from_slice(&issued_ms.to_be_bytes());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&key.pid.to_be_bytes());
    out.extend_from_slice(&key.secret);
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, token), &out);
    out.extend_from_slice(tag.as_ref());
    Ok(out)
}

/// Checks a whole forwarded cancel's signature and reads it.
pub fn decode_peer_cancel(packet: &[u8], token: &[u8]) -> Result<PeerCancel, PeerError> {
    let header: &[u8; PEER_HEADER_LEN] = packet
        .get(..PEER_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(PeerError::WrongSize)?;
    if peer_cancel_len(header)? != packet.len() {
        return Err(PeerError::WrongSize);
    }
    let (signed, mac) = packet.split_at(packet.len() - MAC_LEN);
    hmac::verify(&hmac::Key::new(hmac::HMAC_SHA256, token), signed, mac)
        .map_err(|_| PeerError::BadSignature)?;
    let body = &signed[PEER_HEADER_LEN..];
    let issued_ms = u64::from_be_bytes(body[..8].try_into().map_err(|_| PeerError::WrongSize)?);
    let pid_at = 8 + NONCE_LEN;
    let pid = i32::from_be_bytes(
        body[pid_at..pid_at + 4]
            .try_into()
            .map_err(|_| PeerError::WrongSize)?,
    );
    Ok(PeerCancel {
        key: CancelKey {
            pid,
            secret: Bytes::copy_from_slice(&body[pid_at + 4..]),
        },
        issued_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(secret_len: usize) -> CancelKey {
        CancelKey {
            pid: 0x1234_5678,
            secret: Bytes::from((0..secret_len).map(|i| i as u8).collect::<Vec<_>>()),
        }
    }

    #[test]
    fn round_trips_short_and_protocol_3_2_keys() {
        for len in [4, 32, MAX_SECRET_LEN] {
            let packet = encode_peer_cancel(&key(len), 99, [7; 16], b"token").unwrap();
            let header: &[u8; PEER_HEADER_LEN] = packet[..PEER_HEADER_LEN].try_into().unwrap();
            assert_eq!(peer_cancel_len(header), Ok(packet.len()));
            let got = decode_peer_cancel(&packet, b"token").unwrap();
            assert_eq!(got.key, key(len));
            assert_eq!(got.issued_ms, 99);
        }
    }

    #[test]
    fn refuses_other_tokens_tampering_and_bad_sizes() {
        let packet = encode_peer_cancel(&key(4), 1, [0; 16], b"token").unwrap();
        assert_eq!(
            decode_peer_cancel(&packet, b"other"),
            Err(PeerError::BadSignature)
        );
        let mut tampered = packet.clone();
        tampered[PEER_HEADER_LEN + 8 + 16] ^= 1;
        assert_eq!(
            decode_peer_cancel(&tampered, b"token"),
            Err(PeerError::BadSignature)
        );
        assert_eq!(
            decode_peer_cancel(&packet[..packet.len() - 1], b"token"),
            Err(PeerError::WrongSize)
        );
        assert_eq!(
            decode_peer_cancel(b"PGW", b"token"),
            Err(PeerError::WrongSize)
        );
        let mut long = packet.clone();
        long[5..7].copy_from_slice(&300u16.to_be_bytes());
        assert_eq!(
            decode_peer_cancel(&long, b"token"),
            Err(PeerError::SecretLength(300))
        );
        assert_eq!(
            encode_peer_cancel(&key(0), 1, [0; 16], b"token"),
            Err(PeerError::SecretLength(0))
        );
        let mut foreign = packet;
        foreign[..4].copy_from_slice(b"\0\0\0\x10");
        assert_eq!(
            decode_peer_cancel(&foreign, b"token"),
            Err(PeerError::NotPeerCancel)
        );
    }

    #[test]
    fn answers_round_trip() {
        for a in [
            PeerAnswer::Cancelled,
            PeerAnswer::UnknownKey,
            PeerAnswer::RateLimited,
            PeerAnswer::Refused,
        ] {
            assert_eq!(PeerAnswer::from_byte(a.to_byte()), Some(a));
        }
        assert_eq!(PeerAnswer::from_byte(0), None);
    }
}
