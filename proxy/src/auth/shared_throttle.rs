//! The fleet-wide half of the failed-login throttle: failures counted on Kubernetes Leases that
//! every replica reads, so a client that spreads its guesses over replicas is blocked as if it
//! used one.
//!
//! Each count ((client source, tenant) and (tenant, user)) is one Lease, `pgwake-throttle-<hash>`,
//! labelled `pgwake.io/throttle`. Its annotation `pgwake.io/failures` maps who failed to how
//! often (users under an address count, addresses under an account count), so a success takes
//! back only its own failures as in the local throttle; `renewTime` is the last failure. Writes
//! replace the Lease under the `resourceVersion` read, so replicas failing at once each add
//! their failure (the loser of a race reads again). Every replica keeps a watched copy of the
//! Leases: checking a login is a lookup in memory, and only failures (and a success after
//! failures) write.
//!
//! A block is computed from the count and the last failure's time as locally (free failures,
//! then `base` doubling up to `max`), on wall clocks: replicas' clocks must agree to well
//! within `base`. When the API is unreachable, failures are not recorded (after
//! `write_timeout`) and the copy keeps what it last saw: each replica still throttles on its
//! own counts, so the allowance is then at most `free_failures` per replica.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use pgwake_routing::TenantId;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::ThrottleSettings;

/// Label on every throttle Lease (its value says which count: `address` or `account`).
pub const THROTTLE_LABEL: &str = "pgwake.io/throttle";
/// Annotation holding the failures of one count, as a JSON object of counts by who failed.
const FAILURES_ANNOTATION: &str = "pgwake.io/failures";
/// Annotation naming the count in full (Lease names hold only its hash).
const KEY_ANNOTATION: &str = "pgwake.io/throttle-key";
/// Read-modify-write rounds one failure makes when other replicas keep writing the same count.
const WRITE_ROUNDS: usize = 4;

/// Where the shared counts live and how long recording may hold a login up.
#[derive(Clone, Debug)]
pub struct SharedSettings {
    /// Namespace of the throttle Leases.
    pub namespace: String,
    /// Longest wait for the API when recording an outcome.
    pub write_timeout: Duration,
    /// This replica's name, written as the Leases' holder (for people reading them).
    pub identity: String,
}

/// One shared count and the part of it one attempter owns.
struct Count {
    kind: &'static str,
    key: String,
    who: String,
}

impl Count {
    fn address(ip: IpAddr, tenant: &TenantId, user: &str) -> Count {
        Count {
            kind: "address",
            key: format!("address {ip} {tenant}"),
            who: user.to_owned(),
        }
    }

    fn account(ip: IpAddr, tenant: &TenantId, user: &str) -> Count {
        Count {
            kind: "account",
            key: format!("account {tenant} {user}"),
            who: ip.to_string(),
        }
    }

    fn both(ip: IpAddr, tenant: &TenantId, user: &str) -> [Count; 2] {
        [
            Count::address(ip, tenant, user),
            Count::account(ip, tenant, user),
        ]
    }

    /// The Lease's name: FNV-1a of the key (stable across builds), so any IP, tenant or user
    /// name makes a valid object name.
    fn lease_name(&self) -> String {
        let hash = self.key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("pgwake-throttle-{hash:016x}")
    }
}

/// What a throttle Lease records.
struct Record {
    failures: BTreeMap<String, u32>,
    last: Option<Timestamp>,
}

impl Record {
    /// The record in `lease` if it belongs to `count` (a hash collision otherwise reads empty).
    fn of(lease: &Lease, count: &Count) -> Record {
        let annotations = lease.metadata.annotations.as_ref();
        let mine = annotations
            .and_then(|a| a.get(KEY_ANNOTATION))
            .is_some_and(|k| *k == count.key);
        let failures = annotations
            .and_then(|a| a.get(FAILURES_ANNOTATION))
            .filter(|_| mine)
            .and_then(|f| serde_json::from_str(f).ok())
            .unwrap_or_default();
        let last = lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0);
        Record { failures, last }
    }

    fn total(&self) -> u32 {
        self.failures
            .values()
            .fold(0u32, |sum, n| sum.saturating_add(*n))
    }
}

/// Failure counts shared by every replica through Leases.
pub struct SharedThrottle {
    api: Api<Lease>,
    store: Store<Lease>,
    throttle: ThrottleSettings,
    settings: SharedSettings,
}

impl SharedThrottle {
    /// Starts watching the throttle Leases of `settings.namespace` until `stop` fires, and
    /// sweeping away records that cannot matter any more.
    pub fn start(
        client: kube::Client,
        throttle: ThrottleSettings,
        settings: SharedSettings,
        stop: CancellationToken,
    ) -> std::sync::Arc<SharedThrottle> {
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let config = watcher::Config::default().labels(THROTTLE_LABEL);
        let ns = settings.namespace.clone();
        let store = super::watched_store(api.clone(), config, "throttle leases", ns, stop.clone());
        let shared = std::sync::Arc::new(SharedThrottle {
            api,
            store,
            throttle,
            settings,
        });
        tokio::spawn(shared.clone().run_sweeper(stop));
        shared
    }

    /// Records older than this are forgotten, as the local throttle forgets idle entries.
    fn forget_after(&self) -> Duration {
        self.throttle.max * 4
    }

    /// How long the count's record still blocks attempts, if at all.
    fn wait(&self, record: &Record, now: Timestamp) -> Option<Duration> {
        let s = &self.throttle;
        let total = record.total();
        if total == 0 || total < s.free_failures {
            return None;
        }
        let doublings = (total - s.free_failures).min(20);
        let block = (s.base * 2u32.pow(doublings)).min(s.max);
        let until = record.last? + SignedDuration::try_from(block).ok()?;
        let left = until.duration_since(now);
        Duration::try_from(left).ok().filter(|d| !d.is_zero())
    }

    fn cached(&self, count: &Count) -> Option<Lease> {
        self.store
            .get(&ObjectRef::new(&count.lease_name()).within(&self.settings.namespace))
            .map(|l| (*l).clone())
    }

    /// How long attempts from source `ip` for `user` of `tenant` must wait by the fleet's
    /// counts, from the watched copy (no API call). The account's count holds back only the
    /// sources that failed against it, so guesses elsewhere never lock the user out.
    pub fn blocked_for(&self, ip: IpAddr, tenant: &TenantId, user: &str) -> Option<Duration> {
        let now = Timestamp::now();
        Count::both(ip, tenant, user)
            .iter()
            .filter_map(|c| {
                let record = Record::of(&self.cached(c)?, c);
                let applies = c.kind == "address" || record.failures.contains_key(&c.who);
                self.wait(&record, now).filter(|_| applies)
            })
            .max()
    }

    /// Records an evaluated attempt's outcome for the fleet: a failure adds one to both counts;
    /// a success takes back this attempter's failures where there are any. Gives up after
    /// `write_timeout` (the local throttle still counts).
    pub async fn record(&self, ip: IpAddr, tenant: &TenantId, user: &str, failed: bool) {
        for count in Count::both(ip, tenant, user) {
            if !failed
                && self
                    .cached(&count)
                    .is_none_or(|l| !Record::of(&l, &count).failures.contains_key(&count.who))
            {
                continue;
            }
            let write = self.write(&count, failed);
            match tokio::time::timeout(self.settings.write_timeout, write).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(count = count.kind, tenant = %tenant, error = %e,
                        "could not record a login outcome for the fleet; this replica's own count still applies")
                }
                Err(_) => {
                    warn!(count = count.kind, tenant = %tenant, timeout = ?self.settings.write_timeout,
                        "the Kubernetes API did not record a login outcome in time; this replica's own count still applies")
                }
            }
        }
    }

    /// One count's read-modify-write, under the `resourceVersion` read (the watched copy first,
    /// then a fresh read after a conflict).
    async fn write(&self, count: &Count, failed: bool) -> Result<(), kube::Error> {
        let name = count.lease_name();
        let mut current = self.cached(count);
        for round in 0..WRITE_ROUNDS {
            if round > 0 {
                current = self.api.get_opt(&name).await?;
            }
            let now = Timestamp::now();
            let mut record = current
                .as_ref()
                .map(|l| Record::of(l, count))
                .unwrap_or(Record {
                    failures: BTreeMap::new(),
                    last: None,
                });
            let stale = record.last.is_none_or(|t| {
                Duration::try_from(now.duration_since(t)).is_ok_and(|d| d > self.forget_after())
            });
            if stale {
                record.failures.clear();
            }
            if failed {
                let mine = record.failures.entry(count.who.clone()).or_insert(0);
                *mine = mine.saturating_add(1);
                record.last = Some(now);
            } else if record.failures.remove(&count.who).is_none() {
                return Ok(());
            }
            let lease = self.lease(count, current.clone(), &record);
            let result = match &current {
                None => self.api.create(&PostParams::default(), &lease).await,
                Some(_) => {
                    self.api
                        .replace(&name, &PostParams::default(), &lease)
                        .await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    debug!(
                        count = count.kind,
                        "throttle lease changed under this write; reading again"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        warn!(
            count = count.kind,
            "throttle lease kept changing; one outcome not recorded"
        );
        Ok(())
    }

    /// The Lease holding `record` for `count`, based on `previous` (its `resourceVersion`
    /// makes the write conditional).
    fn lease(&self, count: &Count, previous: Option<Lease>, record: &Record) -> Lease {
        let mut lease = previous.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(count.lease_name()),
                labels: Some([(THROTTLE_LABEL.to_owned(), count.kind.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(KEY_ANNOTATION.to_owned(), count.key.clone());
        annotations.insert(
            FAILURES_ANNOTATION.to_owned(),
            serde_json::to_string(&record.failures).unwrap_or_else(|_| "{}".into()),
        );
        lease.metadata.managed_fields = None;
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(
                self.forget_after().as_secs().clamp(1, i32::MAX as u64) as i32
            ),
            renew_time: record.last.map(MicroTime),
            ..LeaseSpec::default()
        });
        lease
    }

    /// Deletes records whose last failure is older than [`SharedThrottle::forget_after`], each
    /// under the `resourceVersion` seen (a failure recorded meanwhile keeps it). Every replica
    /// sweeps; losing a race to another is harmless.
    async fn run_sweeper(self: std::sync::Arc<Self>, stop: CancellationToken) {
        let every = self.throttle.max.max(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let now = Timestamp::now();
            for lease in self.store.state() {
                let old = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .is_none_or(|t| {
                        Duration::try_from(now.duration_since(t.0))
                            .is_ok_and(|d| d > self.forget_after())
                    });
                let (Some(name), Some(version)) = (
                    lease.metadata.name.as_deref(),
                    lease.metadata.resource_version.clone(),
                ) else {
                    continue;
                };
                if !old {
                    continue;
                }
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: Some(version),
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                match self.api.delete(name, &params).await {
                    Ok(_) => debug!(lease = name, "forgot an old throttle record"),
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => {
                        warn!(error = %e, "could not delete an old throttle record");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_and_distinct_per_count() {
        let t = TenantId::parse("Acme_1").unwrap();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let [a, b] = Count::both(ip, &t, "app");
        assert_ne!(a.lease_name(), b.lease_name());
        assert_eq!(a.lease_name(), Count::address(ip, &t, "other").lease_name());
        assert_eq!(a.lease_name().len(), "pgwake-throttle-".len() + 16);
        assert!(
            a.lease_name()
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
    }

    #[test]
    fn a_record_of_another_key_reads_empty() {
        let t = TenantId::parse("a").unwrap();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let count = Count::address(ip, &t, "app");
        let mut lease = Lease::default();
        lease.metadata.annotations = Some(
            [
                (KEY_ANNOTATION.to_owned(), "address 10.0.0.2 a".to_owned()),
                (FAILURES_ANNOTATION.to_owned(), r#"{"app":5}"#.to_owned()),
            ]
            .into(),
        );
        assert_eq!(Record::of(&lease, &count).total(), 0);
        lease
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(KEY_ANNOTATION.to_owned(), count.key.clone());
        assert_eq!(Record::of(&lease, &count).total(), 5);
    }
}
