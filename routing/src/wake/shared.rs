//! The sleep decision replicas share: a tenant whose backend several gateway replicas use sleeps
//! only when its shared activity record ([`crate::activity`]) shows no other live replica using
//! it. This replica enters itself before it uses or wakes the tenant, renews its entry while it
//! does, and takes it out to put the tenant to sleep.

use std::sync::Arc;

use tokio::time::{Instant, sleep, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Phase;
use super::WakeError;
use super::coordinator::WakeCoordinator;
use super::slot::{Inner, Shared, Slot};
use crate::activity::{ActivityError, Release, SharedActivity};

impl WakeCoordinator {
    /// The tenant's shared activity record, when replicas share its backend.
    pub(super) fn shared(&self, slot: &Slot) -> Option<Shared> {
        let activity = self.activity.as_ref()?;
        let namespace = slot.tenant.backend.activity_namespace(&slot.tenant.id)?;
        Some((activity.clone(), namespace))
    }

    /// True when this replica must write its entry before it uses the tenant: it has none that
    /// is fresh (renewals keep it younger than half the TTL), and the API has not just failed.
    pub(super) fn needs_hold(activity: &SharedActivity, inner: &Inner) -> bool {
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
    pub(super) fn wants_hold(slot: &Slot, inner: &Inner) -> bool {
        matches!(inner.phase, Phase::Awake | Phase::Waking)
            && (inner.connections > 0
                || inner.waiters > 0
                || inner.idle_since.elapsed() < slot.tenant.idle_timeout)
    }

    /// Enters this replica in the tenant's shared record, waiting (until `deadline`) while
    /// another replica puts the tenant to sleep. When the API cannot be reached the tenant is
    /// used anyway: an awake tenant keeps serving.
    pub(super) async fn hold(
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
        let runs = slot.lock().forecast.history.starts().to_vec();
        let gap = self.settings.predict.run_gap.as_secs();
        let result = activity
            .hold(namespace, id, Some(deadline), &runs, gap)
            .await;
        let mut inner = slot.lock();
        match result {
            Ok(holding) => {
                inner.shared.renewed_at = Some(Instant::now());
                inner.shared.failed_at = None;
                inner.shared.next_look = None;
                inner.shared.held_elsewhere = false;
                Self::note_sleeps(slot, &mut inner, holding.sleeps);
                self.ahead.take_runs(&mut inner, &holding.runs);
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
    pub(super) fn note_sleeps(slot: &Slot, inner: &mut Inner, sleeps: u64) {
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
    pub(super) async fn sleep_if_unused(
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
                        && slot.idle_long_enough(&inner)
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
        inner.shared.held_elsewhere = matches!(result, Ok(Release::Held { .. }));
        match &result {
            Ok(Release::Sleep { sleeps }) => {
                inner.shared.sleeps = Some(*sleeps);
                inner.shared.next_look = None;
                let early = !forced && slot.note_sleep(&mut inner, self.ahead.counts());
                info!(tenant = %id, idle = ?slot.tenant.idle_timeout, early, "no replica uses the tenant: putting it to sleep");
                Self::start_sleep(
                    slot,
                    &mut inner,
                    Some((activity.clone(), namespace.clone())),
                );
            }
            Ok(Release::Held { recheck_in }) => {
                debug!(tenant = %id, recheck_in = ?recheck_in, "another replica uses the tenant: not sleeping");
                inner.shared.next_look = Some(Instant::now() + (*recheck_in).min(activity.ttl()));
                if !forced {
                    self.note_kept_awake(slot, &mut inner, true);
                }
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

    /// Rewrites this replica's entries before they get old: every sixth of the TTL it renews
    /// those written a third of the TTL ago or more (and writes those that failed to), for
    /// tenants it still uses.
    pub(super) async fn renew_entries(&self, activity: &SharedActivity, stop: &CancellationToken) {
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
                let runs = {
                    let inner = slot.lock();
                    let due = inner
                        .shared
                        .renewed_at
                        .is_none_or(|t| t.elapsed() >= ttl / 3);
                    if !due || !Self::wants_hold(slot, &inner) {
                        continue;
                    }
                    inner.forecast.history.starts().to_vec()
                };
                let gap = self.settings.predict.run_gap.as_secs();
                let result = activity.hold(&namespace, id, None, &runs, gap).await;
                let mut inner = slot.lock();
                match result {
                    Ok(holding) => {
                        inner.shared.renewed_at = Some(Instant::now());
                        inner.shared.failed_at = None;
                        Self::note_sleeps(slot, &mut inner, holding.sleeps);
                        self.ahead.take_runs(&mut inner, &holding.runs);
                    }
                    Err(e) => {
                        warn!(tenant = %id, error = %e, "cannot renew this replica's activity record");
                        inner.shared.failed_at = Some(Instant::now());
                    }
                }
            }
        }
    }
}
