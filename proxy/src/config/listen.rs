//! `[listen]`, `[tls]` and `[admin]`: where the gateway accepts connections, with which
//! certificates, and who may use the admin API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use ipnet::IpNet;
use serde::Deserialize;

use super::{ConfigError, invalid};

/// Smallest `listen.proxy_protocol_max_header`: a v1 line (107 bytes) or a v2 header with Unix
/// socket addresses (232 bytes) must fit.
const MIN_PROXY_HEADER: u64 = 256;

/// `[admin]`: who may use the admin API's tenant endpoints, and what its connections may cost.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// A file holding a bearer token that `/v1/…` requests must present (`Authorization:
    /// Bearer …`); none: no token (bind the admin listener to a private address).
    pub token_file: Option<PathBuf>,
    /// Host names the admin API answers to besides IP addresses and `localhost` (e.g. a
    /// Service's DNS name that Prometheus scrapes): a request naming any other host is refused,
    /// so a web page whose name was rebound to this address cannot read the API.
    pub hosts: Vec<String>,
    /// Connections the admin listener holds at once; when full, the one waiting longest
    /// without a request in flight is closed to make room. Counted in the file descriptors
    /// kept aside when the client caps are fitted to the file limit.
    pub max_connections: usize,
    /// Time a client has to send a whole request head, from the connection's start or from
    /// the first byte of its next request.
    #[serde(with = "super::duration")]
    pub header_timeout: Duration,
    /// Longest a connection may wait, between requests, for the next one to begin.
    #[serde(with = "super::duration")]
    pub idle_timeout: Duration,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            token_file: None,
            hosts: Vec::new(),
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl AdminConfig {
    /// Checks the connection cap and the deadlines.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(invalid(
                "admin.max_connections",
                "must be at least 1 (every probe and scrape needs a connection)",
            ));
        }
        for (key, v) in [
            ("admin.header_timeout", self.header_timeout),
            ("admin.idle_timeout", self.idle_timeout),
        ] {
            if v.is_zero() {
                return Err(invalid(key, "must be greater than zero (e.g. \"10s\")"));
            }
        }
        Ok(())
    }
}

/// `[listen]`: where the gateway accepts connections (a missing `Option` reads as `None`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Postgres protocol listener.
    pub postgres: SocketAddr,
    /// Admin HTTP listener (`/metrics`, `/healthz`, `/readyz`); none when absent.
    pub admin: Option<SocketAddr>,
    /// Accept clients that do not use TLS. Off by default: passwords would cross in clear.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// HTTP listener for `POST /sql` and WebSocket tunnels (serverless drivers); none when
    /// absent. Same certificates as the Postgres listener.
    pub http: Option<SocketAddr>,
    /// Load balancers whose connections open with a PROXY protocol header (v1 or v2) naming
    /// the real client; from these networks the header is required, from others refused.
    /// Empty: no load balancer is trusted.
    #[serde(default)]
    pub proxy_protocol_from: Vec<IpNet>,
    /// Longest PROXY header accepted (a v2 header with its extensions).
    #[serde(default = "default_proxy_header")]
    pub proxy_protocol_max_header: ByteSize,
    /// Internal listener where other replicas forward cancel requests for keys this replica
    /// issued (see `[peer]`); none: no forwarding in either direction.
    pub peer: Option<SocketAddr>,
    /// Threads that run Postgres sessions and HTTP connections, each with its own event loop
    /// (a connection stays on one from accept to close); 0: one per CPU.
    #[serde(default)]
    pub session_threads: usize,
}

/// Most `listen.session_threads`: far beyond any machine's cores, small enough to be a typo.
const MAX_SESSION_THREADS: usize = 1024;

fn default_proxy_header() -> ByteSize {
    ByteSize::kib(4)
}

impl ListenConfig {
    /// Checks the PROXY protocol bound and the thread count.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.session_threads > MAX_SESSION_THREADS {
            return Err(invalid(
                "listen.session_threads",
                format!(
                    "must be at most {MAX_SESSION_THREADS} (0: one per CPU), not {}",
                    self.session_threads
                ),
            ));
        }
        let max = self.proxy_protocol_max_header.as_u64();
        if !(MIN_PROXY_HEADER..=65_551).contains(&max) {
            return Err(invalid(
                "listen.proxy_protocol_max_header",
                format!(
                    "must be between {MIN_PROXY_HEADER} B and 65551 B (the largest v2 header), \
                     not {max} B"
                ),
            ));
        }
        Ok(())
    }
}

/// `[tls]`: the default certificate and more chosen by SNI, read again when the files change.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Further certificates, each used for the server names it lists.
    #[serde(default)]
    pub certs: Vec<SniCert>,
    /// How often the certificate and key files are checked for new contents (a rotation);
    /// SIGHUP reloads them at once.
    #[serde(default = "default_watch_interval", with = "super::duration")]
    pub watch_interval: Duration,
}

fn default_watch_interval() -> Duration {
    Duration::from_secs(10)
}

impl TlsConfig {
    /// Checks the watch interval.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.watch_interval.is_zero() {
            return Err(invalid(
                "tls.watch_interval",
                "must be more than 0s (e.g. \"10s\")",
            ));
        }
        Ok(())
    }
}

/// `[[tls.certs]]`: a certificate for some server names.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SniCert {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Names it serves: exact (`db.example.com`) or one wildcard label (`*.db.example.com`).
    pub server_names: Vec<String>,
}
