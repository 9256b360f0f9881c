//! The PROXY protocol at both listeners: a load balancer in a trusted network puts a header
//! naming the real client before the client's bytes, and that address is the one the throttle,
//! the tenants' allow and deny lists and the logs see. From anywhere else a header is refused,
//! so a client cannot claim another's address.

use std::net::SocketAddr;

use ipnet::IpNet;
use pgwake_protocol::proxy_header::{self, DETECT_LEN, Detection, Parsed, ProxyHeaderError};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tracing::{debug, warn};

/// Which load balancers may name the client, and how long their header may be.
#[derive(Clone, Debug, Default)]
pub struct ProxyProtocol {
    /// Networks whose connections must open with a header (empty: none).
    pub trusted: Vec<IpNet>,
    /// Longest header accepted.
    pub max_header: usize,
}

/// Why a connection was closed before its first message.
#[derive(Debug, thiserror::Error)]
pub enum ProxyRefusal {
    /// A header from an address outside `listen.proxy_protocol_from`.
    #[error("PROXY protocol header from an untrusted address (not in listen.proxy_protocol_from)")]
    Untrusted,
    /// A trusted load balancer's connection without a header.
    #[error(
        "no PROXY protocol header from an address in listen.proxy_protocol_from (enable the \
         PROXY protocol on the load balancer, or remove its network from the list)"
    )]
    Missing,
    /// A malformed or oversized header.
    #[error("{0}")]
    Invalid(ProxyHeaderError),
    /// The header did not arrive within the startup timeout.
    #[error("PROXY protocol header not received within the startup timeout")]
    Timeout,
    /// The connection failed or closed while the header was read.
    #[error("connection lost while reading the PROXY protocol header: {0}")]
    Io(std::io::Error),
}

impl ProxyRefusal {
    /// Its kind in `pgwake_errors_total`: the header's problems, or the client's I/O.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyRefusal::Io(_) => "client_io",
            ProxyRefusal::Timeout => "startup_timeout",
            _ => "proxy_header",
        }
    }
}

impl ProxyProtocol {
    /// The client's address: the one a trusted load balancer's header names (the socket's own
    /// for the balancer's health checks), else the socket's peer. Reads exactly the header,
    /// so what follows is the client's first message. Refusals are logged here.
    pub async fn client_address(
        &self,
        tcp: &mut TcpStream,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Result<SocketAddr, ProxyRefusal> {
        let result = if self.trusts(peer) {
            self.read_header(tcp, peer, deadline).await
        } else {
            match starts_with_header(tcp, deadline).await {
                true => Err(ProxyRefusal::Untrusted),
                false => Ok(peer),
            }
        };
        match &result {
            Ok(client) if *client != peer => {
                debug!(%peer, %client, "PROXY header names the client")
            }
            Ok(_) => {}
            Err(e @ (ProxyRefusal::Io(_) | ProxyRefusal::Timeout)) => {
                debug!(%peer, error = %e, "connection closed")
            }
            Err(e) => warn!(%peer, error = %e, "connection refused"),
        }
        result
    }

    fn trusts(&self, peer: SocketAddr) -> bool {
        let ip = peer.ip().to_canonical();
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    async fn read_header(
        &self,
        tcp: &mut TcpStream,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Result<SocketAddr, ProxyRefusal> {
        let mut buf = Vec::with_capacity(64);
        loop {
            let need = match proxy_header::parse(&buf, self.max_header) {
                Ok(Parsed::Complete { header, .. }) => return Ok(header.source.unwrap_or(peer)),
                Ok(Parsed::Incomplete { need }) => need,
                Err(ProxyHeaderError::Missing) => return Err(ProxyRefusal::Missing),
                Err(e) => return Err(ProxyRefusal::Invalid(e)),
            };
            let have = buf.len();
            buf.resize(need, 0);
            match timeout_at(deadline, tcp.read_exact(&mut buf[have..])).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(ProxyRefusal::Io(e)),
                Err(_) => return Err(ProxyRefusal::Timeout),
            }
        }
    }
}

/// Whether the connection's first bytes are a PROXY header, looked at without reading them;
/// a connection that closes or stays silent is not (negotiation reports those). Only what
/// arrived first is looked at: a load balancer sends its header whole, and waiting for the rest
/// of a partial signature (`\r\n`, as an idle client may send) would mean polling a connection
/// that may never say more. Such a client's bytes go to negotiation (or the HTTP parser), which
/// refuses them as anything else that is not a startup message or a request.
async fn starts_with_header(tcp: &TcpStream, deadline: Instant) -> bool {
    let mut prefix = [0u8; DETECT_LEN];
    match timeout_at(deadline, tcp.peek(&mut prefix)).await {
        Ok(Ok(n)) if n > 0 => proxy_header::detect(&prefix[..n]) == Detection::Header,
        _ => false,
    }
}
