//! A session after login: relayed to its backend connection, and moved off it when that helps —
//! parked while its tenant sleeps, moved when the backend restarts under it or an operator asks —
//! then revived on a new backend connection with its revival token.
//!
//! The session records its state (one SQL query) once it has been quiet at a safe point for
//! `revival.snapshot_after`; once the tenant's idle timeout has passed since its last traffic
//! (however the snapshot fell in that time) it marks its claim idle, and when
//! every session of the tenant is idle the idle sleeper asks them to park. A parked session keeps
//! only the client socket, the tracker, the snapshot and the sealed token; the client's next
//! message wakes the tenant if needed and revives the session before it is forwarded.
//!
//! When to do which is decided by `pgwake_protocol::mobility` without I/O; this module carries
//! its decisions out.

pub mod relay;
mod requests;
mod revive;
pub mod snapshot;

use std::sync::Arc;
use std::time::Duration;

use pgwake_protocol::frontend::{self, TERMINATE};
use pgwake_protocol::mobility::{Decision, Mobility, Move, Outcome, Policy, RunPlan, SnapshotView};
use pgwake_protocol::notify_pid::NotifyPid;
use pgwake_protocol::{ErrorMessage, Pins, SessionTracker, TrackerLimits, sqlstate};
use pgwake_routing::wake::SessionClient;
use pgwake_routing::{Endpoint, WakeClaim, WakeCoordinator};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use self::relay::RelaySettings;
pub use self::revive::{Revivable, Revival};

use self::relay::{RelayEnd, SessionWatch, relay};
use self::snapshot::{
    Restored, SequenceCheck, Snapshot, SnapshotLimits, StateError, take_snapshot,
};
use crate::cancel::{CancelMap, CancelRegistration, cancel_in_background};
use crate::config::{PinnedPolicy, SequenceStatePolicy};
use crate::metrics::Metrics;
use crate::stream::Stream;
use crate::upstream::{BackendSlot, Connector, Returnable};

/// What sessions share: the way to new backend connections, the wake coordinator (a parked
/// session's tenant may sleep), revival keys and settings, and the relay's sizes.
pub struct Sessions {
    /// Opens and takes back backend connections.
    pub connector: Arc<Connector>,
    /// Wakes a parked session's tenant before it is revived.
    pub coordinator: Arc<WakeCoordinator>,
    /// Gateway-issued cancel keys (a revived session's key points at its new backend).
    pub cancels: Arc<CancelMap>,
    /// Parking and reviving sessions (token keys and `[revival]`).
    pub revival: Option<Arc<Revival>>,
    /// Buffer size and framing limit of each relay.
    pub relay: RelaySettings,
    /// How long recording a session's state may take.
    pub snapshot_timeout: Duration,
    /// Fires when sessions must end (grace period over).
    pub terminate: CancellationToken,
    /// Fires when sessions must end as soon as they are at rest (a shutdown that does not wait
    /// for idle clients); parked sessions end at once.
    pub end_idle: CancellationToken,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}
/// How long the rest of an idle backend's last ErrorResponse may take to arrive.
const HELD_MESSAGE_WAIT: Duration = Duration::from_secs(1);
/// Client bytes read at once while a cancelled request of a parked session is skipped.
const PARKED_READ: usize = 512;

/// A live backend connection of a session.
pub struct Attached {
    /// The connection.
    pub stream: Stream,
    /// Its place under the tenant's cap on backend connections.
    pub slot: BackendSlot,
    /// The session's claim on its tenant.
    pub claim: WakeClaim,
    /// Where it goes.
    pub endpoint: Endpoint,
}

/// What a logged-in session starts with: its backend connection, its cancel key, and how it
/// may move or be handed back. Passed boxed, so the session's task is not sized by it.
pub struct SessionStart {
    /// The backend connection it logged in on.
    pub attached: Attached,
    /// The gateway-issued cancel key the client was given, if any.
    pub cancel: Option<CancelRegistration>,
    /// Its revival token's contents, when it may be parked and revived.
    pub revivable: Option<Revivable>,
    /// How its backend connection is handed back for reuse, when it may be.
    pub returnable: Option<Returnable>,
    /// Who its client is, named beside the session while it keeps its tenant awake.
    pub client: SessionClient,
}

/// What a parked client did.
enum Parked {
    /// Sent these bytes (the start of its next message).
    Message(Vec<u8>),
    /// Closed its connection or said goodbye.
    Closed,
    /// The gateway is shutting down.
    Terminated,
    /// It stayed idle for its `idle_session_timeout`.
    IdleTimeout,
}

impl Sessions {
    /// Relays a logged-in session until it ends, moving it between backend connections when it is
    /// `revivable` and revival is enabled, and handing its backend connection back for reuse when
    /// it is `returnable` and its client leaves at a safe point; counts and logs how it ended.
    pub async fn run(&self, client: &mut Stream, start: Box<SessionStart>) {
        let gw = self;
        let end = drive(gw, client, start).await;
        match end {
            Ok(end) => match end.error_kind() {
                Some(kind) => {
                    gw.metrics.error(kind);
                    info!(reason = ?end, "session ended");
                }
                None => debug!(reason = ?end, "session ended"),
            },
            Err((kind, why)) => {
                gw.metrics.error(kind);
                info!(reason = %why, kind, "session ended");
            }
        }
    }
}

/// How a session ended.
type Ended = Result<RelayEnd, (&'static str, String)>;

/// Relays the session run after run, doing between runs what the park/migrate policy decides.
async fn drive(gw: &Sessions, client: &mut Stream, start: Box<SessionStart>) -> Ended {
    let revival = gw.revival.as_deref().filter(|r| r.config.enabled);
    let limits = revival.map_or_else(TrackerLimits::default, |r| TrackerLimits {
        max_statements: r.config.max_statements,
        max_custom_settings: r.config.max_custom_settings,
    });
    let SessionStart {
        attached,
        cancel,
        revivable,
        returnable,
        client: peer,
    } = unbox(start);
    let mut mover = revival.zip(revivable).map(|(rv, who)| {
        Box::new(Mover {
            rv,
            who,
            peer,
            mobility: Mobility::new(Policy {
                snapshot_after: rv.config.snapshot_after,
                end_pinned: rv.config.pinned == PinnedPolicy::Terminate,
                park_after: rv.config.park_session_after,
            }),
        })
    });
    // The session's state and every step but the relay and the park are boxed: a session's
    // task is as large as its largest step and lives as long as its client stays, mostly
    // relaying or parked; the steps in between (snapshot, hand-back, revival) are short.
    let mut s = Box::new(Live::new(gw, attached, cancel, returnable, limits));
    loop {
        let plan = s.plan(mover.as_deref_mut());
        // Boxed too: the relay's state is freed while the session is parked.
        let end = Box::pin(s.relay_run(client, plan)).await;
        s.cancel_if_abandoned(&end);
        if let RelayEnd::ClientAtRest(bytes) = end {
            if let Err(ended) = Box::pin(s.remake_at_rest(client)).await {
                return ended;
            }
            s.preload = bytes;
            continue;
        }
        if let RelayEnd::ClientLeft = end {
            Box::pin(s.client_left()).await;
            return Ok(RelayEnd::ClientClosed);
        }
        let Some(m) = mover.as_deref_mut() else {
            return Ok(end);
        };
        let outcome = match Box::pin(s.outcome(client, end)).await {
            Ok(outcome) => outcome,
            Err(ended) => return ended,
        };
        let how = match Box::pin(s.settle(client, m, outcome)).await {
            Ok(Some(how)) => how,
            Ok(None) => continue,
            Err(ended) => return ended,
        };
        s = match s.leave(client, m, how).await {
            Ok(s) => s,
            Err(ended) => return ended,
        };
    }
}

/// The value in `b`, its box freed now: a box moved out of in an async fn is freed only when
/// the fn returns, and a session's lasts as long as its client stays.
#[expect(clippy::boxed_local, reason = "freeing the box is the point")]
fn unbox<T>(b: Box<T>) -> T {
    *b
}

/// What a session that can move needs for it: the revival settings, its token and the policy's
/// state.
struct Mover<'g> {
    rv: &'g Revival,
    who: Revivable,
    /// Who the client is, reported with the session's pins.
    peer: SessionClient,
    mobility: Mobility,
}

/// A session between relay runs: its backend connection and what is kept across moves.
struct Live<'g> {
    gw: &'g Sessions,
    cancel: Option<CancelRegistration>,
    current: Attached,
    tracker: SessionTracker,
    snap: Option<Snapshot>,
    /// Client bytes read while parked, relayed first in the next run.
    preload: Vec<u8>,
    park_rx: watch::Receiver<u64>,
    migrate_rx: watch::Receiver<u64>,
    /// Only the connection the session logged in with can be handed back: its login's
    /// ParameterStatus messages are what the next client is told. Boxed: a parked session
    /// has none, and should not carry its room.
    returnable: Option<Box<Returnable>>,
    logged_in: std::time::Instant,
}

impl<'g> Live<'g> {
    fn new(
        gw: &'g Sessions,
        current: Attached,
        cancel: Option<CancelRegistration>,
        returnable: Option<Returnable>,
        limits: TrackerLimits,
    ) -> Live<'g> {
        Live {
            gw,
            cancel,
            park_rx: current.claim.park_requests(),
            migrate_rx: current.claim.migrate_requests(),
            current,
            tracker: SessionTracker::new(limits),
            snap: None,
            preload: Vec::new(),
            returnable: returnable.filter(|_| gw.connector.reuses()).map(Box::new),
            logged_in: std::time::Instant::now(),
        }
    }

    /// The last snapshot as the policy sees it.
    fn view(&self) -> SnapshotView {
        snapshot_view(self.snap.as_ref(), &self.tracker)
    }

    /// How long the session has been quiet (since its login, before any traffic).
    fn since_traffic(&self) -> Duration {
        let last = self.tracker.last_activity().unwrap_or(self.logged_in);
        last.elapsed()
    }

    /// What the next relay run watches for.
    fn plan(&mut self, mover: Option<&mut Mover<'_>>) -> RunPlan {
        let Some(m) = mover else {
            return RunPlan::RELAY_ONLY;
        };
        let since_traffic = self.since_traffic();
        m.mobility.plan(
            self.view(),
            !self.preload.is_empty(),
            since_traffic,
            self.current.claim.idle_timeout(),
        )
    }

    /// Relays until either side ends or `plan` hands the session back.
    async fn relay_run(&mut self, client: &mut Stream, plan: RunPlan) -> RelayEnd {
        if plan.mark_busy {
            self.current.claim.set_idle(false);
        }
        let gw = self.gw;
        let settings = gw.relay;
        let claim = &self.current.claim;
        let mut on_activity = || claim.set_idle(false);
        let mut on_transaction = |open| claim.set_in_transaction(open);
        let client_at_rest = self.tracker.remakes_at_rest().next().is_some();
        let watch = SessionWatch {
            tracker: &mut self.tracker,
            quiet_after: plan.quiet_after,
            quiet_first: plan.quiet_first,
            park: plan.listen_park.then_some(&mut self.park_rx),
            migrate: plan.listen_migrate.then_some(&mut self.migrate_rx),
            hold_backend_end: plan.hold_backend_end,
            on_client_activity: if plan.busy_on_client_activity {
                Some(&mut on_activity)
            } else {
                None
            },
            on_transaction: Some(&mut on_transaction),
            preload: std::mem::take(&mut self.preload),
            keep_backend: self.returnable.is_some(),
            notify_pid: self
                .cancel
                .as_ref()
                .and_then(|c| NotifyPid::new(c.target()?.pid, c.pid)),
            client_at_rest,
        };
        let counters = (
            gw.metrics.bytes_client_to_backend.clone(),
            gw.metrics.bytes_backend_to_client.clone(),
        );
        let stream = &mut self.current.stream;
        let ending = relay::Ending {
            terminate: &gw.terminate,
            when_idle: &gw.end_idle,
        };
        relay(client, stream, settings, counters, ending, watch).await
    }

    /// Tries again the statements a revival left to be made at their first use, before the
    /// client's next request (see [`snapshot::remake_at_rest`]); `Err` when the backend or the
    /// client link broke meanwhile.
    async fn remake_at_rest(&mut self, client: &mut Stream) -> Result<(), Ended> {
        let gw = self.gw;
        let stream = &mut self.current.stream;
        let max = gw.relay.max_message as usize;
        let tried =
            snapshot::remake_at_rest(stream, client, &mut self.tracker, max, gw.snapshot_timeout);
        if let Err(e) = tried.await {
            end_with(client, Some(stream), None).await;
            return Err(Err(("backend_io", format!("remaking statements: {e}"))));
        }
        Ok(())
    }

    /// Cancels the query of a client that went away mid-query: Postgres would run it to its end.
    fn cancel_if_abandoned(&self, end: &RelayEnd) {
        if matches!(
            end,
            RelayEnd::ClientLeft | RelayEnd::ClientClosed | RelayEnd::ClientIo(_)
        ) && self.tracker.in_flight()
            && let Some(target) = self.cancel.as_ref().and_then(CancelRegistration::target)
        {
            cancel_in_background(target, self.gw.connector.connect_timeout());
        }
    }

    /// The client said goodbye or vanished and its backend connection was left alone: hands it
    /// back for reuse when it is at a safe point, else closes it.
    async fn client_left(self: Box<Self>) {
        let Attached {
            stream,
            slot,
            endpoint,
            ..
        } = self.current;
        let gw = self.gw;
        // Prepared statements do not matter here (the reset drops them); the rest of the pins
        // are checked with SQL before the reset.
        let pins = self.tracker.pins();
        let safe = self.tracker.at_rest()
            && !pins.contains(Pins::LISTEN)
            && !pins.contains(Pins::HELD_CURSOR);
        if !safe {
            debug!(pins = %pins.describe(), "backend connection not kept: not at a safe point");
        }
        let conn = (stream, slot);
        gw.connector
            .give_back(conn, endpoint, self.returnable.map(unbox), safe)
            .await;
    }

    /// The policy's name for a run's end; `Err` with how the session ended for the ends that are
    /// no concern of the policy, and for a backend that ended with an error other than a
    /// shutdown (relayed to the client).
    async fn outcome(&mut self, client: &mut Stream, end: RelayEnd) -> Result<Outcome, Ended> {
        match end {
            RelayEnd::Quiet => Ok(Outcome::Quiet),
            RelayEnd::Park => Ok(Outcome::ParkRequested),
            RelayEnd::Migrate => Ok(Outcome::MigrateRequested),
            RelayEnd::BackendEnded { held } => {
                let stream = &mut self.current.stream;
                match backend_going_away(stream, held, self.gw).await {
                    Ok(()) => Ok(Outcome::BackendShutDown),
                    Err(last) => {
                        let _ = client.write_all(&last).await;
                        end_with(client, Some(stream), None).await;
                        Err(Ok(RelayEnd::BackendClosed))
                    }
                }
            }
            other => Err(Ok(other)),
        }
    }

    /// Carries out the policy's decision on a run's outcome: `Ok(Some(how))` when the session
    /// is to leave its backend connection, `Ok(None)` to relay on, `Err` when it ended.
    async fn settle(
        &mut self,
        client: &mut Stream,
        m: &mut Mover<'_>,
        outcome: Outcome,
    ) -> Result<Option<Move>, Ended> {
        let since_traffic = self.since_traffic();
        let mut decision = m.mobility.decide(outcome, self.view(), since_traffic);
        loop {
            match decision {
                Decision::Snapshot => {
                    let (gw, tracker) = (self.gw, &self.tracker);
                    let taken = snapshot(gw, m.rv, client, &mut self.current, tracker, &m.who);
                    let snap = taken.await.map_err(Err)?;
                    let claim = &self.current.claim;
                    claim.set_pins(snap.pins, &m.peer, since_traffic);
                    for s in &snap.statements {
                        if let Some(told) = s.described.told() {
                            self.tracker.record_told_shape(&s.name, told);
                        }
                    }
                    self.snap = Some(snap);
                    decision = m.mobility.snapshot_taken(self.view());
                }
                Decision::MarkIdle => {
                    self.park_rx.borrow_and_update();
                    self.current.claim.set_idle(true);
                    return Ok(None);
                }
                Decision::Stay => {
                    if outcome == Outcome::MigrateRequested {
                        debug!("migrate request: session cannot move");
                    }
                    return Ok(None);
                }
                Decision::Leave(how) => return Ok(Some(how)),
                Decision::EndPinned => {
                    let pins = self.snap.as_ref().map(|s| s.pins.describe());
                    let pins = pins.unwrap_or_default();
                    let msg = ErrorMessage::fatal(
                        sqlstate::IDLE_SESSION_TIMEOUT,
                        format!(
                            "terminating idle session: its database is going to sleep and the \
                             session cannot be moved ({pins})"
                        ),
                    )
                    .with_hint("set revival.pinned = \"keep_awake\" to keep such sessions");
                    end_with(client, Some(&mut self.current.stream), Some(msg)).await;
                    return Err(Err(("pinned_session_ended", format!("pinned: {pins}"))));
                }
                Decision::EndLost => {
                    let msg = ErrorMessage::fatal(
                        sqlstate::CONNECTION_FAILURE,
                        "the connection to the tenant's database was lost",
                    );
                    end_with(client, Some(&mut self.current.stream), Some(msg)).await;
                    return Err(Ok(RelayEnd::BackendClosed));
                }
            }
        }
    }

    /// Moves the session off its backend connection: parked until its client's next message
    /// (unless it migrates), then revived on a new connection; `Err` when it ended instead.
    async fn leave(
        mut self: Box<Self>,
        client: &mut Stream,
        m: &mut Mover<'_>,
        how: Move,
    ) -> Result<Box<Live<'g>>, Ended> {
        let gw = self.gw;
        let Attached {
            stream,
            slot,
            claim,
            endpoint,
        } = self.current;
        // The backend whose process id the client was given serves no other session while this
        // one lives: what the client does with its pid (`pg_terminate_backend`, a look in
        // `pg_stat_activity`) would reach that session.
        let own = self.cancel.as_ref().is_some_and(|c| c.on_own_backend());
        // At rest and movable: the connection can serve another session. Its login parameters
        // and reuse key go with it, given back or closed, not kept while the session is parked.
        let keep = how == Move::SessionIdle && !own;
        let back = self.returnable.take().map(unbox);
        Box::pin(hand_back(gw, (stream, slot), endpoint, back, keep)).await;
        gw.metrics.parked(how.label());
        self.tracker.release_buffers();
        // Until it is revived, the session's cancel key must reach no backend: the one it left
        // may serve another session now.
        if let Some(reg) = &self.cancel {
            reg.detach();
        }
        // Borrowed, not taken: a parked session should hold its snapshot once.
        let Some(snapshot) = self.snap.as_ref() else {
            return Err(Err(("internal", "parked without a snapshot".into())));
        };
        let mut mark = how.parks().then(|| claim.park(how.for_sleep()));
        let mut parked = how.parks();
        loop {
            if parked && self.preload.is_empty() {
                let last = self.tracker.last_activity().unwrap_or(self.logged_in);
                self.preload = wait_while_parked(gw, client, snapshot, how, last).await?;
            }
            // Counted as parked until revived: a cancel during the wake leaves it parked still.
            let started = Instant::now();
            let revived = revive_unless_cancelled(gw, m, snapshot, self.cancel.as_ref(), parked);
            match Box::pin(revived).await {
                ReviveOutcome::Done(done) => {
                    let (new, returnable, restored) = *done;
                    drop(mark.take());
                    let took = started.elapsed();
                    gw.metrics.revived(how.label(), Some(took));
                    info!(
                        reason = how.label(),
                        ms = took.as_secs_f64() * 1000.0,
                        backend = %new.endpoint,
                        left_out = restored.left_out,
                        "session revived"
                    );
                    self.current = new;
                    self.returnable = returnable.filter(|_| gw.connector.reuses()).map(Box::new);
                    m.mobility.revived();
                    self.park_rx = self.current.claim.park_requests();
                    self.migrate_rx = self.current.claim.migrate_requests();
                    let names = restored.statements.iter().map(String::as_str);
                    let stale = restored.stale.iter().map(|(n, a)| (n.as_str(), a.clone()));
                    self.tracker
                        .reset_for_new_backend(names, stale, restored.unnamed);
                    return Ok(self);
                }
                ReviveOutcome::Cancelled => {
                    info!("cancel request while the session waited for its database");
                    let pending = std::mem::take(&mut self.preload);
                    let max = gw.relay.max_message as usize;
                    // Boxed: its read buffer should not size every parked session.
                    let answered = Box::pin(answer_cancelled(client, pending, max));
                    self.preload = answered.await?;
                    parked = true;
                }
                ReviveOutcome::Failed(e) => {
                    gw.metrics.revived(how.label(), None);
                    warn!(error = %e, reason = how.label(), "revival failed");
                    let msg = ErrorMessage::fatal(
                        sqlstate::CONNECTION_FAILURE,
                        format!(
                            "pgwake could not restore this session on a new database connection: {e}"
                        ),
                    )
                    .with_hint("reconnect: a new connection starts a fresh session");
                    Box::pin(end_with(client, None, Some(msg))).await;
                    return Err(Err(("revival_failed", e.to_string())));
                }
            }
        }
    }
}

/// Gives the backend connection a session left back for reuse when `keep`, else closes it. One
/// step that owns all it hands back, so none of it stays in the state of a parked session.
async fn hand_back(
    gw: &Sessions,
    conn: (Stream, BackendSlot),
    endpoint: Endpoint,
    back: Option<Returnable>,
    keep: bool,
) {
    if keep {
        gw.connector.give_back(conn, endpoint, back, true).await;
    } else {
        crate::upstream::close(conn).await;
    }
}

/// How a revival attempt ended. Small: the parked session's state holds it while a cancelled
/// request is answered.
enum ReviveOutcome {
    /// The session is on a new backend connection.
    Done(Box<(Attached, Option<Returnable>, Restored)>),
    /// The client cancelled the request that waited for it.
    Cancelled,
    /// It failed; the session ends.
    Failed(Box<revive::ReviveError>),
}

/// Revives the session; while a client request waits for it (`waiting`), a cancel request for
/// the session's key ends the wait instead, as a cancel ends a query.
async fn revive_unless_cancelled(
    gw: &Sessions,
    m: &mut Mover<'_>,
    snapshot: &Snapshot,
    cancel: Option<&CancelRegistration>,
    waiting: bool,
) -> ReviveOutcome {
    let mut requests = cancel.filter(|_| waiting).map(CancelRegistration::requests);
    if let Some(r) = requests.as_mut() {
        // Requests from before the client's message were for nothing that runs now.
        r.borrow_and_update();
    }
    let asked = async {
        if let Some(r) = requests.as_mut()
            && r.changed().await.is_ok()
        {
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        r = revive::revive(gw, m.rv, &mut m.who, snapshot, cancel) => match r {
            Ok(done) => ReviveOutcome::Done(Box::new(done)),
            Err(e) => ReviveOutcome::Failed(Box::new(e)),
        },
        () = asked => ReviveOutcome::Cancelled,
    }
}

/// How the policy sees `snap` for the session `tracker` follows.
fn snapshot_view(snap: Option<&Snapshot>, tracker: &SessionTracker) -> SnapshotView {
    SnapshotView {
        valid: snap.is_some_and(|s| s.valid_for(tracker)),
        movable: snap.is_some_and(Snapshot::movable),
    }
}

/// Waits, parked with `snapshot`, for the client's next bytes (see [`wait_for_message`]); the
/// session's own `idle_session_timeout` counts from `last_activity`, as on its backend.
async fn wait_while_parked(
    gw: &Sessions,
    client: &mut Stream,
    snapshot: &Snapshot,
    how: Move,
    last_activity: std::time::Instant,
) -> Result<Vec<u8>, Ended> {
    info!(
        reason = how.label(),
        statements = snapshot.statements.len(),
        settings = snapshot.settings.len(),
        "session parked"
    );
    // Postgres would end the session once idle this long; parked, its backend's timer is
    // gone, so the gateway keeps it.
    let idle_deadline = snapshot
        .idle_session_timeout()
        .map(|limit| tokio::time::Instant::from_std(last_activity + limit));
    wait_for_message(gw, client, idle_deadline).await
}

/// Waits, parked, for the client's next bytes, which are returned; `Err` when the client left,
/// the gateway shuts down, or `idle_deadline` (the session's `idle_session_timeout`) passed.
async fn wait_for_message(
    gw: &Sessions,
    client: &mut Stream,
    idle_deadline: Option<tokio::time::Instant>,
) -> Result<Vec<u8>, Ended> {
    gw.metrics.sessions_parked.inc();
    let parked = wait_parked(client, gw, idle_deadline).await;
    gw.metrics.sessions_parked.dec();
    match parked {
        Parked::Message(bytes) => Ok(bytes),
        Parked::Closed => Err(Ok(RelayEnd::ClientClosed)),
        Parked::IdleTimeout => {
            let msg = ErrorMessage::fatal(
                sqlstate::IDLE_SESSION_TIMEOUT,
                "terminating connection due to idle-session timeout",
            );
            Box::pin(end_with(client, None, Some(msg))).await;
            Err(Ok(RelayEnd::ClientClosed))
        }
        Parked::Terminated => {
            let msg = ErrorMessage::fatal(
                sqlstate::ADMIN_SHUTDOWN,
                "terminating connection because the gateway is shutting down",
            );
            Box::pin(end_with(client, None, Some(msg))).await;
            Err(Ok(RelayEnd::Terminated))
        }
    }
}

/// Answers a request the client cancelled while it waited for the session's database, as
/// Postgres answers a cancelled query: ERROR `57014`, and ReadyForQuery once the request ends
/// (a simple query, or the Sync of an extended-protocol batch, whose messages are skipped).
/// Returns the client's bytes after the request.
async fn answer_cancelled(
    client: &mut Stream,
    pending: Vec<u8>,
    max_message: usize,
) -> Result<Vec<u8>, Ended> {
    let mut input = ClientInput {
        buf: pending,
        pos: 0,
    };
    let closed = |_: std::io::Error| -> Ended { Ok(RelayEnd::ClientClosed) };
    let mut first = true;
    loop {
        let tag = input
            .skip_message(client, max_message)
            .await
            .map_err(closed)?;
        if first {
            let msg = ErrorMessage::error(
                sqlstate::QUERY_CANCELED,
                "canceling statement due to user request",
            );
            client.write_all(&msg.to_bytes()).await.map_err(closed)?;
            first = false;
        }
        match tag {
            b'X' => return Err(Ok(RelayEnd::ClientClosed)),
            b'Q' | b'F' | b'S' => {
                client.write_all(&READY_IDLE).await.map_err(closed)?;
                client.flush().await.map_err(closed)?;
                return Ok(input.buf.split_off(input.pos));
            }
            _ => client.flush().await.map_err(closed)?,
        }
    }
}

/// ReadyForQuery, not in a transaction.
const READY_IDLE: [u8; 6] = [b'Z', 0, 0, 0, 5, b'I'];

/// Client bytes read ahead (while parked) followed by the client's stream.
struct ClientInput {
    buf: Vec<u8>,
    pos: usize,
}

impl ClientInput {
    /// Makes sure `n` unread bytes are buffered.
    async fn fill(&mut self, client: &mut Stream, n: usize) -> std::io::Result<()> {
        while self.buf.len() - self.pos < n {
            let mut chunk = [0u8; PARKED_READ];
            let got = client.read(&mut chunk).await?;
            if got == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..got]);
        }
        Ok(())
    }

    /// Reads past one whole message without keeping its body; returns its tag.
    async fn skip_message(&mut self, client: &mut Stream, max: usize) -> std::io::Result<u8> {
        self.fill(client, 5).await?;
        let header: [u8; 5] = self.buf[self.pos..self.pos + 5]
            .try_into()
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
        let body = crate::wire::body_len(&header, max)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
        self.pos += 5;
        let mut left = body;
        loop {
            let here = (self.buf.len() - self.pos).min(left);
            self.pos += here;
            left -= here;
            if left == 0 {
                return Ok(header[0]);
            }
            self.buf.clear();
            self.pos = 0;
            self.fill(client, 1).await?;
        }
    }
}

/// Takes the session's snapshot; a failed query leaves a snapshot that keeps the session where
/// it is until the client sends something.
async fn snapshot(
    gw: &Sessions,
    rv: &Revival,
    client: &mut Stream,
    current: &mut Attached,
    tracker: &SessionTracker,
    who: &Revivable,
) -> Result<Snapshot, (&'static str, String)> {
    let limits = SnapshotLimits {
        max_statements: rv.config.max_statements,
        max_bytes: rv.config.max_snapshot.as_u64() as usize,
        max_message: gw.relay.max_message as usize,
        lock_wait: rv.config.restore_lock_wait,
        sequences: match rv.config.sequence_state {
            SequenceStatePolicy::Pin => SequenceCheck::Drawn,
            _ if tracker.reads_sequence_state() => SequenceCheck::Drawn,
            SequenceStatePolicy::PinIfRead => SequenceCheck::Off,
            SequenceStatePolicy::Auto => SequenceCheck::DrawnAndReadable,
        },
    };
    let wait = gw.snapshot_timeout;
    match take_snapshot(
        &mut current.stream,
        client,
        tracker,
        &who.user,
        limits,
        wait,
    )
    .await
    {
        Ok(s) => {
            if !s.pins.is_empty() {
                gw.metrics.pinned(s.pins);
                info!(pins = %s.pins.describe(), "session pinned to its backend connection");
            } else {
                debug!(
                    settings = s.settings.len(),
                    statements = s.statements.len(),
                    bytes = s.size,
                    "session state recorded"
                );
            }
            Ok(s)
        }
        // The backend or client link broke: the session cannot go on.
        Err(e @ (StateError::Io(_) | StateError::ClientIo(_) | StateError::Timeout(_))) => {
            end_with(client, Some(&mut current.stream), None).await;
            Err(("backend_io", format!("snapshot: {e}")))
        }
        Err(e) => {
            info!(error = %e, "session state could not be recorded; it stays on its backend");
            Ok(Snapshot::unmovable(tracker.client_messages()))
        }
    }
}

/// Reads the rest of what an idle backend sent: `Ok` when it is going away (end of stream,
/// `57P01` admin shutdown, `57P02` crash shutdown), else `Err` with its message to relay.
async fn backend_going_away(
    backend: &mut Stream,
    mut held: Vec<u8>,
    gw: &Sessions,
) -> Result<(), Vec<u8>> {
    if held.is_empty() {
        return Ok(());
    }
    let complete = timeout(HELD_MESSAGE_WAIT, async {
        while held.len() < 5 {
            let mut b = [0u8; 5];
            let n = backend.read(&mut b[..5 - held.len()]).await.ok()?;
            if n == 0 {
                return None;
            }
            held.extend_from_slice(&b[..n]);
        }
        let len = u32::from_be_bytes([held[1], held[2], held[3], held[4]]) as usize + 1;
        if len > gw.connector.max_message() {
            return None;
        }
        if held.len() < len {
            let have = held.len();
            held.resize(len, 0);
            backend.read_exact(&mut held[have..]).await.ok()?;
        }
        Some(len)
    })
    .await
    .ok()
    .flatten();
    let Some(len) = complete else {
        // Cut off mid-message: the backend went away all the same.
        return Ok(());
    };
    let fields = frontend::error_fields(&held[5..len]);
    if fields.code == sqlstate::ADMIN_SHUTDOWN || fields.code == sqlstate::CRASH_SHUTDOWN {
        info!(code = %fields.code, "backend ended an idle session; it moves on its next message");
        Ok(())
    } else {
        Err(held)
    }
}

/// Waits for a parked client's next bytes. Only the first byte is awaited (a parked session
/// holds no read buffer); the rest of the message stays in the socket for the revived relay.
async fn wait_parked(
    client: &mut Stream,
    gw: &Sessions,
    idle_deadline: Option<tokio::time::Instant>,
) -> Parked {
    let mut first = 0u8;
    // The timer is boxed: most sessions have no idle_session_timeout, and a parked session
    // should not carry a timer's room for nothing.
    let idle_ends = async {
        match idle_deadline {
            Some(at) => Box::pin(tokio::time::sleep_until(at)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = idle_ends => Parked::IdleTimeout,
        r = client.read(std::slice::from_mut(&mut first)) => match r {
            Ok(0) | Err(_) => Parked::Closed,
            Ok(_) if first == b'X' => Parked::Closed,
            Ok(_) => Parked::Message(vec![first]),
        },
        _ = gw.terminate.cancelled() => Parked::Terminated,
        _ = gw.end_idle.cancelled() => Parked::Terminated,
    }
}

/// Ends a session the relay handed back: an optional message for the client, then both links
/// closed.
async fn end_with(client: &mut Stream, backend: Option<&mut Stream>, msg: Option<ErrorMessage>) {
    let _ = timeout(Duration::from_millis(500), async {
        if let Some(m) = msg {
            let _ = client.write_all(&m.to_bytes()).await;
            let _ = client.flush().await;
        }
        let _ = client.shutdown().await;
        if let Some(b) = backend {
            let _ = b.write_all(&TERMINATE).await;
            let _ = b.shutdown().await;
        }
    })
    .await;
}
