//! Postgres over WebSocket: binary frames carry the raw protocol stream, frame boundaries
//! unrelated to message boundaries. After the upgrade the connection is a [`Stream::Tunnel`]
//! and runs the same session path as a TCP client (login, relay, cancel keys, metrics); the
//! password arrives in the clear inside the tunnel, often pipelined with the startup message.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream as _};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HOST, HeaderValue, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span};

use super::{Body, HttpState, plain};
use crate::error::fail;
use crate::front::{ActiveGuard, Negotiated, negotiate_tunnel};
use crate::stream::Stream;

/// Whether a request asks for a WebSocket upgrade.
pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    let has = |name, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(UPGRADE, "websocket") && has(CONNECTION, "upgrade")
}

/// The name a tunnel is addressed to: the driver's `address=host:port` query parameter, else
/// the `Host` header, without the port.
fn server_name(req: &Request<Incoming>) -> Option<String> {
    let address = req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "address")
            .map(|(_, v)| v.into_owned())
    });
    let host = address.or_else(|| {
        req.headers()
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    })?;
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h),
    };
    (!name.is_empty()).then(|| name.to_owned())
}

/// Accepts the upgrade and starts the session on the upgraded connection.
pub fn upgrade(
    mut req: Request<Incoming>,
    peer: SocketAddr,
    tls: bool,
    state: Arc<HttpState>,
    tasks: TaskTracker,
) -> Response<Body> {
    let version_ok = req
        .headers()
        .get("sec-websocket-version")
        .is_some_and(|v| v == "13");
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    if !version_ok {
        return Response::builder()
            .status(StatusCode::UPGRADE_REQUIRED)
            .header("sec-websocket-version", "13")
            .body(super::full(Bytes::new()))
            .expect("valid response");
    }
    let name = server_name(&req);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let gw = state.front.clone();
    let mut guard = ActiveGuard::new(&gw.capacity, &gw.metrics);
    tasks.spawn(
        async move {
            let accepted_at = Instant::now();
            let upgraded = match on_upgrade.await {
                Ok(u) => u,
                Err(e) => {
                    debug!(error = %e, "websocket upgrade failed");
                    return;
                }
            };
            let bound = state.config.websocket_write_buffer.as_u64() as usize;
            let io = CountedWrites::new(TokioIo::new(upgraded));
            let ws =
                WebSocketStream::from_raw_socket(io, Role::Server, Some(ws_config(bound))).await;
            let client = Stream::Tunnel {
                io: Box::new(WsBytes::new(ws, bound, state.config.send_timeout)),
                tls,
                server_name: name,
            };
            let deadline = accepted_at + gw.startup_timeout;
            let max = gw.negotiate.max_startup_message;
            let negotiated = tokio::select! {
                n = negotiate_tunnel(client, max, deadline) => n,
                _ = gw.terminate.cancelled() => return,
                _ = guard.slot.evicted() => return,
            };
            match negotiated {
                Ok(Negotiated::Cancel { key, stream }) => {
                    gw.pipeline.cancel_request(&key, peer, stream).await
                }
                Ok(Negotiated::Session { stream, startup }) => {
                    let slot = &mut guard.slot;
                    let session = gw
                        .pipeline
                        .run_session(stream, peer, startup, accepted_at, slot);
                    session.await
                }
                Err((stream, err)) => fail(&gw.metrics, stream, err).await,
            }
        }
        .instrument(info_span!("ws", %peer, tenant = tracing::field::Empty)),
    );
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(UPGRADE, HeaderValue::from_static("websocket"))
        .header(CONNECTION, HeaderValue::from_static("Upgrade"))
        .header("sec-websocket-accept", derive_accept_key(key.as_bytes()))
        .body(super::full(Bytes::new()))
        .expect("valid response")
}

/// The frame codec's settings for at most `bound` bytes waiting for the client: every frame
/// goes to the socket at once (the relay batches already), and what the socket does not take
/// waits within `bound`. Pongs that find no room are not queued: tungstenite keeps one,
/// answering the latest ping, as RFC 6455 allows.
fn ws_config(bound: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .write_buffer_size(0)
        .max_write_buffer_size(bound)
}

/// A socket that counts the bytes it took, so that a stalled client can be told from a slow one.
struct CountedWrites<S> {
    inner: S,
    written: u64,
}

impl<S> CountedWrites<S> {
    fn new(inner: S) -> Self {
        CountedWrites { inner, written: 0 }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CountedWrites<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountedWrites<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A WebSocket as a byte stream: binary frames in and out, text frames refused, a close frame
/// read as end of stream. What waits for the client stays within the write bound; a client
/// that keeps pinging while it has taken nothing for `send_timeout` is closed, as `/sql` closes
/// one that stops reading its response.
struct WsBytes<S> {
    ws: WebSocketStream<CountedWrites<S>>,
    pending: Bytes,
    /// A text frame arrived: the close frame says why.
    refused_text: bool,
    /// Largest binary frame sent: with pongs waiting, it still fits the write bound.
    max_frame: usize,
    send_timeout: Duration,
    /// Since when the client has taken nothing, and the byte count then.
    stalled: Option<(Instant, u64)>,
}

impl<S> WsBytes<S> {
    fn new(ws: WebSocketStream<CountedWrites<S>>, bound: usize, send_timeout: Duration) -> Self {
        WsBytes {
            ws,
            pending: Bytes::new(),
            refused_text: false,
            max_frame: bound / 2,
            send_timeout,
            stalled: None,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsBytes<S> {
    /// Sends what waits (frames, pongs); notes when the client stopped taking bytes.
    fn poll_flushed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.ws).poll_flush(cx).map_err(ws_error);
        let written = self.ws.get_ref().written;
        match flushed {
            Poll::Pending => match self.stalled {
                Some((_, at)) if at == written => {}
                _ => self.stalled = Some((Instant::now(), written)),
            },
            Poll::Ready(_) => self.stalled = None,
        }
        flushed
    }

    /// A ping arrived: its pong is sent when the client takes it. Fails when the client has
    /// taken nothing for `send_timeout`: it pings without reading, and its pongs would wait.
    fn answered_ping(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Poll::Ready(Err(e)) = self.poll_flushed(cx) {
            return Err(e);
        }
        match self.stalled {
            Some((since, _)) if since.elapsed() >= self.send_timeout => {
                debug!(send_timeout = ?self.send_timeout, "the client pings but stopped reading; closing");
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sends pings but stopped reading the answers",
                ))
            }
            _ => Ok(()),
        }
    }
}

fn ws_error(e: tokio_tungstenite::tungstenite::Error) -> io::Error {
    io::Error::other(e)
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsBytes<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.pending = data,
                Some(Ok(Message::Text(_))) => {
                    // Answered with a close frame saying why, when the session is shut down.
                    this.refused_text = true;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text frames are not accepted: send the Postgres protocol in binary frames",
                    )));
                }
                // A close frame (answered by tungstenite) or the end of the connection.
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                // Tungstenite queued the pong.
                Some(Ok(Message::Ping(_))) => this.answered_ping(cx)?,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(ws_error(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsBytes<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Nothing waits once flushed (pongs included), so the frame fits the write bound.
        ready!(this.poll_flushed(cx))?;
        let n = buf.len().min(this.max_frame);
        Pin::new(&mut this.ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
            .map_err(ws_error)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flushed(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.refused_text {
            ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(ws_error)?;
            let frame = CloseFrame {
                code: CloseCode::Unsupported,
                reason: "text frames are not accepted: send the Postgres protocol in binary frames"
                    .into(),
            };
            Pin::new(&mut this.ws)
                .start_send(Message::Close(Some(frame)))
                .map_err(ws_error)?;
            this.refused_text = false;
        }
        match ready!(Pin::new(&mut this.ws).poll_close(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            // Already closed by the peer's close frame: nothing left to say.
            Err(tokio_tungstenite::tungstenite::Error::ConnectionClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(ws_error(e))),
        }
    }
}
