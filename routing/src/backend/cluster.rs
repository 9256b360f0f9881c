//! CloudNativePG's `Cluster` as the gateway sees it: the annotations it reads and writes, where a
//! tenant's cluster is, and waiting on the operator's status. Shared by the `cnpg` backend, the
//! warm `pool` and the primary-pod route (`primary`), none of which needs another for it.

use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::time::{Instant, sleep, timeout_at};

use super::probe::{Probe, probe};
use super::{BackendError, Endpoint};

/// Annotation on a Cluster naming the `host:port` to reach it at instead of its `-rw`
/// service (for gateways outside the cluster network, and for tests).
pub const ENDPOINT_ANNOTATION: &str = "pgwake.io/endpoint";
/// The annotation CloudNativePG hibernates a cluster by.
pub const HIBERNATION_ANNOTATION: &str = "cnpg.io/hibernation";
/// The label naming the tenant a Cluster serves: discovery reads it, the warm pool writes it
/// on the cluster it binds.
pub const TENANT_LABEL: &str = "pgwake.io/tenant";
/// Field manager name for the gateway's patches.
pub(super) const FIELD_MANAGER: &str = "pgwake";

/// Where a tenant's Cluster is and how to reach its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CnpgCluster {
    /// Namespace of the Cluster.
    pub namespace: String,
    /// Cluster name.
    pub name: String,
    /// Address of the read-write service (default `<name>-rw.<namespace>.svc:5432`).
    pub endpoint: Endpoint,
}

impl CnpgCluster {
    /// The cluster an object describes, reached through its `pgwake.io/endpoint` annotation
    /// when it has a valid one, else its `-rw` service.
    pub fn from_object(obj: &DynamicObject) -> Option<CnpgCluster> {
        let name = obj.metadata.name.as_deref()?;
        let namespace = obj.metadata.namespace.as_deref()?;
        let mut cluster = CnpgCluster::new(namespace, name);
        if let Some(e) = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ENDPOINT_ANNOTATION))
            .and_then(|v| Endpoint::parse(v))
        {
            cluster.endpoint = e;
        }
        Some(cluster)
    }

    /// A cluster reached through its `-rw` service.
    pub fn new(namespace: &str, name: &str) -> Self {
        CnpgCluster {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            endpoint: Endpoint::new(format!("{name}-rw.{namespace}.svc"), 5432),
        }
    }

    /// True when the cluster is reached at its `-rw` Service (no endpoint named instead), so
    /// its primary pod may be reached directly.
    pub fn behind_service(&self) -> bool {
        self.endpoint == CnpgCluster::new(&self.namespace, &self.name).endpoint
    }
}

/// How a gateway reaches a woken cluster's primary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Route {
    /// The primary pod's IP as soon as Postgres accepts logins there, the `-rw` Service when
    /// the pod cannot be read; certificates are still checked against the Service's name.
    #[default]
    PrimaryPod,
    /// The `-rw` Service only, once the operator reports the cluster ready.
    Service,
}

/// Timings and the login the readiness probe uses.
#[derive(Clone, Debug)]
pub struct CnpgSettings {
    /// How long a wake may take, operator and Postgres start included.
    pub start_timeout: Duration,
    /// Time between login probes.
    pub probe_interval: Duration,
    /// Longest wait for one probe's answer: a connection that hangs (a Service whose rules
    /// are still being written) is given up and tried again rather than waited on.
    pub probe_timeout: Duration,
    /// How a woken cluster's primary is reached.
    pub route: Route,
    /// User named in probe logins (any name works: an authentication request means ready).
    pub probe_user: String,
}

/// The `Cluster` kind of CloudNativePG.
pub fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "postgresql.cnpg.io",
        "v1",
        "Cluster",
    ))
}

/// True when the operator reports the cluster running: no active hibernation condition and at
/// least one ready instance. `status.phase` alone is not enough: a hibernated cluster can still
/// read "Cluster in healthy state".
pub fn cluster_awake(obj: &DynamicObject) -> bool {
    let ready = obj
        .data
        .get("status")
        .and_then(|s| s.get("readyInstances"))
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    !cluster_hibernated(obj) && ready >= 1
}

/// True when the operator reports the cluster hibernated (its pods are gone).
pub fn cluster_hibernated(obj: &DynamicObject) -> bool {
    obj.data
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(|c| c.as_array())
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c["type"] == HIBERNATION_ANNOTATION && c["status"] == "True")
        })
}

/// True when the Cluster's hibernation annotation asks for `on`.
pub(super) fn hibernation_requested(obj: &DynamicObject) -> bool {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HIBERNATION_ANNOTATION))
        .is_some_and(|v| v == "on")
}

pub(super) fn api_error(e: kube::Error) -> BackendError {
    BackendError::Api(e.to_string())
}

/// Merge-patches the `cnpg.io/hibernation` annotation of Cluster `name` to `value`; returns
/// the Cluster as patched.
pub(super) async fn set_hibernation(
    api: &Api<DynamicObject>,
    name: &str,
    value: &str,
) -> Result<DynamicObject, BackendError> {
    let patch = json!({ "metadata": { "annotations": { HIBERNATION_ANNOTATION: value } } });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(api_error)
}

/// Watches (not polls) Cluster `name` until the operator reports it awake and returns the
/// object as then seen; a [`BackendError::Timeout`] of `settings.start_timeout` at `deadline`.
pub(super) async fn wait_awake(
    api: Api<DynamicObject>,
    name: &str,
    settings: &CnpgSettings,
    deadline: Instant,
) -> Result<DynamicObject, BackendError> {
    watch_until(api, name, settings, deadline, cluster_awake).await
}

/// Watches (not polls) Cluster `name` until `done` holds for it and returns the object as then
/// seen; a [`BackendError::Timeout`] of `settings.start_timeout` at `deadline`.
pub(super) async fn watch_until(
    api: Api<DynamicObject>,
    name: &str,
    settings: &CnpgSettings,
    deadline: Instant,
    done: fn(&DynamicObject) -> bool,
) -> Result<DynamicObject, BackendError> {
    // The watch starts with a listing, so a cluster already there ends it at once.
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut objects = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    timeout_at(deadline, async {
        while let Some(event) = objects.next().await {
            match event {
                Ok(obj) if done(&obj) => return Ok(obj),
                Ok(_) => {}
                // The watcher re-lists and resumes by itself after errors; keep waiting.
                Err(e) => tracing::debug!(cluster = %name, error = %e, "cluster watch error"),
            }
        }
        Err(BackendError::Api("the cluster watch ended".into()))
    })
    .await
    .map_err(|_| BackendError::Timeout(settings.start_timeout))?
}

/// Probes logins on `endpoint` until one succeeds or `deadline` passes: a Cluster can look
/// healthy before Postgres accepts logins.
pub(super) async fn probe_until_ready(
    endpoint: &Endpoint,
    settings: &CnpgSettings,
    deadline: Instant,
) -> Result<(), BackendError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BackendError::Timeout(settings.start_timeout));
        }
        let limit = settings.probe_timeout.min(left);
        match probe(endpoint, &settings.probe_user, "postgres", limit).await {
            Probe::Ready => return Ok(()),
            Probe::NotYet(_) => sleep(settings.probe_interval.min(left)).await,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A Cluster with this status.
    pub(in crate::backend) fn cluster(status: serde_json::Value) -> DynamicObject {
        let mut obj = DynamicObject::new("c", &cluster_resource());
        obj.data = json!({ "status": status });
        obj
    }

    #[test]
    fn awake_needs_ready_instances_and_no_hibernation() {
        assert!(cluster_awake(&cluster(json!({ "readyInstances": 1 }))));
        assert!(!cluster_awake(&cluster(json!({}))));
        assert!(!cluster_awake(&cluster(json!({
            "readyInstances": 1,
            "phase": "Cluster in healthy state",
            "conditions": [{ "type": "cnpg.io/hibernation", "status": "True", "reason": "Hibernated" }]
        }))));
        assert!(cluster_awake(&cluster(json!({
            "readyInstances": 2,
            "conditions": [{ "type": "Ready", "status": "True" }]
        }))));
    }
}
