//! `[reuse]`: keeping backend connections of departed clients for the next ones.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, nonzero, positive};

/// `[reuse]`: backend connections of clients that left at a safe point, reset with
/// `DISCARD ALL` and kept for the next client with the same tenant and startup parameters.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReuseConfig {
    /// Keep connections for reuse; sessions the gateway authenticated take part, passthrough
    /// ones only where their tenant sets `reuse_passthrough`.
    pub enabled: bool,
    /// Idle connections kept for one tenant and set of startup parameters.
    pub max_idle_per_key: usize,
    /// Idle connections kept in all (the oldest of another key gives way when full).
    pub max_idle_total: usize,
    /// An idle connection kept longer than this is closed.
    #[serde(with = "super::duration")]
    pub idle_timeout: Duration,
    /// Time the reset (`DISCARD ALL`) of a returned connection may take.
    #[serde(with = "super::duration")]
    pub reset_timeout: Duration,
}

impl Default for ReuseConfig {
    fn default() -> Self {
        ReuseConfig {
            enabled: true,
            max_idle_per_key: 16,
            max_idle_total: 256,
            idle_timeout: Duration::from_secs(60),
            reset_timeout: Duration::from_secs(2),
        }
    }
}

impl ReuseConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled {
            let bounds = [self.max_idle_per_key, self.max_idle_total];
            let why = "max_idle_per_key and max_idle_total must be at least 1 (or set reuse.enabled = false)";
            positive("reuse.max_idle_per_key", &bounds, why)?;
        }
        let times = [self.idle_timeout, self.reset_timeout];
        let why = "idle_timeout and reset_timeout must be greater than zero";
        nonzero("reuse.idle_timeout", &times, why)
    }
}
