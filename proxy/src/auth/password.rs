//! Cleartext password checks (HTTP `/sql` and WebSocket logins), with a cache of recent
//! successes so a stream of HTTP requests does not pay PBKDF2 on every one.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;
use pgwake_protocol::scram::{ScramKeys, ScramSecret};
use pgwake_routing::TenantId;
use ring::hmac;
use subtle::ConstantTimeEq;

use super::Credential;
use super::client::LoginMaterial;

/// Most (tenant, user) pairs whose last successful password is remembered.
const CACHE_CAPACITY: u64 = 10_000;

/// How long a successful check is remembered; a password removed from the credential source is
/// refused at once anyway (the cache is keyed by the credential it was checked against).
const CACHE_TTL: Duration = Duration::from_secs(300);

#[derive(Clone)]
struct Verified {
    /// The credential the password was checked against: a changed credential misses.
    credential: Arc<Credential>,
    /// HMAC of the password under a per-process key: never the password itself.
    tag: hmac::Tag,
    material: LoginMaterial,
}

/// Checks cleartext passwords against credentials and remembers recent successes.
pub struct PasswordChecker {
    key: hmac::Key,
    verified: Cache<(TenantId, String), Verified>,
}

impl PasswordChecker {
    /// A checker whose cache entries are keyed with a fresh random secret.
    pub fn new() -> PasswordChecker {
        PasswordChecker {
            key: hmac::Key::new(hmac::HMAC_SHA256, &rand::random::<[u8; 32]>()),
            verified: Cache::builder()
                .max_capacity(CACHE_CAPACITY)
                .time_to_live(CACHE_TTL)
                .build(),
        }
    }

    /// Does the work of a wrong password for a user that does not exist (PBKDF2 over the mock
    /// verifier of [`ScramSecret::mock`]), so that answers for unknown and known users take the
    /// same time.
    pub async fn check_unknown(&self, mock_key: &[u8], user: &str, password: &str) {
        let verifier = ScramSecret::mock(mock_key, user);
        let owned = password.to_owned();
        let _ = tokio::task::spawn_blocking(move || {
            ScramKeys::from_password(owned, &verifier.salt, verifier.iterations)
        })
        .await;
    }

    /// The login material when `password` was verified against this very `credential`
    /// recently, without any key derivation; `None` says only that it was not.
    pub fn recall(
        &self,
        tenant: &TenantId,
        user: &str,
        credential: &Arc<Credential>,
        password: &str,
    ) -> Option<LoginMaterial> {
        let tag = hmac::sign(&self.key, password.as_bytes());
        let v = self.verified.get(&(tenant.clone(), user.to_owned()))?;
        (Arc::ptr_eq(&v.credential, credential) && bool::from(v.tag.as_ref().ct_eq(tag.as_ref())))
            .then_some(v.material)
    }

    /// The login material when `password` matches `credential`, else `None`, by PBKDF2 on a
    /// blocking thread. Callers ask [`PasswordChecker::recall`] first, which knows a password
    /// verified recently without the derivation; a match is remembered for it.
    pub async fn check(
        &self,
        tenant: &TenantId,
        user: &str,
        credential: Arc<Credential>,
        password: &str,
    ) -> Option<LoginMaterial> {
        let tag = hmac::sign(&self.key, password.as_bytes());
        let cache_key = (tenant.clone(), user.to_owned());
        let verifier = credential.verifier.clone();
        let owned = password.to_owned();
        let keys = tokio::task::spawn_blocking(move || {
            ScramKeys::from_password(owned, &verifier.salt, verifier.iterations)
        })
        .await
        .ok()?;
        let v = &credential.verifier;
        if keys.client_key.stored_key() != v.stored_key || keys.server_key != v.server_key {
            return None;
        }
        // The client gave the password: keep it for backends with another salt, md5 or
        // cleartext, even where the source holds only a verifier.
        let login_credential = match &credential.password {
            Some(_) => credential.clone(),
            None => Arc::new(Credential::new(v.clone(), Some(password.to_owned()))),
        };
        let material = LoginMaterial {
            keys,
            credential: login_credential,
        };
        self.verified.insert(
            cache_key,
            Verified {
                credential,
                tag,
                material: material.clone(),
            },
        );
        Some(material)
    }
}

impl Default for PasswordChecker {
    fn default() -> Self {
        PasswordChecker::new()
    }
}
