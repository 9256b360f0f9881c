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
use std::time::{Duration, Instant};

use pgwake_protocol::frontend::TERMINATE;
use pgwake_protocol::notify_pid::NotifyPid;
use pgwake_protocol::stale::{Advance, Splice};
use pgwake_protocol::{ErrorMessage, FrameError, FrameScanner, SessionTracker, TxStatus, sqlstate};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::requests::{Asked, Requests};
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
    /// The gateway ended the session: idle inside a transaction past its limit.
    IdleInTransaction,
    /// The session sat at a safe point with nothing moving for the watch's `quiet_after`.
    Quiet,
    /// A park request arrived and the session is at a safe point.
    Park,
    /// A migrate request arrived and the session is at a safe point.
    Migrate,
    /// The client left (Terminate or end of stream) while the watch asked to keep the backend:
    /// the client side is closed, the backend connection untouched (its Terminate withheld).
    ClientLeft,
    /// The client sent bytes (given here, not forwarded) while the session was at rest and the
    /// watch asked for them ([`SessionWatch::client_at_rest`]).
    ClientAtRest(Vec<u8>),
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
            | RelayEnd::ClientAtRest(_)
            | RelayEnd::BackendEnded { .. } => None,
            RelayEnd::ClientIo(_) => Some("client_io"),
            RelayEnd::BackendIo(_) => Some("backend_io"),
            RelayEnd::ClientFrame(_) => Some("client_protocol"),
            RelayEnd::BackendFrame(_) => Some("backend_protocol"),
            RelayEnd::Terminated => Some("shutdown"),
            RelayEnd::IdleInTransaction => Some("idle_in_transaction"),
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

/// What a direction tells the session's tracker: every chunk read, and, while a filter is
/// active (a revival left statements whose rows changed), the unwritten bytes to edit.
trait Tap {
    /// Bytes just read.
    fn observe(&mut self, new: &[u8]);
    /// Edits `data` (unwritten, starting where the last call's `ready` ended) and says how much
    /// is final; `None` when no filter is active (all of it is).
    fn filter(&mut self, data: &mut [u8]) -> Option<Advance>;
}

/// The time of one turn of the relay, read when first needed: every chunk a turn moves took
/// place then, and reading the clock for each would cost more than the rest of the turn.
#[derive(Default)]
struct Clock(Option<Instant>);

impl Clock {
    fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// The client direction of a session's tracker.
struct ClientTap<'a>(&'a mut SessionTracker, &'a mut Clock);

impl Tap for ClientTap<'_> {
    fn observe(&mut self, new: &[u8]) {
        self.0.observe_client(new, self.1.now());
    }

    fn filter(&mut self, data: &mut [u8]) -> Option<Advance> {
        self.0.filter_client(data)
    }
}

/// The backend direction of a session's tracker.
struct BackendTap<'a>(&'a mut SessionTracker, &'a mut Clock);

impl Tap for BackendTap<'_> {
    fn observe(&mut self, new: &[u8]) {
        self.0.observe_backend(new, self.1.now());
    }

    fn filter(&mut self, data: &mut [u8]) -> Option<Advance> {
        self.0.filter_backend(data)
    }
}

/// One direction: a buffer, the bytes in it not yet written, and the framing state.
struct Pump {
    /// Counts the bytes this direction moves.
    counter: IntCounter,
    /// Bytes read and not yet written are `buf[pos..cap]`; of those, `buf[ready..cap]` wait
    /// for more input before a filter lets them go (always empty without a filter).
    buf: Box<[u8]>,
    pos: usize,
    ready: usize,
    cap: usize,
    /// A filter's replacement of bytes within `buf[pos..ready]`, and how much of it is written.
    splice: Option<(Splice, usize)>,
    scanner: FrameScanner,
    /// The source ended.
    eof: bool,
    /// Bytes were written since the last flush.
    need_flush: bool,
    /// A message to send at the next boundary, after which this direction ends.
    inject: Option<Vec<u8>>,
    /// Bytes read in the last `poll_copy` (for quiet detection).
    moved: bool,
    /// A message to send if the source ends at a boundary without an error of its own.
    on_eof: Option<Vec<u8>>,
    /// Length of held bytes at the start of the buffer after [`PumpError::Held`].
    held: usize,
    /// Withhold a Terminate that ends a chunk at a message boundary and end the direction
    /// there, as at end of stream (the backend connection may then be kept).
    withhold_terminate: bool,
    /// Puts the client's process id in notifications its backend stamps with its own.
    notify_pid: Option<NotifyPid>,
}

impl Pump {
    fn new(size: usize, max_message: u32, counter: IntCounter) -> Pump {
        Pump {
            buf: vec![0u8; size].into_boxed_slice(),
            pos: 0,
            ready: 0,
            cap: 0,
            splice: None,
            eof: false,
            need_flush: false,
            scanner: FrameScanner::new(max_message),
            counter,
            inject: None,
            on_eof: None,
            moved: false,
            held: 0,
            withhold_terminate: false,
            notify_pid: None,
        }
    }

    /// True when everything read was written and the stream sits at a message boundary.
    fn drained(&self) -> bool {
        self.pos == self.cap && self.scanner.at_boundary() && !self.eof
    }

    /// Puts client bytes read before the relay started in the buffer, as if just read.
    fn preload(&mut self, bytes: &[u8], tap: &mut dyn Tap) -> Result<(), FrameError> {
        let n = bytes.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&bytes[..n]);
        self.scanner.feed(&self.buf[..n], |_, _| {})?;
        tap.observe(&self.buf[..n]);
        self.counter.inc_by(n as u64);
        self.pos = 0;
        self.cap = n;
        self.apply_filter(tap);
        Ok(())
    }

    /// Lets the tap's filter edit the unwritten bytes and decide how many are final.
    fn apply_filter(&mut self, tap: &mut dyn Tap) {
        match tap.filter(&mut self.buf[..self.cap]) {
            Some(a) => {
                self.ready = a.ready.min(self.cap);
                self.splice = a.splice.map(|s| (s, 0));
            }
            None => self.ready = self.cap,
        }
        if let Some(rewrite) = &mut self.notify_pid
            && let Some(wait) = rewrite.apply(&mut self.buf[..self.cap])
        {
            self.ready = self.ready.min(wait);
        }
    }

    /// Frames the bytes just read into `buf[new]`, noting where notifications' bodies start when
    /// their process id is rewritten.
    fn scan(&mut self, new: std::ops::Range<usize>) -> Result<(), FrameError> {
        let base = new.start;
        match &mut self.notify_pid {
            Some(rewrite) => self.scanner.feed_at(&self.buf[new], |tag, _, at| {
                if tag == b'A' {
                    rewrite.body_at(base + at);
                }
            }),
            None => self.scanner.feed(&self.buf[new], |_, _| {}),
        }
    }

    /// Moves bytes a filter holds back to the front of the buffer, so more can be read after
    /// them; returns how many there are.
    fn carry_held(&mut self) -> usize {
        let held = self.cap - self.ready;
        if held > 0 {
            self.buf.copy_within(self.ready..self.cap, 0);
        }
        if let Some(rewrite) = &mut self.notify_pid {
            rewrite.shift(self.ready);
        }
        self.pos = 0;
        self.ready = 0;
        self.cap = held;
        held
    }

    /// Writes the final bytes, with a filter's replacement in place of what it replaces.
    fn poll_write_ready<W: AsyncWrite + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        mut w: Pin<&mut W>,
    ) -> Poll<Result<(), PumpError>> {
        while self.pos < self.ready {
            let until = match &self.splice {
                Some((s, _)) if s.at >= self.pos => s.at,
                _ => self.ready,
            };
            let n = if self.pos == until {
                let Some((s, done)) = self.splice.as_mut() else {
                    break;
                };
                if s.with.is_empty() {
                    // Bytes taken out (a remade statement's answers): nothing in their place.
                    self.pos += s.len;
                    self.splice = None;
                    continue;
                }
                let n = ready!(w.as_mut().poll_write(cx, &s.with[*done..]))
                    .map_err(PumpError::Write)?;
                *done += n;
                if *done == s.with.len() {
                    self.pos += s.len;
                    self.splice = None;
                }
                n
            } else {
                let n = ready!(w.as_mut().poll_write(cx, &self.buf[self.pos..until]))
                    .map_err(PumpError::Write)?;
                self.pos += n;
                n
            };
            if n == 0 {
                return Poll::Ready(Err(PumpError::Write(io::ErrorKind::WriteZero.into())));
            }
            self.need_flush = true;
        }
        Poll::Ready(Ok(()))
    }

    /// Puts an injected message in the buffer when everything before it is written and the
    /// stream sits at a boundary.
    fn load(&mut self, msg: Vec<u8>) {
        let n = msg.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&msg[..n]);
        self.pos = 0;
        self.ready = n;
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
        tap: &mut dyn Tap,
        hold: bool,
    ) -> Poll<Result<(), PumpError>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        loop {
            if self.pos == self.ready && !self.eof {
                let carried = self.carry_held();
                if carried > 0 {
                    // A filter makes one edit per pass and holds back what follows it, which
                    // may be whole messages already here: it sees them again before any read.
                    self.apply_filter(tap);
                    if self.ready > 0 {
                        continue;
                    }
                }
                if carried == 0 && self.inject.is_some() && self.scanner.at_boundary() {
                    let msg = self.inject.take().unwrap_or_default();
                    self.load(msg);
                    continue;
                }
                let mut rb = ReadBuf::new(&mut self.buf[carried..]);
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
                        // Held bytes only exist mid-message, so at a boundary nothing is carried.
                        if hold && self.scanner.at_boundary() && (n == 0 || self.buf[0] == b'E') {
                            self.held = n;
                            return Poll::Ready(Err(PumpError::Held));
                        }
                        if n == 0 {
                            self.eof = true;
                            // A stream that ends inside a held message ends it as it is.
                            self.ready = self.cap;
                            if self.scanner.at_boundary()
                                && self.scanner.last_tag() != Some(b'E')
                                && let Some(msg) = self.on_eof.take()
                            {
                                self.load(msg);
                            }
                        } else {
                            let new = carried..carried + n;
                            self.scan(new.clone()).map_err(PumpError::Frame)?;
                            let mut keep = n;
                            if self.withhold_terminate
                                && self.scanner.at_boundary()
                                && self.scanner.last_tag() == Some(b'X')
                                && self.buf[new].ends_with(&TERMINATE)
                            {
                                keep = n - TERMINATE.len();
                                self.eof = true;
                            }
                            tap.observe(&self.buf[carried..carried + keep]);
                            self.moved = true;
                            self.counter.inc_by(keep as u64);
                            self.pos = 0;
                            self.cap = carried + keep;
                            self.apply_filter(tap);
                        }
                    }
                }
            }
            ready!(self.poll_write_ready(cx, w.as_mut()))?;
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
    /// How long a session may stay idle inside a transaction before the gateway ends it
    /// (`limits.idle_in_transaction_timeout`), whatever the session set its own
    /// `idle_in_transaction_session_timeout` to; `None`: no limit.
    pub idle_in_transaction: Option<Duration>,
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
    /// Called with whether the session is inside a transaction block, at the start of the
    /// run and whenever that changes.
    pub on_transaction: Option<&'a mut (dyn FnMut(bool) + Send)>,
    /// Client bytes read before this run (while parked), relayed first.
    pub preload: Vec<u8>,
    /// When the client leaves at a message boundary, withhold its Terminate, close only the
    /// client and return [`RelayEnd::ClientLeft`], so the backend connection can be kept.
    pub keep_backend: bool,
    /// The session runs on a backend other than the one whose process id its client was
    /// given: its notifications get the client's id back.
    pub notify_pid: Option<NotifyPid>,
    /// Return [`RelayEnd::ClientAtRest`] with the client's next bytes when they come while the
    /// session is at rest, before they reach the backend.
    pub client_at_rest: bool,
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
            on_transaction: None,
            preload: Vec::new(),
            keep_backend: false,
            notify_pid: None,
            client_at_rest: false,
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

/// When the gateway's shutdown ends a relay.
#[derive(Clone, Copy)]
pub struct Ending<'a> {
    /// Now, at the next message boundary.
    pub terminate: &'a CancellationToken,
    /// As soon as the session is at rest (no transaction open, nothing in flight).
    pub when_idle: &'a CancellationToken,
}

impl<'a> Ending<'a> {
    /// What a run waits for besides its streams: these two tokens, and the caller's `park` and
    /// `migrate` requests (futures that complete when one comes).
    fn requests<P, M>(self, park: P, migrate: M) -> Requests<WaitForCancellationFuture<'a>, P, M>
    where
        P: Future<Output = ()>,
        M: Future<Output = ()>,
    {
        Requests::new(
            self.terminate.cancelled(),
            self.when_idle.cancelled(),
            park,
            migrate,
        )
    }
}

/// Relays until either side ends, `ending` says so or the watch hands the session back; on
/// termination the client gets FATAL `57P01` at the next message boundary. Both streams are
/// closed only when the session ends, not when it is handed back.
pub async fn relay(
    client: &mut Stream,
    backend: &mut Stream,
    settings: RelaySettings,
    counters: (IntCounter, IntCounter),
    ending: Ending<'_>,
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
        mut on_transaction,
        preload,
        keep_backend,
        notify_pid,
        client_at_rest,
    } = watch;
    let mut in_transaction = None;
    let ways = (keep_backend, notify_pid);
    let (mut c2b, mut b2c) = match pumps(settings, counters, ways, &preload, tracker) {
        Ok(p) => p,
        Err(e) => return RelayEnd::ClientFrame(e),
    };
    let mut requests = ending.requests(changed(park), changed(migrate));
    let mut shutdown = Shutdown::new();
    let mut transaction_limit = TransactionLimit::new(settings.idle_in_transaction);
    let mut handback = Handback::new((quiet_after, quiet_first));
    let end = std::future::poll_fn(|cx| {
        let asked = requests.poll(cx);
        if let Poll::Ready(end) = shutdown.poll(cx, asked.terminate, &mut b2c) {
            return Poll::Ready(end);
        }
        c2b.moved = false;
        b2c.moved = false;
        let mut clock = Clock::default();
        let stop = client_at_rest && !shutdown.started();
        let client_poll = match shutdown.client_cut {
            true => Poll::Pending,
            false => poll_client(
                cx,
                (&mut c2b, &b2c),
                (client, backend),
                (tracker, &mut clock),
                stop,
            ),
        };
        if c2b.moved
            && let Some(f) = on_client_activity.take()
        {
            f();
        }
        match client_poll {
            Poll::Ready(Ok(Some(bytes))) => return Poll::Ready(RelayEnd::ClientAtRest(bytes)),
            Poll::Ready(r) => return Poll::Ready(client_end(r.map(|_| ()))),
            Poll::Pending => {}
        }
        if c2b.scanner.last_tag() == Some(b'X') {
            // The client said goodbye; the backend closing next is no failure.
            b2c.on_eof = None;
        }
        let hold = hold_backend_end
            && !shutdown.started()
            && tracker.at_rest()
            && b2c.drained()
            && c2b.drained();
        if let Poll::Ready(r) = b2c.poll_copy(
            cx,
            Pin::new(&mut *backend),
            Pin::new(&mut *client),
            &mut BackendTap(tracker, &mut clock),
            hold,
        ) {
            return Poll::Ready(backend_end(r, &b2c, shutdown.why()));
        }
        report_transaction(on_transaction.as_deref_mut(), &mut in_transaction, tracker);
        if shutdown.started() {
            return Poll::Pending;
        }
        // Both directions would block: see whether the session ends or goes back.
        let still = stillness(tracker, &c2b, &b2c);
        let at_rest = still == Stillness::AtRest;
        let moved = c2b.moved || b2c.moved;
        if transaction_limit.expired(cx, still == Stillness::IdleInTransaction, moved) {
            shutdown.end_idle_transaction(&mut b2c);
        }
        if shutdown.started() || shutdown.end_if_idle(at_rest && asked.idle, &mut b2c) {
            // The FATAL goes out on the next turn, from the backend's direction.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        handback.poll(cx, at_rest, asked, moved.then(|| clock.now()))
    })
    .await;
    finish(end, client, backend, &c2b, keep_backend).await
}

/// Tells `report` whether the session is inside a transaction block when that changed since
/// it was last told (`told`).
fn report_transaction<F: FnMut(bool) + ?Sized>(
    report: Option<&mut F>,
    told: &mut Option<bool>,
    tracker: &SessionTracker,
) {
    if let Some(report) = report {
        let now = tracker.status() != TxStatus::Idle;
        if told.replace(now) != Some(now) {
            report(now);
        }
    }
}

/// One turn of the client's direction: its bytes go to the backend, unless the session is at
/// rest and `stop_at_rest` asks for them, when they are read and handed back (`Some`; `None` at
/// the end of the client's stream).
fn poll_client(
    cx: &mut Context<'_>,
    (c2b, b2c): (&mut Pump, &Pump),
    (client, backend): (&mut Stream, &mut Stream),
    (tracker, clock): (&mut SessionTracker, &mut Clock),
    stop_at_rest: bool,
) -> Poll<Result<Option<Vec<u8>>, PumpError>> {
    if stop_at_rest && stillness(tracker, c2b, b2c) == Stillness::AtRest {
        let mut buf = vec![0u8; CLIENT_AT_REST_READ];
        let mut rb = ReadBuf::new(&mut buf);
        ready!(Pin::new(client).poll_read(cx, &mut rb)).map_err(PumpError::Read)?;
        let n = rb.filled().len();
        buf.truncate(n);
        return Poll::Ready(Ok((n > 0).then_some(buf)));
    }
    let tap = &mut ClientTap(tracker, clock);
    let copied = c2b.poll_copy(cx, Pin::new(client), Pin::new(backend), tap, false);
    copied.map_ok(|()| None)
}

/// Most bytes read at once for [`RelayEnd::ClientAtRest`]; the rest follows through the relay.
const CLIENT_AT_REST_READ: usize = 8192;

/// Where a session stands while both directions wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stillness {
    /// Bytes wait to be written, or a request is being answered.
    Busy,
    /// At a safe point: no transaction open, nothing in flight.
    AtRest,
    /// Inside a transaction, with nothing in flight: the client's turn.
    IdleInTransaction,
}

fn stillness(tracker: &SessionTracker, c2b: &Pump, b2c: &Pump) -> Stillness {
    let drained = c2b.drained() && b2c.drained() && !c2b.need_flush && !b2c.need_flush;
    if !drained {
        Stillness::Busy
    } else if tracker.at_rest() {
        Stillness::AtRest
    } else if tracker.status() != TxStatus::Idle && !tracker.in_flight() && !tracker.in_copy() {
        Stillness::IdleInTransaction
    } else {
        Stillness::Busy
    }
}

/// The two directions of a relay run, the client's with any bytes read while it was parked;
/// `keep_backend` and `notify_pid` as in [`SessionWatch`].
fn pumps(
    settings: RelaySettings,
    counters: (IntCounter, IntCounter),
    (keep_backend, notify_pid): (bool, Option<NotifyPid>),
    preload: &[u8],
    tracker: &mut SessionTracker,
) -> Result<(Pump, Pump), FrameError> {
    let mut c2b = Pump::new(settings.buffer, settings.max_message, counters.0);
    c2b.withhold_terminate = keep_backend;
    let mut b2c = Pump::new(settings.buffer, settings.max_message, counters.1);
    b2c.notify_pid = notify_pid;
    if !preload.is_empty() {
        c2b.preload(preload, &mut ClientTap(tracker, &mut Clock::default()))?;
    }
    b2c.on_eof = Some(
        ErrorMessage::fatal(
            sqlstate::CONNECTION_FAILURE,
            "the connection to the tenant's database was lost",
        )
        .to_bytes()
        .to_vec(),
    );
    Ok((c2b, b2c))
}

/// How the client-to-backend direction ended.
fn client_end(r: Result<(), PumpError>) -> RelayEnd {
    match r {
        Ok(()) => RelayEnd::ClientClosed,
        Err(PumpError::Read(e)) => RelayEnd::ClientIo(e),
        Err(PumpError::Write(e)) => RelayEnd::BackendIo(e),
        Err(PumpError::Frame(e)) => RelayEnd::ClientFrame(e),
        Err(PumpError::Held) => RelayEnd::ClientClosed,
    }
}

/// How the backend-to-client direction ended (`ending`: why the gateway is ending the session,
/// if it is).
fn backend_end(r: Result<(), PumpError>, b2c: &Pump, ending: Option<Why>) -> RelayEnd {
    match r {
        Ok(()) if ending == Some(Why::Shutdown) => RelayEnd::Terminated,
        Ok(()) if ending == Some(Why::IdleInTransaction) => RelayEnd::IdleInTransaction,
        Ok(()) => RelayEnd::BackendClosed,
        Err(PumpError::Read(e)) => RelayEnd::BackendIo(e),
        Err(PumpError::Write(e)) => RelayEnd::ClientIo(e),
        Err(PumpError::Frame(e)) => RelayEnd::BackendFrame(e),
        Err(PumpError::Held) => RelayEnd::BackendEnded {
            held: b2c.buf[..b2c.held].to_vec(),
        },
    }
}

/// The gateway's shutdown as a relay sees it: once it terminates sessions, or ends idle ones
/// and the session is at rest, FATAL `57P01` goes to the client at the next message boundary,
/// and the run ends after a bounded wait for one.
struct Shutdown {
    boundary_wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The client's bytes are no longer read: the session was ended at rest, and a query sent
    /// after that decision must not run without its client hearing the result.
    client_cut: bool,
    /// What ends the session once it has begun.
    why: Why,
}

/// Why the gateway ends a session in the middle of its relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// The gateway is shutting down.
    Shutdown,
    /// It stayed idle inside a transaction past `limits.idle_in_transaction_timeout`.
    IdleInTransaction,
}

/// The gateway's own idle-in-transaction limit: Postgres's setting of the same meaning is set
/// at every login, but a client can lift it for its session (`SET`, `SET LOCAL`,
/// `set_config`) and hold a capped tenant's connection for ever.
struct TransactionLimit {
    limit: Option<Duration>,
    /// Runs while the session is idle inside a transaction.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl TransactionLimit {
    fn new(limit: Option<Duration>) -> Self {
        TransactionLimit { limit, timer: None }
    }

    /// True once the session has been `idle_in_transaction` for the whole limit; `moved`
    /// says bytes moved in this poll (the wait starts again).
    fn expired(&mut self, cx: &mut Context<'_>, idle_in_transaction: bool, moved: bool) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        if !idle_in_transaction || moved {
            self.timer = None;
        }
        if !idle_in_transaction {
            return false;
        }
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        timer.as_mut().poll(cx).is_ready()
    }
}

impl Shutdown {
    /// A shutdown not begun.
    fn new() -> Self {
        Shutdown {
            boundary_wait: None,
            client_cut: false,
            why: Why::Shutdown,
        }
    }

    /// Whether the shutdown reached this run.
    fn started(&self) -> bool {
        self.boundary_wait.is_some()
    }

    /// Why the session is being ended, once it is.
    fn why(&self) -> Option<Why> {
        self.started().then_some(self.why)
    }

    /// Queues the FATAL for the client and starts the wait for a boundary.
    fn begin(&mut self, b2c: &mut Pump) {
        let (code, message) = match self.why {
            Why::Shutdown => (
                sqlstate::ADMIN_SHUTDOWN,
                "terminating connection because the gateway is shutting down",
            ),
            Why::IdleInTransaction => (
                sqlstate::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                "terminating connection due to idle-in-transaction timeout",
            ),
        };
        b2c.inject = Some(ErrorMessage::fatal(code, message).to_bytes().to_vec());
        self.boundary_wait = Some(Box::pin(tokio::time::sleep(TERMINATE_BOUNDARY_WAIT)));
    }

    /// Ends a session idle inside its transaction for longer than the gateway allows, as
    /// Postgres's own timeout would: FATAL `25P03`, and its client is no longer read.
    fn end_idle_transaction(&mut self, b2c: &mut Pump) {
        if self.started() {
            return;
        }
        self.why = Why::IdleInTransaction;
        self.client_cut = true;
        self.begin(b2c);
    }

    /// Begins the shutdown of a session at rest once idle sessions are to end (`idle_ending`:
    /// both hold); true when it did.
    fn end_if_idle(&mut self, idle_ending: bool, b2c: &mut Pump) -> bool {
        if !idle_ending || self.started() {
            return false;
        }
        self.client_cut = true;
        self.begin(b2c);
        true
    }

    /// Ready with [`RelayEnd::Terminated`] once the wait for a boundary is over; `terminate`:
    /// the gateway terminates sessions.
    fn poll(&mut self, cx: &mut Context<'_>, terminate: bool, b2c: &mut Pump) -> Poll<RelayEnd> {
        if self.boundary_wait.is_none() && terminate {
            self.begin(b2c);
        }
        match self
            .boundary_wait
            .as_mut()
            .map(|wait| wait.as_mut().poll(cx))
        {
            Some(Poll::Ready(())) => Poll::Ready(match self.why {
                Why::Shutdown => RelayEnd::Terminated,
                Why::IdleInTransaction => RelayEnd::IdleInTransaction,
            }),
            _ => Poll::Pending,
        }
    }
}

/// A watch's `quiet_after` and `quiet_first`.
type QuietTimes = (Option<Duration>, Option<Duration>);

/// What hands a session back to its caller while both directions wait: a park or migrate
/// request, or the session being quiet for long enough; each only at a safe point.
struct Handback {
    quiet_for: Duration,
    quiet: Option<Pin<Box<tokio::time::Sleep>>>,
    quiet_armed: bool,
    /// When bytes last moved. The timer is pushed back to `quiet_for` after it only when it
    /// fires, so a busy session does not rearrange the timer wheel at every message.
    last_moved: Option<Instant>,
}

impl Handback {
    /// Hands back on a park or migrate request, or after the watch's `(quiet_after,
    /// quiet_first)`.
    fn new((quiet_after, quiet_first): QuietTimes) -> Self {
        Handback {
            quiet_for: quiet_after.unwrap_or(Duration::MAX),
            quiet: quiet_after.map(|d| Box::pin(tokio::time::sleep(quiet_first.unwrap_or(d)))),
            quiet_armed: quiet_first.is_some(),
            last_moved: None,
        }
    }

    /// Ready with how the run ends when the session is `at_rest` and the caller wants it back
    /// (`asked`); `moved` is when bytes moved in this poll, if they did (the quiet period starts
    /// again).
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        at_rest: bool,
        asked: Asked,
        moved: Option<Instant>,
    ) -> Poll<RelayEnd> {
        if at_rest && asked.migrate {
            return Poll::Ready(RelayEnd::Migrate);
        }
        if at_rest && asked.park {
            return Poll::Ready(RelayEnd::Park);
        }
        if let Some(q) = self.quiet.as_mut() {
            if moved.is_some() {
                self.quiet_armed = true;
                self.last_moved = moved;
            }
            while at_rest && self.quiet_armed && q.as_mut().poll(cx).is_ready() {
                let quiet_until = self
                    .last_moved
                    .map(|at| tokio::time::Instant::from_std(at) + self.quiet_for);
                match quiet_until {
                    Some(until) if until > q.deadline() => q.as_mut().reset(until),
                    _ => return Poll::Ready(RelayEnd::Quiet),
                }
            }
        }
        Poll::Pending
    }
}

/// Closes what a finished run leaves: nothing for a session handed back; the client told why
/// a bad frame ends it; the client side only when the backend connection is kept; otherwise a
/// Terminate for a backend whose client vanished, and both streams shut down.
async fn finish(
    end: RelayEnd,
    client: &mut Stream,
    backend: &mut Stream,
    c2b: &Pump,
    keep_backend: bool,
) -> RelayEnd {
    if matches!(
        end,
        RelayEnd::Quiet
            | RelayEnd::Park
            | RelayEnd::Migrate
            | RelayEnd::ClientAtRest(_)
            | RelayEnd::BackendEnded { .. }
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
        let _ =
            tokio::time::timeout(Duration::from_millis(200), backend.write_all(&TERMINATE)).await;
    }
    let close = async {
        let _ = client.shutdown().await;
        let _ = backend.shutdown().await;
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), close).await;
    end
}
