//! When a relayed session that can move records its state, marks its wake claim idle, parks for
//! its tenant's sleep, migrates, or ends — the gateway's park/migrate policy without any I/O.
//!
//! The proxy runs the relay in a loop. Before each run it asks [`Mobility::plan`] what the relay
//! must watch for; after the run hands the session back it tells [`Mobility::decide`] why
//! ([`Outcome`]) and performs the [`Decision`]: a snapshot (one SQL query on the backend),
//! marking the claim idle, leaving the backend connection, or ending the session.
//!
//! Idle time counts from the session's last traffic, never from the start of a run or from a
//! snapshot, so a session at rest marks its claim idle exactly `idle_timeout` after its last
//! query, whenever its snapshot fell in that time.

use std::time::Duration;

/// The settings a session that can move follows (`[revival]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Quiet time at a safe point before the session's state is recorded.
    pub snapshot_after: Duration,
    /// End a session that cannot move when its tenant goes to sleep (`pinned = "terminate"`),
    /// instead of keeping the tenant awake for it.
    pub end_pinned: bool,
    /// Quiet time at a safe point after which a movable session parks on its own, handing its
    /// backend connection to other sessions, even while its tenant is busy
    /// (`revival.park_session_after`; `None`: only for the tenant's sleep).
    pub park_after: Option<Duration>,
}

/// What the policy needs to know of the session's last snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotView {
    /// A snapshot exists and the client has sent nothing since it was taken.
    pub valid: bool,
    /// It found nothing that pins the session to its backend connection.
    pub movable: bool,
}

/// What the relay watches for during its next run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunPlan {
    /// Mark the claim busy before the run: it was idle, but the session changed since.
    pub mark_busy: bool,
    /// Hand the session back on the idle sleeper's park request.
    pub listen_park: bool,
    /// Hand it back on a migrate request.
    pub listen_migrate: bool,
    /// Keep a backend's error or end of stream at rest from the client and hand the session
    /// back, so it can move instead of failing.
    pub hold_backend_end: bool,
    /// Mark the claim busy as soon as the client sends something.
    pub busy_on_client_activity: bool,
    /// Hand it back once it has been at rest this long after bytes last moved.
    pub quiet_after: Option<Duration>,
    /// Hand it back once it has been at rest this long from the start of the run, if no bytes
    /// move first; counts a quiet spell that began before the run.
    pub quiet_first: Option<Duration>,
}

impl RunPlan {
    /// The plan for a session that can never move: relay until either side ends.
    pub const RELAY_ONLY: RunPlan = RunPlan {
        mark_busy: false,
        quiet_after: None,
        quiet_first: None,
        listen_park: false,
        listen_migrate: false,
        hold_backend_end: false,
        busy_on_client_activity: false,
    };
}

/// Why the relay handed a session back (the ends that concern the policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// At rest for the plan's quiet time.
    Quiet,
    /// The idle sleeper asked the tenant's sessions to park.
    ParkRequested,
    /// An operator asked the tenant's sessions to migrate.
    MigrateRequested,
    /// The backend closed or announced its shutdown while the session was at rest.
    BackendShutDown,
}

/// Why a session leaves its backend connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// Its tenant is going to sleep; it parks until the client's next message.
    IdleSleep,
    /// Its backend went away; it parks until the client's next message.
    BackendEnded,
    /// An operator asked; it is revived at once.
    Migrate,
    /// It was quiet for the policy's `park_after`; it parks until the client's next message and
    /// its backend connection serves other sessions meanwhile.
    SessionIdle,
}

impl Move {
    /// Label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Move::IdleSleep => "idle_sleep",
            Move::BackendEnded => "backend_ended",
            Move::Migrate => "migrate",
            Move::SessionIdle => "session_idle",
        }
    }

    /// True when the session waits, parked, for its client's next message before it is revived.
    pub fn parks(self) -> bool {
        !matches!(self, Move::Migrate)
    }

    /// True when it parks because its tenant is idle (the tenant's idle clock keeps running).
    pub fn for_sleep(self) -> bool {
        matches!(self, Move::IdleSleep)
    }
}

/// What the proxy does after a relay run handed the session back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Record the session's state, then ask [`Mobility::snapshot_taken`] what next.
    Snapshot,
    /// Mark the claim idle (the tenant sleeps once all its sessions are), then relay on.
    MarkIdle,
    /// Relay on.
    Stay,
    /// Leave the backend connection.
    Leave(Move),
    /// End the session: it cannot move and its tenant is going to sleep (`pinned = "terminate"`).
    EndPinned,
    /// End the session: its backend went away and it cannot move.
    EndLost,
}

/// The park/migrate state of one session that can move (revival is on and it has a token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mobility {
    policy: Policy,
    /// The claim is marked idle.
    claim_idle: bool,
    /// The current run started at a valid snapshot of a movable session.
    run_movable: bool,
    /// A migrate request waits for the snapshot being taken.
    migrate_after_snapshot: bool,
    /// The tenant's idle timeout as of the last plan.
    idle_timeout: Duration,
}

impl Mobility {
    /// A session that just logged in (or was revived): no snapshot, claim busy.
    pub fn new(policy: Policy) -> Mobility {
        Mobility {
            policy,
            claim_idle: false,
            run_movable: false,
            migrate_after_snapshot: false,
            idle_timeout: Duration::ZERO,
        }
    }

    /// True while the claim is marked idle.
    pub fn claim_idle(&self) -> bool {
        self.claim_idle
    }

    /// The plan for the next relay run. `preloaded`: client bytes read while parked are relayed
    /// first (they may change the session, so the snapshot cannot be trusted); `since_traffic`:
    /// how long the session has been quiet; `idle_timeout`: its tenant's.
    pub fn plan(
        &mut self,
        snapshot: SnapshotView,
        preloaded: bool,
        since_traffic: Duration,
        idle_timeout: Duration,
    ) -> RunPlan {
        self.idle_timeout = idle_timeout;
        let valid = snapshot.valid && !preloaded;
        let mark_busy = !valid && self.claim_idle;
        if mark_busy {
            self.claim_idle = false;
        }
        self.run_movable = valid && snapshot.movable;
        let snapshot_after = self.policy.snapshot_after.min(idle_timeout);
        let quiet_first = if !valid {
            Some(snapshot_after.saturating_sub(since_traffic))
        } else if self.waits_for_idle() {
            // The snapshot is recorded; what remains is the idle clock, which runs from the
            // last traffic. Traffic in the run outdates the snapshot, so after it the relay
            // comes back after `snapshot_after` for a new one.
            let idle = idle_timeout.saturating_sub(since_traffic);
            Some(self.park_wait(since_traffic).map_or(idle, |p| p.min(idle)))
        } else {
            self.park_wait(since_traffic)
        };
        RunPlan {
            mark_busy,
            quiet_after: Some(snapshot_after),
            quiet_first,
            listen_park: self.claim_idle,
            listen_migrate: true,
            hold_backend_end: self.run_movable,
            busy_on_client_activity: self.claim_idle,
        }
    }

    /// What to do about the run's `outcome`; `snapshot` is seen after the run (the client may
    /// have outdated it during the run, and the session never moves on an outdated snapshot);
    /// `since_traffic`: how long the session has been quiet now.
    pub fn decide(
        &mut self,
        outcome: Outcome,
        snapshot: SnapshotView,
        since_traffic: Duration,
    ) -> Decision {
        self.migrate_after_snapshot = false;
        let valid = snapshot.valid;
        let still_movable = self.run_movable && valid;
        let park_due = self.policy.park_after.is_some_and(|p| since_traffic >= p);
        match outcome {
            Outcome::Quiet if !valid => Decision::Snapshot,
            Outcome::Quiet if still_movable && park_due => Decision::Leave(Move::SessionIdle),
            // Back early for the park time: the idle clock has not run out.
            Outcome::Quiet if since_traffic < self.idle_timeout => Decision::Stay,
            Outcome::Quiet if self.waits_for_idle() => {
                self.claim_idle = true;
                Decision::MarkIdle
            }
            Outcome::Quiet => Decision::Stay,
            Outcome::ParkRequested if still_movable => Decision::Leave(Move::IdleSleep),
            Outcome::ParkRequested if self.policy.end_pinned && valid => Decision::EndPinned,
            Outcome::ParkRequested => Decision::Stay,
            Outcome::MigrateRequested if !valid => {
                self.migrate_after_snapshot = true;
                Decision::Snapshot
            }
            Outcome::MigrateRequested => Self::migrate(snapshot),
            Outcome::BackendShutDown if still_movable => Decision::Leave(Move::BackendEnded),
            Outcome::BackendShutDown => Decision::EndLost,
        }
    }

    /// What to do once the snapshot a [`Decision::Snapshot`] asked for is taken.
    pub fn snapshot_taken(&mut self, snapshot: SnapshotView) -> Decision {
        if std::mem::take(&mut self.migrate_after_snapshot) {
            Self::migrate(snapshot)
        } else {
            Decision::Stay
        }
    }

    /// The session is on a new backend connection, with a claim that is not idle.
    pub fn revived(&mut self) {
        self.claim_idle = false;
    }

    /// How much longer a movable session at a valid snapshot waits before it parks on its own.
    fn park_wait(&self, since_traffic: Duration) -> Option<Duration> {
        let park_after = self.policy.park_after.filter(|_| self.run_movable)?;
        Some(park_after.saturating_sub(since_traffic))
    }

    /// At a valid snapshot, the idle clock is what the session waits for: it can park, or it
    /// is to be ended when its tenant sleeps.
    fn waits_for_idle(&self) -> bool {
        !self.claim_idle && (self.run_movable || self.policy.end_pinned)
    }

    fn migrate(snapshot: SnapshotView) -> Decision {
        if snapshot.movable {
            Decision::Leave(Move::Migrate)
        } else {
            Decision::Stay
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SNAP: Duration = Duration::from_secs(2);
    const IDLE: Duration = Duration::from_secs(10);
    const NONE: SnapshotView = SnapshotView {
        valid: false,
        movable: false,
    };
    const MOVABLE: SnapshotView = SnapshotView {
        valid: true,
        movable: true,
    };
    const PINNED: SnapshotView = SnapshotView {
        valid: true,
        movable: false,
    };
    const OUTDATED: SnapshotView = SnapshotView {
        valid: false,
        movable: true,
    };

    fn policy(end_pinned: bool) -> Policy {
        Policy {
            snapshot_after: SNAP,
            end_pinned,
            park_after: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A session whose claim was marked idle at a valid snapshot `view`.
    fn idle(view: SnapshotView, end_pinned: bool) -> Mobility {
        let mut m = Mobility::new(policy(end_pinned));
        m.plan(view, false, IDLE, IDLE);
        assert_eq!(m.decide(Outcome::Quiet, view, IDLE), Decision::MarkIdle);
        m
    }

    #[test]
    fn a_movable_session_quiet_for_park_after_parks_on_its_own() {
        let park = secs(5);
        let parking = || {
            Mobility::new(Policy {
                park_after: Some(park),
                ..policy(false)
            })
        };
        let mut m = parking();
        // At a valid snapshot the run comes back at whichever is first: park or idle.
        let p = m.plan(MOVABLE, false, secs(3), IDLE);
        assert_eq!(p.quiet_first, Some(secs(2)));
        assert_eq!(m.decide(Outcome::Quiet, MOVABLE, secs(4)), Decision::Stay);
        m.plan(MOVABLE, false, secs(5), IDLE);
        let parks = Decision::Leave(Move::SessionIdle);
        assert_eq!(m.decide(Outcome::Quiet, MOVABLE, park), parks);
        // A pinned session never parks on its own; without a snapshot one is taken first.
        for (view, then) in [(PINNED, Decision::Stay), (NONE, Decision::Snapshot)] {
            let mut m = parking();
            m.plan(view, false, secs(5), IDLE);
            assert_eq!(m.decide(Outcome::Quiet, view, IDLE), then, "{view:?}");
        }
        assert!(Move::SessionIdle.parks() && !Move::SessionIdle.for_sleep());
    }

    #[test]
    fn relay_only_watches_nothing() {
        assert_eq!(RunPlan::RELAY_ONLY, RunPlan::default());
    }

    #[test]
    fn without_a_snapshot_the_first_quiet_spell_counts_from_the_last_traffic() {
        let mut m = Mobility::new(policy(false));
        let p = m.plan(NONE, false, secs(1), IDLE);
        assert_eq!(p.quiet_after, Some(SNAP));
        assert_eq!(p.quiet_first, Some(secs(1)));
        assert!(!p.mark_busy && !p.listen_park && !p.hold_backend_end);
        assert!(p.listen_migrate && !p.busy_on_client_activity);
        assert_eq!(
            m.plan(NONE, false, secs(5), IDLE).quiet_first,
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn snapshot_after_never_exceeds_the_idle_timeout() {
        let mut m = Mobility::new(policy(false));
        let p = m.plan(NONE, false, Duration::ZERO, secs(1));
        assert_eq!(p.quiet_after, Some(secs(1)));
        assert_eq!(p.quiet_first, Some(secs(1)));
    }

    #[test]
    fn quiet_without_a_valid_snapshot_takes_one_then_relays_on() {
        let mut m = Mobility::new(policy(false));
        m.plan(NONE, false, SNAP, IDLE);
        assert_eq!(m.decide(Outcome::Quiet, NONE, IDLE), Decision::Snapshot);
        assert_eq!(m.snapshot_taken(MOVABLE), Decision::Stay);
        assert!(!m.claim_idle());
    }

    #[test]
    fn a_snapshot_the_client_outdated_during_the_run_is_taken_again() {
        let mut m = Mobility::new(policy(false));
        m.plan(MOVABLE, false, SNAP, IDLE);
        assert_eq!(m.decide(Outcome::Quiet, OUTDATED, IDLE), Decision::Snapshot);
    }

    #[test]
    fn at_a_valid_snapshot_the_idle_clock_runs_from_the_last_traffic() {
        let mut m = Mobility::new(policy(false));
        let p = m.plan(MOVABLE, false, secs(3), IDLE);
        assert_eq!(p.quiet_first, Some(secs(7)));
        assert_eq!(p.quiet_after, Some(SNAP));
        assert!(p.hold_backend_end && !p.listen_park);
    }

    #[test]
    fn quiet_at_a_valid_movable_snapshot_marks_the_claim_idle() {
        let m = idle(MOVABLE, false);
        assert!(m.claim_idle());
    }

    #[test]
    fn an_idle_claim_listens_for_park_requests_and_client_activity() {
        let mut m = idle(MOVABLE, false);
        let p = m.plan(MOVABLE, false, IDLE, IDLE);
        assert!(p.listen_park && p.busy_on_client_activity && p.hold_backend_end);
        assert!(!p.mark_busy);
        assert_eq!(p.quiet_first, None);
        assert_eq!(p.quiet_after, Some(SNAP));
        // Quiet again (after traffic that did not outdate the snapshot): nothing more to do.
        assert_eq!(m.decide(Outcome::Quiet, MOVABLE, IDLE), Decision::Stay);
    }

    #[test]
    fn an_outdated_snapshot_marks_an_idle_claim_busy() {
        let mut m = idle(MOVABLE, false);
        let p = m.plan(OUTDATED, false, Duration::ZERO, IDLE);
        assert!(p.mark_busy && !p.listen_park && !p.busy_on_client_activity);
        assert!(!p.hold_backend_end);
        assert_eq!(p.quiet_first, Some(SNAP));
        assert!(!m.claim_idle());
    }

    #[test]
    fn bytes_from_a_parked_client_outdate_the_snapshot() {
        let mut m = idle(MOVABLE, false);
        let p = m.plan(MOVABLE, true, Duration::ZERO, IDLE);
        assert!(p.mark_busy && !p.hold_backend_end);
        assert_eq!(p.quiet_first, Some(SNAP));
    }

    #[test]
    fn a_pinned_session_keeps_its_tenant_awake_by_default() {
        let mut m = Mobility::new(policy(false));
        let p = m.plan(PINNED, false, IDLE, IDLE);
        assert_eq!(p.quiet_first, None);
        assert!(!p.hold_backend_end);
        assert_eq!(m.decide(Outcome::Quiet, PINNED, IDLE), Decision::Stay);
        assert!(!m.claim_idle());
    }

    #[test]
    fn a_pinned_session_goes_idle_when_pinned_sessions_are_ended() {
        let mut m = Mobility::new(policy(true));
        let p = m.plan(PINNED, false, secs(4), IDLE);
        assert_eq!(p.quiet_first, Some(secs(6)));
        assert!(!p.hold_backend_end);
        assert_eq!(m.decide(Outcome::Quiet, PINNED, IDLE), Decision::MarkIdle);
    }

    #[test]
    fn park_request_at_a_valid_movable_snapshot_parks_for_sleep() {
        let mut m = idle(MOVABLE, false);
        m.plan(MOVABLE, false, IDLE, IDLE);
        let d = m.decide(Outcome::ParkRequested, MOVABLE, IDLE);
        assert_eq!(d, Decision::Leave(Move::IdleSleep));
    }

    #[test]
    fn park_request_on_a_snapshot_outdated_during_the_run_stays() {
        for end_pinned in [false, true] {
            let mut m = idle(MOVABLE, end_pinned);
            m.plan(MOVABLE, false, IDLE, IDLE);
            assert_eq!(
                m.decide(Outcome::ParkRequested, OUTDATED, IDLE),
                Decision::Stay
            );
        }
    }

    #[test]
    fn park_request_ends_a_pinned_session_when_pinned_sessions_are_ended() {
        let mut m = idle(PINNED, true);
        let p = m.plan(PINNED, false, IDLE, IDLE);
        assert!(p.listen_park && !p.hold_backend_end);
        assert_eq!(
            m.decide(Outcome::ParkRequested, PINNED, IDLE),
            Decision::EndPinned
        );
    }

    #[test]
    fn park_request_moves_only_if_the_run_started_movable() {
        // The run began with client bytes from the park; even if the snapshot looks valid after
        // the run, nothing held the backend's end, so the session does not move.
        let mut m = idle(MOVABLE, false);
        m.plan(MOVABLE, true, IDLE, IDLE);
        assert_eq!(
            m.decide(Outcome::ParkRequested, MOVABLE, IDLE),
            Decision::Stay
        );
    }

    #[test]
    fn migrate_at_a_valid_snapshot_moves_if_movable() {
        let mut m = Mobility::new(policy(false));
        m.plan(MOVABLE, false, Duration::ZERO, IDLE);
        let d = m.decide(Outcome::MigrateRequested, MOVABLE, IDLE);
        assert_eq!(d, Decision::Leave(Move::Migrate));
        m.plan(PINNED, false, Duration::ZERO, IDLE);
        assert_eq!(
            m.decide(Outcome::MigrateRequested, PINNED, IDLE),
            Decision::Stay
        );
    }

    #[test]
    fn migrate_without_a_valid_snapshot_takes_one_first() {
        let mut m = Mobility::new(policy(false));
        m.plan(NONE, false, Duration::ZERO, IDLE);
        assert_eq!(
            m.decide(Outcome::MigrateRequested, NONE, IDLE),
            Decision::Snapshot
        );
        let d = m.snapshot_taken(MOVABLE);
        assert_eq!(d, Decision::Leave(Move::Migrate));
        m.plan(OUTDATED, false, Duration::ZERO, IDLE);
        assert_eq!(
            m.decide(Outcome::MigrateRequested, OUTDATED, IDLE),
            Decision::Snapshot
        );
        assert_eq!(m.snapshot_taken(PINNED), Decision::Stay);
        // The pending migrate was used up: a later snapshot (for a quiet spell) only relays on.
        assert_eq!(m.snapshot_taken(MOVABLE), Decision::Stay);
    }

    #[test]
    fn backend_shutdown_moves_a_movable_session_and_ends_the_rest() {
        let mut m = Mobility::new(policy(false));
        m.plan(MOVABLE, false, Duration::ZERO, IDLE);
        let d = m.decide(Outcome::BackendShutDown, MOVABLE, IDLE);
        assert_eq!(d, Decision::Leave(Move::BackendEnded));
        m.plan(MOVABLE, false, Duration::ZERO, IDLE);
        assert_eq!(
            m.decide(Outcome::BackendShutDown, OUTDATED, IDLE),
            Decision::EndLost
        );
        m.plan(PINNED, true, Duration::ZERO, IDLE);
        assert_eq!(
            m.decide(Outcome::BackendShutDown, PINNED, IDLE),
            Decision::EndLost
        );
    }

    #[test]
    fn a_revived_session_starts_with_a_busy_claim() {
        let mut m = idle(MOVABLE, false);
        m.revived();
        assert!(!m.claim_idle());
        let p = m.plan(MOVABLE, true, Duration::ZERO, IDLE);
        assert!(!p.listen_park && !p.mark_busy);
    }

    #[test]
    fn move_labels_and_parking() {
        assert_eq!(Move::IdleSleep.label(), "idle_sleep");
        assert_eq!(Move::BackendEnded.label(), "backend_ended");
        assert_eq!(Move::Migrate.label(), "migrate");
        assert!(Move::IdleSleep.parks() && Move::BackendEnded.parks() && !Move::Migrate.parks());
        assert!(Move::IdleSleep.for_sleep() && !Move::BackendEnded.for_sleep());
        assert!(!Move::Migrate.for_sleep());
        assert_eq!(Move::SessionIdle.label(), "session_idle");
    }

    /// How a session left alone (no traffic) ended up, and when (time since its last traffic).
    #[derive(Debug, PartialEq)]
    enum Settled {
        Parked(Duration),
        EndedPinned(Duration),
        /// Nothing more happens: it keeps its tenant awake.
        Stays,
    }

    /// Plays a session with no more traffic against a relay that returns at the plan's quiet
    /// time and an idle sleeper that asks it to park as soon as its claim is idle (it is the
    /// tenant's only session). Snapshots take `cost` and find the session `movable` or not.
    fn leave_alone(
        mut m: Mobility,
        mut view: SnapshotView,
        mut since: Duration,
        idle_timeout: Duration,
        movable: bool,
        cost: Duration,
    ) -> Settled {
        for _ in 0..8 {
            let plan = m.plan(view, false, since, idle_timeout);
            assert!(!(plan.listen_park && plan.quiet_first.is_some()));
            let outcome = if plan.listen_park {
                Outcome::ParkRequested
            } else if let Some(wait) = plan.quiet_first {
                since += wait;
                Outcome::Quiet
            } else {
                // No bytes move, so the relay's quiet timer is never armed.
                return Settled::Stays;
            };
            let mut decision = m.decide(outcome, view, since);
            if decision == Decision::Snapshot {
                since += cost;
                view = SnapshotView {
                    valid: true,
                    movable,
                };
                decision = m.snapshot_taken(view);
            }
            match decision {
                Decision::MarkIdle | Decision::Stay => {}
                Decision::Leave(Move::IdleSleep) => return Settled::Parked(since),
                Decision::EndPinned => return Settled::EndedPinned(since),
                other => panic!("{other:?} for a session left alone"),
            }
        }
        panic!("a session left alone kept running without settling");
    }

    /// One relay run of a scripted session: whether the client sends a message, which of the
    /// ends the plan allows comes back, and whether a snapshot taken after it is movable.
    #[derive(Clone, Debug)]
    struct Run {
        traffic: bool,
        end: prop::sample::Index,
        movable: bool,
        preloaded: bool,
        since_ms: u64,
    }

    fn run() -> impl Strategy<Value = Run> {
        (
            any::<bool>(),
            any::<prop::sample::Index>(),
            any::<bool>(),
            prop::bool::weighted(0.1),
            0u64..20_000,
        )
            .prop_map(|(traffic, end, movable, preloaded, since_ms)| Run {
                traffic,
                end,
                movable,
                preloaded,
                since_ms,
            })
    }

    fn timers() -> impl Strategy<Value = (Duration, Duration)> {
        (1u64..600_000, 1u64..3_600_000)
            .prop_map(|(snap, idle)| (Duration::from_millis(snap), Duration::from_millis(idle)))
    }

    proptest! {
        /// From its last query, a session that can move marks itself idle no earlier than the
        /// idle timeout and is parked within one more `snapshot_after` (snapshots taking at
        /// most `snapshot_after`), however the timers compare.
        #[test]
        fn a_movable_session_left_alone_parks_after_the_idle_timeout(
            (snapshot_after, idle_timeout) in timers(),
            end_pinned in any::<bool>(),
            cost_part in 0.0f64..=1.0,
        ) {
            let snapshot_after_eff = snapshot_after.min(idle_timeout);
            let cost = snapshot_after_eff.mul_f64(cost_part);
            let m = Mobility::new(Policy { snapshot_after, end_pinned, park_after: None });
            let settled = leave_alone(m, NONE, Duration::ZERO, idle_timeout, true, cost);
            let Settled::Parked(at) = settled else {
                return Err(TestCaseError::fail(format!("{settled:?}")));
            };
            prop_assert!(at >= idle_timeout, "parked at {at:?}, before {idle_timeout:?}");
            prop_assert!(at <= idle_timeout + snapshot_after_eff, "parked at {at:?}");
        }

        /// A session at a valid movable snapshot that has been quiet for the idle timeout or
        /// longer parks at once.
        #[test]
        fn at_a_valid_movable_snapshot_after_the_idle_timeout_it_parks_at_once(
            (snapshot_after, idle_timeout) in timers(),
            end_pinned in any::<bool>(),
            extra_ms in 0u64..600_000,
        ) {
            let quiet = idle_timeout + Duration::from_millis(extra_ms);
            let m = Mobility::new(Policy { snapshot_after, end_pinned, park_after: None });
            let settled = leave_alone(m, MOVABLE, quiet, idle_timeout, true, Duration::ZERO);
            prop_assert_eq!(settled, Settled::Parked(quiet));
        }

        /// A session that cannot move never parks: it keeps its tenant awake, or with
        /// `pinned = "terminate"` it is ended, after the idle timeout and within one more
        /// `snapshot_after`.
        #[test]
        fn a_pinned_session_is_never_parked(
            (snapshot_after, idle_timeout) in timers(),
            end_pinned in any::<bool>(),
            cost_part in 0.0f64..=1.0,
        ) {
            let snapshot_after_eff = snapshot_after.min(idle_timeout);
            let cost = snapshot_after_eff.mul_f64(cost_part);
            let m = Mobility::new(Policy { snapshot_after, end_pinned, park_after: None });
            let settled = leave_alone(m, NONE, Duration::ZERO, idle_timeout, false, cost);
            if end_pinned {
                let Settled::EndedPinned(at) = settled else {
                    return Err(TestCaseError::fail(format!("{settled:?}")));
                };
                prop_assert!(at >= idle_timeout && at <= idle_timeout + snapshot_after_eff);
            } else {
                prop_assert_eq!(settled, Settled::Stays);
            }
        }

        /// Whatever the client does and whichever allowed end each run comes back with, the
        /// session only moves on a snapshot that is valid and movable (for a park or a backend
        /// end, also when the run began), is ended as pinned only with `pinned = "terminate"`,
        /// snapshots only when it has no valid one, and listens for park requests exactly while
        /// its claim is idle.
        #[test]
        fn moves_and_ends_only_on_what_the_snapshot_allows(
            (snapshot_after, idle_timeout) in timers(),
            end_pinned in any::<bool>(),
            runs in prop::collection::vec(run(), 1..40),
            park_ms in prop::option::of(1u64..600_000),
        ) {
            let park_after = park_ms.map(Duration::from_millis);
            let mut m = Mobility::new(Policy { snapshot_after, end_pinned, park_after });
            let mut view = NONE;
            for r in runs {
                let before = view;
                let idle_before = m.claim_idle();
                let since = Duration::from_millis(r.since_ms);
                let plan = m.plan(view, r.preloaded, since, idle_timeout);
                let trusted = before.valid && !r.preloaded;
                prop_assert_eq!(plan.mark_busy, idle_before && !trusted);
                prop_assert_eq!(plan.listen_park, m.claim_idle());
                prop_assert_eq!(plan.busy_on_client_activity, m.claim_idle());
                prop_assert_eq!(plan.hold_backend_end, trusted && before.movable);
                prop_assert!(plan.quiet_after.is_some() && plan.listen_migrate);
                if r.traffic || r.preloaded {
                    view.valid = false;
                }
                let mut ends = Vec::new();
                if r.traffic || plan.quiet_first.is_some() {
                    ends.push(Outcome::Quiet);
                }
                if plan.listen_park {
                    ends.push(Outcome::ParkRequested);
                }
                ends.push(Outcome::MigrateRequested);
                if plan.hold_backend_end {
                    ends.push(Outcome::BackendShutDown);
                }
                let outcome = *r.end.get(&ends);
                let idle_at_decision = m.claim_idle();
                let at = since + plan.quiet_first.unwrap_or_default();
                let mut decision = m.decide(outcome, view, at);
                if decision == Decision::Snapshot {
                    prop_assert!(!view.valid);
                    view = SnapshotView { valid: true, movable: r.movable };
                    decision = m.snapshot_taken(view);
                    let stays_or_migrates =
                        matches!(decision, Decision::Stay | Decision::Leave(Move::Migrate));
                    prop_assert!(stays_or_migrates);
                }
                match decision {
                    Decision::Leave(
                        Move::IdleSleep | Move::BackendEnded | Move::SessionIdle,
                    ) => {
                        prop_assert!(plan.hold_backend_end && view.valid && view.movable);
                        return Ok(());
                    }
                    Decision::Leave(Move::Migrate) => {
                        prop_assert!(view.valid && view.movable);
                        m.revived();
                        view.valid = false;
                    }
                    Decision::EndPinned => {
                        prop_assert!(end_pinned && view.valid && idle_at_decision);
                        return Ok(());
                    }
                    Decision::EndLost => {
                        prop_assert_eq!(outcome, Outcome::BackendShutDown);
                        return Ok(());
                    }
                    Decision::MarkIdle => {
                        prop_assert!(view.valid && !idle_at_decision && m.claim_idle());
                        prop_assert!(view.movable || end_pinned);
                    }
                    Decision::Stay | Decision::Snapshot => {}
                }
            }
        }
    }
}
