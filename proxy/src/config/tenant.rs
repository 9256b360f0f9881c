//! `[[tenant]]`: one tenant's backend, credentials and limits.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use pgwake_routing::{Endpoint, PredictPolicy, TenantId};
use serde::Deserialize;

use super::pool_class::label_value_ok;
use super::{BackendTls, ConfigError, invalid};

/// Who checks a client's password for a tenant.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// The gateway, against the tenant's credential source; a wrong password never wakes it.
    Gateway,
    /// The backend (the login is relayed); such sessions cannot be revived later.
    Passthrough,
}

/// Where the gateway finds a tenant's users and their secrets.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CredentialsConfig {
    /// A file of `"user" "secret"` lines (a SCRAM verifier, or a password), like PgBouncer's
    /// auth_file; `pgwake passwd USER` prints a line.
    Static {
        /// The file.
        file: PathBuf,
    },
    /// Verifiers looked up on the tenant's own database (which must then be awake).
    AuthQuery {
        /// Role the gateway logs in as to run the query.
        user: String,
        /// Its password.
        password: String,
        /// Database to connect to.
        #[serde(default = "default_auth_database")]
        database: String,
        /// Query taking the user name as `$1` and returning (name, verifier).
        #[serde(default = "default_auth_query")]
        query: String,
    },
    /// The local backend's superuser and password from `[local]`.
    Local,
    /// A Kubernetes Secret with `username` and `password` keys, like the `<cluster>-app`
    /// Secret CloudNativePG makes; watched, so a rotated password applies at once.
    KubernetesSecret {
        /// Secret name (default for `cnpg` tenants: `<cluster>-app`).
        #[serde(default)]
        secret: Option<String>,
        /// Its namespace (default: the cluster's, else `[kubernetes] namespace`).
        #[serde(default)]
        namespace: Option<String>,
    },
}

fn default_auth_database() -> String {
    "postgres".into()
}

fn default_auth_query() -> String {
    "SELECT usename, passwd FROM pgwake.user_lookup($1)".into()
}

/// `[[tenant]]`: one tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant id.
    pub id: TenantId,
    /// Where its database runs.
    pub backend: TenantBackend,
    /// Overrides `[wake] idle_timeout`.
    #[serde(default, with = "super::duration")]
    pub idle_timeout: Option<Duration>,
    /// Overrides `[wake] predict`: what the tenant's run predictions are used for.
    #[serde(default)]
    pub predict: Option<PredictPolicy>,
    /// Who checks passwords (default: the gateway when credentials are known, else passthrough).
    #[serde(default)]
    pub auth: Option<AuthMode>,
    /// Where the tenant's users come from (default for local tenants: `local`).
    #[serde(default)]
    pub credentials: Option<CredentialsConfig>,
    /// Client networks allowed (empty: all).
    #[serde(default)]
    pub allow: Vec<ipnet::IpNet>,
    /// Client networks refused (checked first).
    #[serde(default)]
    pub deny: Vec<ipnet::IpNet>,
    /// Client connections this tenant may hold at once (none: only the gateway's cap); more
    /// get FATAL 53300.
    #[serde(default)]
    pub max_client_connections: Option<usize>,
    /// Connections the gateway may hold to this tenant's database at once, in use and kept
    /// (none: no cap); sessions past it wait for one (`limits.backend_wait_timeout`).
    #[serde(default)]
    pub max_backend_connections: Option<usize>,
    /// Keep backend connections of passthrough sessions for reuse (`[reuse]`), for logins the
    /// backend let in without asking for a password (it trusts the gateway).
    #[serde(default)]
    pub reuse_passthrough: bool,
}

impl TenantConfig {
    /// The credential source in force: the configured one, or `local` for local tenants.
    pub fn effective_credentials(&self) -> Option<CredentialsConfig> {
        match (&self.credentials, &self.backend) {
            (Some(c), _) => Some(c.clone()),
            (None, TenantBackend::Local) => Some(CredentialsConfig::Local),
            (None, _) => None,
        }
    }

    /// The auth mode in force.
    pub fn effective_auth(&self) -> AuthMode {
        self.auth
            .unwrap_or(if self.effective_credentials().is_some() {
                AuthMode::Gateway
            } else {
                AuthMode::Passthrough
            })
    }
}

/// A tenant's compute backend.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum TenantBackend {
    /// An always-on Postgres at `address` (`host:port`).
    Fixed {
        /// `host:port`.
        address: String,
        /// Overrides `[backend] tls` for this tenant.
        #[serde(default)]
        tls: Option<BackendTls>,
    },
    /// A Postgres server the gateway starts and stops itself (see `[local]`).
    Local,
    /// A CloudNativePG `Cluster`, woken by its `cnpg.io/hibernation` annotation.
    Cnpg {
        /// Cluster name.
        cluster: String,
        /// Its namespace (default `[kubernetes] namespace`).
        #[serde(default)]
        namespace: Option<String>,
        /// `host:port` to connect to instead of `<cluster>-rw.<namespace>.svc:5432`.
        #[serde(default)]
        endpoint: Option<String>,
    },
    /// A cluster claimed from a `[[pool_class]]` on the first wake and bound to the tenant.
    Pool {
        /// The pool class's name.
        class: String,
    },
}

/// Checks every tenant against the rest of the configuration (whether `[local]` exists, the
/// pool classes); returns their ids.
pub(super) fn validate_all<'a>(
    tenants: &'a [TenantConfig],
    has_local: bool,
    classes: &HashSet<&str>,
) -> Result<HashSet<&'a TenantId>, ConfigError> {
    let mut seen = HashSet::new();
    for (i, t) in tenants.iter().enumerate() {
        if !seen.insert(&t.id) {
            return Err(invalid(
                format!("tenant[{i}].id"),
                format!("tenant \"{}\" is configured twice", t.id),
            ));
        }
        t.validate_backend(i, has_local, classes)?;
        t.validate_credentials(i, has_local)?;
        for (key, cap) in [
            ("tenant.max_client_connections", t.max_client_connections),
            ("tenant.max_backend_connections", t.max_backend_connections),
        ] {
            if cap == Some(0) {
                return Err(invalid(
                    key,
                    format!(
                        "tenant {} allows no connection: set at least 1, or remove the key",
                        t.id
                    ),
                ));
            }
        }
    }
    Ok(seen)
}

impl TenantConfig {
    fn validate_backend(
        &self,
        i: usize,
        has_local: bool,
        classes: &HashSet<&str>,
    ) -> Result<(), ConfigError> {
        match &self.backend {
            TenantBackend::Fixed { address, .. } => {
                if Endpoint::parse(address).is_none() {
                    return Err(invalid(
                        format!("tenant[{i}].backend.address"),
                        format!("{address:?} is not host:port"),
                    ));
                }
            }
            TenantBackend::Local if !has_local => {
                return Err(invalid(
                    format!("tenant[{i}].backend"),
                    "kind = \"local\" needs a [local] section with data_dir and password",
                ));
            }
            TenantBackend::Local => {}
            TenantBackend::Cnpg { endpoint, .. } => {
                if let Some(e) = endpoint
                    && Endpoint::parse(e).is_none()
                {
                    return Err(invalid(
                        format!("tenant[{i}].backend.endpoint"),
                        format!("{e:?} is not host:port"),
                    ));
                }
            }
            TenantBackend::Pool { class } => {
                if !classes.contains(class.as_str()) {
                    return Err(invalid(
                        format!("tenant[{i}].backend.class"),
                        format!("no [[pool_class]] is named {class:?}"),
                    ));
                }
                if !label_value_ok(self.id.as_str()) {
                    return Err(invalid(
                        format!("tenant[{i}].id"),
                        "a pool tenant's id is a Kubernetes label value: it must start and end \
                         with a letter or digit",
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_credentials(&self, i: usize, has_local: bool) -> Result<(), ConfigError> {
        if self.reuse_passthrough && self.effective_auth() == AuthMode::Gateway {
            return Err(invalid(
                format!("tenant[{i}].reuse_passthrough"),
                "the gateway checks this tenant's passwords, so its sessions take part in [reuse] \
                 already: reuse_passthrough is for passthrough tenants",
            ));
        }
        if self.effective_auth() == AuthMode::Gateway && self.effective_credentials().is_none() {
            return Err(invalid(
                format!("tenant[{i}].credentials"),
                "auth = \"gateway\" needs a credential source (static, auth_query, local or kubernetes_secret)",
            ));
        }
        if let Some(CredentialsConfig::KubernetesSecret { secret: None, .. }) = &self.credentials
            && !matches!(self.backend, TenantBackend::Cnpg { .. })
        {
            return Err(invalid(
                format!("tenant[{i}].credentials.secret"),
                "kind = \"kubernetes_secret\" needs a secret name unless the tenant is a cnpg cluster",
            ));
        }
        if matches!(self.effective_credentials(), Some(CredentialsConfig::Local)) && !has_local {
            return Err(invalid(
                format!("tenant[{i}].credentials"),
                "kind = \"local\" credentials need a [local] section",
            ));
        }
        Ok(())
    }
}
