//! The `kubernetes_secret` credential source: a user and password from a Secret with
//! `username` and `password` keys (CloudNativePG's `<cluster>-app`).
//!
//! One watched copy of a namespace's `kubernetes.io/basic-auth` Secrets serves every tenant in
//! it, so a thousand tenants cost one watch, a rotated password applies to the next login, and
//! logins keep working from the copy while the Kubernetes API is unreachable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{Credential, CredentialError, CredentialSource};

/// The Secret type CloudNativePG gives its user Secrets; only these are watched.
const BASIC_AUTH: &str = "kubernetes.io/basic-auth";

struct Derived {
    version: String,
    user: String,
    credential: Arc<Credential>,
}

/// A watched copy of one namespace's basic-auth Secrets.
pub struct SecretStore {
    namespace: String,
    api: Api<Secret>,
    store: Store<Secret>,
    /// Verifiers made from each Secret's password, per Secret version (PBKDF2 runs once).
    derived: Mutex<HashMap<String, Derived>>,
    ready_timeout: Duration,
}

impl SecretStore {
    /// Starts watching `namespace` until `stop` fires; lookups wait up to `ready_timeout` for
    /// the first listing.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        ready_timeout: Duration,
        stop: CancellationToken,
    ) -> Arc<SecretStore> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("type={BASIC_AUTH}"));
        let ns = namespace.to_owned();
        let store = super::watched_store(api.clone(), config, "secrets", ns, stop);
        Arc::new(SecretStore {
            namespace: namespace.to_owned(),
            api,
            store,
            derived: Mutex::new(HashMap::new()),
            ready_timeout,
        })
    }

    /// Reads one Secret straight from the API; `None` when it is missing, of another type, or
    /// the API cannot be reached in time.
    async fn fetch(&self, name: &str) -> Option<Secret> {
        let get = self.api.get_opt(name);
        match tokio::time::timeout(self.ready_timeout, get).await {
            Ok(Ok(Some(s))) if s.type_.as_deref() == Some(BASIC_AUTH) => Some(s),
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                warn!(namespace = %self.namespace, secret = name, error = %e, "secret read failed");
                None
            }
            Err(_) => None,
        }
    }

    /// The credential in Secret `name` when its `username` is `user`.
    async fn lookup(
        &self,
        name: &str,
        user: &str,
    ) -> Result<Option<Arc<Credential>>, CredentialError> {
        if tokio::time::timeout(self.ready_timeout, self.store.wait_until_ready())
            .await
            .is_err()
        {
            return Err(CredentialError::Unavailable(format!(
                "secrets in namespace {} are not listed yet (Kubernetes API unreachable?)",
                self.namespace
            )));
        }
        let secret = match self
            .store
            .get(&ObjectRef::new(name).within(&self.namespace))
        {
            Some(s) => s,
            // A Secret created a moment ago may not have reached the watch yet.
            None => match self.fetch(name).await {
                Some(s) => Arc::new(s),
                None => return Ok(None),
            },
        };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        {
            let derived = self.derived.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(d) = derived.get(name)
                && d.version == version
            {
                return Ok((d.user == user).then(|| d.credential.clone()));
            }
        }
        let field = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| {
                    CredentialError::Invalid(format!(
                        "secret {}/{name} has no UTF-8 {key:?} key",
                        self.namespace
                    ))
                })
        };
        let secret_user = field("username")?;
        let password = field("password")?;
        let credential = tokio::task::spawn_blocking(move || Credential::from_password(&password))
            .await
            .map(Arc::new)
            .map_err(|e| CredentialError::Unavailable(e.to_string()))?;
        let matches = secret_user == user;
        self.derived
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                name.to_owned(),
                Derived {
                    version,
                    user: secret_user,
                    credential: credential.clone(),
                },
            );
        Ok(matches.then_some(credential))
    }
}

/// One tenant's user, from one Secret of a watched namespace.
pub struct KubeSecretSource {
    store: Arc<SecretStore>,
    secret: String,
}

impl KubeSecretSource {
    /// The source reading Secret `secret` from `store`'s namespace.
    pub fn new(store: Arc<SecretStore>, secret: &str) -> KubeSecretSource {
        KubeSecretSource {
            store,
            secret: secret.to_owned(),
        }
    }
}

#[async_trait]
impl CredentialSource for KubeSecretSource {
    fn kind(&self) -> &'static str {
        "kubernetes_secret"
    }

    async fn lookup(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        self.store.lookup(&self.secret, user).await
    }
}
