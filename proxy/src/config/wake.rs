//! `[wake]`: the accept queue, wake retries and idle sleep.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use pgwake_routing::{PredictPolicy, PredictSettings};
use serde::Deserialize;

use super::{ConfigError, invalid, nonzero};

/// `[wake]`: the accept queue, wake retries and idle sleep.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WakeConfig {
    /// How long a connection waits for its tenant to wake before FATAL 57P03.
    #[serde(with = "super::duration")]
    pub wake_timeout: Duration,
    /// Connections that may wait for one tenant; more get FATAL 53300 at once.
    pub max_waiters_per_tenant: usize,
    /// Connections that may wait across all tenants.
    pub max_waiters_total: usize,
    /// Attempts one wake makes before the tenant is marked failed.
    pub attempts: u32,
    /// Pause after a failed attempt (doubling each time).
    #[serde(with = "super::duration")]
    pub retry_backoff: Duration,
    /// How long a failed tenant refuses connections before the next wake.
    #[serde(with = "super::duration")]
    pub failed_retry_delay: Duration,
    /// A tenant with no connections for this long is put to sleep (per-tenant override:
    /// `idle_timeout` in `[[tenant]]`).
    #[serde(with = "super::duration")]
    pub idle_timeout: Duration,
    /// How often idle tenants are looked for.
    #[serde(with = "super::duration")]
    pub idle_check_interval: Duration,
    /// Tell clients that must wait "waking database …" with a NoticeResponse; sent after the
    /// gateway's AuthenticationOk (clients refuse notices earlier), so only for tenants the
    /// gateway authenticates.
    pub wake_notice: bool,
    /// What tenants' run predictions are used for: `off`, `wake` (wake ahead of a predicted
    /// run) or `wake_and_sleep` (also sleep soon after a run when the next is far away);
    /// per-tenant override: `predict` in `[[tenant]]`.
    pub predict: PredictPolicy,
    /// Added to a tenant's slowest recent wake when waking it ahead of a predicted run.
    #[serde(with = "super::duration")]
    pub predict_margin: Duration,
    /// With `wake_and_sleep`, how long a tenant stays up after a run when the next is far.
    #[serde(with = "super::duration")]
    pub predict_sleep_grace: Duration,
    /// A connection after this long without one starts a new run (as does the first after a
    /// sleep). Keep it away from the periods tenants are used at: a period close to it is
    /// counted every other time.
    #[serde(with = "super::duration")]
    pub predict_run_gap: Duration,
    /// Where run histories are kept across restarts (default: `pgwake-runs.json` in `[local]
    /// data_dir` when a tenant uses the local backend, else in memory only). Its folder must be
    /// writable by the gateway's user alone.
    pub predict_history_file: Option<PathBuf>,
    /// Largest run history file read or written: a larger one is not loaded, and histories
    /// that would make one are not written (warned about once).
    pub predict_history_max_size: ByteSize,
}

impl Default for WakeConfig {
    fn default() -> Self {
        // The predictor's timings default where the predictor is, so the two cannot drift.
        let predict = PredictSettings::default();
        WakeConfig {
            wake_timeout: Duration::from_secs(30),
            max_waiters_per_tenant: 1000,
            max_waiters_total: 10_000,
            attempts: 3,
            retry_backoff: Duration::from_millis(200),
            failed_retry_delay: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            idle_check_interval: Duration::from_secs(1),
            wake_notice: false,
            predict: PredictPolicy::Wake,
            predict_margin: predict.margin,
            predict_sleep_grace: predict.sleep_grace,
            predict_run_gap: predict.run_gap,
            predict_history_file: None,
            predict_history_max_size: ByteSize::b(predict.history_max_bytes),
        }
    }
}

impl WakeConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let times = [
            self.wake_timeout,
            self.idle_check_interval,
            self.predict_run_gap,
        ];
        let why = "wake_timeout, idle_check_interval and predict_run_gap must be greater than zero";
        nonzero("wake.wake_timeout", &times, why)?;
        if self.max_waiters_per_tenant == 0 || self.max_waiters_total == 0 || self.attempts == 0 {
            return Err(invalid(
                "wake.max_waiters_per_tenant",
                "max_waiters_per_tenant, max_waiters_total and attempts must be at least 1",
            ));
        }
        Ok(())
    }
}
