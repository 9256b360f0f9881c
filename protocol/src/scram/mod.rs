//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as Postgres speaks it: verifiers, keys, the gateway's
//! server side (with `tls-server-end-point` channel binding and a mock exchange for unknown users)
//! and its client side towards backends.
//!
//! The state machines only hash and compare, which is cheap. The expensive step, PBKDF2 over a
//! password ([`SaltedPassword::derive`], [`ScramSecret::from_password`],
//! [`ScramSecret::verify_password`], [`ScramKeys::from_password`]), is a plain function so the
//! caller can run it on a blocking thread, never on an async runtime thread.

mod client;
mod server;

use std::borrow::Cow;
use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::{digest, hmac, pbkdf2};
use subtle::ConstantTimeEq;
use thiserror::Error;

pub use client::{AwaitingServerFinal, ScramChallenge, ScramClient, ScramClientError};
pub use server::{ScramError, ScramErrorKind, ScramServer};

/// SASL name of SCRAM-SHA-256 without channel binding.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";
/// SASL name of SCRAM-SHA-256 with channel binding.
pub const SCRAM_SHA_256_PLUS: &str = "SCRAM-SHA-256-PLUS";
/// Iteration count Postgres uses for new verifiers (its `scram_iterations` default).
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// Salt length Postgres uses for new verifiers, in bytes.
pub const DEFAULT_SALT_LEN: usize = 16;
/// Length of every SCRAM-SHA-256 key and signature, in bytes.
pub const KEY_LEN: usize = 32;
/// Random bytes in a nonce: Postgres's length, 24 characters once base64-encoded.
pub const NONCE_RANDOM_LEN: usize = 18;

/// The mechanisms to offer in AuthenticationSASL, the channel-binding one first as Postgres lists
/// them. `channel_binding` is true when the client link is TLS and its certificate gives a
/// `tls-server-end-point` hash ([`crate::channel_binding::tls_server_end_point`]).
pub fn mechanisms(channel_binding: bool) -> &'static [&'static str] {
    if channel_binding {
        &[SCRAM_SHA_256_PLUS, SCRAM_SHA_256]
    } else {
        &[SCRAM_SHA_256]
    }
}

macro_rules! key_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name([u8; KEY_LEN]);

        impl $name {
            /// The key from its raw bytes (for example as unsealed from a revival token).
            pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
                $name(bytes)
            }

            /// The raw key bytes.
            pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
                &self.0
            }
        }

        // Keys are secrets or verifier material: compared in constant time, never printed.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.0.ct_eq(&other.0).into()
            }
        }

        impl Eq for $name {}

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(concat!(stringify!($name), "(..)"))
            }
        }
    };
}

key_type!(
    /// `HMAC(SaltedPassword, "Client Key")`: proves knowledge of the password to a server that
    /// holds the matching StoredKey. The gateway recovers it from a client's proof.
    ClientKey
);
key_type!(
    /// `H(ClientKey)`, as stored in a verifier.
    StoredKey
);
key_type!(
    /// `HMAC(SaltedPassword, "Server Key")`: lets a client check the server's signature.
    ServerKey
);

impl ClientKey {
    /// `H(ClientKey)`, what a verifier made from the same password, salt and iterations holds.
    pub fn stored_key(&self) -> StoredKey {
        StoredKey(sha256(&self.0))
    }
}

/// `Hi(Normalize(password), salt, i)`: PBKDF2-HMAC-SHA-256, from which both keys derive.
#[derive(Clone)]
pub struct SaltedPassword([u8; KEY_LEN]);

impl SaltedPassword {
    /// Runs PBKDF2 over the SASLprep'd password (CPU-heavy: `iterations` HMACs; run it on a
    /// blocking thread). An iteration count of 0 computes one round, as Postgres's code does.
    pub fn derive(password: impl AsRef<[u8]>, salt: &[u8], iterations: u32) -> Self {
        let mut out = [0u8; KEY_LEN];
        pbkdf2::derive(
            pbkdf2::PBKDF2_HMAC_SHA256,
            NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN),
            salt,
            &saslprep(password.as_ref()),
            &mut out,
        );
        SaltedPassword(out)
    }

    /// The ClientKey of this salted password.
    pub fn client_key(&self) -> ClientKey {
        ClientKey(hmac_sha256(&self.0, &[b"Client Key"]))
    }

    /// The ServerKey of this salted password.
    pub fn server_key(&self) -> ServerKey {
        ServerKey(hmac_sha256(&self.0, &[b"Server Key"]))
    }
}

impl fmt::Debug for SaltedPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SaltedPassword(..)")
    }
}

/// Postgres's normalization of a password: SASLprep when the password is valid UTF-8 and
/// SASLprep accepts it, else the raw bytes (Postgres and libpq both fall back that way, so
/// passwords that are not UTF-8 or contain prohibited characters still work).
fn saslprep(password: &[u8]) -> Cow<'_, [u8]> {
    match std::str::from_utf8(password).map(stringprep::saslprep) {
        Ok(Ok(Cow::Borrowed(s))) => Cow::Borrowed(s.as_bytes()),
        Ok(Ok(Cow::Owned(s))) => Cow::Owned(s.into_bytes()),
        _ => Cow::Borrowed(password),
    }
}

/// A stored SCRAM-SHA-256 verifier, as in `pg_authid.rolpassword`:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64 fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramSecret {
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: Vec<u8>,
    /// `H(ClientKey)`: checks a client's proof.
    pub stored_key: StoredKey,
    /// Signs the server's final message.
    pub server_key: ServerKey,
}

/// Why a stored verifier could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid SCRAM-SHA-256 verifier: {0}")]
pub struct ScramSecretError(&'static str);

impl ScramSecret {
    /// The stand-in verifier of a user the gateway does not know: a salt derived from
    /// `mock_key` (a secret kept stable across restarts and replicas) and the user name, so
    /// repeated attempts see the same salt, and the default iteration count. Its keys match no
    /// password.
    pub fn mock(mock_key: &[u8], user: &str) -> ScramSecret {
        ScramSecret {
            iterations: DEFAULT_ITERATIONS,
            salt: hmac_sha256(mock_key, &[user.as_bytes()])[..DEFAULT_SALT_LEN].to_vec(),
            // The keys only need to exist so that checks do the real arithmetic.
            stored_key: StoredKey([0; KEY_LEN]),
            server_key: ServerKey([0; KEY_LEN]),
        }
    }

    /// Reads a verifier in Postgres's format.
    pub fn parse(text: &str) -> Result<Self, ScramSecretError> {
        let rest = text
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or(ScramSecretError("does not start with SCRAM-SHA-256$"))?;
        let (params, keys) = rest
            .split_once('$')
            .ok_or(ScramSecretError("missing '$' before the keys"))?;
        let (iterations, salt) = params
            .split_once(':')
            .ok_or(ScramSecretError("missing ':' after the iteration count"))?;
        let (stored_key, server_key) = keys
            .split_once(':')
            .ok_or(ScramSecretError("missing ':' between the keys"))?;
        Ok(ScramSecret {
            iterations: parse_iterations(iterations).ok_or(ScramSecretError(
                "iteration count is not a positive integer",
            ))?,
            salt: BASE64
                .decode(salt)
                .map_err(|_| ScramSecretError("salt is not base64"))?,
            stored_key: StoredKey(
                decode_key(stored_key).ok_or(ScramSecretError("StoredKey is not 32 bytes"))?,
            ),
            server_key: ServerKey(
                decode_key(server_key).ok_or(ScramSecretError("ServerKey is not 32 bytes"))?,
            ),
        })
    }

    /// The verifier Postgres would store for this password, salt and iteration count
    /// (CPU-heavy: PBKDF2; run it on a blocking thread).
    pub fn from_password(password: impl AsRef<[u8]>, salt: &[u8], iterations: u32) -> Self {
        let salted = SaltedPassword::derive(password, salt, iterations);
        ScramSecret {
            iterations,
            salt: salt.to_vec(),
            stored_key: salted.client_key().stored_key(),
            server_key: salted.server_key(),
        }
    }

    /// Whether a cleartext password matches this verifier (CPU-heavy: PBKDF2; run it on a
    /// blocking thread). Used for cleartext logins inside TLS.
    pub fn verify_password(&self, password: impl AsRef<[u8]>) -> bool {
        let salted = SaltedPassword::derive(password, &self.salt, self.iterations);
        salted.client_key().stored_key() == self.stored_key
    }

    /// The login material for backends with this same verifier, given the ClientKey recovered
    /// from a client's proof against it.
    pub fn keys(&self, client_key: ClientKey) -> ScramKeys {
        ScramKeys {
            iterations: self.iterations,
            salt: self.salt.clone(),
            client_key,
            server_key: self.server_key.clone(),
        }
    }
}

impl fmt::Display for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            BASE64.encode(&self.salt),
            BASE64.encode(self.stored_key.0),
            BASE64.encode(self.server_key.0)
        )
    }
}

impl FromStr for ScramSecret {
    type Err = ScramSecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ScramSecret::parse(s)
    }
}

/// What the gateway needs to log in to a backend with SCRAM as a user, for one salt and
/// iteration count: plain data, so it can be sealed into a revival token.
///
/// A backend accepts these keys only when its verifier was made from the same password with the
/// same salt and iteration count; [`ScramChallenge::matches`] checks the latter two. A backend
/// with another salt needs keys derived from the password with [`ScramKeys::from_password`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramKeys {
    /// PBKDF2 iteration count the keys were derived with.
    pub iterations: u32,
    /// PBKDF2 salt the keys were derived with.
    pub salt: Vec<u8>,
    /// Signs the client's proof.
    pub client_key: ClientKey,
    /// Checks the backend's final signature, so the gateway knows it logged in to a server that
    /// holds the verifier (mutual authentication).
    pub server_key: ServerKey,
}

impl ScramKeys {
    /// Keys for this password under a backend's salt and iteration count (CPU-heavy: PBKDF2;
    /// run it on a blocking thread).
    pub fn from_password(password: impl AsRef<[u8]>, salt: &[u8], iterations: u32) -> Self {
        let salted = SaltedPassword::derive(password, salt, iterations);
        ScramKeys {
            iterations,
            salt: salt.to_vec(),
            client_key: salted.client_key(),
            server_key: salted.server_key(),
        }
    }
}

/// A SCRAM nonce: printable characters that must never repeat, so each exchange consumes one
/// (hence no `Clone`).
#[derive(Debug, PartialEq, Eq)]
pub struct Nonce(String);

impl Nonce {
    /// A nonce from random bytes the caller drew from a secure generator (base64, like Postgres).
    pub fn from_random(bytes: [u8; NONCE_RANDOM_LEN]) -> Self {
        Nonce(BASE64.encode(bytes))
    }

    /// A nonce with exactly this text, for protocol test vectors whose nonces are not base64.
    #[cfg(test)]
    pub(crate) fn from_printable(text: &str) -> Self {
        assert!(is_printable(text.as_bytes()));
        Nonce(text.to_owned())
    }
}

/// `printable` in RFC 5802: ASCII 0x21..=0x7E except ','.
fn is_printable(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&c| (0x21..=0x7e).contains(&c) && c != b',')
}

/// An iteration count: decimal digits only (no sign, no spaces), positive, within u32.
fn parse_iterations(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|&i| i > 0)
}

fn decode_key(text: &str) -> Option<[u8; KEY_LEN]> {
    BASE64.decode(text).ok()?.try_into().ok()
}

fn sha256(data: &[u8]) -> [u8; KEY_LEN] {
    let mut out = [0u8; KEY_LEN];
    out.copy_from_slice(digest::digest(&digest::SHA256, data).as_ref());
    out
}

/// HMAC-SHA-256 over the concatenation of `parts`, without building the concatenation.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; KEY_LEN] {
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, key));
    for part in parts {
        ctx.update(part);
    }
    let mut out = [0u8; KEY_LEN];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

fn xor(a: &[u8; KEY_LEN], b: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// The `AuthMessage` both sides sign: `client-first-bare,server-first,client-final-without-proof`.
fn auth_message<'a>(
    client_first_bare: &'a [u8],
    server_first: &'a [u8],
    client_final_without_proof: &'a [u8],
) -> [&'a [u8]; 5] {
    [
        client_first_bare,
        b",",
        server_first,
        b",",
        client_final_without_proof,
    ]
}

/// One `letter=value` attribute of a SCRAM message. Values may hold anything but ',' (and the
/// callers reject NUL up front, as Postgres does).
fn attribute(part: &[u8], name: u8) -> Option<&[u8]> {
    match part {
        [n, b'=', value @ ..] if *n == name => Some(value),
        _ => None,
    }
}

/// Whether `part` has the shape of an attribute at all (an extension the receiver ignores).
fn is_attribute(part: &[u8]) -> bool {
    matches!(part, [n, b'=', ..] if n.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example verifier: user "user", password "pencil".
    pub(crate) const RFC_SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";

    pub(crate) fn rfc_secret() -> ScramSecret {
        // Derived once: the fuzz loops start thousands of exchanges against it.
        static SECRET: std::sync::LazyLock<ScramSecret> = std::sync::LazyLock::new(|| {
            ScramSecret::from_password("pencil", &BASE64.decode(RFC_SALT).unwrap(), 4096)
        });
        SECRET.clone()
    }

    #[test]
    fn verifier_formats_and_parses() {
        let secret = rfc_secret();
        let text = secret.to_string();
        assert!(text.starts_with("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$"));
        assert_eq!(ScramSecret::parse(&text).unwrap(), secret);
        assert_eq!(text.parse::<ScramSecret>().unwrap(), secret);
        assert!(secret.verify_password("pencil"));
        assert!(!secret.verify_password("pencil "));
        // Debug never shows key material.
        assert!(!format!("{secret:?}").contains(&BASE64.encode(secret.stored_key.0)));
    }

    #[test]
    fn verifier_matches_python_hashlib() {
        // Expected keys computed independently with Python's hashlib.pbkdf2_hmac and hmac.
        let secret = ScramSecret::from_password("pencil", b"0123456789abcdef", 4096);
        assert_eq!(
            secret.to_string(),
            "SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$\
             nQpbZ77WudtqufPwikHXGRt6g2QJ4zns8bZLw273DRM=:\
             jn2amWP1q1h+jgjy0YTO14S6/F02SV7taipOeB7ef20="
        );
    }

    #[test]
    fn saslprep_applies_and_falls_back() {
        // U+00AD SOFT HYPHEN maps to nothing; U+2168 ROMAN NUMERAL NINE normalizes to "IX".
        assert_eq!(&*saslprep("I\u{00AD}X".as_bytes()), b"IX");
        assert_eq!(&*saslprep("\u{2168}".as_bytes()), b"IX");
        // Not UTF-8, or prohibited (a control character): the raw bytes.
        assert_eq!(&*saslprep(b"\xff\xfe"), b"\xff\xfe");
        assert_eq!(&*saslprep("a\u{0007}b".as_bytes()), "a\u{0007}b".as_bytes());
        let a = ScramSecret::from_password("I\u{00AD}X", b"salt", 1);
        let b = ScramSecret::from_password("IX", b"salt", 1);
        assert_eq!(a, b);
    }

    #[test]
    fn verifier_rejects_malformed() {
        let good = rfc_secret().to_string();
        let bad = [
            "",
            "md5abcdef",
            "SCRAM-SHA-256$",
            "SCRAM-SHA-256$4096:c2FsdA==",
            "SCRAM-SHA-256$0:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$+4096:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$99999999999:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$4096:!!$AAAA:AAAA",
            "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
        ];
        for text in bad {
            assert!(ScramSecret::parse(text).is_err(), "{text}");
        }
        assert!(ScramSecret::parse(&good.replace("4096", "4096x")).is_err());
        assert!(ScramSecret::parse(&good[..good.len() - 4]).is_err());
    }

    #[test]
    fn keys_relate() {
        let salted = SaltedPassword::derive("pencil", b"salt", 2);
        let keys = ScramKeys::from_password("pencil", b"salt", 2);
        assert_eq!(keys.client_key, salted.client_key());
        assert_eq!(keys.server_key, salted.server_key());
        let secret = ScramSecret::from_password("pencil", b"salt", 2);
        assert_eq!(secret.stored_key, keys.client_key.stored_key());
        assert_eq!(secret.keys(keys.client_key.clone()), keys);
        assert_eq!(
            format!("{:?}", keys.client_key),
            "ClientKey(..)",
            "keys never print"
        );
    }

    #[test]
    fn nonces_are_printable() {
        let n = Nonce::from_random([0xfb; NONCE_RANDOM_LEN]);
        assert_eq!(n.0.len(), 24);
        assert!(is_printable(n.0.as_bytes()));
        assert_eq!(mechanisms(true), [SCRAM_SHA_256_PLUS, SCRAM_SHA_256]);
        assert_eq!(mechanisms(false), [SCRAM_SHA_256]);
    }
}
