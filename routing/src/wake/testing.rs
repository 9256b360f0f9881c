//! What the coordinator's tests share: a coordinator over fake-backed tenants on tokio's paused
//! clock, and small helpers.

pub(super) use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::{Admission, PredictSettings, TenantStatus, WakeCoordinator, WakeError, WakeEvent};
use crate::backend::FixedBackend;
use crate::predict::PredictPolicy;
use crate::{Endpoint, Tenant, TenantDirectory};

// What most of the tests use, so each module's tests start with one import.
pub(super) use super::{WAKE_HISTORY, WakeSettings, epoch_seconds};
pub(super) use crate::TenantId;
pub(super) use crate::backend::fake::{Call, FakeBackend, WakeStep};
pub(super) use futures_util::future::join_all;
pub(super) use std::time::Duration;
pub(super) use tokio::time::{Instant, sleep, timeout};

pub(super) fn coordinator() -> (Arc<WakeCoordinator>, TenantId) {
    let id = TenantId::parse("t").unwrap();
    let directory = Arc::new(TenantDirectory::new([Tenant {
        id: id.clone(),
        backend: Arc::new(FixedBackend::new(Endpoint::parse("127.0.0.1:1").unwrap())),
        idle_timeout: Duration::from_secs(3600),
        predict: PredictPolicy::Off,
    }]));
    let settings = WakeSettings {
        wake_timeout: Duration::from_secs(5),
        max_waiters_per_tenant: 10,
        max_waiters_total: 10,
        attempts: 1,
        retry_backoff: Duration::from_millis(10),
        failed_retry_delay: Duration::from_secs(1),
        idle_check_interval: Duration::from_secs(3600),
        predict: PredictSettings::default(),
    };
    (WakeCoordinator::new(directory, settings, |_| {}), id)
}

pub(super) const SECOND: Duration = Duration::from_secs(1);

/// Settings for the scripted tests: generous queues and deadline, three attempts.
pub(super) fn settings() -> WakeSettings {
    WakeSettings {
        wake_timeout: 30 * SECOND,
        max_waiters_per_tenant: 100,
        max_waiters_total: 100,
        attempts: 3,
        retry_backoff: Duration::from_millis(100),
        failed_retry_delay: 10 * SECOND,
        idle_check_interval: SECOND,
        predict: PredictSettings::default(),
    }
}

/// A coordinator over fake-backed tenants, and the wake events it reported.
pub(super) struct Lab {
    pub(super) coordinator: Arc<WakeCoordinator>,
    pub(super) directory: Arc<TenantDirectory>,
    events: Arc<Mutex<Vec<WakeEvent>>>,
}

impl Lab {
    pub(super) fn new(
        settings: WakeSettings,
        idle_timeout: Duration,
        tenants: &[(&TenantId, &Arc<FakeBackend>)],
    ) -> Lab {
        Self::predicting(settings, idle_timeout, PredictPolicy::Off, tenants)
    }

    /// A lab whose tenants use run predictions for `predict`.
    pub(super) fn predicting(
        settings: WakeSettings,
        idle_timeout: Duration,
        predict: PredictPolicy,
        tenants: &[(&TenantId, &Arc<FakeBackend>)],
    ) -> Lab {
        let directory = Arc::new(TenantDirectory::new(tenants.iter().map(|(id, backend)| {
            Tenant {
                id: (*id).clone(),
                backend: (*backend).clone(),
                idle_timeout,
                predict,
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

    pub(super) fn status(&self, id: &TenantId) -> TenantStatus {
        self.coordinator
            .status()
            .into_iter()
            .find(|s| s.id == id.as_str())
            .expect("a known tenant")
    }

    /// Outcomes of the finished wakes so far, oldest first.
    pub(super) fn wake_outcomes(&self) -> Vec<bool> {
        self.events.lock().unwrap().iter().map(|e| e.ok).collect()
    }

    /// Starts the idle sleeper; it stops when the returned token is dropped.
    pub(super) fn run_idle_sleeper(&self) -> tokio_util::sync::DropGuard {
        self.run_idle_sleeper_until_draining(CancellationToken::new())
    }

    /// Starts the idle sleeper, told the gateway drains when `draining` fires; it stops when
    /// the returned token is dropped.
    pub(super) fn run_idle_sleeper_until_draining(
        &self,
        draining: CancellationToken,
    ) -> tokio_util::sync::DropGuard {
        let stop = CancellationToken::new();
        let sleeper = self
            .coordinator
            .clone()
            .run_idle_sleeper(stop.clone(), draining);
        tokio::spawn(sleeper);
        stop.drop_guard()
    }

    /// A connection to `id` waiting in a task of its own.
    pub(super) fn spawn_waiter(
        &self,
        id: &TenantId,
    ) -> tokio::task::JoinHandle<Result<Admission, WakeError>> {
        let coordinator = self.coordinator.clone();
        let id = id.clone();
        tokio::spawn(async move { coordinator.ensure_awake(&id).await })
    }
}

pub(super) fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).unwrap()
}

pub(super) fn fake(backend: FakeBackend) -> Arc<FakeBackend> {
    Arc::new(backend)
}

/// The error of an admission that must fail (`Admission` has no `Debug`).
pub(super) fn refused(result: Result<Admission, WakeError>) -> WakeError {
    match result {
        Ok(_) => panic!("admitted, but a refusal was expected"),
        Err(e) => e,
    }
}

/// Lets every spawned task run until it waits, without moving the paused clock.
pub(super) async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// Timers of the paused clock fire on whole milliseconds, so durations are checked to two.
pub(super) fn assert_about(actual: Duration, expected: Duration) {
    assert!(
        actual.abs_diff(expected) <= Duration::from_millis(2),
        "{actual:?} is not about {expected:?}"
    );
}
