//! The `WakeCoordinator`: per-tenant state, exactly one wake in flight per tenant, bounded accept
//! queues with deadlines, failure back-off and idle sleep.
//!
//! A connection asks `ensure_awake`; if the tenant is awake it gets the endpoint and a claim at
//! once. Otherwise it waits (bounded per tenant and in total) while a single wake task runs; the
//! task outlives any one waiter, so a client giving up never cancels a wake others wait for.

pub mod predict;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime};

use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use thiserror::Error;
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::activity::{ActivityError, Release, SharedActivity};
use crate::{BackendError, ComputeState, Endpoint, Tenant, TenantDirectory, TenantId};

/// Finished wakes each tenant remembers for the admin API (`wakes` in its status): enough for a
/// latency sparkline, few enough to copy on every status request.
pub const WAKE_HISTORY: usize = 20;

/// Tenants asked about at once when looking for databases left awake: a gateway that starts
/// beside thousands of discovered tenants gets through them in a few rounds of API calls
/// without sending them all at once, and its idle checks are not held up for long.
const TAKE_OVER_LOOKS_AT_ONCE: usize = 16;

/// Limits and timings of the coordinator.
#[derive(Clone, Debug)]
pub struct WakeSettings {
    /// How long a connection waits for its tenant to wake.
    pub wake_timeout: Duration,
    /// Connections that may wait for one tenant.
    pub max_waiters_per_tenant: usize,
    /// Connections that may wait across all tenants.
    pub max_waiters_total: usize,
    /// Attempts one wake makes before the tenant is marked failed.
    pub attempts: u32,
    /// Pause after the first failed attempt; doubles with each further one.
    pub retry_backoff: Duration,
    /// How long a failed tenant refuses connections before the next wake is tried.
    pub failed_retry_delay: Duration,
    /// How often idle tenants are looked for.
    pub idle_check_interval: Duration,
}

/// A tenant's life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Stopped; the next connection wakes it.
    Asleep,
    /// A wake is in flight.
    Waking,
    /// Accepts connections.
    Awake,
    /// Being put to sleep; arrivals wait and then wake it again.
    Sleeping,
    /// The last wake failed; refused until the retry delay has passed.
    Failed,
}

impl Phase {
    /// Every phase, for metrics.
    pub const ALL: [Phase; 5] = [
        Phase::Asleep,
        Phase::Waking,
        Phase::Awake,
        Phase::Sleeping,
        Phase::Failed,
    ];

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Asleep => "asleep",
            Phase::Waking => "waking",
            Phase::Awake => "awake",
            Phase::Sleeping => "sleeping",
            Phase::Failed => "failed",
        }
    }
}

/// A tenant as the admin API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TenantStatus {
    /// Tenant id.
    pub id: String,
    /// Backend kind.
    pub backend: &'static str,
    /// Current phase.
    pub state: Phase,
    /// When it entered that phase, seconds since the Unix epoch.
    pub since: f64,
    /// Client connections open with a backend connection (or about to get one).
    pub connections: usize,
    /// Client sessions parked: connected, without a backend connection.
    pub parked: usize,
    /// Connections waiting for a wake.
    pub waiters: usize,
    /// How long the last successful wake took, in milliseconds.
    pub last_wake_ms: Option<f64>,
    /// When the last successful wake finished, seconds since the Unix epoch.
    pub last_wake_at: Option<f64>,
    /// The last [`WAKE_HISTORY`] finished wakes, successful or not, oldest first.
    pub wakes: Vec<WakeRecord>,
    /// Why the last wake failed, while failed.
    pub last_error: Option<String>,
    /// Seconds the database has spent waking, awake or going to sleep since the gateway
    /// started: what sleeping saves is the rest.
    pub awake_s: f64,
}

/// One finished wake of a tenant, as its status lists it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WakeRecord {
    /// When the wake finished, seconds since the Unix epoch.
    pub at: f64,
    /// How long it took, in milliseconds.
    pub ms: f64,
    /// True when the tenant woke.
    pub ok: bool,
}

/// Why a connection could not be admitted to its tenant.
#[derive(Debug, Error)]
pub enum WakeError {
    /// Not a configured tenant.
    #[error("tenant {0} is not configured")]
    UnknownTenant(TenantId),
    /// Too many connections already wait for this tenant or in total.
    #[error("too many connections waiting for tenant {tenant} (limit {limit})")]
    QueueFull {
        /// The tenant.
        tenant: TenantId,
        /// The limit that was hit.
        limit: usize,
    },
    /// The tenant did not wake within the wait deadline.
    #[error("the database did not start within {} s", .0.as_secs_f64())]
    Timeout(Duration),
    /// The wake failed (now or recently); `reason` is for logs.
    #[error("the database failed to start: {reason}")]
    Failed {
        /// What went wrong, for the log.
        reason: String,
        /// Time until the next wake may be tried.
        retry_in: Duration,
    },
    /// The tenant cannot be put to sleep while clients are connected.
    #[error("tenant has {0} open connection(s)")]
    Busy(usize),
    /// The tenant cannot be put to sleep while another gateway replica uses it.
    #[error("another gateway replica has sessions for the tenant")]
    ActiveElsewhere,
    /// The tenant is not put to sleep while the Kubernetes API cannot confirm that no other
    /// gateway replica uses it.
    #[error("cannot confirm that no other gateway replica uses the tenant: {0}")]
    Unconfirmed(String),
}

/// One finished wake, for metrics.
#[derive(Clone, Debug)]
pub struct WakeEvent {
    /// Backend kind.
    pub backend: &'static str,
    /// True when the tenant woke.
    pub ok: bool,
    /// How long the wake took.
    pub duration: Duration,
}

type OnWake = Arc<dyn Fn(&WakeEvent) + Send + Sync>;

struct Inner {
    phase: Phase,
    since: SystemTime,
    connections: usize,
    /// Connections whose session has been idle at a safe point for the idle timeout.
    idle_connections: usize,
    /// Sessions parked off this tenant's backend, each counted by its [`ParkedMark`].
    parked: usize,
    waiters: usize,
    endpoint: Option<Endpoint>,
    idle_since: Instant,
    retry_at: Option<Instant>,
    last_error: Option<String>,
    /// The last successful wake.
    last_wake: Option<WakeRecord>,
    /// Finished wakes, oldest first, at most [`WAKE_HISTORY`].
    wakes: VecDeque<WakeRecord>,
    /// Time spent running (waking, awake, sleeping) in periods that have ended.
    awake_before: Duration,
    /// Start of the running period under way, if any.
    running_since: Option<Instant>,
    /// This replica's side of the tenant's shared activity record, when it has one.
    shared: SharedState,
}

/// What a replica knows of its entry in a tenant's shared activity record
/// ([`crate::activity`]).
#[derive(Default)]
struct SharedState {
    /// When this replica last wrote its entry; `None` while it has none.
    renewed_at: Option<Instant>,
    /// When writing the entry last failed (the API is unreachable): connections do not try
    /// again for a while, and an awake tenant keeps serving meanwhile.
    failed_at: Option<Instant>,
    /// The record's sleep count when this replica last read it.
    sleeps: Option<u64>,
    /// Another replica holds the tenant: the idle sleeper reads the record again only then.
    next_look: Option<Instant>,
}

impl Inner {
    /// Time spent running so far, the period under way included.
    fn awake(&self) -> Duration {
        self.awake_before + self.running_since.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

struct Slot {
    tenant: Arc<Tenant>,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    /// Bumped to ask every idle session to leave its backend connection (before a sleep).
    park: watch::Sender<u64>,
    /// Bumped to ask every session to move to a fresh backend connection now.
    migrate: watch::Sender<u64>,
    /// Wakes the idle sleeper early, when the last session of the tenant goes idle or parks,
    /// so sleep does not wait for its next periodic look.
    sleeper: Arc<Notify>,
    /// One reader-writer of the shared activity record per tenant at a time, so the idle
    /// sleeper's release and a connection's announcement of the same replica never interleave.
    hold_lock: tokio::sync::Mutex<()>,
}

impl Slot {
    /// The state of a tenant asleep `since` then.
    fn new(tenant: Arc<Tenant>, sleeper: Arc<Notify>, since: SystemTime) -> Slot {
        Slot {
            sleeper,
            tenant,
            inner: Mutex::new(Inner {
                phase: Phase::Asleep,
                since,
                connections: 0,
                idle_connections: 0,
                parked: 0,
                waiters: 0,
                endpoint: None,
                idle_since: Instant::now(),
                retry_at: None,
                last_error: None,
                last_wake: None,
                wakes: VecDeque::with_capacity(WAKE_HISTORY),
                awake_before: Duration::ZERO,
                running_since: None,
                shared: SharedState::default(),
            }),
            hold_lock: tokio::sync::Mutex::new(()),
            changed: watch::Sender::new(0),
            park: watch::Sender::new(0),
            migrate: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_phase(&self, inner: &mut Inner, phase: Phase) {
        match phase {
            Phase::Asleep | Phase::Failed => {
                if let Some(t) = inner.running_since.take() {
                    inner.awake_before += t.elapsed();
                }
            }
            Phase::Waking | Phase::Awake | Phase::Sleeping => {
                inner.running_since.get_or_insert_with(Instant::now);
            }
        }
        inner.phase = phase;
        inner.since = SystemTime::now();
    }

    fn record_wake(inner: &mut Inner, duration: Duration, ok: bool) {
        let record = WakeRecord {
            at: epoch_seconds(SystemTime::now()),
            ms: duration.as_secs_f64() * 1000.0,
            ok,
        };
        if inner.wakes.len() == WAKE_HISTORY {
            inner.wakes.pop_front();
        }
        inner.wakes.push_back(record);
        if ok {
            inner.last_wake = Some(record);
        }
    }

    fn notify(&self) {
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }
}

fn epoch_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A wake claim: proof that a connection counts against its tenant; dropping it ends the claim
/// and starts the idle clock when it was the last one.
///
/// A session idle at a safe point marks its claim idle: when every claim of a tenant is idle,
/// the idle sleeper asks them all to park (leave their backend connections), and a claim
/// given up by a session parked for that reason does not restart the idle clock.
pub struct WakeClaim {
    slot: Arc<Slot>,
    idle: AtomicBool,
    /// Given up by a session parked because the tenant was idle.
    parked_for_sleep: bool,
}

impl WakeClaim {
    fn new(slot: Arc<Slot>) -> WakeClaim {
        WakeClaim {
            slot,
            idle: AtomicBool::new(false),
            parked_for_sleep: false,
        }
    }

    /// Marks the session idle (at a safe point for the tenant's idle timeout) or active again.
    pub fn set_idle(&self, idle: bool) {
        if self.idle.swap(idle, Ordering::AcqRel) != idle {
            let mut inner = self.slot.lock();
            if idle {
                inner.idle_connections += 1;
                if inner.idle_connections == inner.connections {
                    self.slot.sleeper.notify_one();
                }
            } else {
                inner.idle_connections = inner.idle_connections.saturating_sub(1);
            }
        }
    }

    /// The tenant's idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        self.slot.tenant.idle_timeout
    }

    /// Changes when the idle sleeper asks the tenant's sessions to park.
    pub fn park_requests(&self) -> watch::Receiver<u64> {
        self.slot.park.subscribe()
    }

    /// Changes when an operator asks the tenant's sessions to migrate.
    pub fn migrate_requests(&self) -> watch::Receiver<u64> {
        self.slot.migrate.subscribe()
    }

    /// Ends the claim of a session that left its backend connection but keeps its client; the
    /// tenant counts it as parked until the returned mark is dropped. With `for_sleep` (it
    /// parked because the tenant was idle) the idle clock is not restarted, so the tenant can
    /// sleep at the sleeper's next look.
    pub fn park(mut self, for_sleep: bool) -> ParkedMark {
        self.parked_for_sleep = for_sleep;
        self.slot.lock().parked += 1;
        ParkedMark {
            slot: self.slot.clone(),
        }
    }
}

/// Counts a parked session in its tenant's status while it waits for its client's next
/// message.
pub struct ParkedMark {
    slot: Arc<Slot>,
}

impl Drop for ParkedMark {
    fn drop(&mut self) {
        let mut inner = self.slot.lock();
        inner.parked = inner.parked.saturating_sub(1);
    }
}

impl Drop for WakeClaim {
    fn drop(&mut self) {
        let mut inner = self.slot.lock();
        inner.connections = inner.connections.saturating_sub(1);
        if *self.idle.get_mut() {
            inner.idle_connections = inner.idle_connections.saturating_sub(1);
        }
        if inner.connections == 0 {
            let now = Instant::now();
            inner.idle_since = if self.parked_for_sleep {
                self.slot.sleeper.notify_one();
                now.checked_sub(self.slot.tenant.idle_timeout)
                    .unwrap_or(now)
            } else {
                now
            };
        }
    }
}

/// A connection admitted to an awake tenant.
pub struct Admission {
    /// Where to connect.
    pub endpoint: Endpoint,
    /// The connection's claim on the tenant.
    pub claim: WakeClaim,
}

/// Removes a waiter from both counts however its wait ends.
struct Waiter<'a> {
    slot: &'a Slot,
    total: &'a AtomicUsize,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.slot.lock().waiters -= 1;
        self.total.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Wakes tenants on demand, one wake per tenant at a time, and puts idle ones to sleep.
pub struct WakeCoordinator {
    directory: Arc<TenantDirectory>,
    /// Per-tenant state, made on first use, so tenants added to the directory later get one.
    slots: RwLock<HashMap<TenantId, Arc<Slot>>>,
    settings: WakeSettings,
    waiters_total: AtomicUsize,
    on_wake: OnWake,
    /// Running time of tenants that left the directory, per backend kind, so the totals never
    /// go down.
    awake_of_removed: Mutex<HashMap<&'static str, Duration>>,
    /// Shared with every slot; see [`Slot::sleeper`].
    sleeper: Arc<Notify>,
    /// The shared activity records of tenants whose backends several replicas share.
    activity: Option<Arc<SharedActivity>>,
    /// When the coordinator (the gateway) started: every tenant is asleep since then until it
    /// is first woken, however late its state is first asked for.
    started: SystemTime,
    /// Tenants whose databases outlive this process that were looked at once for being left
    /// awake ([`WakeCoordinator::take_over_left_awake`]).
    looked_at: Mutex<HashSet<TenantId>>,
}

/// A tenant's shared activity record: this replica's side of it and its namespace.
type Shared = (Arc<SharedActivity>, String);

impl WakeCoordinator {
    /// A coordinator for the tenants in `directory` (now and later); `on_wake` hears of every
    /// finished wake.
    pub fn new(
        directory: Arc<TenantDirectory>,
        settings: WakeSettings,
        on_wake: impl Fn(&WakeEvent) + Send + Sync + 'static,
    ) -> Arc<WakeCoordinator> {
        Self::new_shared(directory, settings, None, on_wake)
    }

    /// Like [`WakeCoordinator::new`]; tenants whose backend names an activity namespace sleep
    /// only when `activity` records no other live replica using them.
    pub fn new_shared(
        directory: Arc<TenantDirectory>,
        settings: WakeSettings,
        activity: Option<Arc<SharedActivity>>,
        on_wake: impl Fn(&WakeEvent) + Send + Sync + 'static,
    ) -> Arc<WakeCoordinator> {
        Arc::new(WakeCoordinator {
            activity,
            directory,
            slots: RwLock::new(HashMap::new()),
            settings,
            waiters_total: AtomicUsize::new(0),
            on_wake: Arc::new(on_wake),
            awake_of_removed: Mutex::new(HashMap::new()),
            sleeper: Arc::new(Notify::new()),
            started: SystemTime::now(),
            looked_at: Mutex::new(HashSet::new()),
        })
    }

    /// The state of the tenant the directory holds now. A tenant replaced in the directory
    /// (its cluster changed) starts over with a fresh slot; connections admitted before keep
    /// the old one through their claims.
    fn slot(&self, tenant: &TenantId) -> Result<Arc<Slot>, WakeError> {
        let Some(current) = self.directory.get(tenant) else {
            return Err(WakeError::UnknownTenant(tenant.clone()));
        };
        if let Some(slot) = self.read_slots().get(tenant)
            && Arc::ptr_eq(&slot.tenant, &current)
        {
            return Ok(slot.clone());
        }
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let slot = slots
            .entry(tenant.clone())
            .and_modify(|s| {
                if !Arc::ptr_eq(&s.tenant, &current) {
                    let sleeper = self.sleeper.clone();
                    *s = Arc::new(Slot::new(current.clone(), sleeper, SystemTime::now()));
                }
            })
            .or_insert_with(|| {
                Arc::new(Slot::new(
                    current.clone(),
                    self.sleeper.clone(),
                    self.started,
                ))
            });
        Ok(slot.clone())
    }

    fn read_slots(&self) -> std::sync::RwLockReadGuard<'_, HashMap<TenantId, Arc<Slot>>> {
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    /// True when the tenant accepts connections right now (no wait needed).
    pub fn is_awake(&self, tenant: &TenantId) -> bool {
        self.slot(tenant)
            .is_ok_and(|s| s.lock().phase == Phase::Awake)
    }

    /// Admits a connection: at once if the tenant is awake, else after the (single) wake.
    pub async fn ensure_awake(&self, tenant: &TenantId) -> Result<Admission, WakeError> {
        let slot = &self.slot(tenant)?;
        let shared = self.shared(slot);
        let deadline = Instant::now() + self.settings.wake_timeout;
        let mut waiter: Option<Waiter<'_>> = None;
        loop {
            // Subscribing under the lock means no change between the check and the wait is lost.
            let mut changed = slot.changed.subscribe();
            let hold = {
                let mut inner = slot.lock();
                // A replica enters itself in the shared record before it uses or wakes the
                // tenant, so no other replica puts it to sleep meanwhile. Checked under the
                // lock the idle sleeper takes too: it cannot release the tenant between this
                // check and the admission.
                let hold = shared.as_ref().is_some_and(|(activity, _)| {
                    !matches!(inner.phase, Phase::Waking | Phase::Sleeping)
                        && Self::needs_hold(activity, &inner)
                });
                let start = match inner.phase {
                    Phase::Awake if hold => false,
                    Phase::Awake => {
                        inner.connections += 1;
                        let endpoint = inner
                            .endpoint
                            .clone()
                            .expect("awake tenants have an endpoint");
                        return Ok(Admission {
                            endpoint,
                            claim: WakeClaim::new(slot.clone()),
                        });
                    }
                    Phase::Failed => {
                        let retry_at = inner.retry_at.unwrap_or_else(Instant::now);
                        if retry_at > Instant::now() {
                            return Err(WakeError::Failed {
                                reason: inner.last_error.clone().unwrap_or_default(),
                                retry_in: retry_at - Instant::now(),
                            });
                        }
                        true
                    }
                    Phase::Asleep => true,
                    Phase::Waking | Phase::Sleeping => false,
                };
                // A place in the queue first: a connection refused for a full queue must not
                // start a database either.
                if waiter.is_none() {
                    let per_tenant = self.settings.max_waiters_per_tenant;
                    if inner.waiters >= per_tenant {
                        return Err(WakeError::QueueFull {
                            tenant: tenant.clone(),
                            limit: per_tenant,
                        });
                    }
                    let total = self.settings.max_waiters_total;
                    if self.waiters_total.fetch_add(1, Ordering::Relaxed) >= total {
                        self.waiters_total.fetch_sub(1, Ordering::Relaxed);
                        return Err(WakeError::QueueFull {
                            tenant: tenant.clone(),
                            limit: total,
                        });
                    }
                    inner.waiters += 1;
                    waiter = Some(Waiter {
                        slot,
                        total: &self.waiters_total,
                    });
                }
                if start && !hold {
                    self.start_wake(slot, &mut inner);
                }
                hold
            };
            if let (true, Some((activity, namespace))) = (hold, &shared) {
                // Boxed: only replicas sharing a sleep decision hold, and every queued
                // connection's future would otherwise be sized by the Kubernetes calls.
                Box::pin(self.hold(slot, activity, namespace, deadline)).await?;
                continue;
            }
            if timeout_at(deadline, changed.changed()).await.is_err() {
                return Err(WakeError::Timeout(self.settings.wake_timeout));
            }
        }
    }

    /// The tenant's shared activity record, when replicas share its backend.
    fn shared(&self, slot: &Slot) -> Option<Shared> {
        let activity = self.activity.as_ref()?;
        let namespace = slot.tenant.backend.activity_namespace(&slot.tenant.id)?;
        Some((activity.clone(), namespace))
    }

    /// True when this replica must write its entry before it uses the tenant: it has none that
    /// is fresh (renewals keep it younger than half the TTL), and the API has not just failed.
    fn needs_hold(activity: &SharedActivity, inner: &Inner) -> bool {
        let ttl = activity.ttl();
        let held = inner
            .shared
            .renewed_at
            .is_some_and(|t| t.elapsed() < ttl / 2);
        let backing_off = inner
            .shared
            .failed_at
            .is_some_and(|t| t.elapsed() < ttl / 3);
        !held && !backing_off
    }

    /// True while this replica keeps its entry: the tenant runs for it and it has sessions,
    /// waiters, or had sessions less than the idle timeout ago.
    fn wants_hold(slot: &Slot, inner: &Inner) -> bool {
        matches!(inner.phase, Phase::Awake | Phase::Waking)
            && (inner.connections > 0
                || inner.waiters > 0
                || inner.idle_since.elapsed() < slot.tenant.idle_timeout)
    }

    /// Enters this replica in the tenant's shared record, waiting (until `deadline`) while
    /// another replica puts the tenant to sleep. When the API cannot be reached the tenant is
    /// used anyway: an awake tenant keeps serving.
    async fn hold(
        &self,
        slot: &Arc<Slot>,
        activity: &SharedActivity,
        namespace: &str,
        deadline: Instant,
    ) -> Result<(), WakeError> {
        let timed_out = || WakeError::Timeout(self.settings.wake_timeout);
        let _turn = timeout_at(deadline, slot.hold_lock.lock())
            .await
            .map_err(|_| timed_out())?;
        if !Self::needs_hold(activity, &slot.lock()) {
            // Another connection of this replica wrote the entry while this one waited.
            return Ok(());
        }
        let id = &slot.tenant.id;
        let result = activity.hold(namespace, id, Some(deadline)).await;
        let mut inner = slot.lock();
        match result {
            Ok(sleeps) => {
                inner.shared.renewed_at = Some(Instant::now());
                inner.shared.failed_at = None;
                inner.shared.next_look = None;
                Self::note_sleeps(slot, &mut inner, sleeps);
                Ok(())
            }
            Err(ActivityError::SleepUnderWay) => Err(timed_out()),
            Err(e) => {
                warn!(tenant = %id, error = %e, "cannot record this replica's activity; using the tenant anyway");
                inner.shared.failed_at = Some(Instant::now());
                Ok(())
            }
        }
    }

    /// Takes in the record's sleep count: a tenant this replica sees awake was put to sleep by
    /// another replica if the count moved since, and must be woken again.
    fn note_sleeps(slot: &Slot, inner: &mut Inner, sleeps: u64) {
        if inner.phase == Phase::Awake && inner.shared.sleeps.is_some_and(|s| s != sleeps) {
            info!(tenant = %slot.tenant.id, "another replica put the tenant to sleep");
            inner.endpoint = None;
            slot.set_phase(inner, Phase::Asleep);
            slot.notify();
        }
        inner.shared.sleeps = Some(sleeps);
    }

    /// Takes this replica's entry out of the tenant's shared record and puts the tenant to sleep
    /// when no other live replica uses it. Only for an awake tenant without connections (and,
    /// unless `forced`, without waiters, idle for its timeout and past the next look); returns
    /// what the record said, `None` when nothing was asked.
    async fn sleep_if_unused(
        &self,
        slot: &Arc<Slot>,
        (activity, namespace): &Shared,
        forced: bool,
    ) -> Result<Option<Release>, ActivityError> {
        let _turn = match forced {
            true => slot.hold_lock.lock().await,
            false => match slot.hold_lock.try_lock() {
                Ok(turn) => turn,
                // A connection is entering this replica: the tenant is in use.
                Err(_) => return Ok(None),
            },
        };
        let seen = {
            let mut inner = slot.lock();
            let unused = inner.phase == Phase::Awake
                && inner.connections == 0
                && (forced
                    || (inner.waiters == 0
                        && inner.idle_since.elapsed() >= slot.tenant.idle_timeout
                        && inner.shared.next_look.is_none_or(|t| t <= Instant::now())));
            if !unused {
                return Ok(None);
            }
            // From here on a new connection writes the entry again first, and so waits for
            // this turn to end.
            inner.shared.renewed_at = None;
            inner.shared.failed_at = None;
            inner.shared.sleeps
        };
        let id = &slot.tenant.id;
        let result = activity.release(namespace, id, seen).await;
        let mut inner = slot.lock();
        match &result {
            Ok(Release::Sleep { sleeps }) => {
                inner.shared.sleeps = Some(*sleeps);
                inner.shared.next_look = None;
                info!(tenant = %id, idle = ?slot.tenant.idle_timeout, "no replica uses the tenant: putting it to sleep");
                Self::start_sleep(
                    slot,
                    &mut inner,
                    Some((activity.clone(), namespace.clone())),
                );
            }
            Ok(Release::Held { recheck_in }) => {
                debug!(tenant = %id, recheck_in = ?recheck_in, "another replica uses the tenant: not sleeping");
                inner.shared.next_look = Some(Instant::now() + (*recheck_in).min(activity.ttl()));
            }
            Ok(Release::Slept) => {
                info!(tenant = %id, "another replica put the tenant to sleep");
                inner.endpoint = None;
                slot.set_phase(&mut inner, Phase::Asleep);
                slot.notify();
            }
            Err(e) => {
                warn!(tenant = %id, error = %e, "cannot confirm that no other replica uses the tenant: not sleeping");
                inner.shared.next_look = Some(Instant::now() + activity.ttl() / 3);
            }
        }
        result.map(Some)
    }

    /// Starts the tenant's single wake task; the caller holds the slot's lock.
    fn start_wake(&self, slot: &Arc<Slot>, inner: &mut Inner) {
        slot.set_phase(inner, Phase::Waking);
        let slot = slot.clone();
        let settings = self.settings.clone();
        let on_wake = self.on_wake.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let backend = slot.tenant.backend.clone();
            let id = slot.tenant.id.clone();
            let mut backoff = settings.retry_backoff;
            let mut attempt = 1;
            let result = loop {
                match backend.wake(&id).await {
                    Ok(ep) => break Ok(ep),
                    Err(e @ BackendError::Unavailable(_)) => break Err(e),
                    Err(e) if attempt < settings.attempts => {
                        warn!(tenant = %id, attempt, error = %e, "wake attempt failed; retrying");
                        sleep(backoff).await;
                        backoff *= 2;
                        attempt += 1;
                    }
                    Err(e) => break Err(e),
                }
            };
            let duration = started.elapsed();
            let ok = result.is_ok();
            {
                let mut inner = slot.lock();
                match result {
                    Ok(ep) => {
                        info!(tenant = %id, ms = duration.as_millis() as u64, "tenant awake");
                        inner.endpoint = Some(ep);
                        Slot::record_wake(&mut inner, duration, true);
                        inner.last_error = None;
                        inner.retry_at = None;
                        inner.idle_since = Instant::now();
                        slot.set_phase(&mut inner, Phase::Awake);
                    }
                    Err(e) => {
                        warn!(tenant = %id, error = %e, retry_in = ?settings.failed_retry_delay, "wake failed");
                        inner.endpoint = None;
                        Slot::record_wake(&mut inner, duration, false);
                        inner.last_error = Some(e.to_string());
                        inner.retry_at = Some(Instant::now() + settings.failed_retry_delay);
                        slot.set_phase(&mut inner, Phase::Failed);
                    }
                }
            }
            slot.notify();
            on_wake(&WakeEvent {
                backend: backend.kind(),
                ok,
                duration,
            });
        });
    }

    /// Starts putting the tenant to sleep; the caller holds the slot's lock. With `shared`, the
    /// sleeping mark this replica wrote in the record is taken out once the tenant is asleep.
    fn start_sleep(slot: &Arc<Slot>, inner: &mut Inner, shared: Option<Shared>) {
        slot.set_phase(inner, Phase::Sleeping);
        let slot = slot.clone();
        tokio::spawn(async move {
            let id = slot.tenant.id.clone();
            let result = slot.tenant.backend.sleep(&id).await;
            {
                let mut inner = slot.lock();
                inner.endpoint = None;
                if let Err(e) = &result {
                    warn!(tenant = %id, error = %e, "sleep failed; treating the tenant as asleep");
                    inner.last_error = Some(e.to_string());
                }
                slot.set_phase(&mut inner, Phase::Asleep);
            }
            info!(tenant = %id, "tenant asleep");
            slot.notify();
            if let Some((activity, namespace)) = shared
                && let Err(e) = activity.sleep_done(&namespace, &id).await
            {
                warn!(tenant = %id, error = %e, "cannot take the sleeping mark out; it expires by itself");
            }
        });
    }

    /// Wakes a tenant (admin API) and waits for the outcome.
    pub async fn wake(&self, tenant: &TenantId) -> Result<(), WakeError> {
        self.ensure_awake(tenant).await.map(drop)
    }

    /// Puts a tenant to sleep (admin API) and waits until it is asleep; refused while clients
    /// are connected.
    pub async fn sleep(&self, tenant: &TenantId) -> Result<(), WakeError> {
        let slot = &self.slot(tenant)?;
        let shared = self.shared(slot);
        let deadline = Instant::now() + self.settings.wake_timeout;
        loop {
            let mut changed = slot.changed.subscribe();
            let ask_record = {
                let mut inner = slot.lock();
                if inner.connections > 0 {
                    return Err(WakeError::Busy(inner.connections));
                }
                match inner.phase {
                    Phase::Asleep | Phase::Failed => return Ok(()),
                    Phase::Awake if shared.is_some() => true,
                    Phase::Awake => {
                        Self::start_sleep(slot, &mut inner, None);
                        false
                    }
                    Phase::Waking | Phase::Sleeping => false,
                }
            };
            if let (true, Some(shared)) = (ask_record, &shared) {
                match self.sleep_if_unused(slot, shared, true).await {
                    Ok(Some(Release::Held { .. })) => return Err(WakeError::ActiveElsewhere),
                    Ok(_) => continue,
                    Err(e) => return Err(WakeError::Unconfirmed(e.to_string())),
                }
            }
            if timeout_at(deadline, changed.changed()).await.is_err() {
                return Err(WakeError::Timeout(self.settings.wake_timeout));
            }
        }
    }

    /// Asks every session of the tenant to move to a fresh backend connection at its next safe
    /// point (admin API); returns the number of open sessions.
    pub fn migrate(&self, tenant: &TenantId) -> Result<usize, WakeError> {
        let slot = self.slot(tenant)?;
        slot.migrate.send_modify(|g| *g = g.wrapping_add(1));
        Ok(slot.lock().connections)
    }

    /// Every tenant's status, sorted by id.
    pub fn status(&self) -> Vec<TenantStatus> {
        let mut out: Vec<TenantStatus> = self
            .directory
            .all()
            .iter()
            .filter_map(|t| self.slot(&t.id).ok())
            .map(|slot| {
                let inner = slot.lock();
                TenantStatus {
                    id: slot.tenant.id.to_string(),
                    backend: slot.tenant.backend.kind(),
                    state: inner.phase,
                    since: epoch_seconds(inner.since),
                    connections: inner.connections,
                    parked: inner.parked,
                    waiters: inner.waiters,
                    last_wake_ms: inner.last_wake.map(|w| w.ms),
                    last_wake_at: inner.last_wake.map(|w| w.at),
                    wakes: inner.wakes.iter().copied().collect(),
                    last_error: (inner.phase == Phase::Failed)
                        .then(|| inner.last_error.clone())
                        .flatten(),
                    awake_s: inner.awake().as_secs_f64(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// How many tenants the coordinator serves now.
    pub fn tenant_count(&self) -> usize {
        self.directory.len()
    }

    /// Connections waiting for a wake, across all tenants.
    pub fn waiters_total(&self) -> usize {
        self.waiters_total.load(Ordering::Relaxed)
    }

    /// Puts tenants to sleep once they have had no connection for their idle timeout (and, for
    /// tenants with a shared activity record, no other live replica uses them), notices
    /// databases that stopped by themselves, and renews this replica's entries in shared
    /// records; runs until `stop` fires.
    pub async fn run_idle_sleeper(self: Arc<Self>, stop: CancellationToken) {
        let renewals = async {
            if let Some(activity) = &self.activity {
                self.renew_entries(activity, &stop).await;
            }
        };
        tokio::join!(self.look_for_idle_tenants(&stop), renewals);
    }

    /// Rewrites this replica's entries before they get old: every sixth of the TTL it renews
    /// those written a third of the TTL ago or more (and writes those that failed to), for
    /// tenants it still uses.
    async fn renew_entries(&self, activity: &SharedActivity, stop: &CancellationToken) {
        let ttl = activity.ttl();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep(ttl / 6) => {}
            }
            let slots: Vec<Arc<Slot>> = self.read_slots().values().cloned().collect();
            for slot in &slots {
                let id = &slot.tenant.id;
                let Some(namespace) = slot.tenant.backend.activity_namespace(id) else {
                    continue;
                };
                // A connection or the sleeper is writing this replica's entry right now.
                let Ok(_turn) = slot.hold_lock.try_lock() else {
                    continue;
                };
                {
                    let inner = slot.lock();
                    let due = inner
                        .shared
                        .renewed_at
                        .is_none_or(|t| t.elapsed() >= ttl / 3);
                    if !due || !Self::wants_hold(slot, &inner) {
                        continue;
                    }
                }
                let result = activity.hold(&namespace, id, None).await;
                let mut inner = slot.lock();
                match result {
                    Ok(sleeps) => {
                        inner.shared.renewed_at = Some(Instant::now());
                        inner.shared.failed_at = None;
                        Self::note_sleeps(slot, &mut inner, sleeps);
                    }
                    Err(e) => {
                        warn!(tenant = %id, error = %e, "cannot renew this replica's activity record");
                        inner.shared.failed_at = Some(Instant::now());
                    }
                }
            }
        }
    }

    async fn look_for_idle_tenants(&self, stop: &CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = sleep(self.settings.idle_check_interval) => {}
                _ = self.sleeper.notified() => {}
            }
            self.forget_removed();
            self.take_over_left_awake().await;
            let slots: Vec<Arc<Slot>> = self.read_slots().values().cloned().collect();
            for slot in &slots {
                let awake = slot.lock().phase == Phase::Awake;
                if !awake {
                    continue;
                }
                let state = slot.tenant.backend.state(&slot.tenant.id).await;
                let gone = matches!(state, Ok(ComputeState::Asleep | ComputeState::Moved));
                let shared = self.shared(slot);
                let ask_record = {
                    let mut inner = slot.lock();
                    if inner.phase != Phase::Awake {
                        continue;
                    }
                    if gone {
                        match state {
                            Ok(ComputeState::Moved) => {
                                info!(tenant = %slot.tenant.id, "database moved; the next connection asks where")
                            }
                            _ => {
                                warn!(tenant = %slot.tenant.id, "database stopped on its own; the next connection wakes it")
                            }
                        }
                        inner.endpoint = None;
                        slot.set_phase(&mut inner, Phase::Asleep);
                        slot.notify();
                        false
                    } else if inner.connections == 0
                        && inner.waiters == 0
                        && inner.idle_since.elapsed() >= slot.tenant.idle_timeout
                    {
                        if shared.is_none() {
                            info!(tenant = %slot.tenant.id, idle = ?slot.tenant.idle_timeout, "idle: putting tenant to sleep");
                            Self::start_sleep(slot, &mut inner, None);
                        }
                        shared.is_some()
                    } else {
                        if inner.connections > 0
                            && inner.connections == inner.idle_connections
                            && inner.waiters == 0
                        {
                            // Every session is idle at a safe point: ask them to park; once
                            // they have, the tenant has no connection and sleeps at the next
                            // look.
                            debug!(tenant = %slot.tenant.id, sessions = inner.connections, "idle: parking sessions");
                            slot.park.send_modify(|g| *g = g.wrapping_add(1));
                        }
                        false
                    }
                };
                if let (true, Some(shared)) = (ask_record, &shared) {
                    // What went wrong is logged; the next look asks again.
                    let _ = self.sleep_if_unused(slot, shared, false).await;
                }
            }
        }
    }

    /// A database that outlives the gateway (backends with shared activity records) can be left
    /// running by a gateway before this one, or by a replica since gone, and nothing would put
    /// it to sleep until someone used it. Each such tenant is looked at once; one found awake
    /// is woken here (quick, it runs), so it sleeps after its idle timeout like any other
    /// unless a replica uses it (the shared record decides).
    async fn take_over_left_awake(&self) {
        let unseen: Vec<Arc<Tenant>> = {
            let seen = self.looked_at.lock().unwrap_or_else(|p| p.into_inner());
            self.directory
                .all()
                .into_iter()
                .filter(|t| !seen.contains(&t.id) && t.backend.activity_namespace(&t.id).is_some())
                .collect()
        };
        let mut looks = stream::iter(unseen)
            .map(|tenant| async move {
                let state = tenant.backend.state(&tenant.id).await;
                (tenant, state)
            })
            .buffer_unordered(TAKE_OVER_LOOKS_AT_ONCE);
        while let Some((tenant, state)) = looks.next().await {
            if state.is_err() {
                // Asked again at the next look.
                continue;
            }
            self.looked_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(tenant.id.clone());
            if !matches!(state, Ok(ComputeState::Awake)) {
                continue;
            }
            let Ok(slot) = self.slot(&tenant.id) else {
                continue;
            };
            let mut inner = slot.lock();
            // A connection may have started a wake meanwhile.
            if inner.phase == Phase::Asleep {
                info!(tenant = %tenant.id, "found awake without this gateway having woken it: taking it over, to sleep when idle");
                self.start_wake(&slot, &mut inner);
            }
        }
    }

    /// Drops the state of tenants that left the directory (or were replaced); their open
    /// connections keep what they hold.
    fn forget_removed(&self) {
        let stale: Vec<TenantId> = self
            .read_slots()
            .iter()
            .filter(|(id, slot)| {
                self.directory
                    .get(id)
                    .is_none_or(|t| !Arc::ptr_eq(&t, &slot.tenant))
            })
            .map(|(id, _)| id.clone())
            .collect();
        if stale.is_empty() {
            return;
        }
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        let mut removed = self.awake_of_removed();
        for id in stale {
            if let Some(slot) = slots.remove(&id) {
                *removed.entry(slot.tenant.backend.kind()).or_default() += slot.lock().awake();
            }
        }
    }

    fn awake_of_removed(&self) -> MutexGuard<'_, HashMap<&'static str, Duration>> {
        self.awake_of_removed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Seconds tenants' databases have spent running since the gateway started, per backend
    /// kind, tenants that left the directory included: never decreases.
    pub fn awake_seconds_by_kind(&self) -> HashMap<&'static str, f64> {
        let mut out: HashMap<&'static str, f64> = self
            .awake_of_removed()
            .iter()
            .map(|(k, d)| (*k, d.as_secs_f64()))
            .collect();
        for slot in self.read_slots().values() {
            *out.entry(slot.tenant.backend.kind()).or_default() +=
                slot.lock().awake().as_secs_f64();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use futures_util::future::join_all;
    use tokio::time::timeout;

    use super::*;
    use crate::backend::FixedBackend;
    use crate::backend::fake::{Call, FakeBackend, WakeStep};

    fn coordinator() -> (Arc<WakeCoordinator>, TenantId) {
        let id = TenantId::parse("t").unwrap();
        let directory = Arc::new(TenantDirectory::new([Tenant {
            id: id.clone(),
            backend: Arc::new(FixedBackend::new(Endpoint::parse("127.0.0.1:1").unwrap())),
            idle_timeout: Duration::from_secs(3600),
        }]));
        let settings = WakeSettings {
            wake_timeout: Duration::from_secs(5),
            max_waiters_per_tenant: 10,
            max_waiters_total: 10,
            attempts: 1,
            retry_backoff: Duration::from_millis(10),
            failed_retry_delay: Duration::from_secs(1),
            idle_check_interval: Duration::from_secs(3600),
        };
        (WakeCoordinator::new(directory, settings, |_| {}), id)
    }

    #[tokio::test]
    async fn wake_history_keeps_the_latest_wakes() {
        let (coordinator, id) = coordinator();
        for _ in 0..WAKE_HISTORY + 5 {
            coordinator.wake(&id).await.unwrap();
            coordinator.sleep(&id).await.unwrap();
        }
        let status = coordinator.status().remove(0);
        assert_eq!(status.wakes.len(), WAKE_HISTORY);
        assert!(status.wakes.windows(2).all(|w| w[0].at <= w[1].at));
        let last = status.wakes.last().unwrap();
        assert!(last.ok);
        assert_eq!(status.last_wake_at, Some(last.at));
        assert_eq!(status.last_wake_ms, Some(last.ms));
    }

    #[tokio::test]
    async fn a_tenant_never_woken_is_asleep_since_the_start() {
        let before = epoch_seconds(SystemTime::now());
        let (coordinator, _) = coordinator();
        let after = epoch_seconds(SystemTime::now());
        // The first look at its state comes later, as the status page's first request does.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let status = coordinator.status().remove(0);
        assert_eq!(status.state, Phase::Asleep);
        assert!(
            (before..=after).contains(&status.since),
            "asleep since {} for a coordinator started in {before}..={after}",
            status.since
        );
    }

    #[tokio::test]
    async fn parked_sessions_are_counted_until_their_mark_drops() {
        let (coordinator, id) = coordinator();
        let admission = coordinator.ensure_awake(&id).await.unwrap();
        let status = |c: &WakeCoordinator| {
            let s = c.status().remove(0);
            (s.connections, s.parked)
        };
        assert_eq!(status(&coordinator), (1, 0));
        let mark = admission.claim.park(true);
        assert_eq!(status(&coordinator), (0, 1));
        drop(mark);
        assert_eq!(status(&coordinator), (0, 0));
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// Settings for the scripted tests: generous queues and deadline, three attempts.
    fn settings() -> WakeSettings {
        WakeSettings {
            wake_timeout: 30 * SECOND,
            max_waiters_per_tenant: 100,
            max_waiters_total: 100,
            attempts: 3,
            retry_backoff: Duration::from_millis(100),
            failed_retry_delay: 10 * SECOND,
            idle_check_interval: SECOND,
        }
    }

    /// A coordinator over fake-backed tenants, and the wake events it reported.
    struct Lab {
        coordinator: Arc<WakeCoordinator>,
        directory: Arc<TenantDirectory>,
        events: Arc<Mutex<Vec<WakeEvent>>>,
    }

    impl Lab {
        fn new(
            settings: WakeSettings,
            idle_timeout: Duration,
            tenants: &[(&TenantId, &Arc<FakeBackend>)],
        ) -> Lab {
            let directory = Arc::new(TenantDirectory::new(tenants.iter().map(|(id, backend)| {
                Tenant {
                    id: (*id).clone(),
                    backend: (*backend).clone(),
                    idle_timeout,
                }
            })));
            let events = Arc::new(Mutex::new(Vec::new()));
            let seen = events.clone();
            let coordinator = WakeCoordinator::new(directory.clone(), settings, move |e| {
                seen.lock().unwrap().push(e.clone());
            });
            Lab {
                coordinator,
                directory,
                events,
            }
        }

        fn status(&self, id: &TenantId) -> TenantStatus {
            self.coordinator
                .status()
                .into_iter()
                .find(|s| s.id == id.as_str())
                .expect("a known tenant")
        }

        /// Outcomes of the finished wakes so far, oldest first.
        fn wake_outcomes(&self) -> Vec<bool> {
            self.events.lock().unwrap().iter().map(|e| e.ok).collect()
        }

        /// Starts the idle sleeper; it stops when the returned token is dropped.
        fn run_idle_sleeper(&self) -> tokio_util::sync::DropGuard {
            let stop = CancellationToken::new();
            tokio::spawn(self.coordinator.clone().run_idle_sleeper(stop.clone()));
            stop.drop_guard()
        }

        /// A connection to `id` waiting in a task of its own.
        fn spawn_waiter(
            &self,
            id: &TenantId,
        ) -> tokio::task::JoinHandle<Result<Admission, WakeError>> {
            let coordinator = self.coordinator.clone();
            let id = id.clone();
            tokio::spawn(async move { coordinator.ensure_awake(&id).await })
        }
    }

    fn tenant(name: &str) -> TenantId {
        TenantId::parse(name).unwrap()
    }

    fn fake(backend: FakeBackend) -> Arc<FakeBackend> {
        Arc::new(backend)
    }

    /// The error of an admission that must fail (`Admission` has no `Debug`).
    fn refused(result: Result<Admission, WakeError>) -> WakeError {
        match result {
            Ok(_) => panic!("admitted, but a refusal was expected"),
            Err(e) => e,
        }
    }

    /// Lets every spawned task run until it waits, without moving the paused clock.
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    /// Timers of the paused clock fire on whole milliseconds, so durations are checked to two.
    fn assert_about(actual: Duration, expected: Duration) {
        assert!(
            actual.abs_diff(expected) <= Duration::from_millis(2),
            "{actual:?} is not about {expected:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_connections_share_one_wake() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new().then(WakeStep::Ready(2 * SECOND)));
        let lab = Lab::new(settings(), 60 * SECOND, &[(&t, &backend)]);
        let started = Instant::now();
        let admissions = join_all((0..100).map(|_| lab.coordinator.ensure_awake(&t))).await;
        assert_about(started.elapsed(), 2 * SECOND);
        assert_eq!(backend.wakes().len(), 1);
        let mut claims = Vec::new();
        for admission in admissions {
            let admission = admission.unwrap_or_else(|e| panic!("refused: {e}"));
            assert_eq!(admission.endpoint.to_string(), FakeBackend::ENDPOINT);
            claims.push(admission.claim);
        }
        let status = lab.status(&t);
        assert_eq!(
            (status.state, status.connections, status.waiters),
            (Phase::Awake, 100, 0)
        );
        assert_eq!(lab.wake_outcomes(), [true]);
        drop(claims);
        assert_eq!(lab.status(&t).connections, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn accept_queues_are_bounded_per_tenant_and_in_total() {
        let (a, b) = (tenant("a"), tenant("b"));
        let hanging = fake(FakeBackend::new().then(WakeStep::Hang));
        let settings = WakeSettings {
            max_waiters_per_tenant: 3,
            max_waiters_total: 5,
            ..settings()
        };
        let lab = Lab::new(settings, 60 * SECOND, &[(&a, &hanging), (&b, &hanging)]);
        let mut waiting: Vec<_> = (0..3).map(|_| lab.spawn_waiter(&a)).collect();
        settle().await;
        assert_eq!(lab.coordinator.waiters_total(), 3);
        let full = refused(lab.coordinator.ensure_awake(&a).await);
        assert!(
            matches!(&full, WakeError::QueueFull { tenant, limit: 3 } if *tenant == a),
            "{full:?}"
        );
        waiting.extend((0..2).map(|_| lab.spawn_waiter(&b)));
        settle().await;
        assert_eq!(lab.coordinator.waiters_total(), 5);
        // b has room of its own, but not in the total.
        let full = refused(lab.coordinator.ensure_awake(&b).await);
        assert!(
            matches!(&full, WakeError::QueueFull { tenant, limit: 5 } if *tenant == b),
            "{full:?}"
        );
        for w in waiting {
            assert!(matches!(refused(w.await.unwrap()), WakeError::Timeout(_)));
        }
        // Waiters that left free their places.
        assert_eq!(lab.coordinator.waiters_total(), 0);
        assert_eq!((lab.status(&a).waiters, lab.status(&b).waiters), (0, 0));
        let again = lab.spawn_waiter(&a);
        settle().await;
        assert_eq!(lab.status(&a).waiters, 1);
        again.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_refused_for_a_full_queue_wakes_nothing() {
        let (a, b) = (tenant("a"), tenant("b"));
        let hanging = fake(FakeBackend::new().then(WakeStep::Hang));
        let asleep = fake(FakeBackend::new().then(WakeStep::Ready(SECOND)));
        let settings = WakeSettings {
            max_waiters_total: 1,
            ..settings()
        };
        let lab = Lab::new(settings, 60 * SECOND, &[(&a, &hanging), (&b, &asleep)]);
        let waiting = lab.spawn_waiter(&a);
        settle().await;
        let full = refused(lab.coordinator.ensure_awake(&b).await);
        assert!(
            matches!(full, WakeError::QueueFull { limit: 1, .. }),
            "{full:?}"
        );
        settle().await;
        assert!(
            asleep.wakes().is_empty(),
            "a refused connection started a wake"
        );
        assert_eq!(lab.status(&b).state, Phase::Asleep);
        waiting.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_past_the_deadline_times_out_while_the_wake_goes_on() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new().then(WakeStep::Ready(8 * SECOND)));
        let settings = WakeSettings {
            wake_timeout: 5 * SECOND,
            ..settings()
        };
        let lab = Lab::new(settings, 60 * SECOND, &[(&t, &backend)]);
        let started = Instant::now();
        let err = refused(lab.coordinator.ensure_awake(&t).await);
        assert!(
            matches!(err, WakeError::Timeout(d) if d == 5 * SECOND),
            "{err:?}"
        );
        assert_about(started.elapsed(), 5 * SECOND);
        let status = lab.status(&t);
        assert_eq!((status.state, status.waiters), (Phase::Waking, 0));
        sleep(3 * SECOND + Duration::from_millis(10)).await;
        assert!(lab.coordinator.is_awake(&t));
        let admitted = Instant::now();
        lab.coordinator.ensure_awake(&t).await.unwrap();
        assert_eq!(admitted.elapsed(), Duration::ZERO);
        assert_eq!(backend.wakes().len(), 1);
        assert_eq!(lab.wake_outcomes(), [true]);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_attempts_back_off_then_the_tenant_is_refused_until_the_retry_delay() {
        let t = tenant("t");
        let backend = fake(
            FakeBackend::new()
                .script_wakes([WakeStep::Fail(SECOND); 3])
                .then(WakeStep::Ready(SECOND)),
        );
        let lab = Lab::new(settings(), 60 * SECOND, &[(&t, &backend)]);
        let err = refused(lab.coordinator.ensure_awake(&t).await);
        assert!(
            matches!(&err, WakeError::Failed { retry_in, .. } if *retry_in == 10 * SECOND),
            "{err:?}"
        );
        // Three attempts (settings().attempts), 100 ms then 200 ms apart after each failure.
        let wakes = backend.wakes();
        assert_eq!(wakes.len(), 3);
        assert_about(wakes[1] - wakes[0], Duration::from_millis(1100));
        assert_about(wakes[2] - wakes[1], Duration::from_millis(1200));
        let status = lab.status(&t);
        assert_eq!(status.state, Phase::Failed);
        assert!(status.last_error.unwrap().contains("scripted failure"));
        assert_eq!(
            status.wakes.iter().map(|w| w.ok).collect::<Vec<_>>(),
            [false]
        );
        assert_eq!(lab.wake_outcomes(), [false]);

        // Refused at once, without a new attempt, until the retry delay has passed.
        sleep(4 * SECOND).await;
        let err = refused(lab.coordinator.ensure_awake(&t).await);
        assert!(
            matches!(&err, WakeError::Failed { retry_in, .. } if *retry_in == 6 * SECOND),
            "{err:?}"
        );
        assert_eq!(backend.wakes().len(), 3);

        sleep(6 * SECOND).await;
        lab.coordinator.ensure_awake(&t).await.unwrap();
        assert_eq!(backend.wakes().len(), 4);
        let status = lab.status(&t);
        assert_eq!(status.state, Phase::Awake);
        assert_eq!(status.last_error, None);
        assert_eq!(
            status.wakes.iter().map(|w| w.ok).collect::<Vec<_>>(),
            [false, true]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_backend_is_not_retried() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new().script_wakes([WakeStep::Unavailable]));
        let lab = Lab::new(settings(), 60 * SECOND, &[(&t, &backend)]);
        let err = refused(lab.coordinator.ensure_awake(&t).await);
        assert!(matches!(err, WakeError::Failed { .. }), "{err:?}");
        assert_eq!(backend.wakes().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_does_not_cancel_the_wake() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new().then(WakeStep::Ready(3 * SECOND)));
        let lab = Lab::new(settings(), 60 * SECOND, &[(&t, &backend)]);
        // The client goes away after a second: its future is dropped mid-wait.
        assert!(
            timeout(SECOND, lab.coordinator.ensure_awake(&t))
                .await
                .is_err()
        );
        assert_eq!(lab.coordinator.waiters_total(), 0);
        let status = lab.status(&t);
        assert_eq!((status.state, status.waiters), (Phase::Waking, 0));
        sleep(2 * SECOND + Duration::from_millis(10)).await;
        assert!(lab.coordinator.is_awake(&t));
        assert_eq!(backend.wakes().len(), 1);
        assert_eq!(lab.wake_outcomes(), [true]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_tenant_sleeps_after_its_last_claim_and_the_idle_timeout() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        let lab = Lab::new(settings(), 10 * SECOND, &[(&t, &backend)]);
        let _sleeper = lab.run_idle_sleeper();
        let first = lab.coordinator.ensure_awake(&t).await.unwrap();
        let last = lab.coordinator.ensure_awake(&t).await.unwrap();
        drop(first);
        sleep(60 * SECOND).await;
        assert_eq!(lab.status(&t).state, Phase::Awake);
        assert!(backend.times_of(Call::Sleep).is_empty());

        let released = Instant::now();
        drop(last);
        sleep(9 * SECOND).await;
        assert_eq!(lab.status(&t).state, Phase::Awake);
        sleep(2 * SECOND).await;
        let sleeps = backend.times_of(Call::Sleep);
        assert_eq!(sleeps.len(), 1);
        // At the first look (every second) after the idle timeout.
        let after = sleeps[0] - released;
        assert!(after >= 10 * SECOND && after <= 11 * SECOND, "{after:?}");
        assert_eq!(lab.status(&t).state, Phase::Asleep);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_during_sleep_waits_for_it_then_wakes() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new().sleep_takes(3 * SECOND));
        let lab = Lab::new(settings(), 10 * SECOND, &[(&t, &backend)]);
        let _sleeper = lab.run_idle_sleeper();
        lab.coordinator.wake(&t).await.unwrap();
        while lab.status(&t).state != Phase::Sleeping {
            sleep(Duration::from_millis(100)).await;
        }
        lab.coordinator.ensure_awake(&t).await.unwrap();
        let calls: Vec<Call> = backend
            .calls()
            .into_iter()
            .map(|(_, c)| c)
            .filter(|c| *c != Call::State)
            .collect();
        assert_eq!(
            calls,
            [Call::Wake, Call::Sleep, Call::SleepDone, Call::Wake]
        );
        assert!(backend.wakes()[1] >= backend.times_of(Call::SleepDone)[0]);
        assert_eq!(lab.status(&t).state, Phase::Awake);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_are_asked_to_park_and_the_tenant_sleeps_once_they_have() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        // Only the sessions' signals may drive this sleep: the periodic look comes too late and
        // the idle timeout (ten years) never passes.
        let settings = WakeSettings {
            idle_check_interval: 3600 * SECOND,
            ..settings()
        };
        let idle_timeout = 10 * 365 * 24 * 3600 * SECOND;
        let lab = Lab::new(settings, idle_timeout, &[(&t, &backend)]);
        let _sleeper = lab.run_idle_sleeper();
        let admission = lab.coordinator.ensure_awake(&t).await.unwrap();
        let mut park_requests = admission.claim.park_requests();
        park_requests.borrow_and_update();
        admission.claim.set_idle(true);
        timeout(SECOND, park_requests.changed())
            .await
            .expect("asked to park at once")
            .unwrap();
        let mark = admission.claim.park(true);
        let status = lab.status(&t);
        assert_eq!((status.connections, status.parked), (0, 1));
        timeout(SECOND, async {
            while lab.status(&t).state != Phase::Asleep {
                sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("asleep at once once the last session parked");
        assert_eq!(backend.times_of(Call::Sleep).len(), 1);
        drop(mark);
        assert_eq!(lab.status(&t).parked, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_database_that_stopped_on_its_own_is_woken_again() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        let lab = Lab::new(settings(), 3600 * SECOND, &[(&t, &backend)]);
        let _sleeper = lab.run_idle_sleeper();
        let _held = lab.coordinator.ensure_awake(&t).await.unwrap();
        backend.stop_on_its_own();
        sleep(2 * SECOND).await;
        assert_eq!(lab.status(&t).state, Phase::Asleep);
        lab.coordinator.ensure_awake(&t).await.unwrap();
        assert_eq!(backend.wakes().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn one_tenants_failures_leave_the_others_alone() {
        let (bad, good) = (tenant("bad"), tenant("good"));
        let failing = fake(
            FakeBackend::new()
                .script_wakes([WakeStep::Fail(SECOND)])
                .then(WakeStep::Hang),
        );
        let working = fake(FakeBackend::new());
        let settings = WakeSettings {
            attempts: 1,
            max_waiters_per_tenant: 2,
            max_waiters_total: 10,
            ..settings()
        };
        let lab = Lab::new(
            settings,
            60 * SECOND,
            &[(&bad, &failing), (&good, &working)],
        );
        let (bad_result, good_result) = tokio::join!(
            lab.coordinator.ensure_awake(&bad),
            lab.coordinator.ensure_awake(&good)
        );
        assert!(matches!(refused(bad_result), WakeError::Failed { .. }));
        drop(good_result.unwrap());
        assert_eq!(lab.status(&bad).state, Phase::Failed);
        assert_eq!(lab.status(&good).state, Phase::Awake);

        // Once its retry delay is over, the bad tenant hangs with a full queue; the good one
        // still sleeps, wakes and admits.
        sleep(11 * SECOND).await;
        let stuck: Vec<_> = (0..2).map(|_| lab.spawn_waiter(&bad)).collect();
        settle().await;
        assert!(matches!(
            refused(lab.coordinator.ensure_awake(&bad).await),
            WakeError::QueueFull { limit: 2, .. }
        ));
        lab.coordinator.sleep(&good).await.unwrap();
        lab.coordinator.ensure_awake(&good).await.unwrap();
        assert_eq!(working.wakes().len(), 2);
        assert_eq!(lab.status(&good).last_error, None);
        for w in stuck {
            w.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_tenants_and_busy_sleeps_are_refused() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new());
        let lab = Lab::new(settings(), 60 * SECOND, &[(&t, &backend)]);
        let err = refused(lab.coordinator.ensure_awake(&tenant("nobody")).await);
        assert!(matches!(err, WakeError::UnknownTenant(_)), "{err:?}");
        let admission = lab.coordinator.ensure_awake(&t).await.unwrap();
        let err = lab.coordinator.sleep(&t).await.unwrap_err();
        assert!(matches!(err, WakeError::Busy(1)), "{err:?}");
        drop(admission);
        lab.coordinator.sleep(&t).await.unwrap();
        assert_eq!(lab.status(&t).state, Phase::Asleep);
        assert!(backend.wakes().len() == 1 && backend.times_of(Call::SleepDone).len() == 1);
    }

    #[tokio::test(start_paused = true)]
    async fn running_time_counts_waking_awake_and_sleeping_and_outlives_the_tenant() {
        let t = tenant("t");
        let backend = fake(FakeBackend::new().sleep_takes(2 * SECOND));
        let lab = Lab::new(settings(), 60 * SECOND, &[(&t, &backend)]);
        let admission = lab.coordinator.ensure_awake(&t).await.unwrap();
        sleep(10 * SECOND).await;
        drop(admission);
        lab.coordinator.sleep(&t).await.unwrap();
        // Asleep time does not count.
        sleep(100 * SECOND).await;
        let running = Duration::from_secs_f64(lab.status(&t).awake_s);
        assert_about(running, 13 * SECOND);
        lab.directory.remove(&t);
        lab.coordinator.forget_removed();
        let by_kind = lab.coordinator.awake_seconds_by_kind();
        assert_about(Duration::from_secs_f64(by_kind["fake"]), 13 * SECOND);
    }
}
