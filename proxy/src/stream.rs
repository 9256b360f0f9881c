//! One stream type for both links: plain TCP, TLS as a server (clients) or as a client
//! (backends), or a tunnel carrying the Postgres byte stream inside another protocol (WebSocket).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection to a client or a backend, encrypted or not.
pub enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS terminated by the gateway (client side).
    ServerTls {
        /// The encrypted stream.
        io: Box<tokio_rustls::server::TlsStream<TcpStream>>,
        /// `tls-server-end-point` data of the certificate its handshake served, for
        /// SCRAM-SHA-256-PLUS (taken then: the certificates may be reloaded since).
        channel_binding: Option<Vec<u8>>,
    },
    /// TLS started by the gateway (backend side).
    ClientTls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// The Postgres byte stream inside another protocol (WebSocket binary frames).
    Tunnel {
        /// The byte stream.
        io: Box<dyn TunnelIo>,
        /// True when the carrying connection is encrypted.
        tls: bool,
        /// The name the client addressed (HTTP `Host` or the driver's `address=`), routed
        /// like a TLS server name.
        server_name: Option<String>,
    },
}

/// A byte stream a session can run over.
pub trait TunnelIo: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> TunnelIo for T {}

impl Stream {
    /// The SNI name the client sent, if this is a TLS client connection (or the name a tunnel
    /// was addressed to).
    pub fn sni(&self) -> Option<&str> {
        match self {
            Stream::ServerTls { io, .. } => io.get_ref().1.server_name(),
            Stream::Tunnel { server_name, .. } => server_name.as_deref(),
            _ => None,
        }
    }

    /// True when the link is encrypted.
    pub fn is_tls(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tunnel { tls, .. } => *tls,
            _ => true,
        }
    }

    /// Resolves once the client has closed its side of the TCP connection (a FIN or a reset),
    /// without consuming anything: waiting clients send nothing, so an end of stream means
    /// the client gave up. Pending forever once bytes arrive (they may be a pipelined query,
    /// or TLS records that must not be read here; so a TLS client that sends close_notify
    /// before closing is noticed only when the wait ends) and for tunnels, which have no
    /// socket of their own.
    pub fn hung_up(&self) -> impl Future<Output = ()> + Send + '_ {
        // Only the socket is borrowed: a tunnel's stream is not Sync.
        let tcp = match self {
            Stream::Plain(s) => Some(s),
            Stream::ServerTls { io, .. } => Some(io.get_ref().0),
            Stream::ClientTls(_) | Stream::Tunnel { .. } => None,
        };
        async move {
            let Some(tcp) = tcp else {
                return std::future::pending().await;
            };
            let mut byte = [0u8; 1];
            match tcp.peek(&mut byte).await {
                Ok(0) | Err(_) => {}
                Ok(_) => std::future::pending().await,
            }
        }
    }

    /// Channel-binding data of the certificate a TLS client connection was served.
    pub fn channel_binding(&self) -> Option<&[u8]> {
        match self {
            Stream::ServerTls {
                channel_binding, ..
            } => channel_binding.as_deref(),
            _ => None,
        }
    }

    /// True for a tunnelled stream, whose client authenticates with a cleartext password.
    pub fn is_tunnel(&self) -> bool {
        matches!(self, Stream::Tunnel { .. })
    }

    /// Moves a plain TCP stream to the event loop of the runtime this runs on, so a kept
    /// backend connection handed to a session on another session thread is polled by that
    /// thread instead of waking it from the thread that opened it. Other kinds are returned
    /// as they are (they still work from any thread). An error means the socket is unusable.
    pub fn rebind(self) -> io::Result<Stream> {
        match self {
            Stream::Plain(tcp) => TcpStream::from_std(tcp.into_std()?).map(Stream::Plain),
            other => Ok(other),
        }
    }
}

/// Calls a poll method on whichever stream this is, pinned.
macro_rules! on_inner {
    ($stream:expr, $s:ident => $call:expr) => {
        match $stream.get_mut() {
            Stream::Plain(inner) => {
                let $s = Pin::new(inner);
                $call
            }
            Stream::ServerTls { io, .. } => {
                let $s = Pin::new(io.as_mut());
                $call
            }
            Stream::ClientTls(inner) => {
                let $s = Pin::new(inner.as_mut());
                $call
            }
            Stream::Tunnel { io, .. } => {
                let $s = Pin::new(io.as_mut());
                $call
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        on_inner!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_inner!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_inner!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_inner!(self, s => s.poll_shutdown(cx))
    }
}
