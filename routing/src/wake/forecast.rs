//! The values run predictions are made of, which a tenant's slot holds and the scheduler
//! (`ahead`), the sleeper and the shared activity record read and update: the clock predictions
//! read, the timings a slot copies from the settings, a tenant's runs and pre-wake, and the
//! gateway's totals. No behaviour of its own beyond the clock: it is where the slot and the
//! scheduler meet without knowing each other.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::PredictSettings;
use crate::predict::RunHistory;

/// Wall-clock seconds read through tokio's clock: the predictor works in seconds since the
/// epoch, and a paused clock (tests, the simulated benchmark) moves them as it moves timers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    epoch: SystemTime,
    at: Instant,
}

impl Clock {
    /// A clock reading the wall clock's time now.
    pub(super) fn start() -> Clock {
        Clock {
            epoch: SystemTime::now(),
            at: Instant::now(),
        }
    }

    /// Seconds since the Unix epoch.
    pub(super) fn seconds(&self) -> u64 {
        (self.epoch + self.at.elapsed())
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// What every slot needs of the predictive settings: copied in, so a claim can work out its
/// idle timeout without the coordinator or the scheduler.
#[derive(Clone, Copy, Debug)]
pub(super) struct ForecastTimings {
    pub(super) margin: Duration,
    pub(super) sleep_grace: Duration,
    pub(super) clock: Clock,
}

impl ForecastTimings {
    pub(super) fn new(settings: &PredictSettings, clock: Clock) -> ForecastTimings {
        ForecastTimings {
            margin: settings.margin,
            sleep_grace: settings.sleep_grace,
            clock,
        }
    }
}

/// A wake started ahead of a predicted run, until the run comes or its window closes.
#[derive(Clone, Copy, Debug)]
pub(super) struct PreWake {
    /// When it started, seconds since the epoch.
    pub(super) since: u64,
    /// The end of the predicted run's window, seconds since the epoch.
    pub(super) until: u64,
}

/// A tenant's runs and what came of the predictions made from them.
#[derive(Debug)]
pub(super) struct Forecast {
    pub(super) history: RunHistory,
    /// When a client connection last came or (unless parked for a sleep) went.
    pub(super) last_client: Option<Instant>,
    pub(super) prewake: Option<PreWake>,
    pub(super) counts: RunCounts,
}

/// What a tenant's runs and predictions came to since the gateway started.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RunCounts {
    pub(super) seen: u64,
    pub(super) found_awake: u64,
    pub(super) prewakes_used: u64,
    pub(super) prewakes_wasted: u64,
    pub(super) predictive_sleeps: u64,
}

impl Forecast {
    pub(super) fn new(history: RunHistory) -> Forecast {
        Forecast {
            history,
            last_client: None,
            prewake: None,
            counts: RunCounts::default(),
        }
    }
}

/// The gateway's totals of runs and predictions, for metrics: they outlive removed tenants.
#[derive(Debug, Default)]
pub struct PredictionCounts {
    /// Runs whose first connection found the tenant awake.
    pub runs_found_awake: AtomicU64,
    /// Runs whose first connection had to wait for a wake.
    pub runs_found_asleep: AtomicU64,
    /// Wakes ahead of a predicted run that the run used.
    pub prewakes_used: AtomicU64,
    /// Wakes ahead of a predicted run that did not come.
    pub prewakes_wasted: AtomicU64,
    /// Sleeps before the idle timeout because the next run was predicted far away.
    pub predictive_sleeps: AtomicU64,
}
