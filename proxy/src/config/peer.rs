//! `[peer]`: how replicas of one gateway Service forward cancel requests to each other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[peer]`: forwarding cancel keys issued by another replica to that replica (over
/// `listen.peer`), with peers found in the Service's EndpointSlices.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeerConfig {
    /// The Service whose EndpointSlices list the replicas (label
    /// `kubernetes.io/service-name`).
    pub service: Option<String>,
    /// Namespace of the Service (default `kubernetes.namespace`, else the ServiceAccount's).
    pub namespace: Option<String>,
    /// Name of the EndpointSlice port that carries `listen.peer`.
    pub port_name: String,
    /// This replica's `listen.peer` address as other replicas reach it (in a pod:
    /// `$(POD_IP):<port>`); default `listen.peer` when it names a specific address.
    pub advertise: Option<SocketAddr>,
    /// A file holding the token every replica shares; requests are signed with it (HMAC), so it
    /// never crosses the network.
    pub token_file: Option<PathBuf>,
    /// Cancels with another replica's key that one client address may have forwarded, per
    /// second, once its burst is spent.
    pub forward_rate: f64,
    /// Cancels one client address may have forwarded at once.
    pub forward_burst: u32,
    /// Forwarded cancels this replica answers per second for one peer address, once its burst
    /// is spent.
    pub serve_rate: f64,
    /// Forwarded cancels this replica answers at once for one peer address.
    pub serve_burst: u32,
    /// Addresses each limiter tracks; past this, limits are kept only for the busiest ones
    /// (buckets that have refilled are forgotten first, then new addresses are limited).
    pub limiter_capacity: usize,
    /// How far a forwarded request's issue time may be from this replica's clock; older ones
    /// (replays) are refused.
    #[serde(with = "super::duration")]
    pub max_clock_skew: Duration,
    /// Time to connect to a peer and get its answer, and for a peer to send its request.
    #[serde(with = "super::duration")]
    pub request_timeout: Duration,
    /// Connections `listen.peer` holds at once; when full, the oldest is closed to make room.
    /// Kept aside from the file limit before the client caps are fitted to it.
    pub max_connections: usize,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            service: None,
            namespace: None,
            port_name: "peer".into(),
            advertise: None,
            token_file: None,
            forward_rate: 5.0,
            forward_burst: 20,
            serve_rate: 200.0,
            serve_burst: 400,
            limiter_capacity: 10_000,
            max_clock_skew: Duration::from_secs(30),
            request_timeout: Duration::from_secs(2),
            max_connections: 256,
        }
    }
}

impl PeerConfig {
    /// This replica's address for peers: `advertise`, else `listen` when it is specific.
    pub fn advertised(&self, listen: SocketAddr) -> Option<SocketAddr> {
        self.advertise
            .or_else(|| (!listen.ip().is_unspecified()).then_some(listen))
    }

    pub(super) fn validate(&self, listen: Option<SocketAddr>) -> Result<(), ConfigError> {
        let Some(listen) = listen else {
            return Ok(());
        };
        if self.service.as_deref().is_none_or(str::is_empty) {
            return Err(invalid(
                "peer.service",
                "listen.peer is set: name the Service whose EndpointSlices list the replicas",
            ));
        }
        if self.token_file.is_none() {
            return Err(invalid(
                "peer.token_file",
                "listen.peer is set: give the file holding the token all replicas share",
            ));
        }
        if self.advertised(listen).is_none() {
            return Err(invalid(
                "peer.advertise",
                "listen.peer listens on every address: set peer.advertise to the address other \
                 replicas reach this one at (e.g. PGWAKE_PEER__ADVERTISE=$(POD_IP):6433)",
            ));
        }
        let positive = |r: f64| r.is_finite() && r > 0.0;
        if !positive(self.forward_rate) || !positive(self.serve_rate) {
            return Err(invalid(
                "peer.forward_rate",
                "forward_rate and serve_rate must be greater than zero",
            ));
        }
        if self.forward_burst == 0
            || self.serve_burst == 0
            || self.limiter_capacity == 0
            || self.max_connections == 0
        {
            return Err(invalid(
                "peer.forward_burst",
                "forward_burst, serve_burst, limiter_capacity and max_connections must be at \
                 least 1",
            ));
        }
        if self.max_clock_skew.is_zero() || self.request_timeout.is_zero() {
            return Err(invalid(
                "peer.request_timeout",
                "request_timeout and max_clock_skew must be greater than zero",
            ));
        }
        Ok(())
    }
}
