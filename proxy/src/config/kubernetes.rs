//! `[kubernetes]`: reaching the Kubernetes API, and discovering tenants there.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{AuthMode, ConfigError, invalid};

/// `[kubernetes]`: how the gateway reaches the Kubernetes API.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// A kubeconfig file; unset: the in-cluster ServiceAccount, `KUBECONFIG` or ~/.kube/config.
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig (default: its current context).
    pub context: Option<String>,
    /// Namespace of tenants' clusters when a tenant names none (default: the client's).
    pub namespace: Option<String>,
    /// User named in readiness probes (any name works).
    pub probe_user: Option<String>,
    /// Serve every `Cluster` in `namespace` that carries `discover_label` as a tenant (the
    /// label's value is the tenant id), added and removed while the gateway runs.
    pub discover: bool,
    /// The label discovery looks for.
    pub discover_label: Option<String>,
    /// Who checks passwords of discovered tenants (default `gateway`, against the cluster's
    /// `<cluster>-app` Secret).
    pub discover_auth: Option<AuthMode>,
    /// Idle timeout of discovered tenants (default `[wake] idle_timeout`).
    #[serde(default, with = "super::duration")]
    pub discover_idle_timeout: Option<Duration>,
    /// How long a replica's entry in a tenant's shared activity record counts after its last
    /// renewal (renewed every third of it): a killed replica stops holding its tenants awake
    /// after this (default [`DEFAULT_ACTIVITY_TTL`]).
    #[serde(default, with = "super::duration")]
    pub activity_ttl: Option<Duration>,
}

/// `activity_ttl` when unset: long enough to ride out a slow API call or two, short enough that
/// a killed replica's tenants sleep soon after.
pub const DEFAULT_ACTIVITY_TTL: Duration = Duration::from_secs(15);
/// The shortest `activity_ttl`: renewals and API calls are paced in fractions of it.
const MIN_ACTIVITY_TTL: Duration = Duration::from_secs(1);

impl KubernetesConfig {
    /// `activity_ttl`, or its default.
    pub fn activity_ttl(&self) -> Duration {
        self.activity_ttl.unwrap_or(DEFAULT_ACTIVITY_TTL)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.activity_ttl() < MIN_ACTIVITY_TTL {
            return Err(invalid(
                "kubernetes.activity_ttl",
                format!("must be at least {MIN_ACTIVITY_TTL:?}"),
            ));
        }
        Ok(())
    }
}
