//! One tenant's state, and the claims and marks its connections hold on it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use pgwake_protocol::Pins;

use super::forecast::{Forecast, ForecastTimings, PredictionCounts};
use super::pinned::{PinnedSessions, SessionClient};
use super::{Phase, RunStatus, WAKE_HISTORY, WakeRecord};
use crate::activity::SharedActivity;
use crate::predict::{PredictPolicy, RunHistory};
use crate::{Endpoint, Tenant};

pub(super) struct Inner {
    pub(super) phase: Phase,
    pub(super) since: SystemTime,
    pub(super) connections: usize,
    /// Connections whose session has been idle at a safe point for the idle timeout.
    pub(super) idle_connections: usize,
    /// Sessions parked off this tenant's backend, each counted by its [`ParkedMark`].
    pub(super) parked: usize,
    pub(super) waiters: usize,
    pub(super) endpoint: Option<Endpoint>,
    pub(super) idle_since: Instant,
    pub(super) retry_at: Option<Instant>,
    pub(super) last_error: Option<String>,
    /// The last successful wake.
    pub(super) last_wake: Option<WakeRecord>,
    /// Finished wakes, oldest first, at most [`WAKE_HISTORY`].
    pub(super) wakes: VecDeque<WakeRecord>,
    /// Time spent running (waking, awake, sleeping) in periods that have ended.
    pub(super) awake_before: Duration,
    /// Start of the running period under way, if any.
    pub(super) running_since: Option<Instant>,
    /// This replica's side of the tenant's shared activity record, when it has one.
    pub(super) shared: SharedState,
    /// Its runs and what was predicted from them.
    pub(super) forecast: Forecast,
    /// The idle sleeper logged, in this episode, that the tenant is past its idle timeout
    /// but cannot sleep; cleared when the episode ends.
    pub(super) kept_awake_logged: bool,
}

/// What a replica knows of its entry in a tenant's shared activity record
/// ([`crate::activity`]).
#[derive(Default)]
pub(super) struct SharedState {
    /// When this replica last wrote its entry; `None` while it has none.
    pub(super) renewed_at: Option<Instant>,
    /// When writing the entry last failed (the API is unreachable): connections do not try
    /// again for a while, and an awake tenant keeps serving meanwhile.
    pub(super) failed_at: Option<Instant>,
    /// The record's sleep count when this replica last read it.
    pub(super) sleeps: Option<u64>,
    /// Another replica holds the tenant: the idle sleeper reads the record again only then.
    pub(super) next_look: Option<Instant>,
    /// The record said, when this replica last tried to release the tenant, that another
    /// replica uses it.
    pub(super) held_elsewhere: bool,
}

impl Inner {
    /// Time spent running so far, the period under way included.
    pub(super) fn awake(&self) -> Duration {
        self.awake_before + self.running_since.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

pub(super) struct Slot {
    pub(super) tenant: Arc<Tenant>,
    pub(super) inner: Mutex<Inner>,
    pub(super) changed: watch::Sender<u64>,
    /// Bumped to ask every idle session to leave its backend connection (before a sleep).
    pub(super) park: watch::Sender<u64>,
    /// Bumped to ask every session to move to a fresh backend connection now.
    pub(super) migrate: watch::Sender<u64>,
    /// Wakes the idle sleeper early, when the last session of the tenant goes idle or parks,
    /// so sleep does not wait for its next periodic look.
    pub(super) sleeper: Arc<Notify>,
    /// One reader-writer of the shared activity record per tenant at a time, so the idle
    /// sleeper's release and a connection's announcement of the same replica never interleave.
    pub(super) hold_lock: tokio::sync::Mutex<()>,
    /// The timings predictive wake and sleep use, and the clock they read.
    pub(super) timings: ForecastTimings,
    /// Every tenant's pinned sessions; this tenant's sessions write theirs through their
    /// claims.
    pub(super) pinned: Arc<PinnedSessions>,
    /// Sessions inside a transaction block. Apart from the lock: it changes with every
    /// transaction.
    pub(super) in_transaction: AtomicUsize,
}

impl Slot {
    /// The state of a tenant asleep `since` then, whose recent runs started at `runs`; its
    /// sessions report their pins to `pinned`.
    pub(super) fn new(
        tenant: Arc<Tenant>,
        (sleeper, pinned): (Arc<Notify>, Arc<PinnedSessions>),
        since: SystemTime,
        timings: ForecastTimings,
        runs: RunHistory,
    ) -> Slot {
        Slot {
            sleeper,
            timings,
            tenant,
            pinned,
            in_transaction: AtomicUsize::new(0),
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
                forecast: Forecast::new(runs),
                kept_awake_logged: false,
            }),
            hold_lock: tokio::sync::Mutex::new(()),
            changed: watch::Sender::new(0),
            park: watch::Sender::new(0),
            migrate: watch::Sender::new(0),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_phase(&self, inner: &mut Inner, phase: Phase) {
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
        if phase != Phase::Awake {
            inner.kept_awake_logged = false;
        }
        inner.phase = phase;
        inner.since = SystemTime::now();
    }

    pub(super) fn record_wake(inner: &mut Inner, duration: Duration, ok: bool) {
        let record = WakeRecord {
            at: super::epoch_seconds(SystemTime::now()),
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

    pub(super) fn notify(&self) {
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }
}

/// Successful wakes the lead is taken from: enough that one quick wake does not cut it short,
/// few enough that an unusually slow one (a local tenant's first, which runs initdb) soon stops
/// counting.
const LEAD_WAKES: usize = 3;

/// What a tenant's forecast says about its sleep and its next wake.
impl Slot {
    /// How far ahead of a run to start waking: the slowest of the last [`LEAD_WAKES`]
    /// successful wakes, plus the margin.
    pub(super) fn lead(&self, inner: &Inner) -> Duration {
        let slowest_ms = inner
            .wakes
            .iter()
            .rev()
            .filter(|w| w.ok)
            .take(LEAD_WAKES)
            .map(|w| w.ms)
            .fold(0.0, f64::max);
        Duration::from_secs_f64(slowest_ms / 1000.0) + self.timings.margin
    }

    /// How long the tenant may go without connections (or with only idle ones) before it
    /// sleeps, as of now: its idle timeout, or with `wake_and_sleep` the short grace when the
    /// next run is predicted further away than the idle timeout.
    pub(super) fn idle_timeout_now(&self, inner: &Inner) -> Duration {
        let idle = self.tenant.idle_timeout;
        if self.early_sleep_allowed(inner) {
            self.timings.sleep_grace
        } else {
            idle
        }
    }

    fn early_sleep_allowed(&self, inner: &Inner) -> bool {
        self.tenant.predict == PredictPolicy::WakeAndSleep
            && inner.forecast.prewake.is_none()
            && self.timings.sleep_grace < self.tenant.idle_timeout
            && inner.forecast.history.may_sleep_early(
                self.timings.clock.seconds(),
                self.tenant.idle_timeout,
                self.lead(inner),
            )
    }

    /// True when the tenant, idle since `inner.idle_since`, is due to sleep now.
    pub(super) fn idle_long_enough(&self, inner: &Inner) -> bool {
        inner.forecast.prewake.is_none()
            && inner.idle_since.elapsed() >= self.idle_timeout_now(inner)
    }

    /// Counts a sleep that starts now as predictive when the ordinary idle timeout has not
    /// passed yet; returns whether it was.
    pub(super) fn note_sleep(&self, inner: &mut Inner, counts: &PredictionCounts) -> bool {
        let early = inner.idle_since.elapsed() < self.tenant.idle_timeout;
        if early {
            inner.forecast.counts.predictive_sleeps += 1;
            counts.predictive_sleeps.fetch_add(1, Ordering::Relaxed);
        }
        early
    }

    /// What the status shows of the tenant's runs.
    pub(super) fn run_status(&self, inner: &Inner) -> RunStatus {
        let f = &inner.forecast;
        let now = self.timings.clock.seconds();
        RunStatus {
            pattern: f.history.pattern(),
            next_run: f.history.next_run(now).map(|t| t as f64),
            remembered: f.history.starts().len(),
            seen: f.counts.seen,
            found_awake: f.counts.found_awake,
            prewakes_used: f.counts.prewakes_used,
            prewakes_wasted: f.counts.prewakes_wasted,
            predictive_sleeps: f.counts.predictive_sleeps,
        }
    }
}

/// A tenant's shared activity record: this replica's side of it and its namespace.
pub(super) type Shared = (Arc<SharedActivity>, String);

/// A wake claim: proof that a connection counts against its tenant; dropping it ends the claim
/// and starts the idle clock when it was the last one.
///
/// A session idle at a safe point marks its claim idle: when every claim of a tenant is idle,
/// the idle sleeper asks them all to park (leave their backend connections), and a claim
/// given up by a session parked for that reason does not restart the idle clock.
pub struct WakeClaim {
    pub(super) slot: Arc<Slot>,
    idle: AtomicBool,
    /// Given up by a session parked because the tenant was idle.
    parked_for_sleep: bool,
    /// The session's entry among the tenant's pinned sessions (while it has one).
    id: u64,
    /// Counted in the tenant's sessions inside a transaction block.
    in_transaction: AtomicBool,
}

impl WakeClaim {
    pub(super) fn new(slot: Arc<Slot>) -> WakeClaim {
        WakeClaim {
            id: slot.pinned.new_id(),
            slot,
            idle: AtomicBool::new(false),
            parked_for_sleep: false,
            in_transaction: AtomicBool::new(false),
        }
    }

    /// Records what pins the session to its backend connection, as a snapshot taken
    /// `quiet_for` after its last traffic found (none: it can move), so the tenant's status,
    /// logs and backend cap can say which sessions keep it awake and why. The entry goes when
    /// the claim does.
    pub fn set_pins(&self, pins: Pins, client: &SessionClient, quiet_for: Duration) {
        let tenant = &self.slot.tenant.id;
        self.slot
            .pinned
            .set(tenant, self.id, pins, client, quiet_for);
    }

    /// Marks the session inside a transaction block or out of one.
    pub fn set_in_transaction(&self, in_transaction: bool) {
        if self.in_transaction.swap(in_transaction, Ordering::AcqRel) != in_transaction {
            match in_transaction {
                true => self.slot.in_transaction.fetch_add(1, Ordering::AcqRel),
                false => self.slot.in_transaction.fetch_sub(1, Ordering::AcqRel),
            };
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

    /// How long the session may stay quiet before it counts as idle: the tenant's idle
    /// timeout, or a short grace once its run is over and the next is predicted far away.
    pub fn idle_timeout(&self) -> Duration {
        if self.slot.tenant.predict != PredictPolicy::WakeAndSleep {
            return self.slot.tenant.idle_timeout;
        }
        self.slot.idle_timeout_now(&self.slot.lock())
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
        self.set_in_transaction(false);
        self.slot.pinned.remove(&self.slot.tenant.id, self.id);
        let mut inner = self.slot.lock();
        inner.connections = inner.connections.saturating_sub(1);
        if *self.idle.get_mut() {
            inner.idle_connections = inner.idle_connections.saturating_sub(1);
        }
        if inner.connections == 0 {
            let now = Instant::now();
            if !self.parked_for_sleep {
                inner.forecast.last_client = Some(now);
            }
            inner.idle_since = if self.parked_for_sleep {
                self.slot.sleeper.notify_one();
                // Idle for as long as the sleep needs: the sessions waited that out already.
                now.checked_sub(self.slot.idle_timeout_now(&inner))
                    .unwrap_or(now)
            } else {
                now
            };
        }
    }
}
