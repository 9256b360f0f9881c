//! The `WakeCoordinator`: per-tenant state, exactly one wake in flight per tenant, bounded accept
//! queues with deadlines, failure back-off, idle sleep, and predictive wake and sleep.
//!
//! A connection asks `ensure_awake`; if the tenant is awake it gets the endpoint and a claim at
//! once. Otherwise it waits in the accept queue (bounded per tenant and in total) while a single
//! wake task runs; the task outlives any one waiter, so a client giving up never cancels a wake
//! others wait for.
//!
//! - `queue`: admission, the accept queue;
//! - `coordinator`: the tenants' slots, waking and putting to sleep, the admin API;
//! - `sleeper`: the idle sleeper, which puts unused tenants to sleep;
//! - `shared`: the sleep decision replicas share through the Kubernetes API;
//! - `ahead`: the scheduler of predictive wakes, which the coordinator owns and which sees it
//!   only through a narrow handle (the slots, and starting a wake);
//! - `slot`: one tenant's state, and the claims and marks connections hold on it;
//! - `forecast`: the values run predictions are made of (a tenant's runs and pre-wake, the
//!   clock, the totals), where the slot and the scheduler meet without knowing each other;
//! - `pinned`: the sessions that cannot leave their backend connections, per tenant.
//!
//! `queue`, `sleeper` and `shared` are the coordinator's own methods in files of their own;
//! nothing below the coordinator uses it, and the run predictor itself is sans-io
//! ([`crate::predict`]).

mod ahead;
mod coordinator;
mod forecast;
mod pinned;
mod queue;
mod shared;
mod sleeper;
mod slot;
#[cfg(test)]
mod testing;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use thiserror::Error;

use crate::TenantId;
use crate::predict::{Pattern, PredictPolicy};

pub use coordinator::WakeCoordinator;
pub use forecast::PredictionCounts;
pub use pinned::{PinnedSession, PinnedSessions, SessionClient};
pub use queue::Admission;
pub use slot::{ParkedMark, WakeClaim};

/// Finished wakes each tenant remembers for the admin API (`wakes` in its status): enough for a
/// latency sparkline, few enough to copy on every status request.
pub const WAKE_HISTORY: usize = 20;

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
    /// How often idle tenants are looked for (and predicted runs looked ahead to).
    pub idle_check_interval: Duration,
    /// Predictive wake and sleep.
    pub predict: PredictSettings,
}

/// Timings of predictive wake and sleep, for tenants that opt in ([`PredictPolicy`]).
#[derive(Clone, Debug)]
pub struct PredictSettings {
    /// Added to a tenant's slowest recent wake when waking it ahead of a predicted run.
    pub margin: Duration,
    /// With [`PredictPolicy::WakeAndSleep`], how long a tenant stays up after its run ended
    /// when the next run is predicted further away than its idle timeout.
    pub sleep_grace: Duration,
    /// A client connection after this long without one starts a new run (so does the first
    /// after a sleep). Uses at a period close to it are counted as runs every other time, as
    /// their start times stray to either side; the default, 45 s, lies halfway between the
    /// common half-minute and minute periods.
    pub run_gap: Duration,
    /// Where run histories are kept across restarts (none: in memory only), in a folder only
    /// the gateway's user can write.
    pub history_file: Option<PathBuf>,
    /// Largest history file read or written.
    pub history_max_bytes: u64,
}

impl Default for PredictSettings {
    fn default() -> Self {
        PredictSettings {
            margin: Duration::from_secs(2),
            sleep_grace: Duration::from_secs(15),
            run_gap: Duration::from_secs(45),
            history_file: None,
            history_max_bytes: 1 << 20,
        }
    }
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
    /// What run predictions are used for.
    pub predict: PredictPolicy,
    /// Runs, predictions and what came of them.
    pub runs: RunStatus,
    /// While awake, what keeps it from sleeping.
    pub awake_because: Option<AwakeBecause>,
}

/// What keeps an awake tenant from sleeping, as its status shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AwakeBecause {
    /// Sessions in use: not idle for the idle timeout, not pinned, not in a transaction.
    pub active_sessions: usize,
    /// Sessions inside a transaction block (busy or idle in it): they cannot move until it
    /// ends.
    pub open_transactions: usize,
    /// Sessions that cannot leave their backend connection, with why and whose they are.
    pub pinned: Vec<PinnedSession>,
    /// Sessions idle for the idle timeout, which park once every other session is idle too.
    pub idle_sessions: usize,
    /// Connections waiting for the tenant.
    pub waiting: usize,
    /// Woken ahead of a predicted run: not put to sleep until the run's window has passed.
    pub prewake: bool,
    /// Another gateway replica uses the tenant (its shared activity record says so).
    pub other_replica: bool,
    /// Without sessions: seconds left on the idle clock before it sleeps.
    pub sleeps_in_s: Option<f64>,
}

impl AwakeBecause {
    /// The reasons in words for a log line; `None` when there is nothing but the idle clock.
    pub fn describe(&self) -> Option<String> {
        let mut out = Vec::new();
        if let Some(pinned) = PinnedSession::describe_all(&self.pinned) {
            out.push(pinned);
        }
        let counts = [
            (self.open_transactions, "in an open transaction"),
            (self.active_sessions, "active"),
            (self.waiting, "waiting"),
        ];
        for (n, what) in counts {
            if n > 0 {
                out.push(format!("{n} session(s) {what}"));
            }
        }
        if self.prewake {
            out.push("woken ahead of a predicted run".to_owned());
        }
        if self.other_replica {
            out.push("another gateway replica uses it".to_owned());
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// A tenant's runs and the predictions made from them, as its status shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunStatus {
    /// The pattern the recent runs follow, when one is recognised.
    pub pattern: Option<Pattern>,
    /// When the next run is expected, seconds since the Unix epoch.
    pub next_run: Option<f64>,
    /// Runs remembered (at most [`crate::predict::HISTORY`]).
    pub remembered: usize,
    /// Runs since the gateway started.
    pub seen: u64,
    /// Of those, runs whose first connection found the tenant awake.
    pub found_awake: u64,
    /// Wakes ahead of a predicted run that the run then used.
    pub prewakes_used: u64,
    /// Wakes ahead of a predicted run that did not come.
    pub prewakes_wasted: u64,
    /// Sleeps before the idle timeout because the next run was far.
    pub predictive_sleeps: u64,
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

/// Seconds since the Unix epoch of `t`, as the admin API shows times.
fn epoch_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
