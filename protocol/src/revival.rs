//! Revival tokens: what the gateway needs to log a parked session back in, sealed with an AEAD
//! key so that only a gateway holding the key can read or forge one.
//!
//! A token binds the tenant, user, database, startup parameters and login material (SCRAM keys,
//! and the password when the credential source knows it) with issue and expiry times. Layout:
//! `version (1) | key id length (1) | key id | nonce (12) | AES-256-GCM(claims) + tag`, the
//! header being authenticated data. Several keys can be held for rotation: the first seals, all
//! open. Nonces are random (96 bits), fine for far more tokens than one key will ever seal.
//!
//! Nothing here prints a secret: `Debug` of claims, keys and tokens shows lengths and ids only.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use thiserror::Error;
use zeroize::Zeroize;

use crate::scram::{ClientKey, ScramKeys, ServerKey};

const VERSION: u8 = 1;
/// Length of a revival key in bytes (AES-256).
pub const KEY_LEN: usize = 32;

/// Why a token was refused or a key ring could not be built.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RevivalError {
    /// The bytes are not a token of a known layout.
    #[error("malformed revival token")]
    Malformed,
    /// Sealed with a key this gateway does not hold (rotated out, or another deployment's).
    #[error("revival token sealed with unknown key {0:?}")]
    UnknownKey(String),
    /// The AEAD check failed: altered, or sealed with another key of the same id.
    #[error("revival token failed its integrity check")]
    Tampered,
    /// Past its expiry time.
    #[error("revival token expired")]
    Expired,
    /// Issued for another tenant.
    #[error("revival token belongs to another tenant")]
    WrongTenant,
    /// A key ring needs at least one key, with ids of 1..=255 bytes and unique.
    #[error("invalid revival key configuration: {0}")]
    BadKey(&'static str),
}

/// One AEAD key and its id.
struct RevivalKey {
    id: String,
    key: LessSafeKey,
}

/// The keys a gateway seals and opens tokens with; the first one seals.
pub struct RevivalKeys {
    keys: Vec<RevivalKey>,
    rng: SystemRandom,
}

impl fmt::Debug for RevivalKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("RevivalKeys").field("ids", &ids).finish()
    }
}

impl RevivalKeys {
    /// A key ring from `(id, key bytes)` pairs, newest first: the first seals.
    pub fn new(keys: Vec<(String, [u8; KEY_LEN])>) -> Result<RevivalKeys, RevivalError> {
        if keys.is_empty() {
            return Err(RevivalError::BadKey("no key"));
        }
        let mut out: Vec<RevivalKey> = Vec::with_capacity(keys.len());
        for (id, mut bytes) in keys {
            if id.is_empty() || id.len() > 255 {
                return Err(RevivalError::BadKey("a key id must be 1 to 255 bytes"));
            }
            if out.iter().any(|k| k.id == id) {
                return Err(RevivalError::BadKey("two keys share an id"));
            }
            let unbound = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| RevivalError::BadKey("a key must be 32 bytes"))?;
            bytes.zeroize();
            out.push(RevivalKey {
                id,
                key: LessSafeKey::new(unbound),
            });
        }
        Ok(RevivalKeys {
            keys: out,
            rng: SystemRandom::new(),
        })
    }

    /// A ring with one random key that lives as long as this process (tokens do not survive a
    /// restart or open on another replica).
    pub fn generated() -> RevivalKeys {
        let mut bytes = [0u8; KEY_LEN];
        // The system RNG failing is not something a gateway can run without.
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("system random number generator");
        RevivalKeys::new(vec![("generated".into(), bytes)]).expect("one valid key")
    }

    /// Id of the key that seals.
    pub fn sealing_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Seals `claims` with the newest key.
    pub fn seal(&self, claims: &RevivalClaims) -> RevivalToken {
        let key = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("system random number generator");
        let mut plain = claims.encode();
        // Exactly the token's length: a parked session holds its token until it is revived.
        let header_len = 2 + key.id.len();
        let len = header_len + NONCE_LEN + plain.len() + AES_256_GCM.tag_len();
        let mut out = Vec::with_capacity(len);
        out.push(VERSION);
        out.push(key.id.len() as u8);
        out.extend_from_slice(key.id.as_bytes());
        out.extend_from_slice(&nonce);
        let tag = key
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&out[..header_len]),
                &mut plain,
            )
            .expect("AES-GCM seals any length a token has");
        out.extend_from_slice(&plain);
        out.extend_from_slice(tag.as_ref());
        plain.zeroize();
        RevivalToken(out)
    }

    /// Opens a token for `tenant`, refusing it when altered, foreign, expired at `now` or
    /// issued for another tenant.
    pub fn open(
        &self,
        token: &RevivalToken,
        tenant: &str,
        now: SystemTime,
    ) -> Result<RevivalClaims, RevivalError> {
        let bytes = &token.0;
        let (&version, rest) = bytes.split_first().ok_or(RevivalError::Malformed)?;
        if version != VERSION {
            return Err(RevivalError::Malformed);
        }
        let (&id_len, rest) = rest.split_first().ok_or(RevivalError::Malformed)?;
        let id = rest.get(..id_len as usize).ok_or(RevivalError::Malformed)?;
        let header_len = 2 + id_len as usize;
        let rest = &rest[id_len as usize..];
        if rest.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(RevivalError::Malformed);
        }
        let id = std::str::from_utf8(id).map_err(|_| RevivalError::Malformed)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| RevivalError::UnknownKey(id.to_owned()))?;
        let nonce: [u8; NONCE_LEN] = rest[..NONCE_LEN]
            .try_into()
            .map_err(|_| RevivalError::Malformed)?;
        let mut sealed = rest[NONCE_LEN..].to_vec();
        let result = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&bytes[..header_len]),
                &mut sealed,
            )
            .map_err(|_| RevivalError::Tampered)
            .and_then(|plain| RevivalClaims::decode(plain).ok_or(RevivalError::Malformed));
        sealed.zeroize();
        let claims = result?;
        if claims.tenant != tenant {
            return Err(RevivalError::WrongTenant);
        }
        if unix_seconds(now) >= claims.expires_at {
            return Err(RevivalError::Expired);
        }
        Ok(claims)
    }
}

/// A sealed revival token: opaque bytes; `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct RevivalToken(Vec<u8>);

impl RevivalToken {
    /// The token from bytes (as stored or received from another replica).
    pub fn from_bytes(bytes: Vec<u8>) -> RevivalToken {
        RevivalToken(bytes)
    }

    /// The sealed bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for RevivalToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RevivalToken({} bytes)", self.0.len())
    }
}

/// What logs a user in to a backend without the client: SCRAM keys for the gateway's verifier,
/// keys derived for backends' salts, and the password when known.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct LoginSecrets {
    /// Keys for the gateway's own verifier (from the client's proof).
    pub keys: Option<ScramKeys>,
    /// Keys derived from the password for backends whose salt differs.
    pub derived: Vec<ScramKeys>,
    /// The password, when the credential source holds it.
    pub password: Option<String>,
}

impl fmt::Debug for LoginSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginSecrets")
            .field("keys", &self.keys.is_some())
            .field("derived", &self.derived.len())
            .field("password", &self.password.as_ref().map(|_| "(hidden)"))
            .finish()
    }
}

impl Drop for LoginSecrets {
    fn drop(&mut self) {
        if let Some(p) = &mut self.password {
            p.zeroize();
        }
    }
}

/// What a revival token binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevivalClaims {
    /// Tenant id.
    pub tenant: String,
    /// User the session logged in as.
    pub user: String,
    /// Database.
    pub database: String,
    /// Startup parameters sent to the backend (user and database included).
    pub params: Vec<(String, String)>,
    /// Login material.
    pub secrets: LoginSecrets,
    /// Issue time, seconds since the Unix epoch.
    pub issued_at: u64,
    /// Expiry time, seconds since the Unix epoch.
    pub expires_at: u64,
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl RevivalClaims {
    /// Claims issued at `now`, valid for `ttl`.
    pub fn new(
        tenant: impl Into<String>,
        user: impl Into<String>,
        database: impl Into<String>,
        params: Vec<(String, String)>,
        secrets: LoginSecrets,
        now: SystemTime,
        ttl: Duration,
    ) -> RevivalClaims {
        let issued_at = unix_seconds(now);
        RevivalClaims {
            tenant: tenant.into(),
            user: user.into(),
            database: database.into(),
            params,
            secrets,
            issued_at,
            expires_at: issued_at.saturating_add(ttl.as_secs().max(1)),
        }
    }

    fn encoded_len_hint(&self) -> usize {
        let params: usize = self.params.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
        self.tenant.len() + self.user.len() + self.database.len() + params + 256
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(self.encoded_len_hint());
        put_bytes(&mut w, self.tenant.as_bytes());
        put_bytes(&mut w, self.user.as_bytes());
        put_bytes(&mut w, self.database.as_bytes());
        w.extend_from_slice(&(self.params.len() as u32).to_be_bytes());
        for (k, v) in &self.params {
            put_bytes(&mut w, k.as_bytes());
            put_bytes(&mut w, v.as_bytes());
        }
        let s = &self.secrets;
        let keys: Vec<&ScramKeys> = s.keys.iter().chain(&s.derived).collect();
        w.push(s.keys.is_some() as u8);
        w.extend_from_slice(&(keys.len() as u32).to_be_bytes());
        for k in keys {
            w.extend_from_slice(&k.iterations.to_be_bytes());
            put_bytes(&mut w, &k.salt);
            w.extend_from_slice(k.client_key.as_bytes());
            w.extend_from_slice(k.server_key.as_bytes());
        }
        match &s.password {
            Some(p) => {
                w.push(1);
                put_bytes(&mut w, p.as_bytes());
            }
            None => w.push(0),
        }
        w.extend_from_slice(&self.issued_at.to_be_bytes());
        w.extend_from_slice(&self.expires_at.to_be_bytes());
        w
    }

    /// Claims from their encoded form (a token's plaintext), or `None` when malformed.
    pub fn decode(mut r: &[u8]) -> Option<RevivalClaims> {
        let r = &mut r;
        let tenant = get_string(r)?;
        let user = get_string(r)?;
        let database = get_string(r)?;
        let n = get_u32(r)? as usize;
        let mut params = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            params.push((get_string(r)?, get_string(r)?));
        }
        let has_own = get_u8(r)? == 1;
        let n = get_u32(r)? as usize;
        let mut keys = Vec::with_capacity(n.min(8));
        for _ in 0..n {
            let iterations = get_u32(r)?;
            let salt = get_bytes(r)?.to_vec();
            let client_key = ClientKey::from_bytes(get_array(r)?);
            let server_key = ServerKey::from_bytes(get_array(r)?);
            keys.push(ScramKeys {
                iterations,
                salt,
                client_key,
                server_key,
            });
        }
        let own = if has_own && !keys.is_empty() {
            Some(keys.remove(0))
        } else {
            None
        };
        let password = match get_u8(r)? {
            1 => Some(get_string(r)?),
            _ => None,
        };
        let issued_at = u64::from_be_bytes(get_array(r)?);
        let expires_at = u64::from_be_bytes(get_array(r)?);
        r.is_empty().then_some(RevivalClaims {
            tenant,
            user,
            database,
            params,
            secrets: LoginSecrets {
                keys: own,
                derived: keys,
                password,
            },
            issued_at,
            expires_at,
        })
    }
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    w.extend_from_slice(&(b.len() as u32).to_be_bytes());
    w.extend_from_slice(b);
}

fn get_u8(r: &mut &[u8]) -> Option<u8> {
    let (&b, rest) = r.split_first()?;
    *r = rest;
    Some(b)
}

fn get_array<const N: usize>(r: &mut &[u8]) -> Option<[u8; N]> {
    let a: [u8; N] = r.get(..N)?.try_into().ok()?;
    *r = &r[N..];
    Some(a)
}

fn get_u32(r: &mut &[u8]) -> Option<u32> {
    get_array(r).map(u32::from_be_bytes)
}

fn get_bytes<'a>(r: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = get_u32(r)? as usize;
    let b = r.get(..n)?;
    *r = &r[n..];
    Some(b)
}

fn get_string(r: &mut &[u8]) -> Option<String> {
    String::from_utf8(get_bytes(r)?.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(id: &str, byte: u8) -> RevivalKeys {
        RevivalKeys::new(vec![(id.into(), [byte; KEY_LEN])]).unwrap()
    }

    fn claims(now: SystemTime) -> RevivalClaims {
        let keys = ScramKeys::from_password("hunter2", b"salt", 16);
        RevivalClaims::new(
            "alpha",
            "alice",
            "app",
            vec![
                ("user".into(), "alice".into()),
                ("database".into(), "app".into()),
                ("application_name".into(), "psql".into()),
            ],
            LoginSecrets {
                keys: Some(keys.clone()),
                derived: vec![ScramKeys::from_password("hunter2", b"other", 16)],
                password: Some("hunter2".into()),
            },
            now,
            Duration::from_secs(60),
        )
    }

    #[test]
    fn round_trip() {
        let now = SystemTime::now();
        let keys = ring("k1", 1);
        let c = claims(now);
        let token = keys.seal(&c);
        assert_eq!(keys.open(&token, "alpha", now).unwrap(), c);
        // Two seals of the same claims differ (random nonce).
        assert_ne!(keys.seal(&c), token);
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let now = SystemTime::now();
        let keys = ring("k1", 1);
        let token = keys.seal(&claims(now));
        for i in 0..token.0.len() {
            let mut bad = token.clone();
            bad.0[i] ^= 0x40;
            let err = keys.open(&bad, "alpha", now).unwrap_err();
            assert!(
                matches!(
                    err,
                    RevivalError::Tampered | RevivalError::Malformed | RevivalError::UnknownKey(_)
                ),
                "byte {i}: {err:?}"
            );
        }
        let mut short = token.clone();
        short.0.truncate(20);
        assert_eq!(
            keys.open(&short, "alpha", now),
            Err(RevivalError::Malformed)
        );
        assert_eq!(
            keys.open(&RevivalToken(Vec::new()), "alpha", now),
            Err(RevivalError::Malformed)
        );
    }

    #[test]
    fn expired_wrong_tenant_and_foreign_keys_are_refused() {
        let now = SystemTime::now();
        let keys = ring("k1", 1);
        let token = keys.seal(&claims(now));
        assert_eq!(
            keys.open(&token, "alpha", now + Duration::from_secs(61)),
            Err(RevivalError::Expired)
        );
        assert_eq!(
            keys.open(&token, "beta", now),
            Err(RevivalError::WrongTenant)
        );
        assert_eq!(
            ring("k2", 1).open(&token, "alpha", now),
            Err(RevivalError::UnknownKey("k1".into()))
        );
        assert_eq!(
            ring("k1", 2).open(&token, "alpha", now),
            Err(RevivalError::Tampered),
            "same id, other key"
        );
    }

    #[test]
    fn rotation_newest_seals_older_still_open() {
        let now = SystemTime::now();
        let old = ring("2025", 1);
        let old_token = old.seal(&claims(now));
        let rotated = RevivalKeys::new(vec![
            ("2026".into(), [2; KEY_LEN]),
            ("2025".into(), [1; KEY_LEN]),
        ])
        .unwrap();
        assert_eq!(rotated.sealing_id(), "2026");
        assert!(rotated.open(&old_token, "alpha", now).is_ok());
        let new_token = rotated.seal(&claims(now));
        assert_eq!(
            old.open(&new_token, "alpha", now),
            Err(RevivalError::UnknownKey("2026".into()))
        );
    }

    #[test]
    fn bad_key_rings() {
        assert!(RevivalKeys::new(vec![]).is_err());
        assert!(
            RevivalKeys::new(vec![("a".into(), [0; KEY_LEN]), ("a".into(), [1; KEY_LEN])]).is_err()
        );
        assert!(RevivalKeys::new(vec![(String::new(), [0; KEY_LEN])]).is_err());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let now = SystemTime::now();
        let keys = ring("k1", 1);
        let c = claims(now);
        let text = format!("{c:?} {:?} {keys:?}", keys.seal(&c));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("(hidden)"), "{text}");
    }
}
