//! Cancel forwarding between replicas of one gateway Service.
//!
//! A Service spreads connections over replicas, so a client's CancelRequest often reaches a
//! replica that did not issue its key. A key's process id is its backend's, so it names no
//! replica: a replica that does not hold a key sends it, whole, to the other replicas (found in
//! the Service's EndpointSlices), which answer it from their own keys only. A forwarded
//! request is never forwarded again, so requests cannot loop. Requests are signed with a token
//! the replicas share and rate-limited on both sides: per client address where they are
//! forwarded, per peer address where they are answered.

mod endpoints;
mod limiter;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgwake_protocol::CancelKey;
use pgwake_protocol::peer::{
    PEER_HEADER_LEN, PeerAnswer, decode_peer_cancel, encode_peer_cancel, peer_cancel_len,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use endpoints::PeerEndpoints;
pub use limiter::{RateLimiter, RateSettings};

use crate::cancel::CancelMap;
use crate::capacity::ListenerCap;
use crate::metrics::Metrics;

/// How a replica forwards and answers cancels, from `[peer]`.
pub struct PeerSettings {
    /// This replica's peer address as the others reach it.
    pub advertise: SocketAddr,
    /// The token every replica shares.
    pub token: Vec<u8>,
    /// Limit on cancels forwarded per client address.
    pub forward: RateSettings,
    /// Limit on forwarded cancels answered per peer address.
    pub serve: RateSettings,
    /// How far a request's issue time may be from this replica's clock.
    pub max_clock_skew: Duration,
    /// Time for one exchange with a peer.
    pub request_timeout: Duration,
    /// Time to connect to a backend to deliver a cancel.
    pub backend_connect_timeout: Duration,
}

/// Forwards cancels for other replicas' keys and answers theirs for this replica's keys.
pub struct PeerCancels {
    settings: PeerSettings,
    endpoints: PeerEndpoints,
    forward_limit: RateLimiter,
    serve_limit: RateLimiter,
    cancels: Arc<CancelMap>,
    metrics: Arc<Metrics>,
}

impl PeerCancels {
    /// Forwarding among the replicas `endpoints` lists; `cancels` holds this replica's keys.
    pub fn new(
        settings: PeerSettings,
        endpoints: PeerEndpoints,
        cancels: Arc<CancelMap>,
        metrics: Arc<Metrics>,
    ) -> PeerCancels {
        PeerCancels {
            forward_limit: RateLimiter::new(settings.forward),
            serve_limit: RateLimiter::new(settings.serve),
            settings,
            endpoints,
            cancels,
            metrics,
        }
    }

    /// Sends a key this replica does not hold to the other replicas, unless `client` is over its
    /// rate; returns once they have answered (only the one that issued it holds it).
    pub async fn forward(&self, key: &CancelKey, client: IpAddr) {
        if !self.forward_limit.allow(client) {
            self.metrics.peer_cancel("forwarded", "rate_limited");
            debug!(%client, "cancel forwarding rate-limited");
            return;
        }
        // This replica is left out: it has looked already.
        let owners: Vec<SocketAddr> = self
            .endpoints
            .addresses()
            .into_iter()
            .filter(|a| *a != self.settings.advertise)
            .collect();
        if owners.is_empty() {
            self.metrics.peer_cancel("forwarded", "unroutable");
            debug!("cancel request for a key not held here dropped: no other replica is known");
            return;
        }
        let sends = owners.iter().map(|owner| self.send(key, *owner));
        for (owner, result) in owners
            .iter()
            .zip(futures_util::future::join_all(sends).await)
        {
            let outcome = match result {
                Ok(PeerAnswer::Cancelled) => "cancelled",
                Ok(PeerAnswer::UnknownKey) => "unknown_key",
                Ok(PeerAnswer::RateLimited) => "peer_rate_limited",
                Ok(PeerAnswer::Refused) => {
                    warn!(peer = %owner, "a replica refused a forwarded cancel: do all replicas share peer.token_file and a clock?");
                    "refused"
                }
                Err(e) => {
                    warn!(peer = %owner, error = %e, "cancel not forwarded");
                    "failed"
                }
            };
            self.metrics.peer_cancel("forwarded", outcome);
        }
    }

    async fn send(&self, key: &CancelKey, owner: SocketAddr) -> std::io::Result<PeerAnswer> {
        let request = encode_peer_cancel(key, now_ms(), rand::random(), &self.settings.token)
            .map_err(std::io::Error::other)?;
        let exchange = async {
            let mut s = TcpStream::connect(owner).await?;
            s.write_all(&request).await?;
            let answer = s.read_u8().await?;
            PeerAnswer::from_byte(answer)
                .ok_or_else(|| std::io::Error::other(format!("unknown answer byte {answer}")))
        };
        timeout(self.settings.request_timeout, exchange)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }

    /// Answers forwarded cancels on `listener` until `stop` fires, from this replica's keys only.
    /// It holds at most `max_connections` at once: the oldest is closed to make room, so a
    /// flood of connections ends its own before it can take the gateway's file descriptors
    /// (each lasts `request_timeout` at most anyway).
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        max_connections: usize,
        stop: CancellationToken,
    ) {
        info!(addr = ?listener.local_addr().ok(), "peer listener serving");
        let cap = ListenerCap::new(max_connections);
        loop {
            let (stream, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "peer listener accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // Never `None`: no connection is marked busy, so the oldest always makes room.
            let Some(slot) = cap.open() else {
                continue;
            };
            let this = self.clone();
            tokio::spawn(async move {
                let evicted = slot.eviction();
                tokio::select! {
                    _ = this.answer(stream, peer) => {}
                    _ = evicted.cancelled() => {
                        debug!(%peer, max_connections, "peer connection closed to make room");
                    }
                }
            });
        }
    }

    async fn answer(&self, mut stream: TcpStream, peer: SocketAddr) {
        let answer = if self.serve_limit.allow(peer.ip()) {
            match timeout(
                self.settings.request_timeout,
                self.decide(&mut stream, peer),
            )
            .await
            {
                Ok(a) => a,
                Err(_) => PeerAnswer::Refused,
            }
        } else {
            PeerAnswer::RateLimited
        };
        self.metrics.peer_cancel(
            "served",
            match answer {
                PeerAnswer::Cancelled => "cancelled",
                PeerAnswer::UnknownKey => "unknown_key",
                PeerAnswer::RateLimited => "rate_limited",
                PeerAnswer::Refused => "refused",
            },
        );
        let _ = timeout(self.settings.request_timeout, async {
            stream.write_u8(answer.to_byte()).await?;
            stream.shutdown().await
        })
        .await;
    }

    async fn decide(&self, stream: &mut TcpStream, peer: SocketAddr) -> PeerAnswer {
        let mut header = [0u8; PEER_HEADER_LEN];
        if stream.read_exact(&mut header).await.is_err() {
            return PeerAnswer::Refused;
        }
        let len = match peer_cancel_len(&header) {
            Ok(len) => len,
            Err(e) => {
                warn!(%peer, error = %e, "forwarded cancel refused");
                return PeerAnswer::Refused;
            }
        };
        let mut packet = vec![0u8; len];
        packet[..PEER_HEADER_LEN].copy_from_slice(&header);
        if stream
            .read_exact(&mut packet[PEER_HEADER_LEN..])
            .await
            .is_err()
        {
            return PeerAnswer::Refused;
        }
        let request = match decode_peer_cancel(&packet, &self.settings.token) {
            Ok(r) => r,
            Err(e) => {
                warn!(%peer, error = %e, "forwarded cancel refused");
                return PeerAnswer::Refused;
            }
        };
        let skew = Duration::from_millis(now_ms().abs_diff(request.issued_ms));
        if skew > self.settings.max_clock_skew {
            warn!(%peer, skew_ms = skew.as_millis() as u64, "forwarded cancel refused: too old or from a clock too far off");
            return PeerAnswer::Refused;
        }
        // Answered from this replica's own keys only, never forwarded again: no loops.
        let Some(route) = self.cancels.lookup(&request.key) else {
            let secret_len = request.key.secret.len();
            debug!(%peer, secret_len, "forwarded cancel matches no key of this replica");
            return PeerAnswer::UnknownKey;
        };
        self.metrics.cancels_forwarded.inc();
        let to = route.describe();
        if let Err(e) = route.deliver(self.settings.backend_connect_timeout).await {
            warn!(error = %e, backend = %to, "forwarded cancel not delivered");
        }
        PeerAnswer::Cancelled
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
