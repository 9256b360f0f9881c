//! `[kubernetes]`: reaching the Kubernetes API, and discovering tenants there.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::AuthMode;

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
    #[serde(default, with = "humantime_serde")]
    pub discover_idle_timeout: Option<Duration>,
}
