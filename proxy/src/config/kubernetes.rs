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
    /// after this (default 15 s, `DEFAULT_ACTIVITY_TTL`).
    #[serde(default, with = "super::duration")]
    pub activity_ttl: Option<Duration>,
    /// How woken clusters are reached: `primary_pod` (default) or `service`.
    pub route: KubeRoute,
    /// Longest wait for one readiness probe's answer (default 1 s, `DEFAULT_PROBE_TIMEOUT`).
    #[serde(default, with = "super::duration")]
    pub probe_timeout: Option<Duration>,
}

/// `[kubernetes] route`: where a woken cluster's connections go.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KubeRoute {
    /// The primary pod's IP as soon as Postgres accepts logins there, without waiting for the
    /// operator's status and the `-rw` Service (needs `pods` get, list, watch); the Service when
    /// the pod cannot be read.
    #[default]
    PrimaryPod,
    /// The `-rw` Service, once the operator reports the cluster ready.
    Service,
}

/// `probe_timeout` when unset: a probe on a healthy cluster answers in milliseconds, and a
/// connection that hangs longer is better tried again.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

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

    /// `probe_timeout`, or its default.
    pub fn probe_timeout(&self) -> Duration {
        self.probe_timeout.unwrap_or(DEFAULT_PROBE_TIMEOUT)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.probe_timeout().is_zero() {
            return Err(invalid("kubernetes.probe_timeout", "must be above zero"));
        }
        if self.activity_ttl() < MIN_ACTIVITY_TTL {
            return Err(invalid(
                "kubernetes.activity_ttl",
                format!("must be at least {MIN_ACTIVITY_TTL:?}"),
            ));
        }
        Ok(())
    }
}
