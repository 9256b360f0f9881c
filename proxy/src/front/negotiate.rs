//! The first bytes of a client connection: TLS (by SSLRequest or direct), GSS refusal, cancel
//! requests, and the startup message, all within one deadline and one size limit.

use std::sync::Arc;

use pgwake_protocol::startup::{initial_length, parse_initial};
use pgwake_protocol::{CancelKey, InitialMessage, StartupMessage};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsAcceptor;

use crate::error::SessionError;
use crate::stream::Stream;
use crate::tls::{ALPN_POSTGRESQL, ServerCertificates};

/// First byte of a TLS handshake record; never the first byte of a valid startup length.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What negotiation needs to know.
pub struct NegotiateSettings {
    /// Server certificates, when configured (each handshake takes the current ones).
    pub tls: Option<Arc<ServerCertificates>>,
    /// Accept a startup message without TLS.
    pub allow_plaintext: bool,
    /// Largest initial message.
    pub max_startup_message: usize,
}

/// What the client asked for.
pub enum Negotiated {
    /// Cancel a query; the connection ends afterwards (closed properly: TLS close_notify, so
    /// that libpq 17's encrypted cancel reports success).
    Cancel {
        /// The key the client presented.
        key: CancelKey,
        /// The client stream, to close.
        stream: Stream,
    },
    /// Open a session.
    Session {
        /// The client stream, encrypted when TLS was negotiated.
        stream: Stream,
        /// The startup message.
        startup: StartupMessage,
    },
}

/// A failure, with the stream when an error can still be written to it.
pub type Failed = (Option<Stream>, SessionError);

/// Runs negotiation until a startup or cancel message arrives or `deadline` passes.
pub async fn negotiate(
    tcp: TcpStream,
    settings: &NegotiateSettings,
    deadline: Instant,
) -> Result<Negotiated, Failed> {
    let mut first = [0u8; 1];
    let peeked = timeout_at(deadline, tcp.peek(&mut first)).await;
    let mut stream = match peeked {
        Err(_) => return Err((Some(Stream::Plain(tcp)), SessionError::StartupTimeout)),
        Ok(Err(e)) => return Err((None, SessionError::ClientIo(e))),
        Ok(Ok(0)) => {
            let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
            return Err((None, SessionError::ClientIo(eof)));
        }
        Ok(Ok(_)) if first[0] == TLS_HANDSHAKE_RECORD => {
            let Some(certs) = &settings.tls else {
                return Err((None, SessionError::Handshake(no_tls())));
            };
            let s = accept_tls(certs, tcp, deadline).await?;
            let alpn_ok = match &s {
                Stream::ServerTls { io, .. } => {
                    io.get_ref().1.alpn_protocol() == Some(ALPN_POSTGRESQL)
                }
                _ => false,
            };
            if !alpn_ok {
                return Err((Some(s), SessionError::MissingAlpn));
            }
            s
        }
        Ok(Ok(_)) => Stream::Plain(tcp),
    };

    let mut gss_answered = false;
    loop {
        let msg = match read_initial(&mut stream, settings.max_startup_message, deadline).await {
            Ok(m) => m,
            Err(e) => return Err((Some(stream), e)),
        };
        match msg {
            InitialMessage::SslRequest => {
                let Stream::Plain(tcp) = stream else {
                    return Err((Some(stream), SessionError::UnexpectedRequest("SSLRequest")));
                };
                let Some(certs) = &settings.tls else {
                    let mut s = Stream::Plain(tcp);
                    if let Err(e) = s.write_all(b"N").await {
                        return Err((None, SessionError::ClientIo(e)));
                    }
                    stream = s;
                    continue;
                };
                let mut tcp = tcp;
                if let Err(e) = tcp.write_all(b"S").await {
                    return Err((None, SessionError::ClientIo(e)));
                }
                stream = accept_tls(certs, tcp, deadline).await?;
            }
            InitialMessage::GssEncRequest => {
                if gss_answered || stream.is_tls() {
                    return Err((
                        Some(stream),
                        SessionError::UnexpectedRequest("GSSENCRequest"),
                    ));
                }
                gss_answered = true;
                if let Err(e) = stream.write_all(b"N").await {
                    return Err((None, SessionError::ClientIo(e)));
                }
            }
            InitialMessage::Cancel(key) => return Ok(Negotiated::Cancel { key, stream }),
            InitialMessage::Startup(startup) => {
                if !stream.is_tls() && !settings.allow_plaintext {
                    return Err((Some(stream), SessionError::PlaintextRefused));
                }
                return Ok(Negotiated::Session { stream, startup });
            }
        }
    }
}

/// Reads the startup (or cancel) message of a tunnelled stream, whose carrier already did any
/// encryption: SSL and GSS requests are answered `N`.
pub async fn negotiate_tunnel(
    mut stream: Stream,
    max_startup_message: usize,
    deadline: Instant,
) -> Result<Negotiated, Failed> {
    let mut refused = 0;
    loop {
        let msg = match read_initial(&mut stream, max_startup_message, deadline).await {
            Ok(m) => m,
            Err(e) => return Err((Some(stream), e)),
        };
        match msg {
            InitialMessage::SslRequest | InitialMessage::GssEncRequest if refused < 2 => {
                refused += 1;
                // Flushed at once: over WebSocket an unflushed answer waits in the frame
                // buffer until the client sends more, and the driver waits for it first.
                let answered = async {
                    stream.write_all(b"N").await?;
                    stream.flush().await
                };
                if let Err(e) = answered.await {
                    return Err((None, SessionError::ClientIo(e)));
                }
            }
            InitialMessage::SslRequest => {
                return Err((Some(stream), SessionError::UnexpectedRequest("SSLRequest")));
            }
            InitialMessage::GssEncRequest => {
                return Err((
                    Some(stream),
                    SessionError::UnexpectedRequest("GSSENCRequest"),
                ));
            }
            InitialMessage::Cancel(key) => return Ok(Negotiated::Cancel { key, stream }),
            InitialMessage::Startup(startup) => return Ok(Negotiated::Session { stream, startup }),
        }
    }
}

fn no_tls() -> std::io::Error {
    std::io::Error::other("direct TLS attempted but no certificate is configured")
}

/// The TLS handshake with the certificates current now; the stream keeps the channel-binding
/// data of the certificate it was served.
async fn accept_tls(
    certs: &ServerCertificates,
    tcp: TcpStream,
    deadline: Instant,
) -> Result<Stream, Failed> {
    let generation = certs.current();
    let acceptor = TlsAcceptor::from(generation.config.clone());
    match timeout_at(deadline, acceptor.accept(tcp)).await {
        Ok(Ok(io)) => {
            let channel_binding = generation.channel_binding(io.get_ref().1.server_name());
            Ok(Stream::ServerTls {
                io: Box::new(io),
                channel_binding,
            })
        }
        Ok(Err(e)) => Err((None, SessionError::Handshake(e))),
        Err(_) => Err((None, SessionError::StartupTimeout)),
    }
}

/// Reads one length-prefixed initial message within the deadline and size limit.
async fn read_initial<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    deadline: Instant,
) -> Result<InitialMessage, SessionError> {
    let read = async {
        let mut len = [0u8; 4];
        r.read_exact(&mut len)
            .await
            .map_err(SessionError::ClientIo)?;
        let total = initial_length(len, max)?;
        let mut packet = vec![0u8; total];
        packet[..4].copy_from_slice(&len);
        r.read_exact(&mut packet[4..])
            .await
            .map_err(SessionError::ClientIo)?;
        Ok(parse_initial(&packet)?)
    };
    timeout_at(deadline, read)
        .await
        .unwrap_or(Err(SessionError::StartupTimeout))
}
