//! The accept loop of the Postgres listener: each connection is counted against the caps, its
//! client named (by a trusted load balancer's PROXY header, or the socket), negotiated within
//! the startup timeout, then handed to the pipeline (a session) or answered as a cancel
//! request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::field::Empty;
use tracing::{Instrument, debug, info, info_span, warn};

use super::negotiate::{NegotiateSettings, Negotiated, negotiate};
use super::proxy_protocol::ProxyProtocol;
use super::shards::Shards;
use crate::capacity::{Capacity, ClientSlot};
use crate::error::fail;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::stream::Stream;
use pgwake_protocol::StartupMessage;

/// How often a failing accept is logged; the failures in between are counted in the next line.
const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of file descriptors: wait for some to be freed).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What the Postgres listener's connections share before the pipeline takes them.
pub struct Front {
    /// Where negotiated connections go.
    pub pipeline: Arc<Pipeline>,
    /// TLS, plaintext policy and startup size.
    pub negotiate: NegotiateSettings,
    /// Load balancers trusted to name the client (both listeners).
    pub proxy_protocol: ProxyProtocol,
    /// Time from accept to a complete startup message (PROXY header included).
    pub startup_timeout: Duration,
    /// Open client connections against their caps.
    pub capacity: Arc<Capacity>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Fires when sessions must end (grace period over).
    pub terminate: CancellationToken,
}

impl Front {
    /// The client's address: the one a trusted load balancer's PROXY header names, else the
    /// socket's; `None` when the connection ends first (`interrupted`, or a refused header,
    /// counted).
    pub async fn client_address(
        &self,
        tcp: &mut TcpStream,
        socket_peer: SocketAddr,
        deadline: Instant,
        interrupted: impl Future<Output = ()>,
    ) -> Option<SocketAddr> {
        let named = tokio::select! {
            a = self.proxy_protocol.client_address(tcp, socket_peer, deadline) => a,
            _ = interrupted => return None,
        };
        named.map_err(|e| self.metrics.error(e.kind())).ok()
    }
}

/// A client connection's place in the counts (metrics and caps) for its whole life.
pub struct ActiveGuard {
    metrics: Arc<Metrics>,
    /// Its place against the connection caps.
    pub slot: ClientSlot,
}

impl ActiveGuard {
    /// Counts a client connection as accepted and active until the guard drops; when too many
    /// connections are still logging in, the oldest of them is ended to make room.
    pub fn new(capacity: &Arc<Capacity>, metrics: &Arc<Metrics>) -> ActiveGuard {
        metrics.connections_accepted.inc();
        metrics.connections_active.inc();
        let (slot, evicted) = capacity.open();
        if evicted {
            metrics.error("login_evicted");
        }
        ActiveGuard {
            metrics: metrics.clone(),
            slot,
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.metrics.connections_active.dec();
        self.metrics.connections_closed.inc();
    }
}

/// The next accepted connection of `listener` (named `what` in logs), or `None` once `stop`
/// fires; failed accepts are logged and retried after a pause.
pub async fn accept_next(
    listener: &TcpListener,
    stop: &CancellationToken,
    what: &str,
) -> Option<(TcpStream, SocketAddr)> {
    let mut last_logged: Option<Instant> = None;
    let mut unlogged = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return None,
            a = listener.accept() => a,
        };
        match accepted {
            Ok(a) => return Some(a),
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning, and log
                // once per interval instead of per failure.
                if last_logged.is_none_or(|t| t.elapsed() >= ACCEPT_ERROR_LOG_INTERVAL) {
                    warn!(listener = what, error = %e, failures_since_last_line = unlogged, "accept failed");
                    last_logged = Some(Instant::now());
                    unlogged = 0;
                } else {
                    unlogged += 1;
                }
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

/// Accepts connections until `stop` fires; each runs as a task in `tasks` on one of the
/// session threads.
pub async fn serve(
    listener: TcpListener,
    front: Arc<Front>,
    shards: Arc<Shards>,
    tasks: TaskTracker,
    stop: CancellationToken,
) {
    while let Some((tcp, peer)) = accept_next(&listener, &stop, "postgres").await {
        let front = front.clone();
        let mut guard = ActiveGuard::new(&front.capacity, &front.metrics);
        shards.spawn(&tasks, tcp, move |tcp| async move {
            handle(tcp, peer, &front, &mut guard.slot).await;
        });
    }
    info!("listener stopped accepting");
}

// This and `session` return async blocks instead of being async fns: an async fn's state holds
// its arguments twice (as passed, and moved into its body), and this state is part of every
// connection's task for as long as its client stays, parked included.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn holds its arguments twice"
)]
fn handle<'a>(
    mut tcp: TcpStream,
    socket_peer: SocketAddr,
    front: &'a Front,
    slot: &'a mut ClientSlot,
) -> impl Future<Output = ()> + Send + 'a {
    async move {
        let accepted_at = Instant::now();
        let _ = tcp.set_nodelay(true);
        let deadline = accepted_at + front.startup_timeout;
        // In a block of its own, so that the PROXY header's state is gone before the session.
        let peer = {
            let interrupted = async {
                tokio::select! {
                    _ = front.terminate.cancelled() => {}
                    _ = slot.evicted() => {}
                }
            };
            Box::pin(front.client_address(&mut tcp, socket_peer, deadline, interrupted)).await
        };
        let Some(peer) = peer else {
            return;
        };
        let span = info_span!("conn", %peer, tenant = Empty, via = Empty);
        if peer != socket_peer {
            span.record("via", tracing::field::display(socket_peer));
        }
        session(tcp, peer, front, slot, accepted_at, deadline)
            .instrument(span)
            .await
    }
}

/// Negotiation, then the session or cancel request, of a connection from client `peer`.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn holds its arguments twice"
)]
fn session<'a>(
    tcp: TcpStream,
    peer: SocketAddr,
    front: &'a Front,
    slot: &'a mut ClientSlot,
    accepted_at: Instant,
    deadline: Instant,
) -> impl Future<Output = ()> + Send + 'a {
    async move {
        // Negotiation (a TLS handshake) and the short-lived ends are boxed, and done in a function
        // of their own, so that the session's task, which lives as long as the client stays, is not
        // sized by them.
        let negotiated = Box::pin(negotiate_session(tcp, peer, front, slot, deadline));
        let Some((stream, startup)) = negotiated.await else {
            return;
        };
        front
            .pipeline
            .run_session(stream, peer, startup, accepted_at, slot)
            .await
    }
}

/// Negotiates TLS or a cancel request; the stream and startup message of a session to run,
/// `None` when the connection ended here.
async fn negotiate_session(
    tcp: TcpStream,
    peer: SocketAddr,
    front: &Front,
    slot: &mut ClientSlot,
    deadline: Instant,
) -> Option<(Stream, StartupMessage)> {
    let negotiated = tokio::select! {
        n = negotiate(tcp, &front.negotiate, deadline) => n,
        _ = front.terminate.cancelled() => return None,
        _ = slot.evicted() => {
            debug!("connection ended during negotiation to make room for newer ones");
            return None;
        }
    };
    match negotiated {
        Ok(Negotiated::Cancel { key, stream }) => {
            front.pipeline.cancel_request(&key, peer, stream).await;
            None
        }
        Ok(Negotiated::Session { stream, startup }) => Some((stream, startup)),
        Err((stream, err)) => {
            fail(&front.metrics, stream, err).await;
            None
        }
    }
}
