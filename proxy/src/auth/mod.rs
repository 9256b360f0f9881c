//! Authentication at the gateway: credential sources, the failed-attempt throttle, the SCRAM
//! exchange with the client, and what is kept to log in to the backend on the user's behalf.

mod auth_query;
pub mod client;
mod kube_secret;
mod local;
pub mod password;
pub mod shared_throttle;
mod static_file;
pub mod throttle;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pgwake_protocol::scram::{ScramKeys, ScramSecret};

pub use auth_query::{AuthQuerySettings, AuthQuerySource};
pub use client::LoginMaterial;
pub use kube_secret::{KubeSecretSource, SecretStore};
pub use local::LocalSource;
pub use static_file::StaticSource;

/// Iterations for verifiers the gateway makes from passwords (Postgres's default).
pub const SCRAM_ITERATIONS: u32 = 4096;

/// Backend salts whose password-derived keys a credential remembers.
const DERIVED_KEYS_KEPT: usize = 4;

/// What the gateway knows of one user's password.
pub struct Credential {
    /// The SCRAM verifier clients are checked against.
    pub verifier: ScramSecret,
    /// The password itself, when the source holds it: it lets the gateway log in to a backend
    /// whose verifier differs from this one (another salt) or that asks for md5 or cleartext.
    pub password: Option<String>,
    /// Keys derived from the password for backends' salts, so PBKDF2 runs once per salt.
    derived: Mutex<Vec<ScramKeys>>,
}

impl Credential {
    /// A credential from a verifier and, when known, the password.
    pub fn new(verifier: ScramSecret, password: Option<String>) -> Credential {
        Credential {
            verifier,
            password,
            derived: Mutex::new(Vec::new()),
        }
    }

    /// A credential made from a password with a fresh random salt (PBKDF2: call it off the
    /// async runtime's threads).
    pub fn from_password(password: &str) -> Credential {
        let salt: [u8; 16] = rand::random();
        let verifier = ScramSecret::from_password(password, &salt, SCRAM_ITERATIONS);
        Credential::new(verifier, Some(password.to_owned()))
    }

    /// Keys for a backend with this salt and iteration count, derived earlier.
    pub fn derived_keys(&self, salt: &[u8], iterations: u32) -> Option<ScramKeys> {
        let kept = self.derived.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .find(|k| k.salt == salt && k.iterations == iterations)
            .cloned()
    }

    /// Every key set derived so far (sealed into revival tokens so a revival skips PBKDF2).
    pub fn remembered_keys(&self) -> Vec<ScramKeys> {
        self.derived
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Remembers keys derived for a backend's salt.
    pub fn remember_keys(&self, keys: ScramKeys) {
        let mut kept = self.derived.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= DERIVED_KEYS_KEPT {
            kept.remove(0);
        }
        kept.push(keys);
    }
}

/// A credential source could not answer.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The source's own data is unusable (a bad file line, a stored md5 hash).
    #[error("{0}")]
    Invalid(String),
    /// The source could not be reached (the tenant's database for `auth_query`).
    #[error("credential lookup failed: {0}")]
    Unavailable(String),
}

/// Where a tenant's users and their secrets come from.
#[async_trait]
pub trait CredentialSource: Send + Sync {
    /// Short name, for logs.
    fn kind(&self) -> &'static str;
    /// The user's credential, or `None` for an unknown user.
    async fn lookup(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError>;
    /// A client failed with this user's credential; a caching source forgets its copy so a
    /// changed password is picked up by the next attempt (done before the client is told).
    async fn failed(&self, _user: &str) {}
}

/// The users of a tenant that does not exist, or that the client may not reach: none. Logging
/// in against it goes through the same mock exchange as an unknown user of a real tenant, so
/// the answer tells nothing about which tenants exist.
pub struct NoUsers;

#[async_trait]
impl CredentialSource for NoUsers {
    fn kind(&self) -> &'static str {
        "none"
    }

    async fn lookup(&self, _user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        Ok(None)
    }
}

/// Reads a SCRAM verifier or a password as stored in a credential source.
pub fn parse_secret(secret: &str) -> Result<Credential, CredentialError> {
    if secret.starts_with("SCRAM-SHA-256$") {
        let verifier = ScramSecret::parse(secret)
            .map_err(|e| CredentialError::Invalid(format!("malformed SCRAM verifier: {e}")))?;
        Ok(Credential::new(verifier, None))
    } else if secret.len() == 35 && secret.starts_with("md5") {
        Err(CredentialError::Invalid(
            "md5 hashes cannot check SCRAM logins: store a SCRAM verifier or the password".into(),
        ))
    } else {
        Ok(Credential::from_password(secret))
    }
}

/// Throttle settings.
#[derive(Clone, Debug)]
pub struct ThrottleSettings {
    /// Failed attempts evaluated before attempts are throttled.
    pub free_failures: u32,
    /// Wait after the last free failure.
    pub base: Duration,
    /// Longest wait.
    pub max: Duration,
    /// Failed attempts evaluated per source across all tenants before its attempts wait.
    pub source_free_failures: u32,
    /// Most entries of each count remembered; the least recently used are forgotten first.
    pub capacity: u64,
}

/// A local copy of the objects `api` lists with `config`, kept current by a watch until `stop`
/// fires; a failing watch is logged (`what` names it) and retried with back-off, the copy
/// keeping what it last saw.
fn watched_store<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    what: &'static str,
    namespace: String,
    stop: tokio_util::sync::CancellationToken,
) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    use futures_util::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                e = stream.next() => match e {
                    None => return,
                    Some(Err(e)) => tracing::warn!(%namespace, error = %e, what, "watch failed; retrying"),
                    Some(Ok(_)) => {}
                },
            }
        }
    });
    store
}
