//! The `SessionTracker`: what the gateway must know about a relayed session to move it to
//! another backend connection, learnt from the message stream alone.
//!
//! It is fed the same chunks the relay copies, in both directions, walks the 5-byte headers and
//! keeps only the few bytes of the messages it needs (a Parse's or Close's statement name, a
//! Query's first bytes, ReadyForQuery's status, CommandComplete's tag). Everything else is
//! skipped without being buffered.
//!
//! What the stream shows with certainty — transaction status, requests in flight, COPY, named
//! statements the backend confirmed, LISTEN — is tracked here. Temporary objects, session
//! advisory locks and WITH HOLD cursors leave no trace in the protocol (a `CREATE TEMP TABLE`
//! completes as `CREATE TABLE`, a lock is a plain `SELECT`), so the proxy checks them with SQL
//! when it takes a snapshot; this tracker is the cheap first filter, SQL is the authority.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::frame::Header;
use crate::stale::{Advance, StaleStatement, StaleStatements};
pub use crate::text_watch::CONTEXT_SETTINGS;
use crate::text_watch::{Findings, TextWatch, bind_names_context, bind_setting_names};

/// Bytes kept of a client message whose payload matters (statement names, query text, the
/// parameters bound to a statement that names a setting by parameter).
const CLIENT_CAPTURE: usize = 1024;
/// Capture buffer capacity kept between messages; a larger one is freed (parked sessions
/// should cost little).
const CAPTURE_KEEP: usize = 256;
/// Bytes kept of a backend CommandComplete tag.
const TAG_CAPTURE: usize = 64;

/// Transaction status, from the last ReadyForQuery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStatus {
    /// Not in a transaction block (`I`).
    Idle,
    /// In a transaction block (`T`).
    InTransaction,
    /// In a failed transaction block (`E`).
    Failed,
}

/// Why a session cannot leave its backend connection (a set of reasons).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pins(u16);

impl Pins {
    /// An open or failed transaction block.
    pub const TRANSACTION: Pins = Pins(1);
    /// LISTEN: notifications would be lost.
    pub const LISTEN: Pins = Pins(1 << 1);
    /// A cursor that may outlive its transaction (WITH HOLD).
    pub const HELD_CURSOR: Pins = Pins(1 << 2);
    /// Temporary tables or other temporary objects.
    pub const TEMP_OBJECTS: Pins = Pins(1 << 3);
    /// Session-level advisory locks.
    pub const ADVISORY_LOCK: Pins = Pins(1 << 4);
    /// More named statements than the tracker keeps, or names it could not read: its count is
    /// unreliable (a snapshot that reads `pg_prepared_statements` is not affected).
    pub const UNTRACKED_STATEMENTS: Pins = Pins(1 << 5);
    /// The stream broke framing; nothing about the session can be trusted.
    pub const BROKEN: Pins = Pins(1 << 6);
    /// Custom settings whose names the gateway cannot learn: computed at run time, or more
    /// than it remembers.
    pub const UNTRACKED_SETTINGS: Pins = Pins(1 << 7);
    /// `setseed` was called: the random generator's state cannot be read or carried over.
    pub const RANDOM_SEED: Pins = Pins(1 << 8);
    /// A prepared statement was made by a multi-statement text the gateway cannot attribute
    /// (two `PREPARE`s of one name in it), so it cannot be made again on its own.
    pub const UNATTRIBUTED_PREPARE: Pins = Pins(1 << 9);
    /// The session drew from a sequence (`nextval`, a serial column): its `currval` and
    /// `lastval` cannot be set on another backend without changing the sequence for everyone.
    pub const SEQUENCE_STATE: Pins = Pins(1 << 10);
    /// A prepared statement was made under settings the gateway never read (a `SET DateStyle`
    /// or `SET ROLE` came after it before any snapshot, or in the same text): made again under
    /// today's, it could read its literals or names otherwise.
    pub const UNKNOWN_PREPARE_CONTEXT: Pins = Pins(1 << 11);

    /// Every reason with its description and its metric label, in bit order.
    pub const ALL: [(Pins, &'static str, &'static str); 12] = [
        (Pins::TRANSACTION, "open transaction", "transaction"),
        (Pins::LISTEN, "LISTEN", "listen"),
        (Pins::HELD_CURSOR, "WITH HOLD cursor", "held_cursor"),
        (Pins::TEMP_OBJECTS, "temporary objects", "temp_objects"),
        (
            Pins::ADVISORY_LOCK,
            "session advisory lock",
            "advisory_lock",
        ),
        (
            Pins::UNTRACKED_STATEMENTS,
            "untracked prepared statements",
            "untracked_statements",
        ),
        (Pins::BROKEN, "broken message stream", "broken_stream"),
        (
            Pins::UNTRACKED_SETTINGS,
            "custom settings the gateway cannot name",
            "untracked_settings",
        ),
        (Pins::RANDOM_SEED, "setseed", "random_seed"),
        (
            Pins::UNATTRIBUTED_PREPARE,
            "PREPARE in a text the gateway cannot attribute",
            "unattributed_prepare",
        ),
        (
            Pins::SEQUENCE_STATE,
            "sequence state (currval, lastval)",
            "sequence_state",
        ),
        (
            Pins::UNKNOWN_PREPARE_CONTEXT,
            "a statement prepared under settings the gateway did not see",
            "prepare_context",
        ),
    ];

    /// No pin.
    pub const fn none() -> Pins {
        Pins(0)
    }

    /// True when no reason is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True when every reason in `other` is set here.
    pub fn contains(self, other: Pins) -> bool {
        self.0 & other.0 == other.0
    }

    /// Adds the reasons in `other`.
    pub fn insert(&mut self, other: Pins) {
        self.0 |= other.0;
    }

    /// Removes the reasons in `other`.
    pub fn remove(&mut self, other: Pins) {
        self.0 &= !other.0;
    }

    /// The metric labels of the reasons set.
    pub fn labels(self) -> impl Iterator<Item = &'static str> {
        Self::ALL
            .iter()
            .filter(move |(p, _, _)| self.contains(*p))
            .map(|(_, _, l)| *l)
    }

    /// The reasons, for logs and error messages.
    pub fn describe(self) -> String {
        let names: Vec<&str> = Self::ALL
            .iter()
            .filter(|(p, _, _)| self.contains(*p))
            .map(|(_, n, _)| *n)
            .collect();
        names.join(", ")
    }
}

impl std::ops::BitOr for Pins {
    type Output = Pins;
    fn bitor(self, rhs: Pins) -> Pins {
        Pins(self.0 | rhs.0)
    }
}

/// Bounds on what the tracker keeps.
#[derive(Clone, Copy, Debug)]
pub struct TrackerLimits {
    /// Named prepared statements remembered; a session with more is pinned.
    pub max_statements: usize,
    /// Custom setting names remembered (`pg_settings` does not list them, so the snapshot asks
    /// for each by name); a session that names more is pinned.
    pub max_custom_settings: usize,
}

impl Default for TrackerLimits {
    fn default() -> Self {
        TrackerLimits {
            max_statements: 1000,
            max_custom_settings: 256,
        }
    }
}

/// Where the messages a [`Reader`] frames go.
trait Sink {
    /// A message with `tag` begins; returns how many of its payload bytes to keep.
    fn start(&mut self, tag: u8) -> usize;
    /// The next payload bytes of the current message, as they arrive.
    fn payload(&mut self, _bytes: &[u8]) {}
    /// The message ended; `kept` is the start of its payload.
    fn done(&mut self, tag: u8, kept: &[u8]);
}

/// A client request still waiting for the backend's answer, in the order sent.
#[derive(Debug)]
enum Op {
    /// Parse of a named (`Some`) or unnamed statement, and the context generation it was sent
    /// in.
    Parse(Option<Box<str>>, u64),
    /// Close of a named statement (`Some`) or of a portal or the unnamed statement.
    Close(Option<Box<str>>),
    /// Sync: the backend answers ReadyForQuery.
    Sync,
    /// Simple query (or function call): ends with ReadyForQuery; what a single `PREPARE` or
    /// `DEALLOCATE` in it names, and when it was sent.
    Query(Option<SqlStatementOp>, Stamp),
}

/// When a simple Query was sent, for the statements it prepares.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    /// The context generation before it.
    before: u64,
    /// Its text may change the context.
    changes: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SqlStatementOp {
    Prepare(Box<str>),
    Deallocate(Box<str>),
}

/// Framing state of one direction, keeping the first bytes of the messages that matter.
#[derive(Debug, Default)]
struct Reader {
    header: Header,
    /// The current message's type byte.
    tag: u8,
    remaining: u32,
    capture: Vec<u8>,
    capture_limit: usize,
    in_message: bool,
}

impl Reader {
    /// Walks `data`, telling `sink` where each message starts, its payload, and where it ends.
    /// Returns false on a length field that cannot be valid.
    fn feed(&mut self, mut data: &[u8], sink: &mut impl Sink) -> bool {
        loop {
            if self.in_message {
                let take = (self.remaining as usize).min(data.len());
                // A body that is whole in this chunk (most are) is read where it lies.
                if take == self.remaining as usize && self.capture.is_empty() {
                    let body = &data[..take];
                    sink.payload(body);
                    self.remaining = 0;
                    self.in_message = false;
                    sink.done(self.tag, &body[..take.min(self.capture_limit)]);
                    data = &data[take..];
                    continue;
                }
                let room = self.capture_limit.saturating_sub(self.capture.len());
                self.capture.extend_from_slice(&data[..take.min(room)]);
                sink.payload(&data[..take]);
                self.remaining -= take as u32;
                data = &data[take..];
                if self.remaining > 0 {
                    return true;
                }
                self.in_message = false;
                sink.done(self.tag, &self.capture);
                self.capture.clear();
                if self.capture.capacity() > CAPTURE_KEEP {
                    self.capture = Vec::new();
                }
                continue;
            }
            if data.is_empty() {
                return true;
            }
            let Some((tag, len)) = self.header.take(&mut data) else {
                return true;
            };
            if len < 4 {
                return false;
            }
            self.tag = tag;
            self.remaining = len - 4;
            self.capture_limit = sink.start(tag);
            self.in_message = true;
        }
    }

    fn at_boundary(&self) -> bool {
        !self.header.partial() && !self.in_message
    }
}

/// Session state learnt from the relayed stream; see the module documentation.
#[derive(Debug)]
pub struct SessionTracker {
    limits: TrackerLimits,
    client: Reader,
    backend: Reader,
    status: TxStatus,
    ops: VecDeque<Op>,
    /// ReadyForQuery messages still owed to the client.
    pending: usize,
    /// Extended-protocol messages sent since the last Sync (nothing answers them until one).
    unsynced: bool,
    copy: bool,
    terminating: bool,
    pins: Pins,
    statements: BTreeSet<Box<str>>,
    custom_settings: BTreeSet<Box<str>>,
    /// Dotted names the client passed as literal arguments, any of which a function may have
    /// set; past the limit the rest are not asked for (they are guesses, not settings seen).
    candidate_settings: BTreeSet<Box<str>>,
    /// Query texts of the client's messages, watched for setting names and `setseed`.
    text: TextWatch,
    /// Named statements whose text passes a setting's name to `set_config` as a parameter:
    /// their Binds are read for the names.
    setting_statements: BTreeSet<Box<str>>,
    /// The unnamed statement does so.
    unnamed_sets_setting: bool,
    /// Text of the last unnamed statement the client made, while it may still exist (a
    /// simple Query or a failed Parse destroys it); `None` also when its Parse was too long
    /// to keep. A client may bind it in a later batch, so a move carries it.
    unnamed_text: Option<Box<str>>,
    /// A text called `currval` or `lastval`: the session relies on sequence state.
    reads_sequences: bool,
    /// How each named statement's rows looked when first recorded after the client made it
    /// (`None`: no rows): Postgres checks every later use against that, not against the
    /// shape of any use in between.
    told: BTreeMap<Box<str>, Option<u64>>,
    /// Statements made again on this backend connection whose rows changed.
    /// Boxed, and only while a revival left stale statements (`Some` is an active filter): most
    /// sessions never have one, and a parked session should not carry the filter's room.
    stale: Option<Box<StaleStatements>>,
    client_messages: u64,
    last_activity: Option<Instant>,
    /// Under which settings each statement was prepared.
    contexts: Contexts,
}

impl Default for SessionTracker {
    fn default() -> Self {
        SessionTracker::new(TrackerLimits::default())
    }
}

impl SessionTracker {
    /// A tracker for a session that just finished login (status idle, nothing in flight).
    pub fn new(limits: TrackerLimits) -> SessionTracker {
        SessionTracker {
            limits,
            client: Reader::default(),
            backend: Reader::default(),
            status: TxStatus::Idle,
            ops: VecDeque::new(),
            pending: 0,
            unsynced: false,
            copy: false,
            terminating: false,
            pins: Pins::none(),
            statements: BTreeSet::new(),
            custom_settings: BTreeSet::new(),
            candidate_settings: BTreeSet::new(),
            text: TextWatch::default(),
            setting_statements: BTreeSet::new(),
            unnamed_sets_setting: false,
            unnamed_text: None,
            reads_sequences: false,
            told: BTreeMap::new(),
            stale: None,
            client_messages: 0,
            last_activity: None,
            contexts: Contexts::default(),
        }
    }

    /// Observes bytes the client sent towards the backend.
    pub fn observe_client(&mut self, data: &[u8], now: Instant) {
        if data.is_empty() || self.pins.contains(Pins::BROKEN) {
            return;
        }
        self.last_activity = Some(now);
        let mut reader = std::mem::take(&mut self.client);
        let mut text = std::mem::take(&mut self.text);
        let ok = reader.feed(
            data,
            &mut ClientSink {
                tracker: self,
                text: &mut text,
            },
        );
        self.client = reader;
        self.text = text;
        if !ok {
            self.pins.insert(Pins::BROKEN);
        }
    }

    /// Observes bytes the backend sent towards the client.
    pub fn observe_backend(&mut self, data: &[u8], now: Instant) {
        if data.is_empty() || self.pins.contains(Pins::BROKEN) {
            return;
        }
        self.last_activity = Some(now);
        let mut reader = std::mem::take(&mut self.backend);
        let ok = reader.feed(data, &mut BackendSink(self));
        self.backend = reader;
        if !ok {
            self.pins.insert(Pins::BROKEN);
        }
    }

    fn client_message(&mut self, tag: u8, body: &[u8], found: &Findings) {
        self.client_messages += 1;
        self.note_findings(found);
        let stamp = Stamp {
            before: self.contexts.generation,
            changes: found.context || (found.executes && self.contexts.sql_changers),
        };
        match tag {
            b'Q' | b'F' => {
                let op = if tag == b'Q' {
                    // A simple Query destroys the unnamed statement.
                    self.unnamed_text = None;
                    self.contexts.unnamed = None;
                    if stamp.changes {
                        self.contexts.changed();
                    }
                    sql_statement_op(body)
                } else {
                    None
                };
                self.ops.push_back(Op::Query(op, stamp));
                self.pending += 1;
            }
            b'S' => {
                self.ops.push_back(Op::Sync);
                self.pending += 1;
                self.unsynced = false;
            }
            b'P' => {
                let name = self.statement_name(body);
                match &name {
                    Some(n) if found.bound => {
                        self.setting_statements.insert(n.clone());
                    }
                    Some(n) => {
                        self.setting_statements.remove(n);
                    }
                    None => {
                        self.unnamed_sets_setting = found.bound;
                        self.keep_unnamed_text(body);
                    }
                }
                // Its text changes the context when it runs, not when it is made.
                self.contexts.mark_changer(name.as_deref(), found.context);
                self.ops
                    .push_back(Op::Parse(name, self.contexts.generation));
                self.unsynced = true;
            }
            b'B' => {
                if self.contexts.binds_changer(body) {
                    self.contexts.changed();
                }
                if self.binds_setting(body) {
                    for name in bind_setting_names(body) {
                        self.remember_setting(name);
                    }
                    if bind_names_context(body) {
                        self.contexts.changed();
                    }
                }
                self.unsynced = true;
            }
            b'C' => {
                let name = match body.first() {
                    Some(b'S') => self.statement_name(&body[1..]),
                    _ => None,
                };
                if let Some(n) = &name {
                    self.setting_statements.remove(n);
                    self.contexts.changers.remove(n);
                }
                self.ops.push_back(Op::Close(name));
                self.unsynced = true;
            }
            b'X' => self.terminating = true,
            // COPY data from the client belongs to a request already counted.
            b'd' | b'c' | b'f' => {}
            // Flush asks the backend to send what it has; it is never answered itself, so it
            // leaves the batch as it was (psycopg ends every pipeline with Sync then Flush).
            b'H' => {}
            _ => self.unsynced = true,
        }
    }

    /// Takes in what a message's text showed about settings and the random seed.
    fn note_findings(&mut self, found: &Findings) {
        for name in &found.names {
            self.remember_setting(name.clone());
        }
        for name in &found.candidates {
            if self.candidate_settings.len() < self.limits.max_custom_settings
                && !self.custom_settings.contains(name.as_str())
            {
                self.candidate_settings.insert(name.as_str().into());
            }
        }
        if found.computed {
            self.pins.insert(Pins::UNTRACKED_SETTINGS);
        }
        if found.seed {
            self.pins.insert(Pins::RANDOM_SEED);
        }
        self.reads_sequences |= found.sequence_read;
    }

    /// Remembers a custom setting name the session may have created; past the limit the
    /// session is pinned, since the snapshot could not ask for the rest.
    fn remember_setting(&mut self, name: String) {
        if self.custom_settings.contains(name.as_str()) {
            return;
        }
        if self.custom_settings.len() >= self.limits.max_custom_settings {
            self.pins.insert(Pins::UNTRACKED_SETTINGS);
            return;
        }
        self.custom_settings.insert(name.into());
    }

    /// True when a Bind whose payload starts with `body` binds a statement that passes a
    /// setting's name as a parameter.
    fn binds_setting(&self, body: &[u8]) -> bool {
        let mut parts = body.splitn(3, |&b| b == 0);
        let (_portal, statement) = (parts.next(), parts.next());
        match statement {
            Some([]) => self.unnamed_sets_setting,
            Some(name) => {
                std::str::from_utf8(name).is_ok_and(|n| self.setting_statements.contains(n))
            }
            None => false,
        }
    }

    /// Keeps the text of a Parse of the unnamed statement whose kept bytes are `body`, when
    /// they hold all of it (the name, the text, and the parameter types after it).
    fn keep_unnamed_text(&mut self, body: &[u8]) {
        let text = body.get(1..).and_then(|rest| {
            let end = memchr::memchr(0, rest)?;
            let after = &rest[end + 1..];
            let count = usize::from(u16::from_be_bytes(after.get(..2)?.try_into().ok()?));
            (after.len() == 2 + 4 * count).then_some(&rest[..end])
        });
        match text {
            // A client that parses the same text again and again (most do) keeps it as it is.
            Some(t) if self.unnamed_text.as_deref().map(str::as_bytes) == Some(t) => {}
            Some(t) => self.unnamed_text = std::str::from_utf8(t).ok().map(Into::into),
            None => self.unnamed_text = None,
        }
    }

    /// True when some statement's Binds are read for setting names or context changes.
    fn watches_binds(&self) -> bool {
        self.unnamed_sets_setting
            || !self.setting_statements.is_empty()
            || self.contexts.unnamed_changes
            || !self.contexts.changers.is_empty()
    }

    /// A statement name at the start of `body`; `None` for the unnamed statement. A name the
    /// capture cut short cannot be tracked, which pins the session.
    fn statement_name(&mut self, body: &[u8]) -> Option<Box<str>> {
        match body.iter().position(|&b| b == 0) {
            Some(0) => None,
            Some(end) => match std::str::from_utf8(&body[..end]) {
                Ok(name) => Some(name.into()),
                Err(_) => {
                    self.pins.insert(Pins::UNTRACKED_STATEMENTS);
                    None
                }
            },
            None => {
                self.pins.insert(Pins::UNTRACKED_STATEMENTS);
                None
            }
        }
    }

    fn backend_message(&mut self, tag: u8, body: &[u8]) {
        match tag {
            b'Z' => {
                self.status = match body.first() {
                    Some(b'T') => TxStatus::InTransaction,
                    Some(b'E') => TxStatus::Failed,
                    _ => TxStatus::Idle,
                };
                // Everything up to the request this answers is finished (or was skipped after
                // an error).
                while let Some(op) = self.ops.pop_front() {
                    if matches!(op, Op::Sync | Op::Query(..)) {
                        break;
                    }
                }
                self.pending = self.pending.saturating_sub(1);
                self.copy = false;
                self.contexts.ready(self.status);
            }
            b'1' => {
                if let Some(i) = self.ops.iter().position(|o| matches!(o, Op::Parse(..))) {
                    match self.ops.remove(i) {
                        Some(Op::Parse(Some(name), generation)) => self.remember(name, generation),
                        Some(Op::Parse(None, generation)) => {
                            self.contexts.unnamed = Some(generation)
                        }
                        _ => {}
                    }
                }
            }
            b'3' => {
                if let Some(i) = self.ops.iter().position(|o| matches!(o, Op::Close(_)))
                    && let Some(Op::Close(Some(name))) = self.ops.remove(i)
                {
                    self.forget(&name);
                }
            }
            b'E' => {
                // The backend skips the rest of an extended-protocol batch until Sync: its
                // Parse and Close requests never happen. A failed Parse of the unnamed
                // statement has already destroyed the one before.
                if matches!(self.ops.front(), Some(Op::Parse(None, _))) {
                    self.unnamed_text = None;
                    self.contexts.unnamed = None;
                }
                while matches!(self.ops.front(), Some(Op::Parse(..) | Op::Close(_))) {
                    self.ops.pop_front();
                }
            }
            b'C' => self.command_complete(body),
            b'G' | b'H' | b'W' => self.copy = true,
            b'A' => self.pins.insert(Pins::LISTEN),
            _ => {}
        }
    }

    fn command_complete(&mut self, body: &[u8]) {
        let tag = body.split(|&b| b == 0).next().unwrap_or_default();
        match tag {
            b"LISTEN" => self.pins.insert(Pins::LISTEN),
            // Whether any channel is left is checked with SQL at snapshot time.
            b"UNLISTEN" => self.pins.remove(Pins::LISTEN),
            b"DECLARE CURSOR" => self.pins.insert(Pins::HELD_CURSOR),
            b"CLOSE CURSOR" | b"CLOSE CURSOR ALL" => self.pins.remove(Pins::HELD_CURSOR),
            b"DEALLOCATE ALL" => self.forget_all(),
            b"DISCARD ALL" => {
                self.forget_all();
                self.pins.remove(
                    Pins::LISTEN | Pins::HELD_CURSOR | Pins::TEMP_OBJECTS | Pins::ADVISORY_LOCK,
                );
            }
            b"DISCARD TEMP" => self.pins.remove(Pins::TEMP_OBJECTS),
            b"PREPARE" | b"DEALLOCATE" => {
                let Some((op, stamp)) = self.ops.iter().find_map(|o| match o {
                    Op::Query(op, stamp) => Some((op.clone(), *stamp)),
                    _ => None,
                }) else {
                    self.pins.insert(Pins::UNTRACKED_STATEMENTS);
                    return;
                };
                match op {
                    Some(SqlStatementOp::Prepare(name)) if tag == b"PREPARE" => {
                        // Its text changes the context when an EXECUTE runs it.
                        self.contexts.sql_changers |= stamp.changes;
                        self.remember(name, stamp.before);
                    }
                    Some(SqlStatementOp::Deallocate(name)) if tag == b"DEALLOCATE" => {
                        self.forget(&name)
                    }
                    // A multi-statement query or a name the tracker could not read: the
                    // snapshot reads pg_prepared_statements anyway, but the count here is off.
                    _ => {
                        self.pins.insert(Pins::UNTRACKED_STATEMENTS);
                        if tag == b"PREPARE" {
                            // The text may have changed the context before or after it.
                            let made_in = match stamp.changes {
                                true => UNKNOWN_GENERATION,
                                false => stamp.before,
                            };
                            self.contexts.unattributed(made_in);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// A statement the backend confirmed, made in context generation `generation`.
    fn remember(&mut self, name: Box<str>, generation: u64) {
        self.told.remove(&name);
        if self.statements.len() >= self.limits.max_statements && !self.statements.contains(&name) {
            self.pins.insert(Pins::UNTRACKED_STATEMENTS);
            self.contexts.unattributed(generation);
            return;
        }
        self.contexts.statements.insert(name.clone(), generation);
        self.statements.insert(name);
    }

    /// A statement the client closed.
    fn forget(&mut self, name: &str) {
        if let Some(stale) = &mut self.stale {
            stale.forget(name);
        }
        self.told.remove(name);
        self.statements.remove(name);
        self.contexts.statements.remove(name);
        self.contexts.changers.remove(name);
    }

    /// Every named statement went (`DEALLOCATE ALL`, `DISCARD ALL`).
    fn forget_all(&mut self) {
        if let Some(stale) = &mut self.stale {
            stale.forget_all();
        }
        self.told.clear();
        self.statements.clear();
        self.contexts.forget_all();
    }

    /// Transaction status from the last ReadyForQuery.
    pub fn status(&self) -> TxStatus {
        self.status
    }

    /// True while a request has not been fully answered (or extended-protocol messages wait
    /// for a Sync).
    pub fn in_flight(&self) -> bool {
        self.pending > 0 || self.unsynced || !self.ops.is_empty()
    }

    /// True during COPY.
    pub fn in_copy(&self) -> bool {
        self.copy
    }

    /// The pins the stream showed (transaction status included).
    pub fn pins(&self) -> Pins {
        let mut p = self.pins;
        if self.status != TxStatus::Idle {
            p.insert(Pins::TRANSACTION);
        }
        p
    }

    /// Both directions end at a message boundary, nothing is in flight, the status is idle and
    /// the client has not said goodbye: the backend connection could be swapped here, pins
    /// aside.
    pub fn at_rest(&self) -> bool {
        self.client.at_boundary()
            && self.backend.at_boundary()
            && !self.in_flight()
            && !self.copy
            && !self.terminating
            && self.status == TxStatus::Idle
            && !self.pins.contains(Pins::BROKEN)
    }

    /// At rest and with no pin the stream showed (SQL checks for the rest come on top).
    pub fn at_safe_point(&self) -> bool {
        self.at_rest() && self.pins().is_empty()
    }

    /// Named prepared statements the backend confirmed, as far as the stream shows.
    pub fn statements(&self) -> impl Iterator<Item = &str> {
        self.statements.iter().map(|s| &**s)
    }

    /// Text of the unnamed statement the client made last, if it may still exist and was short
    /// enough to keep; the snapshot asks the backend whether it does.
    pub fn unnamed_text(&self) -> Option<&str> {
        self.unnamed_text.as_deref()
    }

    /// Custom (`prefix.name`) settings the client may have set, and the dotted names it passed
    /// to functions that may set them; the snapshot reads the values of those that exist.
    pub fn custom_settings(&self) -> impl Iterator<Item = &str> {
        self.custom_settings
            .iter()
            .chain(self.candidate_settings.difference(&self.custom_settings))
            .map(|s| &**s)
    }

    /// Number of named prepared statements tracked.
    pub fn statement_count(&self) -> usize {
        self.statements.len()
    }

    /// Client messages seen so far: a change means the session may have changed state.
    pub fn client_messages(&self) -> u64 {
        self.client_messages
    }

    /// When bytes last moved in either direction.
    pub fn last_activity(&self) -> Option<Instant> {
        self.last_activity
    }

    /// Records pins found outside the stream (the SQL checks at snapshot time).
    pub fn add_pins(&mut self, pins: Pins) {
        self.pins.insert(pins);
    }

    /// True when `name` was made again on this backend connection with rows that differ from
    /// what the client was told, or could not be made again.
    pub fn is_stale(&self, name: &str) -> bool {
        self.stale.as_ref().is_some_and(|s| s.contains(name))
    }

    /// How statement `name`'s rows looked when first recorded after the client made it, if
    /// they were: `Some(None)` for no rows.
    pub fn told_shape(&self, name: &str) -> Option<Option<u64>> {
        self.told.get(name).copied()
    }

    /// Records how statement `name`'s rows look, unless they were recorded since the client
    /// made it.
    pub fn record_told_shape(&mut self, name: &str, shape: Option<u64>) {
        if self.statements.contains(name) && !self.told.contains_key(name) {
            self.told.insert(name.into(), shape);
        }
    }

    /// True once a text of the session called `currval` or `lastval`.
    pub fn reads_sequence_state(&self) -> bool {
        self.reads_sequences
    }

    /// Records the context the session's settings make now, as a snapshot read it: unless one
    /// was recorded since the context last changed, statements made since then were made under
    /// it. Nothing is changed but that one record, made once.
    pub fn note_context(&self, now: &Arc<PrepareContext>) {
        self.contexts.current.get_or_init(|| Arc::clone(now));
    }

    /// The context statement `name` (`None`: the unnamed statement) was prepared under, given
    /// the context a snapshot reads `now` and the settings' values at login, `reset` (what
    /// every statement made before the first change was made under); `None` when the gateway
    /// cannot know it: the settings changed after it was made before any snapshot read them,
    /// the text that made it also changed them, or they differ now from what an earlier
    /// snapshot read while nothing the gateway saw changed them (a function that calls
    /// `set_config`).
    pub fn prepare_context(
        &self,
        name: Option<&str>,
        now: &Arc<PrepareContext>,
        reset: Option<&Arc<PrepareContext>>,
    ) -> Option<Arc<PrepareContext>> {
        let c = &self.contexts;
        let made_in = match name {
            Some(n) => c.statements.get(n).copied().or(c.unattributed)?,
            None => c.unnamed?,
        };
        if made_in == c.generation {
            let recorded = c.current.get_or_init(|| Arc::clone(now));
            return (**recorded == **now).then(|| Arc::clone(recorded));
        }
        match c.past.get(&made_in) {
            Some(past) => Some(Arc::clone(past)),
            // Nothing the gateway saw changed them yet: they held their login values.
            None if made_in == 0 => reset.cloned(),
            None => None,
        }
    }

    /// Statements a revival left to be made at their first use that are tried again while the
    /// session is at rest, each with the batch that does it (see [`crate::stale::Remake::at_rest`]).
    pub fn remakes_at_rest(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.stale.iter().flat_map(|s| s.at_rest())
    }

    /// A try at rest made statement `name` again, its rows looking as `rows` (`None`: no rows):
    /// it exists on the backend connection again, and its uses go there as they are unless its
    /// rows look otherwise than the client was told.
    pub fn made_at_rest(&mut self, name: &str, rows: Option<u64>) {
        let Some(stale) = self.stale.as_mut().filter(|s| s.contains(name)) else {
            return;
        };
        stale.made_at_rest(name, rows);
        if self.statements.len() < self.limits.max_statements {
            self.statements.insert(name.into());
        } else if !self.statements.contains(name) {
            self.pins.insert(Pins::UNTRACKED_STATEMENTS);
        }
    }

    /// A try at rest of statement `name` met an error that does not pass: its first use makes it.
    pub fn stop_trying_at_rest(&mut self, name: &str) {
        if let Some(stale) = &mut self.stale {
            stale.stop_trying_at_rest(name);
        }
    }

    /// The stale statements and what their use answers.
    pub fn stale_statements(&self) -> impl Iterator<Item = (&str, &StaleStatement)> {
        self.stale.iter().flat_map(|s| s.names())
    }

    /// Edits client bytes on their way to the backend while statements are stale (see
    /// [`StaleStatements::client`]); `None` when none is.
    pub fn filter_client(&mut self, data: &mut [u8]) -> Option<Advance> {
        self.stale.as_mut().map(|s| s.client(data))
    }

    /// Edits backend bytes on their way to the client while statements are stale (see
    /// [`StaleStatements::backend`]); `None` when none is.
    pub fn filter_backend(&mut self, data: &mut [u8]) -> Option<Advance> {
        self.stale.as_mut().map(|s| s.backend(data))
    }

    /// Gives back the read buffers' spare room, kept from the largest message seen, while the
    /// session has no traffic (parked).
    pub fn release_buffers(&mut self) {
        // Mid-message the buffers hold the message's start: nothing is given back then.
        if !self.client.in_message {
            self.client.capture = Vec::new();
            self.text.release_buffer();
        }
        if !self.backend.in_message {
            self.backend.capture = Vec::new();
        }
        self.ops.shrink_to_fit();
    }

    /// The backend connection was replaced by a fresh one holding these statements (after a
    /// revival); the `stale` ones describe other rows than the client was told or could not be
    /// made again, and their uses answer as given; the unnamed statement is there again only
    /// when `unnamed_restored`. In-stream state starts over, status idle.
    pub fn reset_for_new_backend<'a>(
        &mut self,
        statements: impl IntoIterator<Item = &'a str>,
        stale: impl IntoIterator<Item = (&'a str, StaleStatement)>,
        unnamed_restored: bool,
    ) {
        if !unnamed_restored {
            self.unnamed_text = None;
        }
        let stale = StaleStatements::start(stale.into_iter().map(|(n, a)| (n.into(), a)));
        self.stale = stale.active().then(|| Box::new(stale));
        self.backend = Reader::default();
        self.status = TxStatus::Idle;
        self.ops.clear();
        self.pending = 0;
        self.unsynced = false;
        self.copy = false;
        self.statements = statements.into_iter().map(Into::into).collect();
        self.pins.remove(Pins::UNTRACKED_STATEMENTS);
        // A statement the new connection lacks keeps its context only while its use answers
        // for it; the rest are gone.
        let (statements, stale) = (&self.statements, &self.stale);
        self.contexts
            .statements
            .retain(|n, _| statements.contains(n) || stale.as_ref().is_some_and(|s| s.contains(n)));
    }
}

/// The settings a statement was prepared under ([`CONTEXT_SETTINGS`], in that order), as a
/// snapshot read them with `current_setting`: one text of the values separated by NUL, which
/// no setting's value holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrepareContext(Box<str>);

impl PrepareContext {
    /// The context of these values, one per [`CONTEXT_SETTINGS`] name in its order; `None`
    /// when they are not as many or one holds a NUL.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<PrepareContext> {
        let values: Vec<&str> = values.into_iter().collect();
        (values.len() == CONTEXT_SETTINGS.len() && values.iter().all(|v| !v.contains('\0')))
            .then(|| PrepareContext(values.join("\0").into()))
    }

    /// Each setting's name and value, in [`CONTEXT_SETTINGS`] order.
    pub fn settings(&self) -> impl Iterator<Item = (&'static str, &str)> {
        CONTEXT_SETTINGS.iter().copied().zip(self.0.split('\0'))
    }

    /// Bytes its values hold on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.0.len()
    }
}

/// A statement generation no snapshot can tell the context of.
const UNKNOWN_GENERATION: u64 = u64::MAX;

/// Which context generation each statement was made in, and the context of each generation a
/// statement still holds. The generation moves whenever a text may change a context setting
/// (and again when a transaction block that did ends, as `SET LOCAL` and a rollback undo the
/// change there); a snapshot reads the settings, and the first one taken in a generation is the
/// context of every statement made in it.
#[derive(Debug, Default)]
struct Contexts {
    generation: u64,
    /// The context of the current generation, once a snapshot read it.
    current: OnceLock<Arc<PrepareContext>>,
    /// Contexts of earlier generations that statements were made in and still hold.
    past: BTreeMap<u64, Arc<PrepareContext>>,
    /// The generation each named statement was made in.
    statements: BTreeMap<Box<str>, u64>,
    /// The generation the unnamed statement was made in.
    unnamed: Option<u64>,
    /// The generation of the statements made by texts the tracker could not attribute to a
    /// name ([`UNKNOWN_GENERATION`] once they span more than one).
    unattributed: Option<u64>,
    /// A text that may change the context ran in the batch not yet answered idle.
    dirty: bool,
    /// ... and inside a transaction block, whose end may undo it.
    in_block: bool,
    /// Named statements whose text may change the context when it runs: their Binds do.
    changers: BTreeSet<Box<str>>,
    /// The unnamed statement is such a one.
    unnamed_changes: bool,
    /// A statement made with SQL `PREPARE` is such a one: an `EXECUTE` may change it.
    sql_changers: bool,
}

impl Contexts {
    /// A text that may change the context was sent.
    fn changed(&mut self) {
        self.dirty = true;
        if let Some(read) = self.current.take()
            && self.holds(self.generation)
        {
            self.past.insert(self.generation, read);
        }
        self.generation += 1;
        if !self.past.is_empty() {
            let live: BTreeSet<u64> = self
                .statements
                .values()
                .chain(&self.unnamed)
                .chain(&self.unattributed)
                .copied()
                .collect();
            self.past.retain(|g, _| live.contains(g));
        }
    }

    /// True when a statement the session may hold was made in `generation`.
    fn holds(&self, generation: u64) -> bool {
        self.unnamed == Some(generation)
            || self.unattributed == Some(generation)
            || self.statements.values().any(|&g| g == generation)
    }

    /// A ReadyForQuery with `status` arrived: a change made inside a transaction block may be
    /// undone at its end, so the generation moves again then.
    fn ready(&mut self, status: TxStatus) {
        if status != TxStatus::Idle {
            self.in_block |= self.dirty;
            return;
        }
        if std::mem::take(&mut self.in_block) {
            self.changed();
        }
        self.dirty = false;
    }

    /// Statements made by a text that named none of them, in `generation`.
    fn unattributed(&mut self, generation: u64) {
        self.unattributed = Some(match self.unattributed {
            Some(g) if g != generation => UNKNOWN_GENERATION,
            _ => generation,
        });
    }

    /// Statement `name` (`None`: the unnamed one) is made with a text that may (`changes`) or
    /// may not change the context when it runs.
    fn mark_changer(&mut self, name: Option<&str>, changes: bool) {
        match name {
            None => self.unnamed_changes = changes,
            Some(n) if changes => {
                self.changers.insert(n.into());
            }
            Some(n) => {
                self.changers.remove(n);
            }
        }
    }

    /// True when a Bind whose payload starts with `body` binds a statement whose text may
    /// change the context.
    fn binds_changer(&self, body: &[u8]) -> bool {
        let mut parts = body.splitn(3, |&b| b == 0);
        match (parts.next(), parts.next()) {
            (Some(_), Some([])) => self.unnamed_changes,
            (Some(_), Some(name)) => {
                std::str::from_utf8(name).is_ok_and(|n| self.changers.contains(n))
            }
            _ => false,
        }
    }

    fn forget_all(&mut self) {
        self.statements.clear();
        self.unattributed = None;
        self.changers.clear();
        self.sql_changers = false;
    }
}

/// The client direction: captures what the tracker reads and streams query texts through the
/// text watch.
struct ClientSink<'a> {
    tracker: &'a mut SessionTracker,
    text: &'a mut TextWatch,
}

impl Sink for ClientSink<'_> {
    fn start(&mut self, tag: u8) -> usize {
        self.text.start(tag);
        match tag {
            b'P' | b'C' | b'Q' => CLIENT_CAPTURE,
            b'B' if self.tracker.watches_binds() => CLIENT_CAPTURE,
            _ => 0,
        }
    }

    fn payload(&mut self, bytes: &[u8]) {
        self.text.bytes(bytes);
    }

    fn done(&mut self, tag: u8, kept: &[u8]) {
        match self.text.finish() {
            Some(found) => self.tracker.client_message(tag, kept, &found),
            None => self.tracker.client_message(tag, kept, &Findings::NONE),
        }
    }
}

/// The backend direction: only ReadyForQuery's status and CommandComplete's tag are kept.
struct BackendSink<'a>(&'a mut SessionTracker);

impl Sink for BackendSink<'_> {
    fn start(&mut self, tag: u8) -> usize {
        match tag {
            b'Z' => 1,
            b'C' => TAG_CAPTURE,
            _ => 0,
        }
    }

    fn done(&mut self, tag: u8, kept: &[u8]) {
        self.0.backend_message(tag, kept);
    }
}

/// The statement a single-statement `PREPARE name ...` or `DEALLOCATE [PREPARE] name` query
/// names; `None` for anything else (the caller then knows the count may be off).
fn sql_statement_op(body: &[u8]) -> Option<SqlStatementOp> {
    // Nearly every query begins with another word: its first letter settles it without reading
    // the text as UTF-8 (a non-ASCII first byte may be Unicode space that `trim` skips below).
    match body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c))
    {
        Some(b'p' | b'P' | b'd' | b'D') => {}
        Some(b) if !b.is_ascii() => {}
        _ => return None,
    }
    let text = std::str::from_utf8(body.split(|&b| b == 0).next()?).ok()?;
    let text = text.trim().trim_end_matches(';').trim_end();
    if text.contains(';') {
        return None;
    }
    let mut words = text.split_whitespace();
    let first = words.next()?.to_ascii_lowercase();
    let name = match first.as_str() {
        "prepare" => words.next()?.split('(').next()?,
        "deallocate" => match words.next()? {
            w if w.eq_ignore_ascii_case("prepare") => words.next()?,
            w => w,
        },
        _ => return None,
    };
    // Quoted identifiers keep their case; others fold to lower case, as the server does.
    let name: Box<str> = if let Some(quoted) = name.strip_prefix('"') {
        quoted.strip_suffix('"')?.replace("\"\"", "\"").into()
    } else {
        name.to_ascii_lowercase().into()
    };
    Some(match first.as_str() {
        "prepare" => SqlStatementOp::Prepare(name),
        _ => SqlStatementOp::Deallocate(name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn cstr(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    fn parse(name: &str) -> Vec<u8> {
        let mut b = cstr(name);
        b.extend(cstr("select 1"));
        b.extend([0, 0]);
        msg(b'P', &b)
    }

    fn close(name: &str) -> Vec<u8> {
        let mut b = vec![b'S'];
        b.extend(cstr(name));
        msg(b'C', &b)
    }

    fn query(sql: &str) -> Vec<u8> {
        msg(b'Q', &cstr(sql))
    }

    fn ready(status: u8) -> Vec<u8> {
        msg(b'Z', &[status])
    }

    fn complete(tag: &str) -> Vec<u8> {
        msg(b'C', &cstr(tag))
    }

    fn sync() -> Vec<u8> {
        msg(b'S', &[])
    }

    fn error() -> Vec<u8> {
        msg(b'E', b"SERROR\0C42601\0Mboom\0\0")
    }

    fn now() -> Instant {
        Instant::now()
    }

    #[test]
    fn statements_count_only_once_confirmed() {
        let mut t = SessionTracker::default();
        t.observe_client(&[parse("a"), parse("b"), sync()].concat(), now());
        assert!(t.in_flight());
        assert_eq!(t.statement_count(), 0, "nothing confirmed yet");
        t.observe_backend(&msg(b'1', &[]), now());
        assert_eq!(t.statements().collect::<Vec<_>>(), ["a"]);
        t.observe_backend(&[error(), ready(b'I')].concat(), now());
        assert_eq!(t.statements().collect::<Vec<_>>(), ["a"], "b failed");
        assert!(t.at_safe_point());

        t.observe_client(&[close("a"), sync()].concat(), now());
        t.observe_backend(&[msg(b'3', &[]), ready(b'I')].concat(), now());
        assert_eq!(t.statement_count(), 0);
    }

    fn context(datestyle: &str) -> Arc<PrepareContext> {
        let mut values = vec!["u", "none", "public", datestyle];
        values.resize(CONTEXT_SETTINGS.len(), "x");
        Arc::new(PrepareContext::new(values).unwrap())
    }

    fn run(t: &mut SessionTracker, sql: &str, status: u8) {
        t.observe_client(&query(sql), now());
        t.observe_backend(&[complete("X"), ready(status)].concat(), now());
    }

    #[test]
    fn statements_keep_the_context_they_were_prepared_in() {
        let (mdy, dmy) = (context("ISO, MDY"), context("ISO, DMY"));
        let mut t = SessionTracker::default();
        t.observe_client(&[parse("a"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        // Read by the first snapshot while nothing changed since "a" was made.
        assert_eq!(t.prepare_context(Some("a"), &mdy, None), Some(mdy.clone()));
        run(&mut t, "SET datestyle = 'ISO, DMY'", b'I');
        assert_eq!(t.prepare_context(Some("a"), &dmy, None), Some(mdy.clone()));
        t.observe_client(&[parse("b"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        assert_eq!(t.prepare_context(Some("b"), &dmy, None), Some(dmy.clone()));
        // Made, then the context changed before any snapshot read it.
        run(&mut t, "SET datestyle = 'ISO, YMD'", b'I');
        t.observe_client(&[parse("c"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        run(&mut t, "set role r0", b'I');
        assert_eq!(t.prepare_context(Some("c"), &mdy, None), None);
        assert_eq!(t.prepare_context(Some("a"), &mdy, None), Some(mdy.clone()));
        assert_eq!(t.prepare_context(Some("b"), &mdy, None), Some(dmy.clone()));
        // Unrelated settings leave the generation where it was.
        t.note_context(&mdy);
        run(
            &mut t,
            "set statement_timeout = 5; update t set x = 1",
            b'I',
        );
        t.observe_client(&[parse("d"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        assert_eq!(t.prepare_context(Some("d"), &mdy, None), Some(mdy.clone()));
        // Something the gateway did not see changed it (a function calling set_config).
        assert_eq!(t.prepare_context(Some("d"), &dmy, None), None);
    }

    #[test]
    fn statements_made_before_the_first_change_take_the_login_values() {
        let (mdy, dmy) = (context("ISO, MDY"), context("ISO, DMY"));
        let mut t = SessionTracker::default();
        // A driver's setup: a statement made at login, then settings, all before any snapshot.
        t.observe_client(&[parse("s1"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        run(&mut t, "SET datestyle = 'ISO, DMY'", b'I');
        assert_eq!(t.prepare_context(Some("s1"), &dmy, None), None);
        assert_eq!(
            t.prepare_context(Some("s1"), &dmy, Some(&mdy)),
            Some(mdy.clone())
        );
        // Made after the change and before a snapshot: the login values do not hold for it.
        t.observe_client(&[parse("s2"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        run(&mut t, "SET datestyle = 'ISO, YMD'", b'I');
        assert_eq!(t.prepare_context(Some("s2"), &mdy, Some(&mdy)), None);
    }

    #[test]
    fn a_change_inside_a_block_moves_the_generation_again_at_its_end() {
        let mdy = context("ISO, MDY");
        let mut t = SessionTracker::default();
        run(&mut t, "begin", b'T');
        run(&mut t, "set local datestyle = 'ISO, DMY'", b'T');
        t.observe_client(&query("PREPARE p AS select '03/04/2024'::date"), now());
        t.observe_backend(&[complete("PREPARE"), ready(b'T')].concat(), now());
        run(&mut t, "commit", b'I');
        assert_eq!(
            t.prepare_context(Some("p"), &mdy, None),
            None,
            "made under SET LOCAL"
        );
        t.observe_client(&query("PREPARE q AS select 1"), now());
        t.observe_backend(&[complete("PREPARE"), ready(b'I')].concat(), now());
        assert_eq!(t.prepare_context(Some("q"), &mdy, None), Some(mdy.clone()));
        // A statement whose text changes the context moves it when it runs.
        run(&mut t, "reset datestyle", b'I');
        let mut b = cstr("s");
        b.extend(cstr("select set_config('search_path', $1, false)"));
        b.extend([0, 0]);
        t.observe_client(&[msg(b'P', &b), parse("r"), sync()].concat(), now());
        t.observe_backend(
            &[msg(b'1', &[]), msg(b'1', &[]), ready(b'I')].concat(),
            now(),
        );
        let mut bind = cstr("");
        bind.extend(cstr("s"));
        bind.extend([0, 0, 0, 0, 0, 0]);
        t.observe_client(
            &[msg(b'B', &bind), msg(b'E', &[0, 0, 0, 0, 0]), sync()].concat(),
            now(),
        );
        t.observe_backend(&ready(b'I'), now());
        assert_eq!(t.prepare_context(Some("r"), &mdy, None), None);
        assert_eq!(t.prepare_context(Some("q"), &mdy, None), Some(mdy.clone()));
        // A text that prepares without a name the tracker can read and also changes settings.
        run(&mut t, "DEALLOCATE ALL", b'I');
        t.observe_client(&query("prepare x as select 1; set datestyle = dmy"), now());
        t.observe_backend(
            &[complete("PREPARE"), complete("SET"), ready(b'I')].concat(),
            now(),
        );
        assert_eq!(t.prepare_context(Some("x"), &mdy, None), None);
    }

    #[test]
    fn sql_prepare_and_deallocate() {
        let mut t = SessionTracker::default();
        t.observe_client(&query("PREPARE Foo(int) AS select $1"), now());
        t.observe_backend(&[complete("PREPARE"), ready(b'I')].concat(), now());
        t.observe_client(&query("prepare \"Bar\" as select 2;"), now());
        t.observe_backend(&[complete("PREPARE"), ready(b'I')].concat(), now());
        assert_eq!(t.statements().collect::<Vec<_>>(), ["Bar", "foo"]);
        t.observe_client(&query("deallocate prepare foo"), now());
        t.observe_backend(&[complete("DEALLOCATE"), ready(b'I')].concat(), now());
        assert_eq!(t.statements().collect::<Vec<_>>(), ["Bar"]);
        t.observe_client(&query("DEALLOCATE ALL"), now());
        t.observe_backend(&[complete("DEALLOCATE ALL"), ready(b'I')].concat(), now());
        assert_eq!(t.statement_count(), 0);
        assert!(t.at_safe_point());
    }

    #[test]
    fn statement_ops_are_read_after_any_leading_space() {
        let prepare = |name: &str| Some(SqlStatementOp::Prepare(name.into()));
        assert_eq!(
            sql_statement_op(b"\x0b\x0c\r\n\t PREPARE p AS select 1\0"),
            prepare("p")
        );
        assert_eq!(
            sql_statement_op("\u{2003}prepare q as select 1\0".as_bytes()),
            prepare("q")
        );
        assert_eq!(
            sql_statement_op(b" Deallocate r\0"),
            Some(SqlStatementOp::Deallocate("r".into()))
        );
        for other in [
            &b"select 1\0"[..],
            b"  delete from t\0",
            b"\0",
            b"",
            b"pg_sleep\0",
        ] {
            assert_eq!(sql_statement_op(other), None, "{other:?}");
        }
    }

    #[test]
    fn transactions_copy_and_listen_pin() {
        let mut t = SessionTracker::default();
        assert!(t.at_safe_point());
        t.observe_client(&query("begin"), now());
        assert!(!t.at_rest(), "waiting for the answer");
        t.observe_backend(&[complete("BEGIN"), ready(b'T')].concat(), now());
        assert_eq!(t.status(), TxStatus::InTransaction);
        assert!(t.pins().contains(Pins::TRANSACTION));
        assert!(!t.at_safe_point());
        t.observe_client(&query("commit"), now());
        t.observe_backend(&[complete("COMMIT"), ready(b'I')].concat(), now());
        assert!(t.at_safe_point());

        t.observe_client(&query("copy t from stdin"), now());
        t.observe_backend(&msg(b'G', &[0, 0, 0]), now());
        assert!(t.in_copy());
        t.observe_client(&[msg(b'd', b"1\n"), msg(b'c', &[])].concat(), now());
        t.observe_backend(&[complete("COPY 1"), ready(b'I')].concat(), now());
        assert!(!t.in_copy());
        assert!(t.at_safe_point());

        t.observe_client(&query("listen x"), now());
        t.observe_backend(&[complete("LISTEN"), ready(b'I')].concat(), now());
        assert!(t.at_rest());
        assert!(!t.at_safe_point());
        assert_eq!(t.pins().describe(), "LISTEN");
    }

    #[test]
    fn a_message_split_in_the_middle_is_not_at_rest() {
        let mut t = SessionTracker::default();
        let q = query("select 1");
        t.observe_client(&q[..3], now());
        assert!(!t.at_rest());
        t.observe_client(&q[3..], now());
        t.observe_backend(&ready(b'I')[..2], now());
        assert!(!t.at_rest());
        t.observe_backend(&ready(b'I')[2..], now());
        assert!(t.at_rest());
        assert_eq!(t.client_messages(), 1);
    }

    #[test]
    fn custom_settings_from_query_texts() {
        let mut t = SessionTracker::default();
        t.observe_client(
            &query(
                "SET app.x = 'a'; set SESSION My.Y to 1; SET LOCAL tx.z = 1; SET search_path = x",
            ),
            now(),
        );
        t.observe_client(
            &query("select set_config('app.w', 'v', false), offset.x"),
            now(),
        );
        t.observe_client(&parse("s"), now());
        assert_eq!(
            t.custom_settings().collect::<Vec<_>>(),
            ["app.w", "app.x", "my.y", "tx.z"]
        );
        let mut t = SessionTracker::default();
        t.observe_client(&query("reset app.x; setx a.b; SET a..b = 1"), now());
        assert_eq!(t.custom_settings().collect::<Vec<_>>(), ["app.x"]);
        assert!(t.pins().is_empty());
    }

    #[test]
    fn custom_settings_past_the_capture_and_split_across_chunks() {
        let mut t = SessionTracker::default();
        let text = format!("select '{}'; set app.late = 1", "x".repeat(3000));
        let q = query(&text);
        for c in q.chunks(97) {
            t.observe_client(c, now());
        }
        assert_eq!(t.custom_settings().collect::<Vec<_>>(), ["app.late"]);
    }

    fn bind_text(statement: &str, params: &[&str]) -> Vec<u8> {
        let mut b = cstr("");
        b.extend(cstr(statement));
        b.extend(0u16.to_be_bytes());
        b.extend((params.len() as u16).to_be_bytes());
        for p in params {
            b.extend((p.len() as i32).to_be_bytes());
            b.extend(p.as_bytes());
        }
        b.extend(0u16.to_be_bytes());
        msg(b'B', &b)
    }

    fn parse_text(name: &str, text: &str) -> Vec<u8> {
        let mut b = cstr(name);
        b.extend(cstr(text));
        b.extend([0, 0]);
        msg(b'P', &b)
    }

    #[test]
    fn the_unnamed_statement_text_lives_until_a_query_or_a_failed_parse() {
        let mut t = SessionTracker::default();
        t.observe_client(&[parse_text("", "select 1"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        assert_eq!(t.unnamed_text(), Some("select 1"));
        t.observe_client(&[bind_text("", &[]), sync()].concat(), now());
        t.observe_backend(&ready(b'I'), now());
        assert_eq!(t.unnamed_text(), Some("select 1"), "binding keeps it");
        t.observe_client(&query("select 2"), now());
        t.observe_backend(&[complete("SELECT 1"), ready(b'I')].concat(), now());
        assert_eq!(t.unnamed_text(), None, "a simple query destroys it");

        t.observe_client(&[parse_text("", "select 3"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        t.observe_client(&[parse_text("", "selec 4"), sync()].concat(), now());
        t.observe_backend(&[error(), ready(b'I')].concat(), now());
        assert_eq!(
            t.unnamed_text(),
            None,
            "a failed parse destroyed the one before"
        );

        let long = format!("select '{}'", "x".repeat(2000));
        t.observe_client(&[parse_text("", &long), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        assert_eq!(t.unnamed_text(), None, "too long to keep");
        t.observe_client(&[parse_text("", "select 5"), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        t.reset_for_new_backend([], [], false);
        assert_eq!(t.unnamed_text(), None, "not made again on the new backend");
    }

    #[test]
    fn setting_names_bound_as_parameters() {
        let mut t = SessionTracker::default();
        let set = "select set_config($1, $2, false)";
        t.observe_client(
            &[parse_text("", set), bind_text("", &["App.T", "x"])].concat(),
            now(),
        );
        t.observe_client(
            &[parse_text("s1", set), bind_text("s1", &["app.u", "y"])].concat(),
            now(),
        );
        // Another statement's parameters are values, not names.
        t.observe_client(
            &[parse_text("", "select $1"), bind_text("", &["app.v"])].concat(),
            now(),
        );
        t.observe_client(
            &[close("s1"), bind_text("s1", &["app.w", "z"])].concat(),
            now(),
        );
        assert_eq!(t.custom_settings().collect::<Vec<_>>(), ["app.t", "app.u"]);
        assert!(t.pins().is_empty());
    }

    #[test]
    fn settings_it_cannot_name_and_setseed_pin() {
        let mut t = SessionTracker::new(TrackerLimits {
            max_custom_settings: 2,
            ..TrackerLimits::default()
        });
        t.observe_client(&query("set a.a = 1; set a.b = 1"), now());
        assert!(t.pins().is_empty());
        t.observe_client(&query("set a.c = 1"), now());
        assert_eq!(
            t.pins().describe(),
            "custom settings the gateway cannot name"
        );
        assert_eq!(
            t.pins().labels().collect::<Vec<_>>(),
            ["untracked_settings"]
        );
        let mut t = SessionTracker::default();
        t.observe_client(
            &query("select set_config('app.' || $x$t$x$, 'v', false)"),
            now(),
        );
        assert!(t.pins().contains(Pins::UNTRACKED_SETTINGS));
        let mut t = SessionTracker::default();
        t.observe_client(&query("select setseed(0.5)"), now());
        assert!(t.pins().contains(Pins::RANDOM_SEED));
    }

    #[test]
    fn bad_length_breaks_tracking_for_good() {
        let mut t = SessionTracker::default();
        t.observe_client(&[b'Q', 0, 0, 0, 2], now());
        assert!(t.pins().contains(Pins::BROKEN));
        assert!(!t.at_safe_point());
    }

    #[test]
    fn truncated_names_pin() {
        let mut t = SessionTracker::default();
        let long = "n".repeat(1100);
        t.observe_client(&[parse(&long), sync()].concat(), now());
        t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        assert!(t.pins().contains(Pins::UNTRACKED_STATEMENTS));
    }

    #[test]
    fn statement_limit_pins() {
        let mut t = SessionTracker::new(TrackerLimits {
            max_statements: 2,
            ..TrackerLimits::default()
        });
        for n in ["a", "b", "c"] {
            t.observe_client(&[parse(n), sync()].concat(), now());
            t.observe_backend(&[msg(b'1', &[]), ready(b'I')].concat(), now());
        }
        assert_eq!(t.statement_count(), 2);
        assert!(!t.at_safe_point());
    }

    /// One round of a client that prepares and closes statements; the backend refuses a Parse
    /// of a name that exists (as Postgres does) and everything after it until Sync.
    #[derive(Clone, Debug)]
    enum Step {
        Parse(u8),
        Close(u8),
        Sync,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..4).prop_map(Step::Parse),
            (0u8..4).prop_map(Step::Close),
            Just(Step::Sync),
        ]
    }

    /// The client and backend byte streams for `steps`, and the statements that exist after.
    fn play(steps: &[Step]) -> (Vec<u8>, Vec<u8>, BTreeSet<String>) {
        let (mut c, mut b) = (Vec::new(), Vec::new());
        let mut model = BTreeSet::new();
        let mut failed = false;
        let mut steps = steps.to_vec();
        steps.push(Step::Sync);
        for s in steps {
            match s {
                Step::Parse(n) => {
                    let name = format!("s{n}");
                    c.extend(parse(&name));
                    if failed {
                        continue;
                    }
                    if model.contains(&name) {
                        b.extend(error());
                        failed = true;
                    } else {
                        model.insert(name);
                        b.extend(msg(b'1', &[]));
                    }
                }
                Step::Close(n) => {
                    let name = format!("s{n}");
                    c.extend(close(&name));
                    if !failed {
                        model.remove(&name);
                        b.extend(msg(b'3', &[]));
                    }
                }
                Step::Sync => {
                    c.extend(sync());
                    b.extend(ready(b'I'));
                    failed = false;
                }
            }
        }
        (c, b, model)
    }

    /// What a client of either protocol may do, as drivers do it (psycopg pipelines, pgjdbc's
    /// extended protocol, psql's simple queries, COPY, function calls).
    #[derive(Clone, Debug)]
    enum Act {
        /// Parse of statement `s{n}`, or of the unnamed statement for `n == 4`.
        Parse(u8),
        Bind,
        DescribeStatement(u8),
        DescribePortal,
        Execute {
            fail: bool,
        },
        CloseStatement(u8),
        ClosePortal,
        Sync,
        Flush,
        Query(SimpleQuery),
        FunctionCall,
        CopyIn {
            fail: bool,
        },
    }

    #[derive(Clone, Debug)]
    enum SimpleQuery {
        Rows,
        Fails,
        Empty,
        Prepare(u8),
        Deallocate(u8),
    }

    fn act() -> impl Strategy<Value = Act> {
        let query = prop_oneof![
            Just(SimpleQuery::Rows),
            Just(SimpleQuery::Fails),
            Just(SimpleQuery::Empty),
            (0u8..4).prop_map(SimpleQuery::Prepare),
            (0u8..4).prop_map(SimpleQuery::Deallocate),
        ];
        prop_oneof![
            (0u8..5).prop_map(Act::Parse),
            Just(Act::Bind),
            (0u8..4).prop_map(Act::DescribeStatement),
            Just(Act::DescribePortal),
            any::<bool>().prop_map(|fail| Act::Execute { fail }),
            (0u8..4).prop_map(Act::CloseStatement),
            Just(Act::ClosePortal),
            Just(Act::Sync),
            Just(Act::Flush),
            query.prop_map(Act::Query),
            Just(Act::FunctionCall),
            any::<bool>().prop_map(|fail| Act::CopyIn { fail }),
        ]
    }

    /// A model of the backend answering `acts` as Postgres does: a Parse of an existing name or
    /// a Describe of a missing one fails, an error skips the batch up to its Sync, Flush gets no
    /// answer. Before going back to the simple protocol the client syncs an open batch, as
    /// drivers do. Returns both byte streams, the statements that exist after, and whether the
    /// session ends settled (nothing sent that is still unanswered or unsynced).
    fn play_acts(acts: &[Act]) -> (Vec<u8>, Vec<u8>, BTreeSet<String>, bool) {
        let (mut c, mut b) = (Vec::new(), Vec::new());
        let mut model = BTreeSet::new();
        let (mut open, mut failed) = (false, false);
        let name = |n: u8| {
            if n == 4 {
                String::new()
            } else {
                format!("s{n}")
            }
        };
        for a in acts {
            let simple = matches!(a, Act::Query(_) | Act::FunctionCall | Act::CopyIn { .. });
            if simple && open {
                c.extend(sync());
                b.extend(ready(b'I'));
                (open, failed) = (false, false);
            }
            match a {
                Act::Parse(n) => {
                    let name = name(*n);
                    c.extend(parse(&name));
                    open = true;
                    if failed {
                        continue;
                    }
                    if !name.is_empty() && model.contains(&name) {
                        b.extend(error());
                        failed = true;
                    } else {
                        if !name.is_empty() {
                            model.insert(name);
                        }
                        b.extend(msg(b'1', &[]));
                    }
                }
                Act::Bind => {
                    c.extend(msg(b'B', &[0, 0, 0, 0, 0, 0, 0, 0]));
                    open = true;
                    if !failed {
                        b.extend(msg(b'2', &[]));
                    }
                }
                Act::DescribeStatement(n) => {
                    let name = name(*n);
                    c.extend(msg(b'D', &[&[b'S'][..], &cstr(&name)].concat()));
                    open = true;
                    if failed {
                        continue;
                    }
                    if model.contains(&name) {
                        b.extend([msg(b't', &[0, 0]), msg(b'n', &[])].concat());
                    } else {
                        b.extend(error());
                        failed = true;
                    }
                }
                Act::DescribePortal => {
                    c.extend(msg(b'D', &[b'P', 0]));
                    open = true;
                    if !failed {
                        b.extend(msg(b'n', &[]));
                    }
                }
                Act::Execute { fail } => {
                    c.extend(msg(b'E', &[0, 0, 0, 0, 0]));
                    open = true;
                    if failed {
                        continue;
                    }
                    if *fail {
                        b.extend(error());
                        failed = true;
                    } else {
                        b.extend(complete("SELECT 1"));
                    }
                }
                Act::CloseStatement(n) => {
                    let name = name(*n);
                    c.extend(close(&name));
                    open = true;
                    if !failed {
                        model.remove(&name);
                        b.extend(msg(b'3', &[]));
                    }
                }
                Act::ClosePortal => {
                    c.extend(msg(b'C', &[b'P', 0]));
                    open = true;
                    if !failed {
                        b.extend(msg(b'3', &[]));
                    }
                }
                Act::Sync => {
                    c.extend(sync());
                    b.extend(ready(b'I'));
                    (open, failed) = (false, false);
                }
                Act::Flush => c.extend(msg(b'H', &[])),
                Act::Query(q) => {
                    let (sql, answer) = match q {
                        SimpleQuery::Rows => ("select 1".to_owned(), complete("SELECT 1")),
                        SimpleQuery::Fails => ("select nope".to_owned(), error()),
                        SimpleQuery::Empty => (String::new(), msg(b'I', &[])),
                        SimpleQuery::Prepare(n) => {
                            let name = name(*n);
                            let answer = if model.insert(name.clone()) {
                                complete("PREPARE")
                            } else {
                                error()
                            };
                            (format!("prepare {name} as select 1"), answer)
                        }
                        SimpleQuery::Deallocate(n) => {
                            let name = name(*n);
                            let answer = if model.remove(&name) {
                                complete("DEALLOCATE")
                            } else {
                                error()
                            };
                            (format!("deallocate {name}"), answer)
                        }
                    };
                    c.extend(query(&sql));
                    b.extend([answer, ready(b'I')].concat());
                }
                Act::FunctionCall => {
                    c.extend(msg(b'F', &[0, 0, 0, 1]));
                    b.extend([msg(b'V', &[255, 255, 255, 255]), ready(b'I')].concat());
                }
                Act::CopyIn { fail } => {
                    c.extend(query("copy t from stdin"));
                    b.extend(msg(b'G', &[0, 0, 0]));
                    c.extend(msg(b'd', b"1\n"));
                    if *fail {
                        c.extend(msg(b'f', &cstr("client gave up")));
                        b.extend([error(), ready(b'I')].concat());
                    } else {
                        c.extend(msg(b'c', &[]));
                        b.extend([complete("COPY 1"), ready(b'I')].concat());
                    }
                }
            }
        }
        (c, b, model, !open)
    }

    #[test]
    fn flush_after_sync_leaves_the_session_at_rest() {
        // psycopg's pipeline(): Parse/Bind/Describe/Execute, Sync, then Flush.
        let mut t = SessionTracker::default();
        let (c, b, _, settled) = play_acts(&[
            Act::Parse(4),
            Act::Bind,
            Act::DescribePortal,
            Act::Execute { fail: false },
            Act::Sync,
            Act::Flush,
        ]);
        assert!(settled);
        t.observe_client(&c, now());
        t.observe_backend(&b, now());
        assert!(t.at_safe_point());
        // An empty pipeline block sends only Flush.
        let mut t = SessionTracker::default();
        t.observe_client(&msg(b'H', &[]), now());
        assert!(t.at_safe_point());
        t.observe_client(&query("select 1"), now());
        t.observe_backend(&[complete("SELECT 1"), ready(b'I')].concat(), now());
        assert!(t.at_safe_point());
    }

    #[test]
    fn a_batch_without_its_sync_is_in_flight_even_after_flush() {
        let mut t = SessionTracker::default();
        let (c, b, _, settled) = play_acts(&[Act::Parse(0), Act::Flush]);
        assert!(!settled);
        t.observe_client(&c, now());
        t.observe_backend(&b, now());
        assert!(t.in_flight());
        assert!(!t.at_rest());
    }

    /// A tracker fed all client bytes first (pipelining), then the backend's, each split once
    /// at `cut`.
    fn pipelined(c: &[u8], b: &[u8], cut: prop::sample::Index) -> SessionTracker {
        let mut t = SessionTracker::default();
        let at = cut.index(c.len() + 1);
        t.observe_client(&c[..at], now());
        t.observe_client(&c[at..], now());
        let at = cut.index(b.len() + 1);
        t.observe_backend(&b[..at], now());
        t.observe_backend(&b[at..], now());
        t
    }

    proptest! {
        #[test]
        fn statements_match_the_server(steps in prop::collection::vec(step(), 0..40),
                                       cut in any::<prop::sample::Index>()) {
            let (c, b, model) = play(&steps);
            let t = pipelined(&c, &b, cut);
            let seen: BTreeSet<String> = t.statements().map(str::to_owned).collect();
            prop_assert_eq!(seen, model);
            prop_assert!(t.at_safe_point());
        }

        #[test]
        fn chunking_does_not_matter(steps in prop::collection::vec(step(), 0..20),
                                    sizes in prop::collection::vec(1usize..9, 1..8)) {
            let (c, b, _) = play(&steps);
            let mut whole = SessionTracker::default();
            whole.observe_client(&c, now());
            whole.observe_backend(&b, now());
            let mut pieces = SessionTracker::default();
            let mut i = 0;
            for (k, chunk) in c.chunks(sizes[0]).enumerate() {
                pieces.observe_client(chunk, now());
                i = k;
            }
            for chunk in b.chunks(sizes[i % sizes.len()]) {
                pieces.observe_backend(chunk, now());
            }
            prop_assert_eq!(whole.statements().collect::<Vec<_>>(),
                            pieces.statements().collect::<Vec<_>>());
            prop_assert_eq!(whole.at_safe_point(), pieces.at_safe_point());
        }

        /// Whatever a client sends, once every request is answered and the last ReadyForQuery
        /// says idle, the session is at a safe point holding exactly the server's statements;
        /// while a batch waits for its Sync it is not.
        #[test]
        fn any_settled_sequence_is_at_a_safe_point(acts in prop::collection::vec(act(), 0..40),
                                                   cut in any::<prop::sample::Index>()) {
            let (c, b, model, settled) = play_acts(&acts);
            let t = pipelined(&c, &b, cut);
            prop_assert_eq!(t.at_safe_point(), settled, "client {:?}", acts);
            if settled {
                let seen: BTreeSet<String> = t.statements().map(str::to_owned).collect();
                prop_assert_eq!(seen, model);
            }
        }

        /// Fuzzing by property: arbitrary bytes, arbitrarily split, in both directions, never
        /// panic, and the state stays queryable.
        #[test]
        fn arbitrary_bytes_never_panic(chunks in prop::collection::vec(
                (any::<bool>(), prop::collection::vec(any::<u8>(), 0..300)), 0..30)) {
            let mut t = SessionTracker::new(TrackerLimits {
                max_statements: 3,
                ..TrackerLimits::default()
            });
            for (from_client, bytes) in &chunks {
                if *from_client {
                    t.observe_client(bytes, now());
                } else {
                    t.observe_backend(bytes, now());
                }
                let _ = (t.at_safe_point(), t.pins().describe(), t.statement_count());
            }
        }

        /// The same with byte streams made of well-formed headers around random bodies, which
        /// reach the message handlers far more often than raw noise.
        #[test]
        fn framed_noise_never_panics(msgs in prop::collection::vec(
                (any::<bool>(), prop::sample::select(b"PQCSXZ13EGHWAdcfBDE".to_vec()),
                 prop::collection::vec(any::<u8>(), 0..80)), 0..60)) {
            let mut t = SessionTracker::new(TrackerLimits {
                max_statements: 3,
                ..TrackerLimits::default()
            });
            for (from_client, tag, body) in &msgs {
                let m = msg(*tag, body);
                if *from_client {
                    t.observe_client(&m, now());
                } else {
                    t.observe_backend(&m, now());
                }
            }
            let _ = (t.at_safe_point(), t.in_flight(), t.statements().count());
        }
    }
}
