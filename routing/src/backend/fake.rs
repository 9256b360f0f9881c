//! A scripted fake backend for unit tests of the coordinator: it answers wakes from a script
//! (ready after a delay, fail, refuse as unavailable, hang) and records every call with its
//! time, so faults and timings no real database produces on demand can be tested without
//! sockets or Postgres.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use super::{BackendError, ComputeBackend, ComputeState, Endpoint};
use crate::TenantId;

/// How the fake answers one wake.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WakeStep {
    /// Accepts logins after this long.
    Ready(Duration),
    /// Fails with [`BackendError::StartFailed`] after this long.
    Fail(Duration),
    /// Fails at once with [`BackendError::Unavailable`], which is not worth a retry.
    Unavailable,
    /// Never answers.
    Hang,
}

/// One call the fake received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// A wake began.
    Wake,
    /// A sleep began.
    Sleep,
    /// A sleep finished.
    SleepDone,
    /// The state was asked for.
    State,
}

struct Script {
    wakes: VecDeque<WakeStep>,
    /// The answer once `wakes` is used up.
    then: WakeStep,
    sleep_takes: Duration,
    running: bool,
    calls: Vec<(Instant, Call)>,
}

/// A compute backend that answers from a script and records its calls; see the module docs.
pub(crate) struct FakeBackend {
    script: Mutex<Script>,
}

impl FakeBackend {
    /// The address every successful wake answers with.
    pub(crate) const ENDPOINT: &str = "127.0.0.1:5432";

    /// A fake whose every wake is ready after one second and whose sleeps are instant.
    pub(crate) fn new() -> FakeBackend {
        FakeBackend {
            script: Mutex::new(Script {
                wakes: VecDeque::new(),
                then: WakeStep::Ready(Duration::from_secs(1)),
                sleep_takes: Duration::ZERO,
                running: false,
                calls: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers the next wakes with `steps`, in order, before falling back to `then`.
    pub(crate) fn script_wakes(self, steps: impl IntoIterator<Item = WakeStep>) -> Self {
        self.lock().wakes.extend(steps);
        self
    }

    /// Answers every wake after the scripted ones with `step`.
    pub(crate) fn then(self, step: WakeStep) -> Self {
        self.lock().then = step;
        self
    }

    /// Makes each sleep take this long.
    pub(crate) fn sleep_takes(self, d: Duration) -> Self {
        self.lock().sleep_takes = d;
        self
    }

    /// The database stops without being asked, as a crashed or externally stopped one does.
    pub(crate) fn stop_on_its_own(&self) {
        self.lock().running = false;
    }

    /// Every call so far with its time, oldest first.
    pub(crate) fn calls(&self) -> Vec<(Instant, Call)> {
        self.lock().calls.clone()
    }

    /// When each wake began, oldest first.
    pub(crate) fn wakes(&self) -> Vec<Instant> {
        self.times_of(Call::Wake)
    }

    /// When each call of this kind was made, oldest first.
    pub(crate) fn times_of(&self, call: Call) -> Vec<Instant> {
        self.lock()
            .calls
            .iter()
            .filter(|(_, c)| *c == call)
            .map(|(t, _)| *t)
            .collect()
    }

    fn record(&self, call: Call) {
        self.lock().calls.push((Instant::now(), call));
    }
}

#[async_trait]
impl ComputeBackend for FakeBackend {
    fn kind(&self) -> &'static str {
        "fake"
    }

    async fn wake(&self, _tenant: &TenantId) -> Result<Endpoint, BackendError> {
        let step = {
            let mut script = self.lock();
            script.calls.push((Instant::now(), Call::Wake));
            let then = script.then;
            script.wakes.pop_front().unwrap_or(then)
        };
        match step {
            WakeStep::Ready(d) => {
                sleep(d).await;
                self.lock().running = true;
                Ok(Endpoint::parse(Self::ENDPOINT).expect("a valid address"))
            }
            WakeStep::Fail(d) => {
                sleep(d).await;
                Err(BackendError::StartFailed("scripted failure".into()))
            }
            WakeStep::Unavailable => Err(BackendError::Unavailable("scripted: no binaries".into())),
            WakeStep::Hang => std::future::pending().await,
        }
    }

    async fn sleep(&self, _tenant: &TenantId) -> Result<(), BackendError> {
        self.record(Call::Sleep);
        let d = self.lock().sleep_takes;
        sleep(d).await;
        self.lock().running = false;
        self.record(Call::SleepDone);
        Ok(())
    }

    async fn state(&self, _tenant: &TenantId) -> Result<ComputeState, BackendError> {
        self.record(Call::State);
        Ok(if self.lock().running {
            ComputeState::Awake
        } else {
            ComputeState::Asleep
        })
    }
}
