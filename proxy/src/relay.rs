//! The relay: bytes copied in bulk both ways, message boundaries tracked from headers only.
//!
//! One future drives both directions, so neither can block the other (a backend streaming rows
//! while the client pipelines queries must not deadlock through the gateway), and no lock is
//! needed around a TLS stream. When either side ends, the whole session ends.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pgwake_protocol::{ErrorMessage, FrameError, FrameScanner, sqlstate};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::sync::CancellationToken;

use crate::stream::Stream;

/// How long a session being terminated may take to reach a message boundary.
const TERMINATE_BOUNDARY_WAIT: Duration = Duration::from_secs(2);

/// Why the relay ended.
#[derive(Debug)]
pub enum RelayEnd {
    /// The client closed its connection.
    ClientClosed,
    /// The backend closed its connection.
    BackendClosed,
    /// Reading from or writing to the client failed.
    ClientIo(io::Error),
    /// Reading from or writing to the backend failed.
    BackendIo(io::Error),
    /// The client broke message framing.
    ClientFrame(FrameError),
    /// The backend broke message framing.
    BackendFrame(FrameError),
    /// The gateway ended the session while shutting down.
    Terminated,
}

impl RelayEnd {
    /// Label for `pgwake_errors_total`, or `None` for an ordinary end.
    pub fn error_kind(&self) -> Option<&'static str> {
        match self {
            RelayEnd::ClientClosed | RelayEnd::BackendClosed => None,
            RelayEnd::ClientIo(_) => Some("client_io"),
            RelayEnd::BackendIo(_) => Some("backend_io"),
            RelayEnd::ClientFrame(_) => Some("client_protocol"),
            RelayEnd::BackendFrame(_) => Some("backend_protocol"),
            RelayEnd::Terminated => Some("shutdown"),
        }
    }
}

enum PumpError {
    Read(io::Error),
    Write(io::Error),
    Frame(FrameError),
}

/// One direction: a buffer, the bytes in it not yet written, and the framing state.
struct Pump {
    buf: Box<[u8]>,
    pos: usize,
    cap: usize,
    eof: bool,
    need_flush: bool,
    scanner: FrameScanner,
    counter: IntCounter,
    /// A message to send at the next boundary, after which this direction ends.
    inject: Option<Vec<u8>>,
    /// A message to send if the source ends at a boundary without an error of its own.
    on_eof: Option<Vec<u8>>,
}

impl Pump {
    fn new(size: usize, max_message: u32, counter: IntCounter) -> Pump {
        Pump {
            buf: vec![0u8; size].into_boxed_slice(),
            pos: 0,
            cap: 0,
            eof: false,
            need_flush: false,
            scanner: FrameScanner::new(max_message),
            counter,
            inject: None,
            on_eof: None,
        }
    }

    /// Puts an injected message in the buffer when everything before it is written and the
    /// stream sits at a boundary.
    fn load(&mut self, msg: Vec<u8>) {
        let n = msg.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&msg[..n]);
        self.pos = 0;
        self.cap = n;
        self.eof = true;
    }

    /// Copies until the reader would block with everything written; `Ready(Ok)` at end of stream.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut r: Pin<&mut R>,
        mut w: Pin<&mut W>,
    ) -> Poll<Result<(), PumpError>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        loop {
            if self.pos == self.cap && !self.eof {
                if self.inject.is_some() && self.scanner.at_boundary() {
                    let msg = self.inject.take().unwrap_or_default();
                    self.load(msg);
                    continue;
                }
                let mut rb = ReadBuf::new(&mut self.buf);
                match r.as_mut().poll_read(cx, &mut rb) {
                    Poll::Pending => {
                        if self.need_flush {
                            ready!(w.as_mut().poll_flush(cx)).map_err(PumpError::Write)?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(PumpError::Read(e))),
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        if n == 0 {
                            self.eof = true;
                            if self.scanner.at_boundary()
                                && self.scanner.last_tag() != Some(b'E')
                                && let Some(msg) = self.on_eof.take()
                            {
                                self.load(msg);
                            }
                        } else {
                            self.scanner
                                .feed(&self.buf[..n], |_, _| {})
                                .map_err(PumpError::Frame)?;
                            self.counter.inc_by(n as u64);
                            self.pos = 0;
                            self.cap = n;
                        }
                    }
                }
            }
            while self.pos < self.cap {
                let n = ready!(w.as_mut().poll_write(cx, &self.buf[self.pos..self.cap]))
                    .map_err(PumpError::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(PumpError::Write(io::ErrorKind::WriteZero.into())));
                }
                self.pos += n;
                self.need_flush = true;
            }
            if self.eof {
                ready!(w.as_mut().poll_flush(cx)).map_err(PumpError::Write)?;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Buffer size and framing limit of a relay.
#[derive(Clone, Copy, Debug)]
pub struct RelaySettings {
    /// Bytes buffered per direction.
    pub buffer: usize,
    /// Largest message body accepted in either direction.
    pub max_message: u32,
}

/// Relays until either side ends or `terminate` fires; on termination the client gets FATAL
/// `57P01` at the next message boundary.
pub async fn relay(
    client: &mut Stream,
    backend: &mut Stream,
    settings: RelaySettings,
    counters: (IntCounter, IntCounter),
    terminate: &CancellationToken,
) -> RelayEnd {
    let mut c2b = Pump::new(settings.buffer, settings.max_message, counters.0);
    let mut b2c = Pump::new(settings.buffer, settings.max_message, counters.1);
    b2c.on_eof = Some(
        ErrorMessage::fatal(
            sqlstate::CONNECTION_FAILURE,
            "the connection to the tenant's database was lost",
        )
        .to_bytes()
        .to_vec(),
    );
    let mut terminated = Box::pin(terminate.cancelled());
    let mut boundary_wait: Option<Pin<Box<tokio::time::Sleep>>> = None;

    let end = std::future::poll_fn(|cx| {
        if boundary_wait.is_none() && terminated.as_mut().poll(cx).is_ready() {
            b2c.inject = Some(
                ErrorMessage::fatal(
                    sqlstate::ADMIN_SHUTDOWN,
                    "terminating connection because the gateway is shutting down",
                )
                .to_bytes()
                .to_vec(),
            );
            boundary_wait = Some(Box::pin(tokio::time::sleep(TERMINATE_BOUNDARY_WAIT)));
        }
        if let Some(wait) = boundary_wait.as_mut()
            && wait.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(RelayEnd::Terminated);
        }
        if let Poll::Ready(r) = c2b.poll_copy(cx, Pin::new(&mut *client), Pin::new(&mut *backend)) {
            return Poll::Ready(match r {
                Ok(()) => RelayEnd::ClientClosed,
                Err(PumpError::Read(e)) => RelayEnd::ClientIo(e),
                Err(PumpError::Write(e)) => RelayEnd::BackendIo(e),
                Err(PumpError::Frame(e)) => RelayEnd::ClientFrame(e),
            });
        }
        if c2b.scanner.last_tag() == Some(b'X') {
            // The client said goodbye; the backend closing next is no failure.
            b2c.on_eof = None;
        }
        if let Poll::Ready(r) = b2c.poll_copy(cx, Pin::new(&mut *backend), Pin::new(&mut *client)) {
            return Poll::Ready(match r {
                Ok(()) if boundary_wait.is_some() => RelayEnd::Terminated,
                Ok(()) => RelayEnd::BackendClosed,
                Err(PumpError::Read(e)) => RelayEnd::BackendIo(e),
                Err(PumpError::Write(e)) => RelayEnd::ClientIo(e),
                Err(PumpError::Frame(e)) => RelayEnd::BackendFrame(e),
            });
        }
        Poll::Pending
    })
    .await;

    // A client that vanished without Terminate leaves the backend mid-protocol; tell it we are
    // done so it ends cleanly instead of logging an unexpected EOF.
    if c2b.scanner.last_tag() != Some(b'X') && c2b.scanner.at_boundary() {
        let terminate_msg = [b'X', 0, 0, 0, 4];
        let _ = tokio::time::timeout(
            Duration::from_millis(200),
            backend.write_all(&terminate_msg),
        )
        .await;
    }
    let close = async {
        let _ = client.shutdown().await;
        let _ = backend.shutdown().await;
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), close).await;
    end
}
