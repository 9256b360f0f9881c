//! The idle sleeper: puts tenants to sleep once unused for their idle timeout, asks idle
//! sessions to park first, notices databases that stopped or moved by themselves, and takes over
//! databases left awake by an earlier gateway.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::stream::{self, StreamExt};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Phase;
use super::coordinator::WakeCoordinator;
use super::slot::{Inner, Slot};
use crate::{ComputeState, Tenant};

/// Tenants asked about at once when looking for databases left awake: a gateway that starts
/// beside thousands of discovered tenants gets through them in a few rounds of API calls
/// without sending them all at once, and its idle checks are not held up for long.
const TAKE_OVER_LOOKS_AT_ONCE: usize = 16;

impl WakeCoordinator {
    /// Puts tenants to sleep once they have had no connection for their idle timeout (and, for
    /// tenants with a shared activity record, no other live replica uses them), notices
    /// databases that stopped by themselves, renews this replica's entries in shared records,
    /// and wakes tenants ahead of their predicted runs; runs until `stop` fires. No tenant is
    /// woken ahead once `draining` fires (the gateway stops taking clients): a pre-wake then
    /// would start a database nobody can reach.
    pub async fn run_idle_sleeper(
        self: Arc<Self>,
        stop: CancellationToken,
        draining: CancellationToken,
    ) {
        let renewals = async {
            if let Some(activity) = &self.activity {
                self.renew_entries(activity, &stop).await;
            }
        };
        tokio::join!(
            self.look_for_idle_tenants(&stop),
            renewals,
            self.ahead.run(self.as_ref(), &draining)
        );
    }

    /// Asks each awake tenant's backend whether its database still runs, and puts to sleep
    /// those unused for their idle timeout (asking idle sessions to park first).
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
                // A sleep another replica decided is in the record before this one hears of it.
                let sleeps = match (&shared, gone) {
                    (Some((activity, namespace)), true) => {
                        activity.sleeps(namespace, &slot.tenant.id).await.ok()
                    }
                    _ => None,
                };
                let ask_record = {
                    let mut inner = slot.lock();
                    if inner.phase != Phase::Awake {
                        continue;
                    }
                    if gone {
                        let slept_elsewhere =
                            sleeps.is_some_and(|n| inner.shared.sleeps.is_some_and(|s| s != n));
                        match state {
                            Ok(ComputeState::Moved) => {
                                info!(tenant = %slot.tenant.id, "database moved; the next connection asks where")
                            }
                            _ if slept_elsewhere => {
                                info!(tenant = %slot.tenant.id, "another replica put the tenant to sleep")
                            }
                            _ => {
                                warn!(tenant = %slot.tenant.id, "database stopped on its own; the next connection wakes it")
                            }
                        }
                        if sleeps.is_some() {
                            inner.shared.sleeps = sleeps;
                        }
                        inner.endpoint = None;
                        slot.set_phase(&mut inner, Phase::Asleep);
                        slot.notify();
                        false
                    } else if inner.connections == 0
                        && inner.waiters == 0
                        && slot.idle_long_enough(&inner)
                    {
                        if shared.is_none() {
                            let early = slot.note_sleep(&mut inner, self.ahead.counts());
                            let idle_s = inner.idle_since.elapsed().as_secs_f64();
                            info!(tenant = %slot.tenant.id, idle_s, idle_timeout = ?slot.tenant.idle_timeout, early, "idle: putting tenant to sleep");
                            Self::start_sleep(slot, &mut inner, None);
                        }
                        shared.is_some()
                    } else {
                        let kept = self.held_by_pins(slot, &inner);
                        self.note_kept_awake(slot, &mut inner, kept);
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

    /// True when the tenant would sleep but for sessions that cannot move: every session that
    /// is not idle is pinned and has had no traffic for the idle timeout, or sits in a
    /// transaction block while the pinned ones have.
    fn held_by_pins(&self, slot: &Slot, inner: &Inner) -> bool {
        let busy = inner.connections.saturating_sub(inner.idle_connections);
        if busy == 0 || inner.waiters > 0 {
            return false;
        }
        let quiet = slot.idle_timeout_now(inner);
        let quiet_pinned = self.pinned.quiet_for(&slot.tenant.id, quiet);
        quiet_pinned > 0 && quiet_pinned + slot.in_transaction.load(Ordering::Acquire) >= busy
    }

    /// Logs, once per episode, that the tenant is past its idle timeout but cannot sleep
    /// (`kept`), with why; the episode ends when that is no longer so. The caller holds the
    /// slot's lock.
    pub(super) fn note_kept_awake(&self, slot: &Slot, inner: &mut Inner, kept: bool) {
        if !kept {
            inner.kept_awake_logged = false;
            return;
        }
        if std::mem::replace(&mut inner.kept_awake_logged, true) {
            return;
        }
        let Some(because) = self.awake_because(slot, inner) else {
            return;
        };
        info!(
            tenant = %slot.tenant.id,
            idle = ?slot.idle_timeout_now(inner),
            pinned = because.pinned.len(),
            open_transactions = because.open_transactions,
            other_replica = because.other_replica,
            reasons = because.describe().unwrap_or_default(),
            "past its idle timeout, the tenant cannot sleep"
        );
    }

    /// A database that outlives the gateway (backends with shared activity records) can be left
    /// running by a gateway before this one, or by a replica since gone, and nothing would put
    /// it to sleep until someone used it. Each such tenant is looked at once; one found awake
    /// is woken here (quick, it runs), so it sleeps after its idle timeout like any other
    /// unless a replica uses it (the shared record decides). Its run history is read from the
    /// shared record at the same time.
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
                let runs = match (
                    &self.activity,
                    tenant.backend.activity_namespace(&tenant.id),
                ) {
                    (Some(activity), Some(namespace)) => {
                        activity.runs(&namespace, &tenant.id).await.ok()
                    }
                    _ => None,
                };
                (tenant, state, runs)
            })
            .buffer_unordered(TAKE_OVER_LOOKS_AT_ONCE);
        while let Some((tenant, state, runs)) = looks.next().await {
            if state.is_err() {
                // Asked again at the next look.
                continue;
            }
            self.looked_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(tenant.id.clone());
            // The runs other replicas saw, so this one predicts from the same history before
            // any client comes to it.
            if let Some(runs) = runs.filter(|r| !r.is_empty())
                && let Ok(slot) = self.slot(&tenant.id)
            {
                self.ahead.take_runs(&mut slot.lock(), &runs);
            }
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
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
}
