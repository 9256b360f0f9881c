//! Backend connection reuse: a client the gateway authenticated that leaves at a safe point hands
//! its backend connection back, reset with `DISCARD ALL`, to a cache; the next such client with
//! the same key takes it instead of a new login (and a new Postgres process). Passthrough
//! clients of a tenant with `reuse_passthrough` take part too, for startups the backend lets in
//! without a password: the gateway cannot check such a client, but the backend would not either.
//!
//! The key is the tenant plus every startup parameter the client sent (`user`, `database`,
//! `options`, `application_name`, `client_encoding`, ...). `DISCARD ALL` runs `RESET ALL`, which
//! returns each setting to its session default, and session defaults come from the startup
//! packet: only a client with the same startup parameters gets the connection, and the
//! ParameterStatus values the backend reported at its login are then current again, so they are
//! kept with the connection and replayed to the next client.
//!
//! `DISCARD ALL` also ends `SET SESSION AUTHORIZATION`/`SET ROLE`, drops prepared statements,
//! cursors (held ones too), temporary tables, LISTEN registrations, session advisory locks,
//! cached plans and sequence state. Being conservative, a session is still not returned when its
//! client leaves inside a transaction, mid-request or in COPY (the stream shows it), or holding
//! temporary objects, session advisory locks, LISTEN registrations or open cursors (one SQL check,
//! pipelined with the reset): such a session was stateful, and its connection is closed.
//! Prepared statements do not count: they are per-connection caches drivers rebuild.
//! Not undone by any reset, and so documented rather than handled: libraries loaded with `LOAD`,
//! state inside procedural languages, and a custom setting (`app.x`) once set stays defined
//! (empty) after the reset.
//!
//! Kept connections hold no wake claim, so they never keep a tenant awake; a tenant that sleeps
//! stops its backend, which closes them. Before one is handed out it must be silent (not closed,
//! not talking) and lead to the tenant's current address; otherwise it is dropped and the client
//! gets a fresh login.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pgwake_protocol::frontend::{self, TERMINATE};
use pgwake_routing::{Endpoint, TenantId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::cap::BackendSlot;
use super::pool::{Pool, PoolConnection, PoolSettings, silent};
use crate::cancel::CancelTarget;
use crate::config::ReuseConfig;
use crate::metrics::Metrics;
use crate::stream::Stream;
use crate::wire::body_len;

/// Which clients may share a kept backend connection: same tenant, same startup parameters,
/// and the same kind of login (a connection the gateway logged in for a client it checked never
/// goes to a passthrough client, nor the other way round).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReuseKey {
    tenant: TenantId,
    /// Sorted, so the order a driver sends them in does not matter.
    params: Vec<(String, String)>,
    passthrough: bool,
}

impl ReuseKey {
    /// The key of a client the gateway authenticated, of `tenant`, that sent these startup
    /// parameters (those forwarded to the backend).
    pub fn new(tenant: &TenantId, params: &[(String, String)]) -> ReuseKey {
        ReuseKey::of(tenant, params, false)
    }

    /// The key of a passthrough client (its login relayed to a backend that trusts the
    /// gateway) of `tenant` that sent these startup parameters.
    pub fn passthrough(tenant: &TenantId, params: &[(String, String)]) -> ReuseKey {
        ReuseKey::of(tenant, params, true)
    }

    fn of(tenant: &TenantId, params: &[(String, String)], passthrough: bool) -> ReuseKey {
        let mut params = params.to_vec();
        params.sort();
        ReuseKey {
            tenant: tenant.clone(),
            params,
            passthrough,
        }
    }

    /// The key's tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// Whether the key's clients are passthrough ones, who have seen nothing of a login when
    /// they take a kept connection (the gateway's own check told the others AuthenticationOk).
    pub fn is_passthrough(&self) -> bool {
        self.passthrough
    }
}

/// What a session keeps so it can hand its backend connection back when its client leaves.
pub struct Returnable {
    /// Who may take the connection next.
    pub key: ReuseKey,
    /// The ParameterStatus messages the backend sent at its login.
    pub parameters: Bytes,
    /// The backend's real cancel key (the next client gets its own gateway key for it).
    pub target: CancelTarget,
}

/// A kept connection handed to a new client.
pub struct Taken {
    /// The backend connection, reset and idle.
    pub stream: Stream,
    /// Its login's parameters and cancel key, to replay and to return it again.
    pub returnable: Returnable,
    /// Its place under the tenant's cap.
    pub slot: BackendSlot,
}

/// An idle backend connection in the cache.
struct Kept {
    stream: Stream,
    endpoint: Endpoint,
    parameters: Bytes,
    target: CancelTarget,
    slot: BackendSlot,
}

impl PoolConnection for Kept {
    fn usable(&mut self) -> bool {
        silent(&mut self.stream)
    }
}

/// The cache of reset backend connections (`[reuse]`).
pub struct Reuse {
    config: ReuseConfig,
    pool: Arc<Pool<ReuseKey, Kept>>,
}

impl Reuse {
    /// The cache, or `None` when `[reuse] enabled = false`.
    pub fn new(config: &ReuseConfig) -> Option<Arc<Reuse>> {
        if !config.enabled {
            return None;
        }
        let pool = Pool::new(PoolSettings {
            max_per_key: config.max_idle_per_key,
            max_total: config.max_idle_total,
            idle_timeout: config.idle_timeout,
            // Only idle connections live here, and nobody waits for one.
            acquire_timeout: Duration::ZERO,
        });
        Some(Arc::new(Reuse {
            config: config.clone(),
            pool,
        }))
    }

    /// A kept connection for `key` leading to `endpoint` (the tenant's current address), if
    /// any; counts the hit or miss and the stale connections dropped on the way.
    pub fn take(&self, key: &ReuseKey, endpoint: &Endpoint, metrics: &Metrics) -> Option<Taken> {
        let taken = loop {
            let (found, stale) = self.pool.detach(key);
            for _ in 0..stale {
                metrics.reuse("stale");
            }
            // A miss is counted by the caller, once it logs in anew (it may wait and look again).
            let Some(kept) = found else {
                break None;
            };
            if kept.endpoint != *endpoint {
                // The tenant slept and woke elsewhere.
                metrics.reuse("stale");
                continue;
            }
            // Perhaps opened on another session thread: poll it from this one.
            let Ok(stream) = kept.stream.rebind() else {
                metrics.reuse("stale");
                continue;
            };
            metrics.reuse("hit");
            break Some(Taken {
                stream,
                returnable: Returnable {
                    key: key.clone(),
                    parameters: kept.parameters,
                    target: kept.target,
                },
                slot: kept.slot,
            });
        };
        self.record(metrics);
        taken
    }

    /// Resets a departed client's backend connection and keeps it (true), or closes it when the
    /// reset fails or the cache is full.
    pub async fn give_back(
        &self,
        (mut stream, slot): (Stream, BackendSlot),
        endpoint: Endpoint,
        returnable: Returnable,
        max_message: usize,
        metrics: &Metrics,
    ) -> bool {
        let reset =
            tokio::time::timeout(self.config.reset_timeout, reset(&mut stream, max_message))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
        match reset {
            Ok(Checked::Clean) => {}
            Ok(Checked::Pinned) => {
                debug!(
                    "backend connection not kept: temporary objects, advisory locks, LISTEN or cursors"
                );
                metrics.reuse_return("not_safe");
                close(stream).await;
                return false;
            }
            Err(e) => {
                debug!(error = %e, "backend connection not kept: reset failed");
                metrics.reuse_return("reset_failed");
                close(stream).await;
                return false;
            }
        }
        let kept = Kept {
            stream,
            endpoint,
            parameters: returnable.parameters,
            target: returnable.target,
            slot,
        };
        let adopted = match self.pool.adopt(returnable.key, kept) {
            Ok(()) => {
                debug!("backend connection kept for reuse");
                metrics.reuse_return("kept");
                true
            }
            Err(kept) => {
                metrics.reuse_return("full");
                close(kept.stream).await;
                false
            }
        };
        self.record(metrics);
        adopted
    }

    /// Closes the oldest kept connection of `tenant`, whatever its key, so its slot under the
    /// tenant's cap goes to a session that waits; false when it has none.
    pub async fn close_one_of(&self, tenant: &TenantId, metrics: &Metrics) -> bool {
        let Some(kept) = self.pool.evict_oldest_where(|k| k.tenant == *tenant) else {
            return false;
        };
        close(kept.stream).await;
        self.record(metrics);
        true
    }

    /// Closes every kept connection of `key` (a passthrough key whose backend now asks for a
    /// password: what it let in before may no longer be handed on).
    pub async fn forget(&self, key: &ReuseKey, metrics: &Metrics) {
        let mut closed = false;
        while let Some(kept) = self.pool.evict_oldest_where(|k| k == key) {
            close(kept.stream).await;
            closed = true;
        }
        if closed {
            self.record(metrics);
        }
    }

    /// Closes kept connections past the idle timeout and publishes the idle gauge, until `stop`
    /// fires.
    pub async fn run_reaper(self: Arc<Self>, metrics: Arc<Metrics>, stop: CancellationToken) {
        let period = (self.config.idle_timeout / 2).max(Duration::from_millis(100));
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    self.pool.reap();
                    self.record(&metrics);
                }
            }
        }
    }

    fn record(&self, metrics: &Metrics) {
        metrics.reuse_idle.set(self.pool.stats().idle as i64);
    }
}

/// Pins the stream does not show, checked with SQL: temporary objects, session advisory locks,
/// LISTEN, open cursors.
const PINS_SQL: &str = "SELECT EXISTS (SELECT FROM pg_class WHERE relnamespace = \
pg_my_temp_schema()) OR EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND \
pid = pg_backend_pid()) OR EXISTS (SELECT FROM pg_listening_channels()) OR EXISTS \
(SELECT FROM pg_cursors)";

/// What the check before the reset found.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    /// Reset and idle: can be kept.
    Clean,
    /// The session had state the gateway does not hand on, even reset.
    Pinned,
}

/// Checks for pins and sends `DISCARD ALL` in one round trip, then waits for the backend to be
/// idle again. The replies arrive together, so they are read in as few reads as they come in
/// and taken apart in place (a read per message header and body would cost a dozen system
/// calls per returned connection under churn).
async fn reset(stream: &mut Stream, max_message: usize) -> std::io::Result<Checked> {
    let mut out = Vec::with_capacity(PINS_SQL.len() + 32);
    frontend::query(&mut out, PINS_SQL);
    let expected = 1 + frontend::reset(&mut out, false);
    stream.write_all(&out).await?;
    stream.flush().await?;
    out.clear();
    let (mut buf, mut at) = (out, 0);
    let mut replies = Replies {
        pinned: None,
        failed: false,
        ready: 0,
    };
    loop {
        while let Some((tag, body, len)) = next_message(&buf[at..], max_message)? {
            at += len;
            if let Some(done) = replies.take(tag, body, expected) {
                return done;
            }
        }
        buf.drain(..at);
        at = 0;
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The whole message at the start of `buf`, if it is all there: its tag, body and length.
fn next_message(buf: &[u8], max_message: usize) -> std::io::Result<Option<(u8, &[u8], usize)>> {
    let Some(header) = buf.first_chunk::<5>() else {
        return Ok(None);
    };
    let len = 5 + body_len(header, max_message)
        .ok_or_else(|| std::io::Error::other("message length out of range"))?;
    Ok(buf.get(5..len).map(|body| (header[0], body, len)))
}

/// What the replies to the pin check and the reset said so far.
struct Replies {
    pinned: Option<bool>,
    failed: bool,
    ready: usize,
}

impl Replies {
    /// Takes one reply in; the outcome once the `expected`-th ReadyForQuery is in.
    fn take(&mut self, tag: u8, body: &[u8], expected: usize) -> Option<std::io::Result<Checked>> {
        match tag {
            // One row, one column: int16 count, int32 length, then `t` or `f`.
            b'D' => self.pinned = Some(body.get(6) == Some(&b't')),
            b'E' => self.failed = true,
            b'Z' => {
                self.ready += 1;
                if self.ready < expected {
                    return None;
                }
                return Some(match (self.failed, self.pinned, body.first()) {
                    (false, Some(false), Some(b'I')) => Ok(Checked::Clean),
                    (false, Some(true), _) => Ok(Checked::Pinned),
                    _ => Err(std::io::Error::other("the session reset failed")),
                });
            }
            // Row description, CommandComplete, ParameterStatus for settings returning to
            // their defaults, notices.
            _ => {}
        }
        None
    }
}

/// Says goodbye to a backend connection that is not kept, and waits (briefly) until the backend
/// has closed its end: its process has left `pg_stat_activity` by then.
pub async fn close(mut stream: Stream) {
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        let _ = stream.write_all(&TERMINATE).await;
        let _ = stream.shutdown().await;
        let mut rest = [0u8; 512];
        while let Ok(n) = stream.read(&mut rest).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
