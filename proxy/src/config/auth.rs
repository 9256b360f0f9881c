//! `[auth]`: the failed-login throttle and other settings of gateway authentication.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[auth]`: settings shared by every tenant the gateway authenticates.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Failed attempts evaluated per (client IP, tenant) and per (tenant, user) before further
    /// attempts wait (and are refused only when the wait outlasts the login's deadline).
    pub throttle_free_failures: u32,
    /// Wait after the last free failure; doubles with each further evaluated failure.
    #[serde(with = "super::duration")]
    pub throttle_base: Duration,
    /// Longest throttle wait.
    #[serde(with = "super::duration")]
    pub throttle_max: Duration,
    /// Failed attempts evaluated per client IP across all tenants before its further attempts
    /// wait, so made-up tenant names buy no fresh free failures.
    pub throttle_source_free_failures: u32,
    /// Entries the throttle remembers of each count ((client IP, tenant), (tenant, user)).
    pub throttle_capacity: u64,
    /// Also count failures across replicas, on Kubernetes Leases every replica watches (needs
    /// the Kubernetes API; see the README's deployment section).
    pub throttle_shared: bool,
    /// Namespace of the shared throttle's Leases (default `[kubernetes] namespace`).
    pub throttle_namespace: Option<String>,
    /// Longest wait for the Kubernetes API when recording a login outcome for the fleet; after
    /// it, only this replica's count has it.
    #[serde(with = "super::duration")]
    pub throttle_shared_timeout: Duration,
    /// Highest SCRAM iteration count the gateway derives keys for when logging in to a backend
    /// with a password: a backend could otherwise make it burn CPU.
    pub max_backend_iterations: u32,
    /// How long verifiers fetched by `auth_query` are cached.
    #[serde(with = "super::duration")]
    pub auth_query_ttl: Duration,
    /// Key for the salts of mock exchanges with unknown users; set it so replicas and
    /// restarts answer alike (random per process when unset).
    pub mock_secret: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            throttle_free_failures: 3,
            throttle_base: Duration::from_secs(1),
            throttle_max: Duration::from_secs(300),
            throttle_source_free_failures: 20,
            throttle_capacity: 100_000,
            throttle_shared: false,
            throttle_namespace: None,
            throttle_shared_timeout: Duration::from_secs(1),
            max_backend_iterations: 100_000,
            auth_query_ttl: Duration::from_secs(60),
            mock_secret: None,
        }
    }
}

impl AuthConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.throttle_shared && self.throttle_shared_timeout.is_zero() {
            return Err(invalid(
                "auth.throttle_shared_timeout",
                "must be greater than zero when throttle_shared is on",
            ));
        }
        if self.throttle_source_free_failures == 0 {
            return Err(invalid(
                "auth.throttle_source_free_failures",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
