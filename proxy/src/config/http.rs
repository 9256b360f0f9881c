//! `[http]`: limits of `POST /sql` and its pool of backend connections.

use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use super::{ConfigError, invalid, nonzero, positive};

/// Smallest `http.websocket_write_buffer`: half of it is the largest frame sent, and the
/// relay's buffer should fit in a few.
const MIN_WEBSOCKET_WRITE_BUFFER: u64 = 4 << 10;
/// Largest `http.websocket_write_buffer`: beyond it the bound no longer bounds.
const MAX_WEBSOCKET_WRITE_BUFFER: u64 = 64 << 20;
/// Without `http.max_spill_per_tenant`, a tenant may hold this fraction of the spill total:
/// room for several busy tenants at once while one of them stalls its readers.
const DEFAULT_SPILL_SHARES: u64 = 4;

/// `[http]`: limits of `POST /sql` and its pool of backend connections.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Largest request body; a larger one is answered 413.
    pub max_request_size: ByteSize,
    /// Largest response body; a larger result is answered 507.
    pub max_response_size: ByteSize,
    /// Memory one `/sql` response may take while it is built; beyond it the body goes to an
    /// unnamed temporary file (in `$TMPDIR`) and is sent from there.
    pub response_memory: ByteSize,
    /// What all spilled responses may hold on disk at once, until each is sent; a response
    /// that finds no room is answered 507.
    pub max_spill_total: ByteSize,
    /// What one tenant's spilled responses may hold of `max_spill_total` at once, so that one
    /// tenant's slow readers cannot take all of it from the others; past it that tenant's
    /// response is answered 507. Unset: a quarter of `max_spill_total`.
    pub max_spill_per_tenant: Option<ByteSize>,
    /// Longest a response may go without any of its body being taken by the client; a client
    /// that stops reading has its connection closed (and the response's file freed).
    #[serde(with = "super::duration")]
    pub send_timeout: Duration,
    /// Most bytes a WebSocket connection keeps waiting for its client (outgoing frames and
    /// the answers to its pings); pings beyond it get one answer, for the latest. A client that
    /// keeps pinging while it takes nothing for `send_timeout` is closed.
    pub websocket_write_buffer: ByteSize,
    /// Time a `/sql` request may take once its backend connection is ready.
    #[serde(with = "super::duration")]
    pub query_timeout: Duration,
    /// Pooled backend connections per (tenant, user, database).
    pub pool_max_per_key: usize,
    /// Pooled backend connections in total.
    pub pool_max_total: usize,
    /// Idle pooled connections older than this are closed.
    #[serde(with = "super::duration")]
    pub pool_idle_timeout: Duration,
    /// How long a request waits for a pool slot when the bounds are reached.
    #[serde(with = "super::duration")]
    pub pool_acquire_timeout: Duration,
    /// Time a client has to send a request's headers (HTTP/1.1), and the longest a connection
    /// (HTTP/1.1 kept alive, or HTTP/2) may sit with no request in flight.
    #[serde(with = "super::duration")]
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body; a slower one is answered 408.
    #[serde(with = "super::duration")]
    pub body_timeout: Duration,
    /// Statements each pooled connection keeps prepared by query text, so a repeated query
    /// skips Postgres's parse and plan; 0 turns the cache off.
    pub statement_cache: usize,
    /// Longest query text the statement cache keeps; longer ones are parsed every time.
    pub statement_cache_max_query: ByteSize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_request_size: ByteSize::mib(10),
            max_response_size: ByteSize::mib(10),
            response_memory: ByteSize::mib(1),
            max_spill_total: ByteSize::gib(1),
            max_spill_per_tenant: None,
            send_timeout: Duration::from_secs(30),
            websocket_write_buffer: ByteSize::kib(256),
            query_timeout: Duration::from_secs(300),
            pool_max_per_key: 20,
            pool_max_total: 500,
            pool_idle_timeout: Duration::from_secs(60),
            pool_acquire_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            statement_cache: 64,
            statement_cache_max_query: ByteSize::kib(16),
        }
    }
}

impl HttpConfig {
    /// `max_spill_per_tenant`, or its default share of `max_spill_total`.
    pub fn spill_per_tenant(&self) -> u64 {
        self.max_spill_per_tenant
            .map_or(self.max_spill_total.as_u64() / DEFAULT_SPILL_SHARES, |b| {
                b.as_u64()
            })
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let bounds = [self.pool_max_per_key, self.pool_max_total];
        let bounds_why =
            "pool bounds must be at least 1 (http.pool_max_per_key, http.pool_max_total)";
        positive("http.pool_max_per_key", &bounds, bounds_why)?;
        let times = [self.header_timeout, self.body_timeout, self.send_timeout];
        let times_why = "http.header_timeout, http.body_timeout and http.send_timeout must be \
                         greater than zero";
        nonzero("http.header_timeout", &times, times_why)?;
        let ws = self.websocket_write_buffer.as_u64();
        if !(MIN_WEBSOCKET_WRITE_BUFFER..=MAX_WEBSOCKET_WRITE_BUFFER).contains(&ws) {
            return Err(invalid(
                "http.websocket_write_buffer",
                format!("must be between 4KiB and 64MiB, not {ws} B"),
            ));
        }
        let per_tenant = self.spill_per_tenant();
        if per_tenant > self.max_spill_total.as_u64() {
            return Err(invalid(
                "http.max_spill_per_tenant",
                format!(
                    "must not exceed http.max_spill_total ({} B), not {per_tenant} B",
                    self.max_spill_total.as_u64()
                ),
            ));
        }
        Ok(())
    }
}
