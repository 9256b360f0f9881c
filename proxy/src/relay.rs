//! The relay: bytes copied in bulk both ways, message boundaries tracked from headers only.
//!
//! One future drives both directions, so neither can block the other (a backend streaming rows
//! while the client pipelines queries must not deadlock through the gateway), and no lock is
//! needed around a TLS stream. When either side ends, the whole session ends.
//!
//! The relay also feeds the session's [`SessionTracker`] with every chunk, and can hand the
//! session back to its caller at a safe point (quiet, asked to park or migrate, or an idle
//! backend going away) without closing anything, so the caller can move it to another backend.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pgwake_protocol::frontend::TERMINATE;
use pgwake_protocol::{ErrorMessage, FrameError, FrameScanner, SessionTracker, sqlstate};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
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
    /// The session sat at a safe point with nothing moving for the watch's `quiet_after`.
    Quiet,
    /// A park request arrived and the session is at a safe point.
    Park,
    /// A migrate request arrived and the session is at a safe point.
    Migrate,
    /// The client left (Terminate or end of stream) while the watch asked to keep the backend:
    /// the client side is closed, the backend connection untouched (its Terminate withheld).
    ClientLeft,
    /// The backend began an ErrorResponse (its bytes so far in `held`, not forwarded) or closed
    /// (`held` empty) while the session was at rest: usually a shutdown or restart.
    BackendEnded {
        /// The bytes read from the backend and kept from the client.
        held: Vec<u8>,
    },
}

impl RelayEnd {
    /// Label for `pgwake_errors_total`, or `None` for an ordinary end.
    pub fn error_kind(&self) -> Option<&'static str> {
        match self {
            RelayEnd::ClientClosed
            | RelayEnd::ClientLeft
            | RelayEnd::BackendClosed
            | RelayEnd::Quiet
            | RelayEnd::Park
            | RelayEnd::Migrate
            | RelayEnd::BackendEnded { .. } => None,
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
    /// The first bytes of what the caller asked to hold are in the buffer.
    Held,
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
    /// Bytes read in the last `poll_copy` (for quiet detection).
    moved: bool,
    /// Length of held bytes at the start of the buffer after [`PumpError::Held`].
    held: usize,
    /// Withhold a Terminate that ends a chunk at a message boundary and end the direction
    /// there, as at end of stream (the backend connection may then be kept).
    withhold_terminate: bool,
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
            moved: false,
            held: 0,
            withhold_terminate: false,
        }
    }

    /// True when everything read was written and the stream sits at a message boundary.
    fn drained(&self) -> bool {
        self.pos == self.cap && self.scanner.at_boundary() && !self.eof
    }

    /// Puts client bytes read before the relay started in the buffer, as if just read.
    fn preload(&mut self, bytes: &[u8], observe: &mut dyn FnMut(&[u8])) -> Result<(), FrameError> {
        let n = bytes.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&bytes[..n]);
        self.scanner.feed(&self.buf[..n], |_, _| {})?;
        observe(&self.buf[..n]);
        self.counter.inc_by(n as u64);
        self.pos = 0;
        self.cap = n;
        Ok(())
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
    /// Every chunk read goes to `observe`. With `hold`, a chunk that starts an ErrorResponse
    /// (or the end of the stream) is kept back and reported as [`PumpError::Held`].
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut r: Pin<&mut R>,
        mut w: Pin<&mut W>,
        observe: &mut dyn FnMut(&[u8]),
        hold: bool,
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
                        if hold && self.scanner.at_boundary() && (n == 0 || self.buf[0] == b'E') {
                            self.held = n;
                            return Poll::Ready(Err(PumpError::Held));
                        }
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
                            let mut keep = n;
                            if self.withhold_terminate
                                && self.scanner.at_boundary()
                                && self.scanner.last_tag() == Some(b'X')
                                && self.buf[..n].ends_with(&TERMINATE)
                            {
                                keep = n - TERMINATE.len();
                                self.eof = true;
                            }
                            observe(&self.buf[..keep]);
                            self.moved = true;
                            self.counter.inc_by(keep as u64);
                            self.pos = 0;
                            self.cap = keep;
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

/// What the relay watches besides the two streams, and when it hands the session back.
pub struct SessionWatch<'a> {
    /// Fed with every chunk in both directions.
    pub tracker: &'a mut SessionTracker,
    /// Return [`RelayEnd::Quiet`] once the session has been at rest this long after bytes last
    /// moved.
    pub quiet_after: Option<Duration>,
    /// Return [`RelayEnd::Quiet`] once the session has been at rest this long from the start
    /// of this run, if no bytes move before (`None`: only after bytes have moved). Lets the
    /// caller count an idle period that began before the run.
    pub quiet_first: Option<Duration>,
    /// Return [`RelayEnd::Park`] at rest once this changes.
    pub park: Option<&'a mut watch::Receiver<u64>>,
    /// Return [`RelayEnd::Migrate`] at rest once this changes.
    pub migrate: Option<&'a mut watch::Receiver<u64>>,
    /// Keep an ErrorResponse or end of stream from a backend at rest from the client and
    /// return [`RelayEnd::BackendEnded`], so the caller can move the session instead.
    pub hold_backend_end: bool,
    /// Called once, when the client first sends bytes in this run.
    pub on_client_activity: Option<&'a mut (dyn FnMut() + Send)>,
    /// Client bytes read before this run (while parked), relayed first.
    pub preload: Vec<u8>,
    /// When the client leaves at a message boundary, withhold its Terminate, close only the
    /// client and return [`RelayEnd::ClientLeft`], so the backend connection can be kept.
    pub keep_backend: bool,
}

impl<'a> SessionWatch<'a> {
    /// A watch that only feeds the tracker.
    pub fn new(tracker: &'a mut SessionTracker) -> SessionWatch<'a> {
        SessionWatch {
            tracker,
            quiet_after: None,
            quiet_first: None,
            park: None,
            migrate: None,
            hold_backend_end: false,
            on_client_activity: None,
            preload: Vec::new(),
            keep_backend: false,
        }
    }
}

/// A watch receiver's next change as a future, or one that never completes.
async fn changed(rx: Option<&mut watch::Receiver<u64>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Relays until either side ends, `terminate` fires or the watch hands the session back; on
/// termination the client gets FATAL `57P01` at the next message boundary. Both streams are
/// closed only when the session ends, not when it is handed back.
pub async fn relay(
    client: &mut Stream,
    backend: &mut Stream,
    settings: RelaySettings,
    counters: (IntCounter, IntCounter),
    terminate: &CancellationToken,
    watch: SessionWatch<'_>,
) -> RelayEnd {
    let SessionWatch {
        tracker,
        quiet_after,
        quiet_first,
        park,
        migrate,
        hold_backend_end,
        mut on_client_activity,
        preload,
        keep_backend,
    } = watch;
    let mut c2b = Pump::new(settings.buffer, settings.max_message, counters.0);
    c2b.withhold_terminate = keep_backend;
    let mut b2c = Pump::new(settings.buffer, settings.max_message, counters.1);
    if !preload.is_empty()
        && let Err(e) = c2b.preload(&preload, &mut |d| {
            tracker.observe_client(d, std::time::Instant::now())
        })
    {
        return RelayEnd::ClientFrame(e);
    }
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
    let mut park_fut = Box::pin(changed(park));
    let mut migrate_fut = Box::pin(changed(migrate));
    let (mut park_asked, mut migrate_asked) = (false, false);
    let quiet_for = quiet_after.unwrap_or(Duration::MAX);
    let mut quiet = quiet_after.map(|d| Box::pin(tokio::time::sleep(quiet_first.unwrap_or(d))));
    let mut quiet_armed = quiet_first.is_some();

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
        let now = std::time::Instant::now();
        c2b.moved = false;
        b2c.moved = false;
        let client_poll = c2b.poll_copy(
            cx,
            Pin::new(&mut *client),
            Pin::new(&mut *backend),
            &mut |d| tracker.observe_client(d, now),
            false,
        );
        if c2b.moved
            && let Some(f) = on_client_activity.take()
        {
            f();
        }
        if let Poll::Ready(r) = client_poll {
            return Poll::Ready(match r {
                Ok(()) => RelayEnd::ClientClosed,
                Err(PumpError::Read(e)) => RelayEnd::ClientIo(e),
                Err(PumpError::Write(e)) => RelayEnd::BackendIo(e),
                Err(PumpError::Frame(e)) => RelayEnd::ClientFrame(e),
                Err(PumpError::Held) => RelayEnd::ClientClosed,
            });
        }
        if c2b.scanner.last_tag() == Some(b'X') {
            // The client said goodbye; the backend closing next is no failure.
            b2c.on_eof = None;
        }
        let hold = hold_backend_end
            && boundary_wait.is_none()
            && tracker.at_rest()
            && b2c.drained()
            && c2b.drained();
        if let Poll::Ready(r) = b2c.poll_copy(
            cx,
            Pin::new(&mut *backend),
            Pin::new(&mut *client),
            &mut |d| tracker.observe_backend(d, now),
            hold,
        ) {
            return Poll::Ready(match r {
                Ok(()) if boundary_wait.is_some() => RelayEnd::Terminated,
                Ok(()) => RelayEnd::BackendClosed,
                Err(PumpError::Read(e)) => RelayEnd::BackendIo(e),
                Err(PumpError::Write(e)) => RelayEnd::ClientIo(e),
                Err(PumpError::Frame(e)) => RelayEnd::BackendFrame(e),
                Err(PumpError::Held) => RelayEnd::BackendEnded {
                    held: b2c.buf[..b2c.held].to_vec(),
                },
            });
        }
        if boundary_wait.is_some() {
            return Poll::Pending;
        }
        // Both directions would block: see whether the caller wants the session back.
        if !park_asked && park_fut.as_mut().poll(cx).is_ready() {
            park_asked = true;
        }
        if !migrate_asked && migrate_fut.as_mut().poll(cx).is_ready() {
            migrate_asked = true;
        }
        let at_rest = tracker.at_rest()
            && c2b.drained()
            && b2c.drained()
            && !c2b.need_flush
            && !b2c.need_flush;
        if at_rest && migrate_asked {
            return Poll::Ready(RelayEnd::Migrate);
        }
        if at_rest && park_asked {
            return Poll::Ready(RelayEnd::Park);
        }
        if let Some(q) = quiet.as_mut() {
            if c2b.moved || b2c.moved {
                quiet_armed = true;
                q.as_mut().reset(tokio::time::Instant::now() + quiet_for);
            }
            if at_rest && quiet_armed && q.as_mut().poll(cx).is_ready() {
                return Poll::Ready(RelayEnd::Quiet);
            }
        }
        Poll::Pending
    })
    .await;
    if matches!(
        end,
        RelayEnd::Quiet | RelayEnd::Park | RelayEnd::Migrate | RelayEnd::BackendEnded { .. }
    ) {
        return end;
    }
    if let RelayEnd::ClientFrame(e) = &end {
        // The bad bytes never reached the backend; tell the client why its session ends.
        let msg = ErrorMessage::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            format!("invalid frontend message: {e}"),
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            client.write_all(&msg.to_bytes()).await?;
            client.flush().await
        })
        .await;
    }
    if keep_backend && matches!(end, RelayEnd::ClientClosed) && c2b.scanner.at_boundary() {
        let _ = tokio::time::timeout(Duration::from_millis(500), client.shutdown()).await;
        return RelayEnd::ClientLeft;
    }

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
