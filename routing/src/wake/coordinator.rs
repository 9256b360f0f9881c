//! The coordinator: every tenant's slot, the single wake and the sleep of each, and what the
//! admin API asks of them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout_at};
use tracing::{info, warn};

use super::ahead::{LookAhead, WakeStarter};
use super::forecast::PredictionCounts;
use super::pinned::PinnedSessions;
use super::slot::{Inner, Shared, Slot};
use super::{AwakeBecause, Phase, TenantStatus, WakeError, WakeEvent, WakeSettings};
use crate::activity::{Release, SharedActivity};
use crate::predict::RunHistory;
use crate::{BackendError, Tenant, TenantDirectory, TenantId};

type OnWake = Arc<dyn Fn(&WakeEvent) + Send + Sync>;

/// Wakes tenants on demand, one wake per tenant at a time, and puts idle ones to sleep.
pub struct WakeCoordinator {
    pub(super) directory: Arc<TenantDirectory>,
    /// Per-tenant state, made on first use, so tenants added to the directory later get one.
    slots: RwLock<HashMap<TenantId, Arc<Slot>>>,
    pub(super) settings: WakeSettings,
    pub(super) waiters_total: AtomicUsize,
    on_wake: OnWake,
    /// Running time of tenants that left the directory, per backend kind, so the totals never
    /// go down.
    awake_of_removed: Mutex<HashMap<&'static str, Duration>>,
    /// Shared with every slot; see [`Slot::sleeper`].
    pub(super) sleeper: Arc<Notify>,
    /// The shared activity records of tenants whose backends several replicas share.
    pub(super) activity: Option<Arc<SharedActivity>>,
    /// When the coordinator (the gateway) started: every tenant is asleep since then until it
    /// is first woken, however late its state is first asked for.
    started: SystemTime,
    /// Tenants whose databases outlive this process that were looked at once for being left
    /// awake ([`WakeCoordinator::take_over_left_awake`]).
    pub(super) looked_at: Mutex<HashSet<TenantId>>,
    /// The scheduler of predictive wakes, with the clock run predictions read, the run
    /// histories and the totals of runs and predictions.
    pub(super) ahead: LookAhead,
    /// Every tenant's pinned sessions, as their sessions report them.
    pub(super) pinned: Arc<PinnedSessions>,
}

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
        let ahead = LookAhead::new(&settings, |id| directory.get(id).is_some());
        Arc::new(WakeCoordinator {
            activity,
            ahead,
            directory,
            slots: RwLock::new(HashMap::new()),
            settings,
            waiters_total: AtomicUsize::new(0),
            on_wake: Arc::new(on_wake),
            awake_of_removed: Mutex::new(HashMap::new()),
            sleeper: Arc::new(Notify::new()),
            started: SystemTime::now(),
            looked_at: Mutex::new(HashSet::new()),
            pinned: Arc::default(),
        })
    }

    /// The state of the tenant the directory holds now. A tenant replaced in the directory
    /// (its cluster changed) starts over with a fresh slot; connections admitted before keep
    /// the old one through their claims.
    pub(super) fn slot(&self, tenant: &TenantId) -> Result<Arc<Slot>, WakeError> {
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
                    // The database changed, the tenant's habits did not.
                    let runs = s.lock().forecast.history.clone();
                    *s = Arc::new(self.new_slot(&current, SystemTime::now(), runs));
                }
            })
            .or_insert_with(|| {
                let runs = self.ahead.take_history(tenant);
                Arc::new(self.new_slot(&current, self.started, runs))
            });
        Ok(slot.clone())
    }

    fn new_slot(&self, tenant: &Arc<Tenant>, since: SystemTime, runs: RunHistory) -> Slot {
        let reports = (self.sleeper.clone(), self.pinned.clone());
        Slot::new(tenant.clone(), reports, since, self.ahead.timings(), runs)
    }

    pub(super) fn read_slots(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, HashMap<TenantId, Arc<Slot>>> {
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the tenant's single wake task; the caller holds the slot's lock.
    pub(super) fn start_wake(&self, slot: &Arc<Slot>, inner: &mut Inner) {
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
    pub(super) fn start_sleep(slot: &Arc<Slot>, inner: &mut Inner, shared: Option<Shared>) {
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
        self.admit(tenant, false).await.map(drop)
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
                    since: super::epoch_seconds(inner.since),
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
                    predict: slot.tenant.predict,
                    runs: slot.run_status(&inner),
                    awake_because: self.awake_because(&slot, &inner),
                }
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Every tenant's pinned sessions: what the sessions report, for whoever must say what
    /// holds a tenant's backend connections.
    pub fn pinned_sessions(&self) -> Arc<PinnedSessions> {
        self.pinned.clone()
    }

    /// What keeps the tenant awake, while it is; the caller holds the slot's lock.
    pub(super) fn awake_because(&self, slot: &Slot, inner: &Inner) -> Option<AwakeBecause> {
        if inner.phase != Phase::Awake {
            return None;
        }
        let pinned = self.pinned.of(&slot.tenant.id);
        let open_transactions = slot.in_transaction.load(Ordering::Acquire);
        let active_sessions = inner
            .connections
            .saturating_sub(inner.idle_connections)
            .saturating_sub(pinned.len())
            .saturating_sub(open_transactions);
        let prewake = inner.forecast.prewake.is_some();
        let sleeps_in_s = (inner.connections == 0 && inner.waiters == 0 && !prewake).then(|| {
            let left = slot
                .idle_timeout_now(inner)
                .saturating_sub(inner.idle_since.elapsed());
            left.as_secs_f64()
        });
        Some(AwakeBecause {
            active_sessions,
            open_transactions,
            pinned,
            idle_sessions: inner.idle_connections,
            waiting: inner.waiters,
            prewake,
            other_replica: inner.shared.held_elsewhere,
            sleeps_in_s,
        })
    }

    /// Seconds since the Unix epoch on the coordinator's clock, which the run predictions read.
    pub fn clock_seconds(&self) -> u64 {
        self.ahead.clock_seconds()
    }

    /// The gateway's totals of runs and predictions.
    pub fn prediction_counts(&self) -> &PredictionCounts {
        self.ahead.counts()
    }

    /// How many tenants the coordinator serves now.
    pub fn tenant_count(&self) -> usize {
        self.directory.len()
    }

    /// Connections waiting for a wake, across all tenants.
    pub fn waiters_total(&self) -> usize {
        self.waiters_total.load(Ordering::Relaxed)
    }

    /// Drops the state of tenants that left the directory (or were replaced); their open
    /// connections keep what they hold.
    pub(super) fn forget_removed(&self) {
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

/// The scheduler's handle on its coordinator.
impl WakeStarter for WakeCoordinator {
    fn slots(&self) -> Vec<Arc<Slot>> {
        self.read_slots().values().cloned().collect()
    }

    fn start(&self, slot: &Arc<Slot>, inner: &mut Inner) {
        self.start_wake(slot, inner);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
