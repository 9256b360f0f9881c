//! Reaching a woken CloudNativePG cluster through its primary pod's own address.
//!
//! After a hibernated cluster's Postgres accepts logins, the operator still has to see the pod
//! Ready (its readiness probe), write `readyInstances`, and the `-rw` Service has to route (the
//! EndpointSlice, then kube-proxy's rules): measured on a real node, 2 to 3 s more. The pod's IP
//! is known while it is still Pending, so a wake that probes it directly is done as soon as
//! Postgres is. The Service path runs beside it and wins when the pod cannot be found or read.
//!
//! Only the pod the operator names both current and target primary is used: during a switchover
//! either could be a standby, which accepts logins too.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::time::{Instant, sleep};
use tracing::{debug, info, warn};

use super::cluster::{CnpgSettings, Route, api_error, cluster_awake};
use super::probe::{Probe, probe};
use super::{BackendError, ComputeState, Endpoint};
use crate::TenantId;

/// The pod a tenant was routed to directly.
#[derive(Clone, Debug)]
struct PodRoute {
    namespace: String,
    pod: String,
    ip: String,
    port: u16,
}

/// The name CloudNativePG gives the Postgres port of an instance pod's container.
const POSTGRES_PORT_NAME: &str = "postgresql";

/// Primary pods a backend routes its tenants to, so `state` can tell when one moved.
pub(super) struct PrimaryRoutes {
    client: kube::Client,
    routes: Mutex<HashMap<TenantId, PodRoute>>,
    /// Set once a pod read was refused, so the missing permission is logged once.
    refused: AtomicBool,
}

/// The pod the operator names both current and target primary; `None` while a switchover is
/// under way or before the cluster's first start.
pub(super) fn designated_primary(cluster: &DynamicObject) -> Option<&str> {
    let status = cluster.data.get("status")?;
    let current = status.get("currentPrimary")?.as_str()?;
    let target = status.get("targetPrimary")?.as_str()?;
    (!current.is_empty() && current == target).then_some(current)
}

/// The IP of a pod that is neither ending nor ended.
fn live_ip(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    status.pod_ip.clone().filter(|ip| !ip.is_empty())
}

/// The port Postgres listens on in `pod`, as its container declares it.
fn postgres_port(pod: &Pod) -> Option<u16> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(POSTGRES_PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// The address the instance manager last reported for `pod`.
fn reported_ip<'a>(cluster: &'a DynamicObject, pod: &str) -> Option<&'a str> {
    cluster.data["status"]["instancesReportedState"][pod]["ip"].as_str()
}

fn refused(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            if s.code == 403
    )
}

impl PrimaryRoutes {
    pub(super) fn new(client: kube::Client) -> Self {
        PrimaryRoutes {
            client,
            routes: Mutex::new(HashMap::new()),
            refused: AtomicBool::new(false),
        }
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, PodRoute>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets where a tenant was routed (it sleeps, or its cluster is released).
    pub(super) fn forget(&self, tenant: &TenantId) {
        self.routes().remove(tenant);
    }

    /// Reaches the primary of `cluster` (as last seen) for `tenant`: directly at its pod, or by
    /// `via_service`, whichever accepts logins first. `service` is the `-rw` Service's address
    /// when the pod may stand in for it (`None`: an address was named for the cluster, and only
    /// `via_service` is used).
    pub(super) async fn reach(
        &self,
        tenant: &TenantId,
        cluster: &DynamicObject,
        service: Option<&Endpoint>,
        settings: &CnpgSettings,
        deadline: Instant,
        via_service: impl Future<Output = Result<Endpoint, BackendError>>,
    ) -> Result<Endpoint, BackendError> {
        self.forget(tenant);
        let pod = designated_primary(cluster)
            .filter(|_| settings.route == Route::PrimaryPod)
            .zip(cluster.metadata.namespace.as_deref())
            .zip(service);
        let Some(((pod, namespace), service)) = pod else {
            return via_service.await;
        };
        tokio::select! {
            Some(route) = self.probe_pod(namespace, pod, service.port, settings, deadline) => {
                let endpoint = Endpoint {
                    host: route.ip.clone(),
                    port: route.port,
                    tls_name: Some(service.host.clone()),
                };
                info!(tenant = %tenant, pod = %route.pod, address = %endpoint, "reached the primary pod directly");
                self.routes().insert(tenant.clone(), route);
                Ok(endpoint)
            }
            r = via_service => r,
        }
    }

    /// Watches pod `pod` and probes logins at its IP (on the port its container declares, else
    /// `port`) until one succeeds (`None`: the pod cannot be read, or `deadline` passed).
    async fn probe_pod(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
        settings: &CnpgSettings,
        deadline: Instant,
    ) -> Option<PodRoute> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={pod}"));
        let mut events = watcher(pods, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut address: Option<(String, u16)> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            if let Some((ip, port)) = &address {
                let endpoint = Endpoint::new(ip.clone(), *port);
                let limit = settings.probe_timeout.min(left);
                if probe(&endpoint, &settings.probe_user, "postgres", limit).await == Probe::Ready {
                    return Some(PodRoute {
                        namespace: namespace.to_owned(),
                        pod: pod.to_owned(),
                        ip: ip.clone(),
                        port: *port,
                    });
                }
            }
            let pause = match address {
                Some(_) => settings.probe_interval.min(left),
                None => left,
            };
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(p)) => {
                        address = live_ip(&p).map(|ip| (ip, postgres_port(&p).unwrap_or(port)));
                    }
                    Some(Err(e)) if refused(&e) => {
                        if !self.refused.swap(true, Ordering::Relaxed) {
                            warn!(namespace, pod, error = %e, "cannot read the primary pod (RBAC: pods get, list, watch); waking through the -rw Service");
                        }
                        return None;
                    }
                    // The watcher re-lists and resumes by itself after other errors.
                    Some(Err(e)) => debug!(pod, error = %e, "pod watch error"),
                    None => return None,
                },
                _ = sleep(pause) => {}
            }
        }
    }

    /// The state of a tenant's cluster that is not asked to hibernate: from the pod when the
    /// tenant was routed to it directly, else from the operator's status.
    pub(super) async fn state(
        &self,
        tenant: &TenantId,
        cluster: &DynamicObject,
    ) -> Result<ComputeState, BackendError> {
        Ok(match self.direct_state(tenant, cluster).await? {
            Some(state) => state,
            None if cluster_awake(cluster) => ComputeState::Awake,
            None => ComputeState::Asleep,
        })
    }

    /// The state of a tenant routed to a pod directly (`None`: it was not): `Moved` when the
    /// cluster's primary is no longer there (another instance took over, or the pod was made
    /// again with another address), else `Awake`. The operator's status may lag the pod by
    /// seconds after a wake, so only the pod and the primary's name are trusted.
    async fn direct_state(
        &self,
        tenant: &TenantId,
        cluster: &DynamicObject,
    ) -> Result<Option<ComputeState>, BackendError> {
        let Some(route) = self.routes().get(tenant).cloned() else {
            return Ok(None);
        };
        let moved = match designated_primary(cluster) {
            Some(primary) if primary != route.pod => true,
            // A switchover under way: the route stands until it settles.
            None => false,
            // The instance manager's report is enough when it agrees; it lags after a restart,
            // so a disagreement is settled by the pod itself.
            Some(_) if reported_ip(cluster, &route.pod) == Some(route.ip.as_str()) => false,
            Some(_) => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &route.namespace);
                let pod = pods.get_opt(&route.pod).await.map_err(api_error)?;
                pod.as_ref().and_then(live_ip).as_deref() != Some(route.ip.as_str())
            }
        };
        if moved {
            info!(tenant = %tenant, pod = %route.pod, "the primary is no longer at the address routed to");
            self.forget(tenant);
        }
        Ok(Some(if moved {
            ComputeState::Moved
        } else {
            ComputeState::Awake
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cluster::tests::cluster;
    use serde_json::json;

    #[test]
    fn only_an_agreed_primary_is_reached_directly() {
        let agreed = cluster(json!({ "currentPrimary": "c-1", "targetPrimary": "c-1" }));
        assert_eq!(designated_primary(&agreed), Some("c-1"));
        let switching = cluster(json!({ "currentPrimary": "c-1", "targetPrimary": "c-2" }));
        assert_eq!(designated_primary(&switching), None);
        assert_eq!(designated_primary(&cluster(json!({}))), None);
        let unstarted = cluster(json!({ "currentPrimary": "", "targetPrimary": "" }));
        assert_eq!(designated_primary(&unstarted), None);
    }

    #[test]
    fn pods_give_their_address_and_port_until_they_end() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "c-1" },
            "spec": { "containers": [{
                "name": "postgres",
                "ports": [
                    { "name": "metrics", "containerPort": 9187 },
                    { "name": "postgresql", "containerPort": 5433 }
                ]
            }]},
            "status": { "phase": "Pending", "podIP": "10.0.0.7" }
        }))
        .unwrap();
        assert_eq!(live_ip(&pod).as_deref(), Some("10.0.0.7"));
        assert_eq!(postgres_port(&pod), Some(5433));
        pod.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(live_ip(&pod), None);
    }
}
