//! `[backend]`: TLS towards backends.

use std::path::PathBuf;

use serde::Deserialize;

/// TLS on the gateway's link to a backend, with libpq's meanings.
///
/// The default is `disable` while authentication is relayed: a backend reached over TLS offers
/// SCRAM-SHA-256-PLUS, and SCRAM's downgrade protection then refuses libpq clients (default
/// `channel_binding=prefer`) whose own TLS link ends at the gateway.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendTls {
    /// Never.
    #[default]
    Disable,
    /// When the backend offers it.
    Prefer,
    /// Always; refuse a backend without TLS.
    Require,
}

/// `[backend]`: defaults for backend connections.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// TLS to backends.
    pub tls: BackendTls,
    /// CA certificates (PEM) that backend certificates must chain to; when set, certificates and
    /// host names are verified, otherwise the link is encrypted but not authenticated.
    pub ca: Option<PathBuf>,
}
