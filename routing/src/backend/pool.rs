//! The `pool` backend: tenants get pre-warmed CloudNativePG clusters from a pool class instead of
//! waiting for a cluster of their own to start.
//!
//! Warm clusters carry the labels `pgwake.io/pool=<class>` and `pgwake.io/state=warm`. A wake for
//! a tenant first looks for a cluster already bound to it (see the binding Lease below; e.g. one
//! the `hibernate` release policy put to sleep) and wakes it by annotation like the `cnpg`
//! backend. Otherwise it claims a warm one with a JSON patch whose `test` op requires
//! `pgwake.io/state == warm` and that sets `pgwake.io/state=claimed` and
//! `pgwake.io/tenant=<id>`: the API server applies test and change atomically, so of two
//! claimants of one cluster the second gets 422 and moves on to the next cluster.
//!
//! Across gateway processes one tenant could still claim two clusters (each process runs its
//! own single-flight wake), and labels cannot be made unique. The binding itself is therefore
//! recorded in a per-tenant Lease, `pgwake-bind-<class>-<tenant>` (its `holderIdentity` is the
//! cluster's name), which the API server lets only one writer create (409 for the others) or
//! rebind (`resourceVersion` precondition). A gateway that claimed a cluster but lost the
//! binding gives its claim back and routes to the bound cluster.
//!
//! Once bound, the claimant marks the cluster with the annotation `pgwake.io/bound` (a patch
//! that again tests the claim labels): that mark is the point of no return. A claim that never
//! got that far (its gateway was killed between claim and binding) is an orphan: claimed, not
//! marked, and named by no binding Lease. The replenisher returns orphans to the warm pool once
//! it has seen them unchanged for the class's `orphan_grace`, with a patch conditional on the
//! `resourceVersion` it read (so it cannot undo a mark written meanwhile; the claimant's mark
//! then fails and it binds anew). A gateway shutting down hands back its unfinished claims the
//! same way. Clusters that carry the mark are never returned, even without a Lease: they may
//! hold a tenant's data.
//!
//! A replenisher per class, run only by the replica holding the Lease `pgwake-pool-<class>`,
//! creates clusters from the class's template until `min_warm` are warm.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use serde_json::{Value, json};
use thiserror::Error;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cluster::{CnpgCluster, ENDPOINT_ANNOTATION, TENANT_LABEL};
use super::cluster::{
    FIELD_MANAGER, api_error, hibernation_requested, probe_until_ready, set_hibernation, wait_awake,
};
use super::primary::PrimaryRoutes;
use super::{BackendError, CnpgSettings, ComputeBackend, ComputeState, Endpoint};
use super::{cluster_awake, cluster_resource};
use crate::TenantId;
use crate::lease::LeaderLease;

/// Label naming the pool class a cluster belongs to.
pub const POOL_LABEL: &str = "pgwake.io/pool";
/// Label saying whether a pool cluster is `warm` (free) or `claimed`.
pub const STATE_LABEL: &str = "pgwake.io/state";

/// Annotation set on a claimed cluster once its binding Lease names it (value: the Lease).
pub const BOUND_ANNOTATION: &str = "pgwake.io/bound";

const WARM: &str = "warm";
const CLAIMED: &str = "claimed";
/// Label keys as JSON-pointer path segments (`/` escaped as `~1`).
const STATE_PATH: &str = "/metadata/labels/pgwake.io~1state";
const TENANT_PATH: &str = "/metadata/labels/pgwake.io~1tenant";
const BOUND_PATH: &str = "/metadata/annotations/pgwake.io~1bound";
/// Rounds one wake makes when bindings keep changing under it (another gateway bound the tenant
/// first, or the bound cluster vanished), before it gives up (the wake coordinator retries).
const CLAIM_ROUNDS: usize = 3;

/// What putting a pool tenant to sleep does with its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Delete the Cluster (ephemeral tenants); the next wake claims a fresh one.
    Delete,
    /// Hibernate it by annotation and keep the binding; the next wake wakes the same cluster.
    Hibernate,
}

/// One pool class: where its clusters live, how many are kept warm, and how they are made.
#[derive(Clone, Debug)]
pub struct PoolClass {
    /// Class name, the value of `pgwake.io/pool` and the prefix of generated cluster names.
    pub name: String,
    /// Namespace of its clusters (and of its Lease).
    pub namespace: String,
    /// Warm clusters the replenisher keeps.
    pub min_warm: usize,
    /// What sleep does.
    pub release: Release,
    /// The Cluster manifest new warm clusters are made from (see [`cluster_template`]).
    pub template: Value,
    /// How often the replenisher checks the warm count (it also runs right after a claim).
    pub replenish_interval: Duration,
    /// How long the replenisher's Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long a claimed cluster must stay unbound and unmarked before the replenisher returns
    /// it to the warm pool.
    pub orphan_grace: Duration,
}

/// Why a Cluster template cannot be used.
#[derive(Debug, Error)]
#[error("pool template: {0}")]
pub struct TemplateError(String);

/// Checks a Cluster manifest for use as a pool template and strips what the API server assigns
/// (name, resourceVersion, uid, status...); `apiVersion` and `kind` are filled in when absent.
pub fn cluster_template(mut manifest: Value) -> Result<Value, TemplateError> {
    let resource = cluster_resource();
    let obj = manifest
        .as_object_mut()
        .ok_or_else(|| TemplateError("the manifest is not a mapping".into()))?;
    for (key, want) in [
        ("apiVersion", resource.api_version.as_str()),
        ("kind", resource.kind.as_str()),
    ] {
        match obj.get(key) {
            None => {
                obj.insert(key.into(), want.into());
            }
            Some(v) if v == want => {}
            Some(v) => {
                return Err(TemplateError(format!(
                    "{key} is {v}, a pool template must be a {want} of {}",
                    resource.api_version
                )));
            }
        }
    }
    obj.remove("status");
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| TemplateError("metadata is not a mapping".into()))?;
    for key in [
        "name",
        "generateName",
        "namespace",
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        meta.remove(key);
    }
    if obj.get("spec").is_none_or(|s| !s.is_object()) {
        return Err(TemplateError("the manifest has no spec".into()));
    }
    Ok(manifest)
}

/// Pre-warmed CloudNativePG clusters claimed by tenants on demand.
pub struct PoolBackend {
    client: kube::Client,
    resource: ApiResource,
    classes: HashMap<String, PoolClass>,
    tenants: HashMap<TenantId, String>,
    settings: CnpgSettings,
    identity: String,
    /// The cluster each tenant was last routed to, so `state` is one GET.
    bound: Mutex<HashMap<TenantId, String>>,
    /// Per class: wakes the replenisher after a claim or a delete.
    refill: HashMap<String, Notify>,
    /// Clusters this gateway claimed and has not yet bound and marked: (class, tenant) by
    /// cluster name, handed back on shutdown.
    claiming: Mutex<HashMap<String, (String, TenantId)>>,
    /// Set on shutdown: no new claims are bound.
    closing: AtomicBool,
    /// Primary pods tenants were routed to directly.
    routes: PrimaryRoutes,
}

/// Name of the Lease that records which cluster of `class` the tenant is bound to. Tenant ids
/// that are not already DNS-safe (upper case, `_`) are replaced by a stable hash.
fn binding_name(class: &str, tenant: &TenantId) -> String {
    let id = tenant.as_str();
    if id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        format!("pgwake-bind-{class}-{id}")
    } else {
        // FNV-1a: stable across builds, unlike std's hasher.
        let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("pgwake-bind-{class}-{hash:016x}")
    }
}

/// The cluster a binding Lease names, if it names one.
fn bound_to(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn label_selector(class: &str, key: &str, value: &str) -> String {
    format!("{POOL_LABEL}={class},{key}={value}")
}

fn json_patch(ops: Value) -> Result<Patch<()>, BackendError> {
    serde_json::from_value(ops)
        .map(Patch::Json)
        .map_err(|e| BackendError::Api(format!("building a JSON patch: {e}")))
}

fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

/// The address of a cluster's primary: the `pgwake.io/endpoint` annotation, else the `-rw`
/// service, and whether it is that service (which the primary pod may stand in for).
fn endpoint_of(obj: &DynamicObject, namespace: &str) -> Result<(Endpoint, bool), BackendError> {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    match obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ENDPOINT_ANNOTATION))
    {
        Some(value) => match Endpoint::parse(value) {
            Some(endpoint) => Ok((endpoint, false)),
            None => Err(BackendError::StartFailed(format!(
                "cluster {name}: annotation {ENDPOINT_ANNOTATION}={value:?} is not host:port"
            ))),
        },
        None => Ok((CnpgCluster::new(namespace, name).endpoint, true)),
    }
}

/// The order a tenant tries warm clusters in: those the operator reports running first, then
/// those still starting. The replenisher labels a cluster warm when it creates it, and a real
/// operator needs tens of seconds to start it, so a claim that took any warm cluster could wait
/// that long while a running one stood by. Within each group tenants start at different
/// clusters (by a hash of the tenant), so concurrent claims rarely collide.
fn claim_order(objects: Vec<DynamicObject>, tenant: &TenantId) -> Vec<String> {
    let (running, starting): (Vec<_>, Vec<_>) = objects.into_iter().partition(cluster_awake);
    let mut h = std::hash::DefaultHasher::new();
    tenant.as_str().hash(&mut h);
    let start = h.finish();
    let mut order = Vec::new();
    for group in [running, starting] {
        let mut names = live_names(group);
        if !names.is_empty() {
            let len = names.len() as u64;
            names.rotate_left((start % len) as usize);
        }
        order.extend(names);
    }
    order
}

/// Names of live (not being deleted) clusters in a list, sorted.
fn live_names(objects: Vec<DynamicObject>) -> Vec<String> {
    let mut names: Vec<String> = objects
        .into_iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort();
    names
}

impl PoolBackend {
    /// A backend for these classes; `tenants` maps each tenant to its class; `identity` names
    /// this replica in the replenishers' Leases (unique per process).
    pub fn new(
        client: kube::Client,
        classes: Vec<PoolClass>,
        tenants: HashMap<TenantId, String>,
        settings: CnpgSettings,
        identity: String,
    ) -> Self {
        PoolBackend {
            routes: PrimaryRoutes::new(client.clone()),
            client,
            resource: cluster_resource(),
            refill: classes
                .iter()
                .map(|c| (c.name.clone(), Notify::new()))
                .collect(),
            classes: classes.into_iter().map(|c| (c.name.clone(), c)).collect(),
            tenants,
            settings,
            identity,
            bound: Mutex::new(HashMap::new()),
            claiming: Mutex::new(HashMap::new()),
            closing: AtomicBool::new(false),
        }
    }

    fn class_of(&self, tenant: &TenantId) -> Result<&PoolClass, BackendError> {
        self.tenants
            .get(tenant)
            .and_then(|c| self.classes.get(c))
            .ok_or_else(|| BackendError::UnknownTenant(tenant.clone()))
    }

    fn api(&self, class: &PoolClass) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &class.namespace, &self.resource)
    }

    fn wake_replenisher(&self, class: &PoolClass) {
        if let Some(n) = self.refill.get(&class.name) {
            n.notify_one();
        }
    }

    fn leases(&self, class: &PoolClass) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &class.namespace)
    }

    fn patch_params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        }
    }

    /// Clusters of the class labelled for the tenant, sorted by name: the bound one, plus any
    /// claimed by a gateway that died before it could bind it.
    async fn labelled_clusters(
        &self,
        api: &Api<DynamicObject>,
        class: &PoolClass,
        tenant: &TenantId,
    ) -> Result<Vec<String>, BackendError> {
        let selector = label_selector(&class.name, TENANT_LABEL, tenant.as_str());
        let list = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(api_error)?;
        Ok(live_names(list.items))
    }

    /// Labels a warm cluster as claimed for the tenant; atomic through the patch's `test` op.
    /// Returns the cluster as the patch left it.
    async fn claim(
        &self,
        api: &Api<DynamicObject>,
        class: &PoolClass,
        tenant: &TenantId,
    ) -> Result<DynamicObject, BackendError> {
        let list = api
            .list(&ListParams::default().labels(&label_selector(&class.name, STATE_LABEL, WARM)))
            .await
            .map_err(api_error)?;
        let warm = claim_order(list.items, tenant);
        if warm.is_empty() {
            self.wake_replenisher(class);
            return Err(BackendError::StartFailed(format!(
                "pool class {} has no warm cluster",
                class.name
            )));
        }
        let patch = json_patch(json!([
            { "op": "test", "path": STATE_PATH, "value": WARM },
            { "op": "replace", "path": STATE_PATH, "value": CLAIMED },
            { "op": "add", "path": TENANT_PATH, "value": tenant.as_str() },
        ]))?;
        let mut won = None;
        for name in warm {
            match api.patch(&name, &Self::patch_params(), &patch).await {
                Ok(obj) => {
                    won = Some(obj);
                    break;
                }
                // 422: the test failed, someone claimed it first; 404: deleted meanwhile.
                Err(e) if is_status(&e, &[404, 409, 422]) => {
                    tracing::debug!(tenant = %tenant, cluster = %name, error = %e, "lost a claim race");
                }
                Err(e) => return Err(api_error(e)),
            }
        }
        self.wake_replenisher(class);
        won.ok_or_else(|| {
            BackendError::StartFailed(format!(
                "every warm cluster of pool class {} was claimed by someone else",
                class.name
            ))
        })
    }

    /// Returns a claimed cluster to the warm pool (after losing the binding race).
    async fn give_back(&self, api: &Api<DynamicObject>, tenant: &TenantId, name: &str) {
        let patch = match json_patch(json!([
            { "op": "test", "path": STATE_PATH, "value": CLAIMED },
            { "op": "test", "path": TENANT_PATH, "value": tenant.as_str() },
            { "op": "replace", "path": STATE_PATH, "value": WARM },
            { "op": "remove", "path": TENANT_PATH },
        ])) {
            Ok(p) => p,
            Err(e) => {
                warn!(tenant = %tenant, cluster = %name, error = %e, "could not give a claimed cluster back");
                return;
            }
        };
        if let Err(e) = api.patch(name, &Self::patch_params(), &patch).await {
            // It stays labelled for the tenant but unbound; a `delete` release removes it.
            warn!(tenant = %tenant, cluster = %name, error = %e, "could not give a claimed cluster back");
        }
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, TenantId)>> {
        self.claiming.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Binds a cluster this gateway just claimed, then marks it bound. `None` when the wake
    /// must start a new round: another gateway bound the tenant first, or the claim was handed
    /// back before the mark landed. Every path that does not end marked gives the claim back.
    async fn settle_claim(
        &self,
        api: &Api<DynamicObject>,
        class: &PoolClass,
        tenant: &TenantId,
        lease: Option<Lease>,
        obj: DynamicObject,
    ) -> Result<Option<DynamicObject>, BackendError> {
        let name = obj.name_any();
        if self.closing.load(Ordering::Acquire) {
            self.give_back(api, tenant, &name).await;
            return Err(BackendError::StartFailed(
                "the gateway is shutting down".into(),
            ));
        }
        match self.bind(class, tenant, lease, &name).await {
            Ok(true) => {}
            Ok(false) => {
                info!(tenant = %tenant, class = %class.name, cluster = %name,
                    "another gateway bound the tenant first; giving the claimed cluster back");
                self.give_back(api, tenant, &name).await;
                return Ok(None);
            }
            Err(e) => {
                self.give_back(api, tenant, &name).await;
                return Err(e);
            }
        }
        // The claim labels are tested again: a hand-back that got in first makes this fail.
        let mark = if obj.metadata.annotations.is_some() {
            json!({ "op": "add", "path": BOUND_PATH, "value": binding_name(&class.name, tenant) })
        } else {
            json!({ "op": "add", "path": "/metadata/annotations",
                    "value": { BOUND_ANNOTATION: binding_name(&class.name, tenant) } })
        };
        let patch = json_patch(json!([
            { "op": "test", "path": STATE_PATH, "value": CLAIMED },
            { "op": "test", "path": TENANT_PATH, "value": tenant.as_str() },
            mark,
        ]))?;
        match api.patch(&name, &Self::patch_params(), &patch).await {
            Ok(obj) => Ok(Some(obj)),
            Err(e) if is_status(&e, &[404, 409, 422]) => {
                info!(tenant = %tenant, class = %class.name, cluster = %name,
                    "the claim was handed back before it was marked bound; binding anew");
                let lease = self
                    .leases(class)
                    .get_opt(&binding_name(&class.name, tenant))
                    .await
                    .map_err(api_error)?;
                if let Some(l) = lease.filter(|l| bound_to(l) == Some(name.as_str())) {
                    self.unbind(class, l).await?;
                }
                Ok(None)
            }
            Err(e) => {
                // Its binding Lease keeps the sweep away from it all the same.
                warn!(tenant = %tenant, class = %class.name, cluster = %name, error = %e,
                    "could not mark a claimed cluster bound");
                Ok(Some(obj))
            }
        }
    }

    /// Returns a claimed cluster that was never marked bound to the warm pool, if it is still
    /// claimed (for `tenant`, when given). The patch is conditional on the `resourceVersion`
    /// read here, so a mark written meanwhile wins. True when it went back.
    async fn return_unmarked(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        tenant: Option<&str>,
    ) -> Result<bool, BackendError> {
        let Some(obj) = api.get_opt(name).await.map_err(api_error)? else {
            return Ok(false);
        };
        let labels = obj.labels();
        let labelled = labels.get(TENANT_LABEL).map(String::as_str);
        if obj.metadata.deletion_timestamp.is_some()
            || labels.get(STATE_LABEL).map(String::as_str) != Some(CLAIMED)
            || obj.annotations().contains_key(BOUND_ANNOTATION)
            || tenant.is_some_and(|t| labelled != Some(t))
        {
            return Ok(false);
        }
        let Some(version) = obj.metadata.resource_version.clone() else {
            return Ok(false);
        };
        let mut ops = vec![
            json!({ "op": "test", "path": "/metadata/resourceVersion", "value": version }),
            json!({ "op": "replace", "path": STATE_PATH, "value": WARM }),
        ];
        if labelled.is_some() {
            ops.push(json!({ "op": "remove", "path": TENANT_PATH }));
        }
        match api
            .patch(name, &Self::patch_params(), &json_patch(Value::Array(ops))?)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, &[404, 409, 422]) => Ok(false),
            Err(e) => Err(api_error(e)),
        }
    }

    /// Returns the class's orphaned claims (see the module docs) to the warm pool. `seen` holds,
    /// by cluster, the tenant label each unbound claim had when first seen and when that was;
    /// the grace runs on this process's monotonic clock, so no clocks are compared.
    async fn sweep_orphans(
        &self,
        class: &PoolClass,
        seen: &mut HashMap<String, (Option<String>, Instant)>,
    ) -> Result<(), BackendError> {
        let api = self.api(class);
        let claimed = api
            .list(&ListParams::default().labels(&label_selector(&class.name, STATE_LABEL, CLAIMED)))
            .await
            .map_err(api_error)?;
        let bindings = self
            .leases(class)
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}={}", class.name)))
            .await
            .map_err(api_error)?;
        let bound: HashSet<&str> = bindings.items.iter().filter_map(bound_to).collect();
        let now = Instant::now();
        let mut unbound = HashMap::new();
        for obj in claimed.items {
            let name = obj.name_any();
            if obj.metadata.deletion_timestamp.is_some()
                || obj.annotations().contains_key(BOUND_ANNOTATION)
                || bound.contains(name.as_str())
            {
                continue;
            }
            let tenant = obj.labels().get(TENANT_LABEL).cloned();
            let since = match seen.remove(&name) {
                Some((t, since)) if t == tenant => since,
                _ => now,
            };
            if now.duration_since(since) < class.orphan_grace {
                unbound.insert(name, (tenant, since));
                continue;
            }
            // The list above may be stale: look at the tenant's binding once more.
            if let Some(id) = tenant.as_deref().and_then(|t| TenantId::parse(t).ok()) {
                let lease = self
                    .leases(class)
                    .get_opt(&binding_name(&class.name, &id))
                    .await
                    .map_err(api_error)?;
                if lease.as_ref().and_then(bound_to) == Some(name.as_str()) {
                    continue;
                }
            }
            if self.return_unmarked(&api, &name, tenant.as_deref()).await? {
                info!(class = %class.name, cluster = %name, tenant = ?tenant, grace = ?class.orphan_grace,
                    "returned an abandoned claim to the warm pool");
            }
        }
        *seen = unbound;
        Ok(())
    }

    /// On shutdown: refuses further bindings and returns the claims this gateway has not
    /// finished to the warm pool.
    async fn hand_back_claims(&self) {
        self.closing.store(true, Ordering::Release);
        let claims: Vec<_> = self
            .claims()
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect();
        for (name, (class, tenant)) in claims {
            let Some(class) = self.classes.get(&class) else {
                continue;
            };
            match self
                .return_unmarked(&self.api(class), &name, Some(tenant.as_str()))
                .await
            {
                Ok(true) => {
                    info!(class = %class.name, cluster = %name, tenant = %tenant,
                        "shutting down: handed an unfinished claim back")
                }
                Ok(false) => {}
                Err(e) => {
                    warn!(class = %class.name, cluster = %name, tenant = %tenant, error = %e,
                        "shutting down: could not hand an unfinished claim back")
                }
            }
        }
    }

    /// Records `cluster` as the tenant's in its binding Lease: creates the Lease, or rebinds an
    /// unbound one under its `resourceVersion`. False when another gateway wrote it first.
    async fn bind(
        &self,
        class: &PoolClass,
        tenant: &TenantId,
        previous: Option<Lease>,
        cluster: &str,
    ) -> Result<bool, BackendError> {
        let leases = self.leases(class);
        let name = binding_name(&class.name, tenant);
        let spec = LeaseSpec {
            holder_identity: Some(cluster.to_owned()),
            ..LeaseSpec::default()
        };
        let result = match previous {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name),
                        labels: Some(
                            [
                                (POOL_LABEL.to_owned(), class.name.clone()),
                                (TENANT_LABEL.to_owned(), tenant.as_str().to_owned()),
                            ]
                            .into_iter()
                            .collect(),
                        ),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                leases.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                lease.spec = Some(spec);
                leases.replace(&name, &PostParams::default(), &lease).await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, &[409]) => Ok(false),
            Err(e) => Err(api_error(e)),
        }
    }

    /// Clears a binding whose cluster is gone, under the Lease's `resourceVersion`.
    async fn unbind(&self, class: &PoolClass, mut lease: Lease) -> Result<(), BackendError> {
        let Some(name) = lease.metadata.name.clone() else {
            return Ok(());
        };
        lease.spec = Some(LeaseSpec::default());
        match self
            .leases(class)
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, &[404, 409]) => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }

    /// Keeps `min_warm` warm clusters in every class and returns abandoned claims while this
    /// replica holds the class's Lease; runs until `stop` fires, then hands back this gateway's
    /// unfinished claims and gives the Leases up.
    pub async fn run_replenisher(self: Arc<Self>, stop: CancellationToken) {
        let tasks: Vec<_> = self
            .classes
            .values()
            .map(|class| {
                let me = self.clone();
                let class = class.clone();
                let stop = stop.clone();
                tokio::spawn(async move { me.replenish(&class, stop).await })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        self.hand_back_claims().await;
    }

    async fn replenish(&self, class: &PoolClass, stop: CancellationToken) {
        let mut lease = LeaderLease::new(
            self.client.clone(),
            &class.namespace,
            &format!("pgwake-pool-{}", class.name),
            &self.identity,
            class.lease_duration,
        );
        let Some(refill) = self.refill.get(&class.name) else {
            return;
        };
        let mut unbound = HashMap::new();
        loop {
            match lease.try_hold().await {
                Ok(true) => {
                    if let Err(e) = self.top_up(class).await {
                        warn!(class = %class.name, error = %e, "replenishing the pool failed");
                    }
                    if let Err(e) = self.sweep_orphans(class, &mut unbound).await {
                        warn!(class = %class.name, error = %e, "looking for abandoned claims failed");
                    }
                }
                // Another replica sweeps now; its grace starts from its own first sighting.
                Ok(false) => unbound.clear(),
                Err(e) => {
                    warn!(class = %class.name, error = %e, "pool lease: the Kubernetes API failed")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = refill.notified() => {}
                _ = sleep(class.replenish_interval) => {}
            }
        }
        if let Err(e) = lease.release().await {
            warn!(class = %class.name, error = %e, "could not give the pool lease up");
        }
    }

    /// Creates clusters from the template until `min_warm` are warm.
    async fn top_up(&self, class: &PoolClass) -> Result<(), BackendError> {
        let api = self.api(class);
        let list = api
            .list(&ListParams::default().labels(&label_selector(&class.name, STATE_LABEL, WARM)))
            .await
            .map_err(api_error)?;
        let warm = live_names(list.items).len();
        for _ in warm..class.min_warm {
            let mut manifest = class.template.clone();
            let meta = &mut manifest["metadata"];
            meta["generateName"] = format!("{}-", class.name).into();
            meta["namespace"] = class.namespace.clone().into();
            if !meta["labels"].is_object() {
                meta["labels"] = json!({});
            }
            meta["labels"][POOL_LABEL] = class.name.clone().into();
            meta["labels"][STATE_LABEL] = WARM.into();
            let obj: DynamicObject = serde_json::from_value(manifest)
                .map_err(|e| BackendError::StartFailed(format!("pool template: {e}")))?;
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            let created = api.create(&params, &obj).await.map_err(api_error)?;
            info!(class = %class.name, cluster = ?created.metadata.name, warm, min_warm = class.min_warm,
                "created warm pool cluster");
        }
        Ok(())
    }
}

#[async_trait]
impl ComputeBackend for PoolBackend {
    fn kind(&self) -> &'static str {
        "pool"
    }

    async fn wake(&self, tenant: &TenantId) -> Result<Endpoint, BackendError> {
        let deadline = Instant::now() + self.settings.start_timeout;
        let class = self.class_of(tenant)?;
        let api = self.api(class);
        let binding = binding_name(&class.name, tenant);
        for _ in 0..CLAIM_ROUNDS {
            let lease = self
                .leases(class)
                .get_opt(&binding)
                .await
                .map_err(api_error)?;
            // `current`: the object's status is as read, not from before a patch.
            let (name, obj, current) = match lease.as_ref().and_then(bound_to) {
                Some(name) => {
                    let name = name.to_owned();
                    let obj = api.get_opt(&name).await.map_err(api_error)?;
                    let Some(obj) = obj.filter(|o| {
                        o.metadata.deletion_timestamp.is_none()
                            && o.labels().get(TENANT_LABEL).map(String::as_str)
                                == Some(tenant.as_str())
                    }) else {
                        info!(tenant = %tenant, class = %class.name, cluster = %name, "bound cluster is gone; binding anew");
                        if let Some(l) = lease {
                            self.unbind(class, l).await?;
                        }
                        continue;
                    };
                    if hibernation_requested(&obj) {
                        let obj = set_hibernation(&api, &name, "off").await?;
                        info!(tenant = %tenant, class = %class.name, cluster = %name, hibernation = "off", "patched cluster");
                        (name, obj, false)
                    } else {
                        (name, obj, true)
                    }
                }
                None => {
                    let obj = self.claim(&api, class, tenant).await?;
                    let name = obj.name_any();
                    self.claims()
                        .insert(name.clone(), (class.name.clone(), tenant.clone()));
                    let settled = self.settle_claim(&api, class, tenant, lease, obj).await;
                    self.claims().remove(&name);
                    let Some(obj) = settled? else { continue };
                    info!(tenant = %tenant, class = %class.name, cluster = %name, "claimed pool cluster");
                    (name, obj, true)
                }
            };
            let (service, direct) = endpoint_of(&obj, &class.namespace)?;
            let via_service = async {
                // A warm cluster is normally running already: no watch needed then.
                if !(current && cluster_awake(&obj)) {
                    wait_awake(api.clone(), &name, &self.settings, deadline).await?;
                }
                probe_until_ready(&service, &self.settings, deadline).await?;
                Ok(service.clone())
            };
            let endpoint = self
                .routes
                .reach(
                    tenant,
                    &obj,
                    direct.then_some(&service),
                    &self.settings,
                    deadline,
                    via_service,
                )
                .await?;
            self.bound
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(tenant.clone(), name);
            return Ok(endpoint);
        }
        Err(BackendError::StartFailed(format!(
            "the binding of tenant {tenant} kept changing under this gateway"
        )))
    }

    async fn sleep(&self, tenant: &TenantId) -> Result<(), BackendError> {
        let class = self.class_of(tenant)?;
        let api = self.api(class);
        self.routes.forget(tenant);
        let lease = self
            .leases(class)
            .get_opt(&binding_name(&class.name, tenant))
            .await
            .map_err(api_error)?;
        let bound = lease.as_ref().and_then(bound_to).map(str::to_owned);
        match class.release {
            Release::Hibernate => {
                if let Some(name) = bound {
                    set_hibernation(&api, &name, "on").await?;
                    info!(tenant = %tenant, class = %class.name, cluster = %name, hibernation = "on", "patched cluster");
                }
            }
            Release::Delete => {
                let mut doomed = self.labelled_clusters(&api, class, tenant).await?;
                doomed.extend(bound.filter(|b| !doomed.contains(b)));
                for name in doomed {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if is_status(&e, &[404]) => {}
                        Err(e) => return Err(api_error(e)),
                    }
                    info!(tenant = %tenant, class = %class.name, cluster = %name, "deleted pool cluster");
                }
                if let Some(l) = lease {
                    self.unbind(class, l).await?;
                }
                self.bound
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(tenant);
                self.wake_replenisher(class);
            }
        }
        Ok(())
    }

    async fn state(&self, tenant: &TenantId) -> Result<ComputeState, BackendError> {
        let class = self.class_of(tenant)?;
        let api = self.api(class);
        let cached = self
            .bound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .cloned();
        let name = match cached {
            Some(n) => n,
            None => {
                let lease = self
                    .leases(class)
                    .get_opt(&binding_name(&class.name, tenant))
                    .await
                    .map_err(api_error)?;
                match lease.as_ref().and_then(bound_to) {
                    Some(n) => n.to_owned(),
                    None => return Ok(ComputeState::Asleep),
                }
            }
        };
        let Some(obj) = api.get_opt(&name).await.map_err(api_error)? else {
            return Ok(ComputeState::Asleep);
        };
        let still_bound = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(TENANT_LABEL))
            .is_some_and(|t| t == tenant.as_str());
        if !still_bound || obj.metadata.deletion_timestamp.is_some() || hibernation_requested(&obj)
        {
            return Ok(ComputeState::Asleep);
        }
        self.routes.state(tenant, &obj).await
    }

    fn activity_namespace(&self, tenant: &TenantId) -> Option<String> {
        self.class_of(tenant).ok().map(|c| c.namespace.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warm_cluster(name: &str, ready: i64) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "postgresql.cnpg.io/v1",
            "kind": "Cluster",
            "metadata": { "name": name },
            "status": { "readyInstances": ready }
        }))
        .unwrap()
    }

    #[test]
    fn running_warm_clusters_are_claimed_before_starting_ones() {
        let items = || {
            vec![
                warm_cluster("small-a", 0),
                warm_cluster("small-b", 1),
                warm_cluster("small-c", 0),
                warm_cluster("small-d", 1),
            ]
        };
        for tenant in ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"] {
            let order = claim_order(items(), &TenantId::parse(tenant).unwrap());
            assert_eq!(order.len(), 4, "{order:?}");
            let (running, starting) = order.split_at(2);
            assert!(
                running.iter().all(|n| n == "small-b" || n == "small-d"),
                "{order:?}"
            );
            assert!(
                starting.iter().all(|n| n == "small-a" || n == "small-c"),
                "{order:?}"
            );
        }
    }

    #[test]
    fn templates_are_checked_and_stripped() {
        let t = cluster_template(json!({
            "metadata": { "name": "x", "resourceVersion": "7", "labels": { "team": "a" } },
            "spec": { "instances": 1 },
            "status": { "readyInstances": 1 }
        }))
        .unwrap();
        assert_eq!(t["kind"], "Cluster");
        assert_eq!(t["apiVersion"], "postgresql.cnpg.io/v1");
        assert!(t["metadata"].get("name").is_none());
        assert!(t["metadata"].get("resourceVersion").is_none());
        assert_eq!(t["metadata"]["labels"]["team"], "a");
        assert!(t.get("status").is_none());
        let err = cluster_template(json!({ "kind": "Pod", "spec": {} })).unwrap_err();
        assert!(err.to_string().contains("Cluster"), "{err}");
        assert!(cluster_template(json!({ "metadata": {} })).is_err());
        assert!(cluster_template(json!("text")).is_err());
    }

    #[test]
    fn binding_names_are_dns_safe_and_stable() {
        let t = |s: &str| TenantId::parse(s).unwrap();
        assert_eq!(
            binding_name("small", &t("acme-1")),
            "pgwake-bind-small-acme-1"
        );
        let odd = binding_name("small", &t("Acme_1"));
        assert_eq!(odd, binding_name("small", &t("Acme_1")));
        assert_ne!(odd, binding_name("small", &t("acme_1")));
        assert_eq!(odd.len(), "pgwake-bind-small-".len() + 16);
    }

    #[test]
    fn endpoint_annotation_overrides_the_service() {
        let mut obj = DynamicObject::new("small-abc", &cluster_resource());
        assert_eq!(
            endpoint_of(&obj, "pool").unwrap().0.to_string(),
            "small-abc-rw.pool.svc:5432"
        );
        assert!(endpoint_of(&obj, "pool").unwrap().1, "the -rw Service");
        obj.metadata.annotations = Some(
            [(ENDPOINT_ANNOTATION.to_owned(), "127.0.0.9:6000".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(
            endpoint_of(&obj, "pool").unwrap().0.to_string(),
            "127.0.0.9:6000"
        );
        assert!(!endpoint_of(&obj, "pool").unwrap().1, "a named endpoint");
        obj.metadata.annotations = Some(
            [(ENDPOINT_ANNOTATION.to_owned(), "nowhere".to_owned())]
                .into_iter()
                .collect(),
        );
        assert!(endpoint_of(&obj, "pool").is_err());
    }
}
