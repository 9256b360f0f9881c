//! Compute backends: where a tenant's database runs, and how to wake it and put it to sleep.

mod cluster;
mod cnpg;
#[cfg(test)]
pub(crate) mod fake;
mod fixed;
mod local;
mod pool;
mod primary;
mod probe;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use thiserror::Error;

pub use cluster::{
    CnpgCluster, CnpgSettings, ENDPOINT_ANNOTATION, HIBERNATION_ANNOTATION, Route, TENANT_LABEL,
    cluster_awake, cluster_hibernated, cluster_resource,
};
pub use cnpg::CnpgBackend;
pub use fixed::FixedBackend;
pub use local::{ClaimError, LocalBackend, LocalSettings, can_enter, find_bin_dir, server_account};
pub use pool::{
    POOL_LABEL, PoolBackend, PoolClass, Release, STATE_LABEL, TemplateError, cluster_template,
};

use crate::TenantId;

/// A Postgres server address a tenant's connections go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The name a backend's TLS certificate is checked against when `host` is not it: an
    /// address a backend found for speed (a primary pod's IP) behind a Service name.
    pub tls_name: Option<String>,
}

impl Endpoint {
    /// `host:port`, with certificates checked against `host`.
    pub fn new(host: impl Into<String>, port: u16) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
            tls_name: None,
        }
    }

    /// The name certificates are checked against.
    pub fn tls_name(&self) -> &str {
        self.tls_name.as_deref().unwrap_or(&self.host)
    }

    /// Parses `host:port` (IPv6 as `[addr]:port`).
    pub fn parse(s: &str) -> Option<Endpoint> {
        let (host, port) = s.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return None;
        }
        Some(Endpoint::new(host, port.parse().ok()?))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Whether a tenant's database can take connections now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComputeState {
    /// Accepts logins.
    Awake,
    /// Stopped; a wake is needed.
    Asleep,
    /// Running, but no longer at the address the last wake returned (a failover, a pod made
    /// again): a wake is needed to find it.
    Moved,
}

/// Why a backend could not wake, stop or report a tenant.
#[derive(Debug, Error)]
pub enum BackendError {
    /// The backend does not know this tenant.
    #[error("tenant {0} has no compute in this backend")]
    UnknownTenant(TenantId),
    /// The backend cannot work at all on this machine (missing binaries, no account).
    #[error("{0}")]
    Unavailable(String),
    /// Starting the database failed; the text says why (for the log, not the client).
    #[error("start failed: {0}")]
    StartFailed(String),
    /// The Kubernetes API refused or could not be reached.
    #[error("kubernetes API: {0}")]
    Api(String),
    /// The database did not accept logins in time.
    #[error("did not accept logins within {0:?}")]
    Timeout(Duration),
}

/// Where a tenant's database runs, and how to wake it and put it to sleep.
#[async_trait]
pub trait ComputeBackend: Send + Sync {
    /// Short name of the implementation, for logs and metrics.
    fn kind(&self) -> &'static str;
    /// Makes the tenant's database accept logins and returns its address once a login is
    /// possible (backends try a login, `probe`); idempotent.
    async fn wake(&self, tenant: &TenantId) -> Result<Endpoint, BackendError>;
    /// Puts the tenant's database to sleep; idempotent.
    async fn sleep(&self, tenant: &TenantId) -> Result<(), BackendError>;
    /// The tenant's current state.
    async fn state(&self, tenant: &TenantId) -> Result<ComputeState, BackendError>;
    /// Namespace of the tenant's shared activity record ([`crate::activity`]), for backends
    /// whose databases several gateway replicas share; `None` (the default): this gateway alone
    /// decides when the tenant sleeps.
    fn activity_namespace(&self, _tenant: &TenantId) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        let e = Endpoint::parse("127.0.0.1:5433").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 5433));
        assert_eq!(
            Endpoint::parse("[::1]:5432").unwrap().to_string(),
            "[::1]:5432"
        );
        assert!(Endpoint::parse("nohost").is_none());
        assert!(Endpoint::parse(":5432").is_none());
        assert!(Endpoint::parse("h:99999").is_none());
    }
}
