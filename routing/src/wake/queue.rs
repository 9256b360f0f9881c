//! Admission: a connection gets its tenant's endpoint at once when the tenant is awake, or waits
//! in the tenant's accept queue, bounded per tenant and in total, for the single wake.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::{Instant, timeout_at};

use super::coordinator::WakeCoordinator;
use super::slot::{Slot, WakeClaim};
use super::{Phase, WakeError};
use crate::{Endpoint, TenantId};

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

impl WakeCoordinator {
    /// True when the tenant accepts connections right now (no wait needed).
    pub fn is_awake(&self, tenant: &TenantId) -> bool {
        self.slot(tenant)
            .is_ok_and(|s| s.lock().phase == Phase::Awake)
    }

    /// Admits a client connection: at once if the tenant is awake, else after the (single)
    /// wake.
    pub async fn ensure_awake(&self, tenant: &TenantId) -> Result<Admission, WakeError> {
        self.admit(tenant, true).await
    }

    /// Admits a connection; `client` is false for the admin API's wake, which starts no run.
    pub(super) async fn admit(
        &self,
        tenant: &TenantId,
        client: bool,
    ) -> Result<Admission, WakeError> {
        let slot = &self.slot(tenant)?;
        let shared = self.shared(slot);
        let deadline = Instant::now() + self.settings.wake_timeout;
        let mut waiter: Option<Waiter<'_>> = None;
        let mut arrival = client;
        loop {
            // Subscribing under the lock means no change between the check and the wait is lost.
            let mut changed = slot.changed.subscribe();
            let hold = {
                let mut inner = slot.lock();
                // Under the lock that admits it or queues it, so that of connections arriving
                // together only the first can start a run.
                if std::mem::take(&mut arrival) {
                    self.ahead.note_arrival(slot, &mut inner);
                }
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
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
}
