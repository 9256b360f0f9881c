//! The timed client of the wake scenario: one fresh connection, a password login and
//! `select 1`, with tokio-postgres over plaintext or rustls.
//!
//! A library client rather than `psql`, because psql's own start (loading libpq, reading
//! `.psqlrc`, locale set-up) costs milliseconds that would land in every sample. The timer
//! starts before the TCP connect and stops when the query's answer is in; Postgres sends the row,
//! CommandComplete and ReadyForQuery in one write, so "first row" and "query done" are the same
//! moment here.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use pgwake_protocol::channel_binding::tls_server_end_point;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::config::{ChannelBinding as ChannelBindingMode, SslMode};
use tokio_postgres::tls::{ChannelBinding, TlsConnect};
use tokio_postgres::{NoTls, SimpleQueryMessage};

/// Where and as whom the client logs in.
#[derive(Clone, Debug)]
pub struct Login {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password (SCRAM-SHA-256 at the Postgres server).
    pub password: String,
    /// Database name as the client sends it (for pgwake it names the tenant too).
    pub dbname: String,
}

impl Login {
    /// A tokio-postgres configuration for this login in plaintext (`sslmode=disable`) to
    /// 127.0.0.1; callers add what their client sets beyond that.
    pub fn plain_config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .user(&self.user)
            .password(&self.password)
            .dbname(&self.dbname)
            .host("127.0.0.1")
            .port(self.port)
            .ssl_mode(SslMode::Disable);
        config
    }
}

/// Plaintext, or TLS trusting one certificate (with SCRAM-SHA-256-PLUS, as libpq uses it when
/// offered).
#[derive(Clone)]
pub enum Transport {
    /// `sslmode=disable`.
    Plain,
    /// `sslmode=require`, with the server certificate verified against this configuration.
    Tls(RustlsConnect),
}

impl Transport {
    /// TLS that trusts only `cert_pem` (the harness's self-signed certificate, issued for
    /// `localhost`). Session resumption is off so that every connection pays a full handshake:
    /// the cold and the warm connection of a cycle must cost the same on the client side.
    pub fn tls(cert_pem: &str) -> Result<Transport> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(
                CertificateDer::from_pem_slice(cert_pem.as_bytes())
                    .context("parse the certificate")?,
            )
            .context("trust the certificate")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Transport::Tls(RustlsConnect(Arc::new(config))))
    }

    /// "plaintext" or "TLS", for reports.
    pub fn label(&self) -> &'static str {
        match self {
            Transport::Plain => "plaintext",
            Transport::Tls(_) => "TLS",
        }
    }
}

/// Opens a connection, logs in, runs `select 1` and closes the connection again. Returns the time
/// from before the TCP connect until the answer was in (closing is not timed, but waited for, so
/// the server has seen the client go before the caller's next step). Gives up after `limit`.
pub async fn connect_select1(
    login: &Login,
    transport: &Transport,
    limit: Duration,
) -> Result<Duration> {
    let mut config = login.plain_config();
    config.application_name("pgwake-bench");
    let attempt = async {
        match transport {
            Transport::Plain => timed(&config, login.port, NoTls).await,
            Transport::Tls(tls) => {
                // Require -PLUS, so a gateway that stopped offering it shows as a failure
                // instead of quietly measuring a different login.
                config
                    .ssl_mode(SslMode::Require)
                    .channel_binding(ChannelBindingMode::Require);
                timed(&config, login.port, tls.clone()).await
            }
        }
    };
    tokio::time::timeout(limit, attempt)
        .await
        .map_err(|_| anyhow!("no answer within {limit:?}"))?
}

async fn timed<T>(config: &tokio_postgres::Config, port: u16, tls: T) -> Result<Duration>
where
    T: TlsConnect<TcpStream>,
    T::Stream: Send + 'static,
{
    let started = Instant::now();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    // As libpq does: small protocol messages must not wait for Nagle's algorithm.
    tcp.set_nodelay(true)?;
    let (client, connection) = config.connect_raw(tcp, tls).await.map_err(describe)?;
    let connection = tokio::spawn(connection);
    let answer = client.simple_query("select 1").await.map_err(describe)?;
    let elapsed = started.elapsed();
    let one = answer.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0),
        _ => None,
    });
    if one != Some("1") {
        bail!("select 1 answered {answer:?}");
    }
    // Dropping the client makes the connection task send Terminate and finish.
    drop(client);
    let _ = tokio::time::timeout(Duration::from_secs(2), connection).await;
    Ok(elapsed)
}

/// tokio-postgres shows only "db error" for server errors; the server's message says what failed.
fn describe(e: tokio_postgres::Error) -> anyhow::Error {
    match e.as_db_error() {
        Some(db) => anyhow!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => anyhow!(e),
    }
}

/// tokio-postgres's TLS hook implemented with tokio-rustls (the gateway's own TLS stack), so the
/// harness needs no OpenSSL.
#[derive(Clone)]
pub struct RustlsConnect(Arc<rustls::ClientConfig>);

impl TlsConnect<TcpStream> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: TcpStream) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from("localhost").map_err(io::Error::other)?;
            let tls = tokio_rustls::TlsConnector::from(self.0)
                .connect(name, stream)
                .await?;
            Ok(RustlsStream(tls))
        })
    }
}

/// A client TLS stream for tokio-postgres.
pub struct RustlsStream(tokio_rustls::client::TlsStream<TcpStream>);

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tokio_postgres::tls::TlsStream for RustlsStream {
    /// `tls-server-end-point` of the certificate the server presented: the gateway offers
    /// SCRAM-SHA-256-PLUS over TLS, and libpq (`channel_binding=prefer`) then uses it, so this
    /// client does too.
    fn channel_binding(&self) -> ChannelBinding {
        self.0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|cert| tls_server_end_point(cert.as_ref()).ok())
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}
