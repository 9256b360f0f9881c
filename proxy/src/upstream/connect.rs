//! Opening a backend connection: TCP, then TLS as the tenant's backend TLS mode asks.

use std::sync::Arc;
use std::time::Duration;

use pgwake_protocol::backend::ssl_request;
use pgwake_routing::Endpoint;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsConnector;

use crate::config::BackendTls;
use crate::error::SessionError;
use crate::stream::Stream;

/// How to reach and log in to backends.
pub struct BackendLink {
    /// TLS client configuration for backends.
    pub tls_config: Arc<ClientConfig>,
    /// Largest message accepted from a backend during login.
    pub max_message: usize,
    /// Largest message accepted from a client during login (password, SASL).
    pub max_client_message: usize,
    /// `idle_in_transaction_session_timeout` every backend login sets (`None`: left alone).
    pub idle_in_transaction: Option<Duration>,
}

/// Opens TCP (and TLS, per `mode`) to `endpoint` by `deadline`.
pub async fn connect(
    link: &BackendLink,
    endpoint: &Endpoint,
    mode: BackendTls,
    deadline: Instant,
) -> Result<Stream, SessionError> {
    let unreachable = |source| SessionError::BackendUnreachable {
        endpoint: endpoint.to_string(),
        source,
    };
    let timed_out = || unreachable(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let mut tcp = timeout_at(
        deadline,
        TcpStream::connect((endpoint.host.as_str(), endpoint.port)),
    )
    .await
    .map_err(|_| timed_out())?
    .map_err(unreachable)?;
    tcp.set_nodelay(true).map_err(unreachable)?;
    if mode == BackendTls::Disable {
        return Ok(Stream::Plain(tcp));
    }
    let answer = timeout_at(deadline, async {
        tcp.write_all(&ssl_request()).await?;
        let mut b = [0u8; 1];
        tcp.read_exact(&mut b).await?;
        Ok::<u8, std::io::Error>(b[0])
    })
    .await
    .map_err(|_| timed_out())?
    .map_err(unreachable)?;
    match (answer, mode) {
        (b'S', _) => {}
        (b'N', BackendTls::Prefer) => return Ok(Stream::Plain(tcp)),
        (b'N', _) => {
            return Err(SessionError::BackendUnsupported(
                "does not accept TLS, and [backend] tls = \"require\"".into(),
            ));
        }
        (other, _) => {
            return Err(SessionError::BackendProtocol(format!(
                "unexpected answer {other:#x} to SSLRequest"
            )));
        }
    }
    let name = ServerName::try_from(endpoint.tls_name().to_owned())
        .map_err(|e| SessionError::BackendUnsupported(format!("host name is invalid: {e}")))?;
    let tls = timeout_at(
        deadline,
        TlsConnector::from(link.tls_config.clone()).connect(name, tcp),
    )
    .await
    .map_err(|_| timed_out())?
    .map_err(unreachable)?;
    Ok(Stream::ClientTls(Box::new(tls)))
}
