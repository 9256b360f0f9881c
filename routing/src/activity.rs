//! Shared activity: which gateway replicas are using a tenant, recorded through the Kubernetes
//! API, so that a tenant sleeps only when no live replica has active sessions for it and only
//! one replica at a time puts it to sleep.
//!
//! The record is the Lease `pgwake-activity-<tenant>` in the namespace of the tenant's cluster
//! (where the gateway's Role is bound anyway). Its annotations hold:
//! - `pgwake.io/holders`: a JSON map from replica identity to an expiry time (milliseconds since
//!   the Unix epoch). A replica is listed while it has active sessions for the tenant, or had
//!   them less than the tenant's idle timeout ago, and renews its entry every third of the TTL.
//!   An entry past its expiry (a replica that was killed) no longer counts and is dropped by the
//!   next write.
//! - `pgwake.io/sleeping`: `{"by": identity, "until": ms}` while a replica puts the tenant to
//!   sleep; a replica that wants the tenant waits until it is gone (or expired).
//! - `pgwake.io/sleeps`: how many sleeps have begun. A replica that remembers a smaller number
//!   knows the tenant was put to sleep since it last saw it awake.
//! - `pgwake.io/runs`: the starts of the tenant's last runs as the replicas saw them (a JSON
//!   array of seconds since the Unix epoch, oldest first), so that every replica predicts from
//!   the same history ([`crate::predict`]), a new one included. Each write of a replica's
//!   entry merges in the runs it saw.
//!
//! Every write is a create or a replace carrying the `resourceVersion` that was read, so a
//! replica announcing itself and another starting a sleep cannot both succeed: the loser gets
//! 409, reads again and decides again. Expiry times are compared with the reader's wall clock,
//! so replicas' clocks must agree to well within the TTL (as NTP keeps them).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::time::{Instant, sleep, timeout};

use crate::TenantId;
use crate::predict::RunHistory;

const HOLDERS: &str = "pgwake.io/holders";
const SLEEPING: &str = "pgwake.io/sleeping";
const SLEEPS: &str = "pgwake.io/sleeps";
const RUNS: &str = "pgwake.io/runs";
/// Reads and writes one operation makes when other replicas keep writing the record between
/// its read and its write, before it gives up (the caller tries again later).
const WRITE_ROUNDS: usize = 10;
/// How often a replica waiting for another's sleep to finish reads the record again: sleeps take
/// seconds (the operator stops the pods), so this adds little to the wait.
const SLEEP_POLL: Duration = Duration::from_millis(100);

/// How long entries last and how long a sleep may keep others waiting.
#[derive(Clone, Debug)]
pub struct ActivitySettings {
    /// How long a replica's entry counts after its last renewal (renewed every third of it).
    pub ttl: Duration,
    /// How long a sleep may take; a sleeping mark older than this plus the TTL is ignored (the
    /// replica putting the tenant to sleep died).
    pub sleep_timeout: Duration,
}

/// Why the record could not be read or written.
#[derive(Debug, Error)]
pub enum ActivityError {
    /// The Kubernetes API refused or could not be reached in time.
    #[error("kubernetes API: {0}")]
    Api(String),
    /// Other replicas kept writing the record between this one's reads and writes.
    #[error("the activity record kept changing; try again")]
    Contended,
    /// Another replica is putting the tenant to sleep (and did not finish in the time given).
    #[error("another replica is putting the tenant to sleep")]
    SleepUnderWay,
}

/// What a replica learns when it writes its entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The record's sleep count.
    pub sleeps: u64,
    /// The tenant's run starts as the record now holds them, this replica's merged in.
    pub runs: Vec<u64>,
}

/// What a replica that has no use for a tenant any more learns when it takes its entry out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// No live replica uses the tenant: this replica has marked it as going to sleep and must
    /// put it to sleep, then call [`SharedActivity::sleep_done`]. `sleeps` is the new count.
    Sleep {
        /// The record's sleep count, this sleep included.
        sleeps: u64,
    },
    /// Another replica uses the tenant or is putting it to sleep; ask again after `recheck_in`
    /// (when the earliest of their entries expires unless renewed).
    Held {
        /// When the record is worth reading again.
        recheck_in: Duration,
    },
    /// Another replica put the tenant to sleep since this one last saw it awake.
    Slept,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct SleepMark {
    by: String,
    until: u64,
}

/// The record as read from (and written back to) the Lease's annotations.
#[derive(Debug, Default)]
struct Record {
    holders: BTreeMap<String, u64>,
    sleeping: Option<SleepMark>,
    sleeps: u64,
    runs: Vec<u64>,
}

impl Record {
    /// Reads the annotations; a value that does not parse (edited by hand) counts as absent.
    fn read(meta: &ObjectMeta) -> Record {
        let get = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key));
        Record {
            holders: get(HOLDERS)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default(),
            sleeping: get(SLEEPING).and_then(|v| serde_json::from_str(v).ok()),
            sleeps: get(SLEEPS).and_then(|v| v.parse().ok()).unwrap_or(0),
            runs: get(RUNS)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default(),
        }
    }

    fn write(&self, meta: &mut ObjectMeta) {
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(
            HOLDERS.into(),
            serde_json::to_string(&self.holders).unwrap_or_default(),
        );
        match &self.sleeping {
            Some(mark) => {
                annotations.insert(
                    SLEEPING.into(),
                    serde_json::to_string(mark).unwrap_or_default(),
                );
            }
            None => {
                annotations.remove(SLEEPING);
            }
        }
        annotations.insert(SLEEPS.into(), self.sleeps.to_string());
        if !self.runs.is_empty() {
            annotations.insert(
                RUNS.into(),
                serde_json::to_string(&self.runs).unwrap_or_default(),
            );
        }
    }

    /// Drops expired entries and an expired sleeping mark.
    fn prune(&mut self, now: u64) {
        self.holders.retain(|_, until| *until > now);
        if self.sleeping.as_ref().is_some_and(|s| s.until <= now) {
            self.sleeping = None;
        }
    }
}

/// What an operation on the record decided: write the changed record, or leave it as read.
enum Step<T> {
    Write(T),
    Keep(T),
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// Name of a tenant's activity Lease. Tenant ids that are not already DNS-safe (upper case,
/// `_`, a trailing `-`) are replaced by a stable hash.
pub fn record_name(tenant: &TenantId) -> String {
    let id = tenant.as_str();
    let safe = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.ends_with('-');
    if safe {
        format!("pgwake-activity-{id}")
    } else {
        // FNV-1a: stable across builds, unlike std's hasher.
        let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("pgwake-activity-{hash:016x}")
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// This replica's side of the shared activity records of Kubernetes-backed tenants.
pub struct SharedActivity {
    client: kube::Client,
    identity: String,
    settings: ActivitySettings,
}

impl SharedActivity {
    /// Records for replica `identity` (unique per process) through `client`.
    pub fn new(client: kube::Client, identity: String, settings: ActivitySettings) -> Self {
        SharedActivity {
            client,
            identity,
            settings,
        }
    }

    /// How long an entry counts after its last renewal.
    pub fn ttl(&self) -> Duration {
        self.settings.ttl
    }

    /// Each API call is bounded by this, so an unreachable API server delays nothing by more.
    fn call_timeout(&self) -> Duration {
        self.settings.ttl / 3
    }

    /// Runs one API call, bounded by [`Self::call_timeout`].
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, ActivityError> {
        timeout(self.call_timeout(), call)
            .await
            .map_err(|_| ActivityError::Api(format!("no answer within {:?}", self.call_timeout())))
    }

    /// Reads the tenant's record, lets `decide` change it, and writes it back with the
    /// `resourceVersion` read (creating it when absent); reads and decides again on a conflict.
    async fn update<T>(
        &self,
        namespace: &str,
        tenant: &TenantId,
        mut decide: impl FnMut(&mut Record, u64) -> Step<T>,
    ) -> Result<T, ActivityError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let name = record_name(tenant);
        for _ in 0..WRITE_ROUNDS {
            let read = self
                .bounded(api.get_opt(&name))
                .await?
                .map_err(|e| ActivityError::Api(e.to_string()))?;
            let now = now_ms();
            let written = match read {
                None => {
                    let mut record = Record::default();
                    let out = match decide(&mut record, now) {
                        Step::Keep(out) => return Ok(out),
                        Step::Write(out) => out,
                    };
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            labels: Some(BTreeMap::from([(
                                "app.kubernetes.io/managed-by".to_owned(),
                                "pgwake".to_owned(),
                            )])),
                            ..ObjectMeta::default()
                        },
                        spec: None,
                    };
                    record.write(&mut lease.metadata);
                    let params = PostParams::default();
                    let created = self.bounded(api.create(&params, &lease)).await?;
                    created.map(|_| out)
                }
                Some(mut lease) => {
                    let mut record = Record::read(&lease.metadata);
                    let out = match decide(&mut record, now) {
                        Step::Keep(out) => return Ok(out),
                        Step::Write(out) => out,
                    };
                    record.write(&mut lease.metadata);
                    let params = PostParams::default();
                    let replaced = self.bounded(api.replace(&name, &params, &lease)).await?;
                    replaced.map(|_| out)
                }
            };
            match written {
                Ok(out) => return Ok(out),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(ActivityError::Api(e.to_string())),
            }
        }
        Err(ActivityError::Contended)
    }

    /// Writes or renews this replica's entry for the tenant, merging in the run starts `runs`
    /// (starts less than `run_gap` seconds apart are one run), and returns what the record holds.
    /// While another replica puts the tenant to sleep it waits for that to finish until
    /// `wait_until` (without one, or past it: [`ActivityError::SleepUnderWay`]).
    pub async fn hold(
        &self,
        namespace: &str,
        tenant: &TenantId,
        wait_until: Option<Instant>,
        runs: &[u64],
        run_gap: u64,
    ) -> Result<Holding, ActivityError> {
        let ttl = ms(self.settings.ttl);
        loop {
            let held = self
                .update(namespace, tenant, |record, now| {
                    record.prune(now);
                    if record.sleeping.is_some() {
                        return Step::Keep(None);
                    }
                    record.holders.insert(self.identity.clone(), now + ttl);
                    let mut history = RunHistory::from_starts(&record.runs);
                    history.merge(runs, run_gap);
                    record.runs = history.starts().to_vec();
                    Step::Write(Some(Holding {
                        sleeps: record.sleeps,
                        runs: record.runs.clone(),
                    }))
                })
                .await?;
            match held {
                Some(holding) => return Ok(holding),
                None if wait_until.is_some_and(|t| Instant::now() + SLEEP_POLL < t) => {
                    sleep(SLEEP_POLL).await
                }
                None => return Err(ActivityError::SleepUnderWay),
            }
        }
    }

    /// Takes this replica's entry out and, when no other live replica holds the tenant and
    /// nobody put it to sleep since this replica saw the sleep count `seen`, marks it as going
    /// to sleep by this replica.
    pub async fn release(
        &self,
        namespace: &str,
        tenant: &TenantId,
        seen: Option<u64>,
    ) -> Result<Release, ActivityError> {
        let budget = ms(self.settings.sleep_timeout + self.settings.ttl);
        self.update(namespace, tenant, |record, now| {
            record.prune(now);
            let was_listed = record.holders.remove(&self.identity).is_some();
            let step = |out| match was_listed {
                true => Step::Write(out),
                false => Step::Keep(out),
            };
            let until = record
                .holders
                .values()
                .chain(record.sleeping.as_ref().map(|s| &s.until))
                .min();
            if let Some(until) = until {
                return step(Release::Held {
                    recheck_in: Duration::from_millis(until.saturating_sub(now)),
                });
            }
            if seen.is_some_and(|s| s != record.sleeps) {
                return step(Release::Slept);
            }
            record.sleeps += 1;
            record.sleeping = Some(SleepMark {
                by: self.identity.clone(),
                until: now + budget,
            });
            Step::Write(Release::Sleep {
                sleeps: record.sleeps,
            })
        })
        .await
    }

    /// The tenant's record as it stands (an empty one when there is none).
    async fn read(&self, namespace: &str, tenant: &TenantId) -> Result<Record, ActivityError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let read = self
            .bounded(api.get_opt(&record_name(tenant)))
            .await?
            .map_err(|e| ActivityError::Api(e.to_string()))?;
        Ok(read.map_or_else(Record::default, |lease| Record::read(&lease.metadata)))
    }

    /// The tenant's run starts as the record holds them (none without a record).
    pub async fn runs(
        &self,
        namespace: &str,
        tenant: &TenantId,
    ) -> Result<Vec<u64>, ActivityError> {
        Ok(self.read(namespace, tenant).await?.runs)
    }

    /// How many sleeps of the tenant have begun, as the record holds it (0 without a record).
    pub async fn sleeps(&self, namespace: &str, tenant: &TenantId) -> Result<u64, ActivityError> {
        Ok(self.read(namespace, tenant).await?.sleeps)
    }

    /// Takes this replica's sleeping mark out once the tenant is asleep.
    pub async fn sleep_done(
        &self,
        namespace: &str,
        tenant: &TenantId,
    ) -> Result<(), ActivityError> {
        self.update(namespace, tenant, |record, _| {
            if record
                .sleeping
                .as_ref()
                .is_some_and(|s| s.by == self.identity)
            {
                record.sleeping = None;
                Step::Write(())
            } else {
                Step::Keep(())
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_expired_entries_are_pruned() {
        let mut record = Record::default();
        record.holders.insert("a".into(), 100);
        record.holders.insert("b".into(), 300);
        record.sleeping = Some(SleepMark {
            by: "a".into(),
            until: 150,
        });
        record.sleeps = 7;
        record.runs = vec![1000, 1900, 2800];
        let mut meta = ObjectMeta::default();
        record.write(&mut meta);
        let mut read = Record::read(&meta);
        assert_eq!(read.holders, record.holders);
        assert_eq!(read.runs, record.runs);
        assert_eq!((read.sleeping.clone(), read.sleeps), (record.sleeping, 7));
        read.prune(200);
        assert_eq!(read.holders.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(read.sleeping, None);
        read.write(&mut meta);
        assert!(!meta.annotations.unwrap().contains_key(SLEEPING));
    }

    #[test]
    fn hand_edited_values_count_as_absent() {
        let meta = ObjectMeta {
            annotations: Some(BTreeMap::from([
                (HOLDERS.to_owned(), "not json".to_owned()),
                (SLEEPS.to_owned(), "-1".to_owned()),
                (RUNS.to_owned(), "[1, \"two\"]".to_owned()),
            ])),
            ..ObjectMeta::default()
        };
        let record = Record::read(&meta);
        assert!(record.holders.is_empty() && record.sleeping.is_none() && record.sleeps == 0);
        assert!(record.runs.is_empty());
    }

    #[test]
    fn record_names_are_dns_safe() {
        let name = |s: &str| record_name(&TenantId::parse(s).unwrap());
        assert_eq!(name("orders-2"), "pgwake-activity-orders-2");
        for odd in ["Orders", "a_b", "trailing-"] {
            let n = name(odd);
            assert!(n.starts_with("pgwake-activity-") && n.len() == 32, "{n}");
        }
        assert_ne!(name("Orders"), name("orders_"));
    }
}
