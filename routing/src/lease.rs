//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several gateway replicas only
//! one does a job at a time (the pool replenisher).
//!
//! Every write is a replace carrying the `resourceVersion` that was read, so two replicas that
//! race for the Lease cannot both win (the second gets 409). A Lease held by someone else is
//! taken over only after its record has stayed unchanged for its duration as measured by this
//! process's own monotonic clock, as client-go does: no comparison of wall clocks between
//! machines is needed.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;
use tracing::info;

/// One replica's claim on a named Lease.
pub struct LeaderLease {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The other holder's record as last seen, and when it was first seen like that.
    observed: Option<(String, Instant)>,
    /// When this replica last wrote the Lease as its holder.
    renewed_at: Option<Instant>,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderLease {
    /// A claim on Lease `namespace/name` for `identity` (unique per replica), held for
    /// `duration` after each renewal.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        LeaderLease {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            observed: None,
            renewed_at: None,
        }
    }

    fn spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let renewing = previous.is_some_and(|p| p.holder_identity.as_ref() == Some(&self.identity));
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().clamp(1, i32::MAX as u64) as i32),
            acquire_time: if renewing {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(
                previous
                    .and_then(|p| p.lease_transitions)
                    .unwrap_or(0)
                    .saturating_add(i32::from(!renewing && previous.is_some())),
            ),
            ..LeaseSpec::default()
        }
    }

    /// Acquires or renews the Lease if possible; true while this replica is the leader.
    /// Renewals are written once a third of the duration has passed since the last one.
    pub async fn try_hold(&mut self) -> Result<bool, kube::Error> {
        let now = Instant::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.renewed_at = Some(now);
                    info!(lease = %self.name, identity = %self.identity, "acquired lease");
                    Ok(true)
                }
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let mine = spec.holder_identity.as_ref() == Some(&self.identity);
        if mine {
            if self
                .renewed_at
                .is_some_and(|t| now.duration_since(t) < self.duration / 3)
            {
                return Ok(true);
            }
        } else {
            self.renewed_at = None;
            let record = format!(
                "{:?} {:?}",
                spec.holder_identity,
                spec.renew_time.as_ref().map(|t| t.0)
            );
            let held_for = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or(self.duration);
            let expired = match &self.observed {
                _ if spec
                    .holder_identity
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty() =>
                {
                    true
                }
                Some((seen, since)) if *seen == record => now.duration_since(*since) >= held_for,
                _ => {
                    self.observed = Some((record, now));
                    false
                }
            };
            if !expired {
                return Ok(false);
            }
        }
        // The resourceVersion read above rides along: a concurrent writer makes this a 409.
        lease.spec = Some(self.spec(Some(&spec)));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !mine {
                    info!(lease = %self.name, identity = %self.identity, "took over lease");
                }
                self.observed = None;
                self.renewed_at = Some(now);
                Ok(true)
            }
            Err(e) if is_conflict(&e) => {
                self.renewed_at = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this replica holds it, so another can take over at once instead of
    /// waiting out the duration (on shutdown).
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        if self.renewed_at.take().is_none() {
            return Ok(());
        }
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_ref() != Some(&self.identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                info!(lease = %self.name, identity = %self.identity, "released lease");
                Ok(())
            }
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
