//! `[listen]`, `[tls]` and `[admin]`: where the gateway accepts connections, with which
//! certificates, and who may use the admin API.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// `[admin]`: who may use the admin API's tenant endpoints.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// A file holding a bearer token that `/v1/…` requests must present (`Authorization:
    /// Bearer …`); none: no token (bind the admin listener to a private address).
    pub token_file: Option<PathBuf>,
}

/// `[listen]`: where the gateway accepts connections.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Postgres protocol listener.
    pub postgres: SocketAddr,
    /// Admin HTTP listener (`/metrics`, `/healthz`, `/readyz`); none when absent.
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// Accept clients that do not use TLS. Off by default: passwords would cross in clear.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// HTTP listener for `POST /sql` and WebSocket tunnels (serverless drivers); none when
    /// absent. Same certificates as the Postgres listener.
    #[serde(default)]
    pub http: Option<SocketAddr>,
    /// Internal listener where other replicas forward cancel requests for keys this replica
    /// issued (see `[peer]`); none: no forwarding in either direction.
    #[serde(default)]
    pub peer: Option<SocketAddr>,
}

/// `[tls]`: the default certificate and more chosen by SNI.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Further certificates, each used for the server names it lists.
    #[serde(default)]
    pub certs: Vec<SniCert>,
}

/// `[[tls.certs]]`: a certificate for some server names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SniCert {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Names it serves: exact (`db.example.com`) or one wildcard label (`*.db.example.com`).
    pub server_names: Vec<String>,
}
