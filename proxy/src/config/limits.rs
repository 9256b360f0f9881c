//! `[limits]`: bounds on what one client or backend connection may cost.

use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[limits]`: bounds on what a client or backend may cost.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest startup-phase message accepted from a client (startup, password, SASL).
    pub max_startup_message: ByteSize,
    /// Largest single message relayed in either direction once connected.
    pub max_message: ByteSize,
    /// Time a client has to negotiate TLS and send its startup message.
    #[serde(with = "super::duration")]
    pub startup_timeout: Duration,
    /// Time a client has, once its startup message is in, to finish authenticating (the whole
    /// SCRAM exchange, or its cleartext password over WebSocket).
    #[serde(with = "super::duration")]
    pub auth_timeout: Duration,
    /// Client connections the gateway holds at once (Postgres and WebSocket, logged in or not);
    /// more get FATAL 53300. Lowered at start-up to what the process's file limit can hold
    /// beside the backend connections (bounded by the tenants' caps when all have one).
    pub max_client_connections: usize,
    /// Client connections still negotiating or authenticating; when full, the oldest of them is
    /// ended to make room for a new one. Lowered like `max_client_connections`.
    pub max_unauthenticated_connections: usize,
    /// Time to open a TCP connection (and TLS) to a backend.
    #[serde(with = "super::duration")]
    pub connect_timeout: Duration,
    /// Time the login exchange with the backend may take, password round trips included.
    #[serde(with = "super::duration")]
    pub login_timeout: Duration,
    /// On SIGTERM, how long sessions may go on before they are ended.
    #[serde(with = "super::duration")]
    pub shutdown_grace: Duration,
    /// Relay buffer per direction per connection.
    pub relay_buffer: ByteSize,
    /// How long a session waits for a backend connection of a tenant at its
    /// `max_backend_connections`; then FATAL 53300.
    #[serde(with = "super::duration")]
    pub backend_wait_timeout: Duration,
    /// Sessions that may wait for a backend connection of one such tenant at once; more get
    /// FATAL 53300 at once.
    pub max_backend_waiters: usize,
    /// Longest a session may sit idle inside an open transaction (holding its backend
    /// connection, and a place under its tenant's cap); then Postgres ends it with FATAL 25P03,
    /// as its own `idle_in_transaction_session_timeout` does (set on every backend login).
    /// 0: no limit.
    #[serde(with = "super::duration")]
    pub idle_in_transaction_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_startup_message: ByteSize::kib(10),
            max_message: ByteSize::gib(1),
            startup_timeout: Duration::from_secs(10),
            auth_timeout: Duration::from_secs(15),
            max_client_connections: 10_000,
            max_unauthenticated_connections: 1_000,
            connect_timeout: Duration::from_secs(5),
            login_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            relay_buffer: ByteSize::kib(16),
            backend_wait_timeout: Duration::from_secs(30),
            max_backend_waiters: 10_000,
            idle_in_transaction_timeout: Duration::from_secs(3600),
        }
    }
}

impl Limits {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, v) in [
            ("limits.startup_timeout", self.startup_timeout),
            ("limits.connect_timeout", self.connect_timeout),
            ("limits.login_timeout", self.login_timeout),
            ("limits.auth_timeout", self.auth_timeout),
            ("limits.backend_wait_timeout", self.backend_wait_timeout),
        ] {
            if v.is_zero() {
                return Err(invalid(key, "must be greater than zero"));
            }
        }
        if self.max_client_connections == 0 || self.max_unauthenticated_connections == 0 {
            return Err(invalid(
                "limits.max_client_connections",
                "max_client_connections and max_unauthenticated_connections must be at least 1",
            ));
        }
        for (key, v, low, high, range) in [
            (
                "limits.max_startup_message",
                self.max_startup_message,
                64,
                1 << 20,
                "64B and 1MiB",
            ),
            (
                "limits.max_message",
                self.max_message,
                1 << 10,
                1 << 30,
                "1KiB and 1GiB",
            ),
            (
                "limits.relay_buffer",
                self.relay_buffer,
                1 << 10,
                16 << 20,
                "1KiB and 16MiB",
            ),
        ] {
            if v.as_u64() < low || v.as_u64() > high {
                return Err(invalid(key, format!("must be between {range}")));
            }
        }
        Ok(())
    }
}
