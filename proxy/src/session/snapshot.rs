//! Recording a session's state on its backend with plain SQL, and restoring it on a new backend
//! connection: session-level settings first (a `search_path` change alters what a statement
//! means), then session authorization and role, then prepared statements, the unnamed one last.
//!
//! Restoring runs only statements the gateway composed, and a `PREPARE` a client sent inside a
//! longer text is made again from that one statement, through the extended protocol, where the
//! server refuses more than one command. A piece that cannot be restored (a statement whose
//! table was dropped, one whose rows no longer look as the client was told) is left out, so it
//! fails where it is used, not at the revival; only session authorization and role, which
//! decide what the session may do, end it when they cannot be restored.
//!
//! Not carried over, by design: notifications (LISTEN pins a session instead, as does sequence
//! state, `currval` and `lastval`, where something could read it), the unnamed portal (it ends with its transaction), an
//! unnamed statement whose Parse was too long for the tracker to keep, and anything a session
//! keeps in extension-private memory. Prepared statements are re-parsed with their recorded parameter
//! type OIDs, which hold on the same cluster (a tenant's database after a sleep or restart).

use std::sync::Arc;
use std::time::Duration;

use pgwake_protocol::frontend::{self, ErrorFields};
use pgwake_protocol::sql_text::{PrepareSource, prepare_source};
use pgwake_protocol::stale::{Remake, StaleAnswer, StaleStatement};
use pgwake_protocol::tracker::{CONTEXT_SETTINGS, PrepareContext};
use pgwake_protocol::{Pins, SessionTracker};
use tokio::io::AsyncWriteExt;
use tokio::time::{Instant, timeout_at};
use tracing::{debug, info};

use crate::stream::Stream;
use crate::wire::{RawMessage, read_message};

/// One query reads everything a revival needs and the pins the protocol cannot show: each row
/// is (kind, name, value, extra), all text. Every relation, function and type is named with
/// its schema, so nothing on the session's `search_path` (a view `shadow.pg_locks` before
/// `pg_catalog`) stands in for the catalog's. Temporary objects of every kind count, not only
/// relations. The unnamed portal this query runs in shows in `pg_cursors`; a client's own
/// cursor that outlives its transaction has a name.
const SNAPSHOT_SQL: &str = "\
SELECT 's', name, pg_catalog.current_setting(name), NULL FROM pg_catalog.pg_settings \
 WHERE source IN ('session', 'database', 'user', 'database user') AND name NOT IN \
 ('transaction_isolation', 'transaction_read_only', 'transaction_deferrable') \
UNION ALL SELECT 'a', 'session_authorization', pg_catalog.current_setting('session_authorization'), NULL \
UNION ALL SELECT 'r', 'role', pg_catalog.current_setting('role'), NULL \
UNION ALL SELECT 'p', name, statement, parameter_types::pg_catalog.oid[]::pg_catalog.text || from_sql::pg_catalog.text \
 FROM pg_catalog.pg_prepared_statements WHERE name <> '\u{7f}pgwake snapshot' \
UNION ALL SELECT 'x', 'temp', (pg_catalog.pg_my_temp_schema() <> 0 AND ( \
 EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_proc WHERE pronamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_type WHERE typnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_operator WHERE oprnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_collation WHERE collnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_conversion WHERE connamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_opclass WHERE opcnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_opfamily WHERE opfnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_ts_config WHERE cfgnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_ts_dict WHERE dictnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_ts_parser WHERE prsnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_ts_template WHERE tmplnamespace = pg_catalog.pg_my_temp_schema()) \
 OR EXISTS (SELECT FROM pg_catalog.pg_statistic_ext WHERE stxnamespace = pg_catalog.pg_my_temp_schema())))::pg_catalog.text, NULL \
UNION ALL SELECT 't', 'temp_schema', (pg_catalog.pg_my_temp_schema() <> 0)::pg_catalog.text, NULL \
UNION ALL SELECT 'x', 'advisory', (EXISTS (SELECT FROM pg_catalog.pg_locks \
 WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()))::pg_catalog.text, NULL \
UNION ALL SELECT 'x', 'listen', (EXISTS (SELECT FROM pg_catalog.pg_listening_channels()))::pg_catalog.text, NULL \
UNION ALL SELECT 'x', 'cursor', (EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE name <> ''))::pg_catalog.text, NULL \
UNION ALL SELECT 'e', 'client_encoding', pg_catalog.current_setting('client_encoding'), NULL";

/// Wraps the snapshot's rows (kind, name, value, extra) so that names and values travel as
/// UTF-8 bytes, spelt in hex digits, whatever the session's `client_encoding`: read as text in
/// a LATIN1 session they would come back changed (`ßchema` as `ï¿½chema`).
fn as_utf8_bytes(rows_sql: &str) -> String {
    format!(
        "SELECT k, pg_catalog.encode(pg_catalog.convert_to(n, 'UTF8'), 'hex'), \
         pg_catalog.encode(pg_catalog.convert_to(v, 'UTF8'), 'hex'), e \
         FROM ({rows_sql}) AS u(k, n, v, e)"
    )
}

/// The text that hex digits spell, taken as the UTF-8 it was converted to.
fn from_hex_utf8(digits: &[u8]) -> String {
    let bytes: Vec<u8> = digits
        .chunks_exact(2)
        .filter_map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect();
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Text as a bytea literal in hex (`\x…`): plain ASCII, so it reaches the server unchanged
/// whatever the connection's `client_encoding`.
fn hex_bytes(text: &str) -> String {
    let mut hex = String::with_capacity(2 + text.len() * 2);
    hex.push_str("\\x");
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in text.bytes() {
        hex.push(char::from(DIGITS[usize::from(b >> 4)]));
        hex.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    hex
}

/// Whether the session holds sequence state, asked without an error in the server's log: a
/// block raises a notice the snapshot reads (with the notice level set for this block alone,
/// whatever the session's, and `pg_catalog` alone on the search path, so no object of the
/// session's can stand in for a catalog's). `{readers}` is replaced by [`READERS_SQL`] or
/// nothing.
///
/// `lastval()` answers when the session drew from a sequence; it fails with 55000 when the
/// session never did, and also when the last sequence drawn was dropped since, while an
/// earlier one's `currval` still answers: so on 55000 each sequence's `currval` is tried. Any
/// other failure (no privilege on the sequence under `SET ROLE`) proves nothing, so it counts
/// as state: the session could `RESET ROLE` and read it. Both lock the sequence they read, so
/// the block waits at most `{lock_wait}` for another session's lock (a `DROP` in a transaction
/// it keeps open): the session's client is not served while the check runs, and that other
/// session may be waiting for this one's answer. A lock that outlasts the wait proves nothing
/// either.
const SEQUENCE_STATE_SQL: &str = "DO $pgwake$DECLARE s pg_catalog.oid; f pg_catalog.text; BEGIN \
 PERFORM pg_catalog.set_config('client_min_messages', 'notice', true); \
 PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true); \
 PERFORM pg_catalog.set_config('lock_timeout', '{lock_wait}', true); \
 {readers} \
 BEGIN PERFORM pg_catalog.lastval(); RAISE NOTICE 'pgwake: sequence state'; RETURN; \
 EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; \
 WHEN OTHERS THEN RAISE NOTICE 'pgwake: sequence state'; RETURN; END; \
 FOR s IN SELECT c.oid FROM pg_catalog.pg_class AS c WHERE c.relkind = 'S' \
 AND (c.relpersistence <> 't' OR c.relnamespace = pg_catalog.pg_my_temp_schema()) LOOP \
 BEGIN PERFORM pg_catalog.currval(s::pg_catalog.regclass); \
 RAISE NOTICE 'pgwake: sequence state'; RETURN; \
 EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL; \
 WHEN OTHERS THEN RAISE NOTICE 'pgwake: sequence state'; RETURN; END; \
 END LOOP; END$pgwake$";

/// Ends the sequence check early (no state that anything could read) unless the database holds
/// code that calls `currval` or `lastval`: a function or procedure body (its text, or the parsed
/// body of a `BEGIN ATOMIC` one), a column default, a view or rule, a check constraint, a
/// policy, a trigger's `WHEN`. Parsed expressions name the functions they call by OID
/// (`:funcid`), so quoting, schema prefixes and spacing cannot hide a call. Dynamic SQL that
/// builds the name from pieces is not seen (a listed known difference).
const READERS_SQL: &str = "f := ':funcid (' || 'currval(regclass)'::regprocedure::oid \
 || '|' || 'lastval()'::regprocedure::oid || ') '; \
 IF NOT (EXISTS (SELECT FROM pg_catalog.pg_proc AS p WHERE p.oid >= 16384 \
 AND (p.prosrc ~* E'\\\\m(currval|lastval)' OR pg_catalog.to_jsonb(p) ->> 'prosqlbody' ~ f)) \
 OR EXISTS (SELECT FROM pg_catalog.pg_attrdef AS d WHERE d.adbin::text ~ f) \
 OR EXISTS (SELECT FROM pg_catalog.pg_rewrite AS r WHERE r.oid >= 16384 AND r.ev_action::text ~ f) \
 OR EXISTS (SELECT FROM pg_catalog.pg_constraint AS c WHERE c.conbin::text ~ f) \
 OR EXISTS (SELECT FROM pg_catalog.pg_policy AS y \
 WHERE y.polqual::text ~ f OR y.polwithcheck::text ~ f) \
 OR EXISTS (SELECT FROM pg_catalog.pg_trigger AS t WHERE t.tgqual::text ~ f)) THEN RETURN; END IF;";

/// What the snapshot asks about the session's sequence state (`currval`, `lastval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Nothing: the session moves whatever it drew.
    Off,
    /// Whether it drew from a sequence: then it is pinned.
    Drawn,
    /// Whether it drew from one while the database holds code that reads sequence state.
    DrawnAndReadable,
}

impl SequenceCheck {
    /// The block that asks it, if anything is asked, waiting at most `lock_wait` for a lock.
    fn sql(self, lock_wait: Duration) -> Option<String> {
        let readers = match self {
            SequenceCheck::Off => return None,
            SequenceCheck::Drawn => "",
            SequenceCheck::DrawnAndReadable => READERS_SQL,
        };
        let sql = SEQUENCE_STATE_SQL.replace("{lock_wait}", &lock_timeout(lock_wait));
        Some(sql.replace("{readers}", readers))
    }
}

/// The notice [`SEQUENCE_STATE_SQL`] raises.
const SEQUENCE_STATE_NOTICE: &str = "pgwake: sequence state";

/// Custom settings are not in `pg_settings`, so they are asked for by name: the names the
/// session's own texts used, and those the database's functions set (a function or trigger
/// that calls `set_config('app.tenant', …)` or runs `SET app.tenant`). Only the names that
/// exist in the session are recorded. `{names}` is replaced by the quoted tracked names.
const CUSTOM_SETTINGS_SQL: &str = r"
UNION ALL SELECT 's', n, pg_catalog.current_setting(n, true), NULL FROM (
 SELECT pg_catalog.lower(m[1]) AS n FROM pg_catalog.pg_proc AS p
 CROSS JOIN LATERAL pg_catalog.regexp_matches(p.prosrc,
 E'(?:set_config\\s*\\(\\s*''|\\mset\\s+(?:session\\s+|local\\s+)?)([a-z_][a-z0-9_$]*(?:\\.[a-z_][a-z0-9_$]*)+)',
 'gi') AS m
 WHERE p.pronamespace <> 'pg_catalog'::pg_catalog.regnamespace
 AND p.pronamespace <> 'information_schema'::pg_catalog.regnamespace
 UNION SELECT pg_catalog.unnest(ARRAY[{names}]::pg_catalog.text[])) AS c
 WHERE pg_catalog.current_setting(n, true) IS NOT NULL
 AND n NOT IN (SELECT name FROM pg_catalog.pg_settings)";

/// How a prepared statement's result looked to the client when the session was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Described {
    /// Rows of this shape ([`frontend::row_shape`]).
    Rows(u64),
    /// No rows.
    NoRows,
    /// Describing it failed: its table changed or went away, so using it fails already.
    Failed,
}

impl Described {
    /// The shape to remember as what the client was told (`Some(None)`: no rows), unless
    /// describing failed.
    pub fn told(self) -> Option<Option<u64>> {
        match self {
            Described::Rows(shape) => Some(Some(shape)),
            Described::NoRows => Some(None),
            Described::Failed => None,
        }
    }
}

/// The gateway's own statement while a statement made with SQL `PREPARE` is made again at its
/// first use.
const OWN_REMAKE: &str = "\u{7f}pgwake remake";

impl PreparedStatement {
    /// How its first use makes it again: a Close of its name, then its Parse (for one made with
    /// SQL, its `PREPARE` run under the gateway's own statement); and the batch that tries it
    /// while the session is at rest, under `context` (the settings it was prepared under),
    /// waiting at most `lock_wait` for a lock.
    fn remake(&self, context: Option<&PrepareContext>, lock_wait: Duration) -> Remake {
        let messages = self.remake_messages();
        let mut at_rest = Vec::with_capacity(messages.len() + 512);
        // Local to the batch's own transaction: at its Sync the session's values are back.
        frontend::parse(&mut at_rest, OWN_LOCK_WAIT, LOCK_WAIT_SQL, &[]);
        frontend::bind_text(&mut at_rest, OWN_LOCK_WAIT, &[&lock_timeout(lock_wait)]);
        frontend::execute(&mut at_rest);
        frontend::close_statement(&mut at_rest, OWN_LOCK_WAIT);
        for (name, value) in context.into_iter().flat_map(PrepareContext::settings) {
            frontend::parse(
                &mut at_rest,
                OWN_CONTEXT,
                LOCAL_SETTING_SQL,
                &[BYTEA, BYTEA],
            );
            frontend::bind_text(
                &mut at_rest,
                OWN_CONTEXT,
                &[&hex_bytes(name), &hex_bytes(value)],
            );
            frontend::execute(&mut at_rest);
            frontend::close_statement(&mut at_rest, OWN_CONTEXT);
        }
        at_rest.extend_from_slice(&messages);
        frontend::describe_statement(&mut at_rest, &self.name);
        frontend::sync(&mut at_rest);
        // A batch of its own, so that it runs whatever the first met: the client must not see
        // the gateway's statement in pg_prepared_statements.
        frontend::close_statement(&mut at_rest, OWN_REMAKE);
        frontend::sync(&mut at_rest);
        Remake {
            messages: messages.into(),
            // On a line of its own: a comment at its end must not swallow what follows.
            prepare: self.from_sql.then(|| format!("{}\n", self.text).into()),
            at_rest: at_rest.into(),
            told: self.described.told(),
        }
    }

    /// The messages that make it again in a batch of the client's (see [`Remake::messages`]).
    fn remake_messages(&self) -> Vec<u8> {
        let mut out = Vec::new();
        frontend::close_statement(&mut out, &self.name);
        if self.from_sql {
            // An earlier try whose PREPARE failed left its own statement behind (the batch
            // skipped to its Sync past the Close).
            frontend::close_statement(&mut out, OWN_REMAKE);
            frontend::parse(&mut out, OWN_REMAKE, &self.text, &[]);
            frontend::bind_text(&mut out, OWN_REMAKE, &[]);
            frontend::execute(&mut out);
            frontend::close_statement(&mut out, OWN_REMAKE);
        } else {
            frontend::parse(&mut out, &self.name, &self.text, &self.param_types);
        }
        out
    }

    /// This statement, not to be used as the new backend connection holds it.
    fn stale(&self, answer: StaleAnswer) -> StaleStatement {
        StaleStatement {
            answer,
            param_types: self.param_types.as_slice().into(),
        }
    }
}

/// A named prepared statement as `pg_prepared_statements` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedStatement {
    /// Statement name.
    pub name: String,
    /// Its text; for SQL-level statements, the `PREPARE` that made it (the client's whole
    /// text when it held nothing else, else that one statement of it).
    pub text: String,
    /// Parameter type OIDs.
    pub param_types: Vec<u32>,
    /// Made with SQL `PREPARE` rather than a protocol Parse.
    pub from_sql: bool,
    /// Its result as the client was told.
    pub described: Described,
    /// The settings it was prepared under, when they differ from the session's now.
    pub context: Option<Arc<PrepareContext>>,
}

/// The session's unnamed statement as the backend describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnnamedStatement {
    /// Its text, as the client's Parse gave it.
    pub text: String,
    /// Parameter type OIDs as the server resolved them.
    pub param_types: Vec<u32>,
    /// Its result.
    pub described: Described,
    /// The settings it was prepared under, when they differ from the session's now.
    pub context: Option<Arc<PrepareContext>>,
}

/// A session's state, recorded at a safe point.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The tracker's client message count when it was taken: any later client message may
    /// have changed the state, so the snapshot is valid only while the count is the same.
    pub at_message: u64,
    /// Settings changed with SET (`pg_settings.source = 'session'`), as `current_setting` shows
    /// them.
    pub settings: Vec<(String, String)>,
    /// `SET SESSION AUTHORIZATION` in force, when it differs from the login user.
    pub session_authorization: Option<String>,
    /// `SET ROLE` in force.
    pub role: Option<String>,
    /// Named prepared statements.
    pub statements: Vec<PreparedStatement>,
    /// The unnamed statement, when the client made it with a text short enough to keep and it
    /// still exists: a client may bind it in a later batch.
    pub unnamed: Option<UnnamedStatement>,
    /// The session's `client_encoding` (whether set by its startup or later), in which the
    /// client's statement texts are restored.
    pub client_encoding: String,
    /// The settings that decide how a statement is read ([`CONTEXT_SETTINGS`]) as they are
    /// now, whatever set them: a statement prepared under others is made again under those,
    /// then these are put back.
    pub context: Option<Arc<PrepareContext>>,
    /// The session has a temporary schema (it made a temporary object once, since dropped):
    /// `pg_my_temp_schema()` and `current_schemas(true)` show it.
    pub temp_schema: bool,
    /// Statements that could not be made again at an earlier revival and that the client has
    /// not closed, with the ErrorResponse their use answers or how their first use makes them.
    pub failed: Vec<(String, StaleStatement)>,
    /// Pins the stream and the SQL checks found.
    pub pins: Pins,
    /// Bytes of settings and statement text held.
    pub size: usize,
    /// Over a size or count limit, or a statement's rows could not be looked at (a lock held
    /// them) and were never recorded: the session stays where it is.
    pub too_large: bool,
}

impl Snapshot {
    /// Gives back the room its vectors grew by while being filled: a snapshot is kept for as
    /// long as its session stays parked, by thousands of sessions.
    fn shrink(&mut self) {
        self.settings.shrink_to_fit();
        self.statements.shrink_to_fit();
        self.failed.shrink_to_fit();
        for s in &mut self.statements {
            s.param_types.shrink_to_fit();
        }
    }

    /// A statement is recorded as the client was told it (when the gateway first described
    /// it), not as it looks now: a table changed and changed back leaves it usable, as
    /// Postgres checks each use against the statement's first shape. One stale on this
    /// connection and never described is recorded as failing to describe; one that could not
    /// be made again keeps the error its use answers. A statement a lock kept from being looked
    /// at (`locked`) and never recorded leaves how the client was told its rows look unknown:
    /// moving could not prove it, so the session stays.
    fn carry_stale(&mut self, tracker: &SessionTracker, limits: SnapshotLimits, locked: &[String]) {
        for s in self.statements.iter_mut() {
            if let Some(told) = tracker.told_shape(&s.name) {
                s.described = told.map_or(Described::NoRows, Described::Rows);
            } else if tracker.is_stale(&s.name) {
                s.described = Described::Failed;
            }
        }
        for (name, stale) in tracker.stale_statements() {
            let held = match &stale.answer {
                StaleAnswer::Failed(error) => error.len(),
                StaleAnswer::Remake(r) => r.messages.len(),
                StaleAnswer::ResultChanged => continue,
            };
            if !self.statements.iter().any(|s| s.name == name) {
                self.size += name.len() + held;
                self.failed.push((name.to_owned(), stale.clone()));
            }
        }
        if self.size > limits.max_bytes
            || locked.iter().any(|name| tracker.told_shape(name).is_none())
        {
            self.too_large = true;
        }
    }

    /// Records under which settings each statement was prepared (`now`: the values the snapshot
    /// read, in [`CONTEXT_SETTINGS`] order). A statement whose settings the gateway cannot know
    /// pins the session: made again under today's, it could read its literals or names
    /// otherwise.
    fn carry_contexts(&mut self, tracker: &SessionTracker, now: &[String], reset: &[String]) {
        let reset = PrepareContext::new(reset.iter().map(String::as_str)).map(Arc::new);
        let Some(now) = PrepareContext::new(now.iter().map(String::as_str)).map(Arc::new) else {
            if !self.statements.is_empty() || self.unnamed.is_some() {
                self.pins.insert(Pins::UNKNOWN_PREPARE_CONTEXT);
            }
            return;
        };
        tracker.note_context(&now);
        let mut unknown = false;
        let mut context_of =
            |name: Option<&str>| match tracker.prepare_context(name, &now, reset.as_ref()) {
                Some(c) if *c == *now => None,
                Some(c) => Some(c),
                None => {
                    unknown = true;
                    None
                }
            };
        for s in &mut self.statements {
            s.context = context_of(Some(&s.name));
        }
        if let Some(u) = &mut self.unnamed {
            u.context = context_of(None);
        }
        if unknown {
            self.pins.insert(Pins::UNKNOWN_PREPARE_CONTEXT);
        }
        self.context = Some(now);
    }

    /// A snapshot that marks the session as not movable (the query failed, or revival is not
    /// possible for it), so it is not retried until the client sends something.
    pub fn unmovable(at_message: u64) -> Snapshot {
        Snapshot {
            at_message,
            too_large: true,
            ..Snapshot::default()
        }
    }

    /// The session's `idle_session_timeout`, when it set one: Postgres ends the session once
    /// it has been idle that long, which a parked session's backend can no longer do.
    pub fn idle_session_timeout(&self) -> Option<Duration> {
        let (_, value) = self
            .settings
            .iter()
            .find(|(name, _)| name == "idle_session_timeout")?;
        postgres_duration(value).filter(|d| !d.is_zero())
    }

    /// True when the session may leave its backend connection.
    pub fn movable(&self) -> bool {
        self.pins.is_empty() && !self.too_large
    }

    /// Still describes the session the tracker sees.
    pub fn valid_for(&self, tracker: &SessionTracker) -> bool {
        self.at_message == tracker.client_messages()
    }
}

/// A duration as `current_setting` shows a setting in milliseconds (`0`, `500ms`, `5s`,
/// `10min`, `2h`, `1d`).
fn postgres_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits].parse().ok()?;
    let ms = match text[digits..].trim() {
        "" | "ms" => n,
        "s" => n.checked_mul(1000)?,
        "min" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        "d" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

/// Why a snapshot or restore failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing the backend failed.
    #[error("backend I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Writing to the client failed (forwarding an asynchronous message).
    #[error("client I/O: {0}")]
    ClientIo(std::io::Error),
    /// The backend answered with an error.
    #[error("{}: {}", .0.code, .0.message)]
    Backend(ErrorFields),
    /// The backend sent something unexpected.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Limits on what a snapshot may hold.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotLimits {
    /// Named prepared statements.
    pub max_statements: usize,
    /// Bytes of settings and statement text.
    pub max_bytes: usize,
    /// Largest backend message read.
    pub max_message: usize,
    /// What to ask about the session's sequence state; a session that holds some is pinned.
    pub sequences: SequenceCheck,
    /// How long looking at a prepared statement, or at the session's sequence state,
    /// waits for a lock another session holds (`revival.restore_lock_wait`).
    pub lock_wait: Duration,
}

/// The name of the gateway's own statement while it asks something of a session's backend
/// (a name no client picks: it starts with DEL).
const OWN_STATEMENT: &str = "\u{7f}pgwake snapshot";

/// Runs `sql` as the gateway's own named statement rather than a simple Query, which would
/// destroy the session's unnamed statement, and closes it in a batch of its own, so it never
/// outlives the question even when `sql` fails. Answers in two batches.
fn ask(out: &mut Vec<u8>, sql: &str) {
    frontend::parse(out, OWN_STATEMENT, sql, &[]);
    frontend::bind_text(out, OWN_STATEMENT, &[]);
    frontend::execute(out);
    frontend::sync(out);
    frontend::close_statement(out, OWN_STATEMENT);
    frontend::sync(out);
}

/// Records the session's state on its backend (at a safe point). Asynchronous messages the
/// backend sends meanwhile (notices, parameter changes) go on to the client.
pub async fn take_snapshot(
    backend: &mut Stream,
    client: &mut Stream,
    tracker: &SessionTracker,
    login_user: &str,
    limits: SnapshotLimits,
    wait: Duration,
) -> Result<Snapshot, StateError> {
    let deadline = Instant::now() + wait;
    let mut sql = SNAPSHOT_SQL.to_owned();
    // The tracker accepts only identifier characters and dots in a name, so quoting is plain.
    let tracked: Vec<String> = tracker
        .custom_settings()
        .filter(|n| !n.contains('\''))
        .map(|n| format!("'{n}'"))
        .collect();
    sql.push_str(&CUSTOM_SETTINGS_SQL.replace("{names}", &tracked.join(",")));
    sql.push_str(&context_sql());
    let sql = as_utf8_bytes(&sql);
    let sequence_sql = limits.sequences.sql(limits.lock_wait);
    let mut out =
        Vec::with_capacity(sql.len() + sequence_sql.as_ref().map_or(0, String::len) + 512);
    ask(&mut out, &sql);
    if let Some(sequence_sql) = &sequence_sql {
        ask(&mut out, sequence_sql);
    }
    backend.write_all(&out).await?;
    backend.flush().await?;
    // The statement list comes from pg_prepared_statements, so the tracker losing count of
    // statements (a multi-statement PREPARE, a cut-off name) does not pin the session here.
    let mut pins = tracker.pins();
    pins.remove(Pins::UNTRACKED_STATEMENTS);
    let mut snap = Snapshot {
        at_message: tracker.client_messages(),
        pins,
        ..Snapshot::default()
    };
    let mut failure = None;
    let mut context = vec![String::new(); CONTEXT_SETTINGS.len()];
    let mut reset = vec![String::new(); CONTEXT_SETTINGS.len()];
    // Every answer is read, whatever the first one was, so none of it reaches the client.
    let batches = if sequence_sql.is_some() { 4 } else { 2 };
    let mut answered = 0;
    while answered < batches {
        let msg = next_message(backend, limits.max_message, deadline, wait).await?;
        let sequence_check = answered >= 2;
        match msg.tag() {
            b'D' if !sequence_check => {
                let values = (&mut context[..], &mut reset[..]);
                absorb_row(&mut snap, values, msg.body(), (login_user, limits))?
            }
            b'N' if sequence_check
                && frontend::error_fields(msg.body()).message == SEQUENCE_STATE_NOTICE =>
            {
                snap.pins.insert(Pins::SEQUENCE_STATE);
            }
            b'E' if !sequence_check => failure = Some(frontend::error_fields(msg.body())),
            b'E' => {
                let e = frontend::error_fields(msg.body());
                debug!(code = %e.code, "the sequence state check failed");
            }
            b'Z' => answered += 1,
            b'N' | b'A' | b'S' => client
                .write_all(&msg.bytes)
                .await
                .map_err(StateError::ClientIo)?,
            b'1' | b'2' | b'3' | b'C' => {}
            other => {
                return Err(StateError::Protocol(format!(
                    "message type {:?} during the snapshot",
                    other as char
                )));
            }
        }
    }
    if let Some(e) = failure {
        return Err(StateError::Backend(e));
    }
    let unnamed = tracker.unnamed_text();
    let locked = describe_statements(
        backend,
        client,
        &mut snap,
        unnamed,
        limits,
        (deadline, wait),
    )
    .await?;
    snap.carry_stale(tracker, limits, &locked);
    snap.carry_contexts(tracker, &context, &reset);
    snap.shrink();
    Ok(snap)
}

/// Takes in one row of the snapshot query (kind, name, value, extra); the values of the
/// settings that decide how a statement is read go to `context`, their login values to `reset`.
fn absorb_row(
    snap: &mut Snapshot,
    (context, reset): (&mut [String], &mut [String]),
    body: &[u8],
    (login_user, limits): (&str, SnapshotLimits),
) -> Result<(), StateError> {
    let row = frontend::data_row(body)
        .filter(|r| r.len() == 4)
        .ok_or_else(|| StateError::Protocol("malformed row".into()))?;
    let text = |i: usize| {
        row[i]
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let bytes = |i: usize| row[i].map(from_hex_utf8).unwrap_or_default();
    let kind = text(0);
    if kind == "c" || kind == "c0" {
        let name = bytes(1);
        if let Some(i) = CONTEXT_SETTINGS.iter().position(|n| *n == name) {
            let value = match (kind.as_str(), name.as_str()) {
                // The login's identity: not a setting pg_settings lists.
                ("c0", "session_authorization") => login_user.to_owned(),
                _ => bytes(2),
            };
            if kind == "c" {
                context[i] = value;
            } else {
                reset[i] = value;
            }
        }
        return Ok(());
    }
    snap.absorb(&kind, bytes(1), bytes(2), &text(3), login_user, limits);
    Ok(())
}

/// The snapshot's rows for the settings that decide how a statement is read, as they are now
/// (`c`) and as the login left them (`c0`: `pg_settings.reset_val`; `role` resets to `none`).
fn context_sql() -> String {
    let names: Vec<String> = CONTEXT_SETTINGS.iter().map(|n| format!("'{n}'")).collect();
    format!(
        " UNION ALL SELECT 'c', n, pg_catalog.current_setting(n), NULL \
         FROM pg_catalog.unnest(ARRAY[{0}]::pg_catalog.text[]) AS c(n) \
         UNION ALL SELECT 'c0', n, COALESCE((SELECT s.reset_val FROM pg_catalog.pg_settings s \
         WHERE pg_catalog.lower(s.name) = n), CASE n WHEN 'role' THEN 'none' END), NULL \
         FROM pg_catalog.unnest(ARRAY[{0}]::pg_catalog.text[]) AS c0(n)",
        names.join(",")
    )
}

/// The backend's next message, read whole before `deadline` (`wait` is the time it was given,
/// for the error).
async fn next_message(
    backend: &mut Stream,
    max_message: usize,
    deadline: Instant,
    wait: Duration,
) -> Result<RawMessage, StateError> {
    timeout_at(deadline, read_message(backend, max_message))
        .await
        .map_err(|_| StateError::Timeout(wait))??
        .ok_or_else(|| StateError::Protocol("message length out of range".into()))
}

/// The statement that shortens the lock wait for the rest of its transaction (one batch up to
/// its Sync); its parameter is the wait.
const LOCK_WAIT_SQL: &str = "SELECT pg_catalog.set_config('lock_timeout', $1, true)";

/// Sets a setting (name and value as UTF-8 bytes) for the current transaction alone.
const LOCAL_SETTING_SQL: &str = "SELECT pg_catalog.set_config(pg_catalog.convert_from($1, 'UTF8'), \
     pg_catalog.convert_from($2, 'UTF8'), true)";

/// The gateway's own statement that shortens the lock wait while the snapshot looks at the
/// session's statements (the unnamed one is the session's).
const OWN_LOCK_WAIT: &str = "\u{7f}pgwake lock wait";

/// `lock_timeout` as Postgres reads it (whole milliseconds, at least 1: 0 means no limit).
fn lock_timeout(wait: Duration) -> String {
    format!("{}ms", wait.as_millis().max(1))
}

/// True for an error that passes: a lock, a deadlock, a cancel, a serialization failure, a
/// shortage of resources. A statement that meets one now may well be made a moment later.
fn transient(code: &str) -> bool {
    code == "55P03" || code == "57014" || code.starts_with("40") || code.starts_with("53")
}

/// One question of [`describe_statements`].
#[derive(Clone, Copy)]
enum Ask {
    Statement(usize),
    Unnamed,
    /// Closing the gateway's own statement.
    Done,
}

/// Records how each protocol-level statement's result looks now, as the client was told when
/// it prepared it (or, if it changed since, fails to describe, as its next use would fail), and
/// whether the unnamed statement whose text the tracker kept (`unnamed`) still exists. Each
/// look waits at most `limits.lock_wait` for a lock (Postgres locks what a statement names to
/// describe it); the names of the statements a lock kept from being looked at are returned.
async fn describe_statements(
    backend: &mut Stream,
    client: &mut Stream,
    snap: &mut Snapshot,
    unnamed: Option<&str>,
    limits: SnapshotLimits,
    (deadline, wait): (Instant, Duration),
) -> Result<Vec<String>, StateError> {
    let mut asked: Vec<Ask> = (0..snap.statements.len()).map(Ask::Statement).collect();
    if unnamed.is_some() {
        asked.push(Ask::Unnamed);
    }
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    asked.push(Ask::Done);
    let lock_wait = lock_timeout(limits.lock_wait);
    let mut out = Vec::new();
    frontend::parse(&mut out, OWN_LOCK_WAIT, LOCK_WAIT_SQL, &[]);
    for ask in &asked {
        let name = match ask {
            Ask::Statement(i) => snap.statements[*i].name.as_str(),
            Ask::Unnamed => "",
            Ask::Done => {
                frontend::close_statement(&mut out, OWN_LOCK_WAIT);
                frontend::sync(&mut out);
                continue;
            }
        };
        frontend::bind_text(&mut out, OWN_LOCK_WAIT, &[&lock_wait]);
        frontend::execute(&mut out);
        frontend::describe_statement(&mut out, name);
        frontend::sync(&mut out);
    }
    backend.write_all(&out).await?;
    backend.flush().await?;
    let mut answers = asked.into_iter();
    let mut current = answers.next();
    let mut described = Described::Failed;
    let mut exists = false;
    let mut param_types = Vec::new();
    let mut locked = Vec::new();
    let mut lock_error = false;
    while let Some(asked) = current {
        let msg = next_message(backend, limits.max_message, deadline, wait).await?;
        match msg.tag() {
            b't' => {
                exists = true;
                param_types = frontend::parameter_types(msg.body()).unwrap_or_default();
            }
            b'T' => {
                described =
                    frontend::row_shape(msg.body()).map_or(Described::Failed, Described::Rows)
            }
            b'n' => described = Described::NoRows,
            b'E' => {
                exists = false;
                described = Described::Failed;
                lock_error = transient(&frontend::error_fields(msg.body()).code);
            }
            b'Z' => {
                let described = std::mem::replace(&mut described, Described::Failed);
                match (asked, unnamed) {
                    (Ask::Statement(i), _) => {
                        if std::mem::take(&mut lock_error) {
                            locked.push(snap.statements[i].name.clone());
                        }
                        snap.statements[i].described = described;
                    }
                    (Ask::Unnamed, _) if lock_error => locked.push(String::new()),
                    (Ask::Unnamed, Some(text)) if exists && described != Described::Failed => {
                        snap.size += text.len();
                        snap.unnamed = Some(UnnamedStatement {
                            text: text.to_owned(),
                            param_types: std::mem::take(&mut param_types),
                            described,
                            context: None,
                        });
                    }
                    _ => {}
                }
                lock_error = false;
                exists = false;
                current = answers.next();
            }
            b'N' | b'A' | b'S' => client
                .write_all(&msg.bytes)
                .await
                .map_err(StateError::ClientIo)?,
            _ => {}
        }
    }
    Ok(locked)
}

impl Snapshot {
    fn absorb(
        &mut self,
        kind: &str,
        name: String,
        value: String,
        extra: &str,
        login_user: &str,
        limits: SnapshotLimits,
    ) {
        self.size += name.len() + value.len();
        match kind {
            "s" => self.settings.push((name, value)),
            "a" if value != login_user => self.session_authorization = Some(value),
            "r" if value != "none" => self.role = Some(value),
            "t" => self.temp_schema = value == "true",
            "e" => self.client_encoding = value,
            "p" => {
                // `{23,25}true`: the type array, then from_sql.
                let (types, from_sql) = match extra.rfind('}') {
                    Some(i) => (&extra[..=i], &extra[i + 1..]),
                    None => (extra, "false"),
                };
                let param_types = types
                    .trim_matches(|c| c == '{' || c == '}')
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .filter_map(|t| t.parse().ok())
                    .collect();
                let from_sql = from_sql == "true";
                let text = if from_sql {
                    match prepare_source(&value, &name) {
                        PrepareSource::Whole => value,
                        PrepareSource::Part(statement) => statement.to_owned(),
                        PrepareSource::Unknown => {
                            self.pins.insert(Pins::UNATTRIBUTED_PREPARE);
                            value
                        }
                    }
                } else {
                    value
                };
                self.statements.push(PreparedStatement {
                    name,
                    text,
                    param_types,
                    from_sql,
                    // Until the Describe that follows says how it looks.
                    described: Described::Failed,
                    context: None,
                });
            }
            "x" if value == "true" => self.pins.insert(match name.as_str() {
                "temp" => Pins::TEMP_OBJECTS,
                "advisory" => Pins::ADVISORY_LOCK,
                "listen" => Pins::LISTEN,
                _ => Pins::HELD_CURSOR,
            }),
            _ => {}
        }
        if self.statements.len() > limits.max_statements || self.size > limits.max_bytes {
            self.too_large = true;
        }
    }
}

/// Gives a new backend connection a temporary schema, as the session had one: a temporary
/// table made and dropped at once.
const TEMP_SCHEMA_SQL: &str = "DO $pgwake$BEGIN IF pg_catalog.pg_my_temp_schema() = 0 THEN \
 CREATE TEMP TABLE \"\u{7f}pgwake temp schema\" (); DROP TABLE pg_temp.\"\u{7f}pgwake temp schema\"; \
 END IF; END$pgwake$";

/// What one pipelined step of a restore is for, so its answer can be judged.
#[derive(Clone, Copy, Debug)]
enum Step<'a> {
    /// A setting: left out when the server refuses it (it fails where it is used).
    Setting(&'a str),
    /// The temporary schema: left out when the server refuses it.
    TempSchema,
    /// Session authorization or role: the session ends when it cannot be restored, as it
    /// would otherwise run with other privileges than it had.
    Identity(&'a str),
    /// One of the settings a group of statements was prepared under, set before they are made
    /// again (`true` for the first of the group): when it is refused, those statements fail at
    /// their use with its error, as made under today's settings they could mean otherwise.
    Context(&'a str, bool),
    /// A prepared statement, made again and described.
    Statement(&'a PreparedStatement),
    /// The unnamed statement, made again and described.
    Unnamed(&'a UnnamedStatement),
    /// Closing the unnamed statement the restore itself (or an earlier user of a kept
    /// connection) left, as the session had none to carry.
    NoUnnamed,
    /// A statement an earlier revival left to be made at its first use, tried again as at rest
    /// ([`Remake::at_rest`]), then the clean-up batch after it.
    Carried(&'a str, &'a StaleStatement, &'a Remake),
    CarriedCleanup,
}

/// The outcome of a restore: which statements the new backend connection holds.
#[derive(Debug, Default)]
pub struct Restored {
    /// Names of the prepared statements made again.
    pub statements: Vec<String>,
    /// Statements the client must not use as the new backend connection holds them, with what
    /// their use answers: those whose rows are described differently from what the client was
    /// told fail with `0A000`, as Postgres fails a cached statement whose result changed; those
    /// that could not be made again fail with the error their Parse met, as Postgres fails a
    /// statement whose table went away when it next uses it.
    pub stale: Vec<(String, StaleStatement)>,
    /// Pieces left out (settings refused, statements that no longer parse): each fails where
    /// it is used.
    pub left_out: usize,
    /// The session's unnamed statement was made again, as the client was told it.
    pub unnamed: bool,
}

/// The type OID of `bytea`.
const BYTEA: u32 = 17;

/// The pipelined requests that restore `snap`, and what each Sync's answer is for. Each
/// statement is made waiting at most `lock_wait` for a lock.
fn restore_requests(snap: &Snapshot, lock_wait: Duration) -> (Vec<u8>, Vec<Step<'_>>) {
    let lock_wait = lock_timeout(lock_wait);
    let shorten_lock_wait = |out: &mut Vec<u8>| {
        frontend::parse(out, "", LOCK_WAIT_SQL, &[]);
        frontend::bind_text(out, "", &[&lock_wait]);
        frontend::execute(out);
    };
    let mut out = Vec::with_capacity(256 + snap.size * 2);
    let mut steps = Vec::new();
    // Names and values travel as UTF-8 bytes, whatever the connection's client_encoding, and
    // the function is the catalog's whatever search_path the settings restored so far hold.
    let assign = |out: &mut Vec<u8>, name: &str, value: &str| {
        frontend::parse(
            out,
            "",
            "SELECT pg_catalog.set_config(pg_catalog.convert_from($1, 'UTF8'), \
             pg_catalog.convert_from($2, 'UTF8'), false)",
            &[BYTEA, BYTEA],
        );
        frontend::bind_text(out, "", &[&hex_bytes(name), &hex_bytes(value)]);
        frontend::execute(out);
        frontend::sync(out);
    };
    // Statement texts are the UTF-8 the snapshot read: parsed while the connection reads
    // UTF-8, unless every text is ASCII, which every client encoding reads alike.
    let switch_encoding = !snap.client_encoding.is_empty()
        && !snap.client_encoding.eq_ignore_ascii_case("UTF8")
        && snap.statements.iter().any(|s| !s.text.is_ascii());
    if switch_encoding {
        assign(&mut out, "client_encoding", "UTF8");
        steps.push(Step::Setting("client_encoding"));
    }
    for (name, value) in &snap.settings {
        if switch_encoding && name == "client_encoding" {
            continue;
        }
        assign(&mut out, name, value);
        steps.push(Step::Setting(name));
    }
    if snap.temp_schema {
        // After the settings (temp_buffers must be set before the first temporary table) and
        // as the login user, who may make temporary objects where a SET ROLE may not.
        frontend::parse(&mut out, "", TEMP_SCHEMA_SQL, &[]);
        frontend::bind_text(&mut out, "", &[]);
        frontend::execute(&mut out);
        frontend::sync(&mut out);
        steps.push(Step::TempSchema);
    }
    if let Some(a) = &snap.session_authorization {
        assign(&mut out, "session_authorization", a);
        steps.push(Step::Identity("session_authorization"));
    }
    if let Some(r) = &snap.role {
        assign(&mut out, "role", r);
        steps.push(Step::Identity("role"));
    }
    let mut in_force = InForce::new(snap);
    for s in statements_by_context(snap) {
        in_force.enter(&mut out, &mut steps, s.context.as_deref());
        shorten_lock_wait(&mut out);
        if s.from_sql {
            // Through the extended protocol: the server refuses a text of more than one command.
            frontend::parse(&mut out, "", &s.text, &[]);
            frontend::bind_text(&mut out, "", &[]);
            frontend::execute(&mut out);
            frontend::describe_statement(&mut out, &s.name);
        } else {
            frontend::parse(&mut out, &s.name, &s.text, &s.param_types);
            frontend::describe_statement(&mut out, &s.name);
        }
        frontend::sync(&mut out);
        steps.push(Step::Statement(s));
    }
    if switch_encoding {
        // Before the unnamed statement, whose text the tracker kept as the client sent it.
        assign(&mut out, "client_encoding", &snap.client_encoding);
        steps.push(Step::Setting("client_encoding"));
    }
    // Last, as the steps above make unnamed statements of their own.
    match &snap.unnamed {
        Some(u) => {
            in_force.enter(&mut out, &mut steps, u.context.as_deref());
            shorten_lock_wait(&mut out);
            frontend::parse(&mut out, "", &u.text, &u.param_types);
            frontend::describe_statement(&mut out, "");
            steps.push(Step::Unnamed(u));
        }
        None => {
            frontend::close_statement(&mut out, "");
            steps.push(Step::NoUnnamed);
        }
    }
    frontend::sync(&mut out);
    in_force.leave(&mut out, &mut steps);
    try_carried(snap, &mut out, &mut steps);
    (out, steps)
}

/// Tries again the statements an earlier revival left to be made at their first use, last:
/// each batch sets what it needs for itself alone.
fn try_carried<'a>(snap: &'a Snapshot, out: &mut Vec<u8>, steps: &mut Vec<Step<'a>>) {
    for (name, stale, remake) in carried_remakes(snap) {
        out.extend_from_slice(&remake.at_rest);
        steps.push(Step::Carried(name, stale, remake));
        steps.push(Step::CarriedCleanup);
    }
}

/// The statements an earlier revival left to be made at their first use and that are still
/// tried before it.
fn carried_remakes(snap: &Snapshot) -> impl Iterator<Item = (&str, &StaleStatement, &Remake)> {
    snap.failed
        .iter()
        .filter_map(|(name, stale)| Some((name.as_str(), stale, stale.tried_at_rest()?)))
}

/// The session's statements, those prepared under its settings of now first, then each group
/// prepared under the same other settings together.
fn statements_by_context(snap: &Snapshot) -> Vec<&PreparedStatement> {
    let mut ordered: Vec<&PreparedStatement> = snap.statements.iter().collect();
    let mut contexts: Vec<&PrepareContext> = Vec::new();
    for s in &snap.statements {
        if let Some(c) = s.context.as_deref()
            && !contexts.contains(&c)
        {
            contexts.push(c);
        }
    }
    ordered.sort_by_key(|s| {
        s.context.as_deref().map_or(0, |c| {
            1 + contexts.iter().position(|k| *k == c).unwrap_or(0)
        })
    });
    ordered
}

/// The gateway's own statement while it sets a statement's settings back after the session's
/// unnamed statement was made again (an unnamed one would destroy it).
const OWN_CONTEXT: &str = "\u{7f}pgwake context";

/// The settings that decide how a statement is read, as the restore has set them so far.
struct InForce<'a> {
    snap: &'a Snapshot,
    values: Vec<&'a str>,
}

impl<'a> InForce<'a> {
    /// As the session has them: the restore set its settings and identity first.
    fn new(snap: &'a Snapshot) -> InForce<'a> {
        let values = snap
            .context
            .as_deref()
            .map(|c| c.settings().map(|(_, v)| v).collect())
            .unwrap_or_default();
        InForce { snap, values }
    }

    /// Sets what `context` (`None`: the session's own) holds that differs from what is in
    /// force, before statements prepared under it are made again.
    fn enter(
        &mut self,
        out: &mut Vec<u8>,
        steps: &mut Vec<Step<'a>>,
        context: Option<&'a PrepareContext>,
    ) {
        let Some(target) = context.or(self.snap.context.as_deref()) else {
            return;
        };
        let mut first = true;
        for (i, (name, value)) in target.settings().enumerate() {
            if self.values.get(i).is_none_or(|v| *v == value) {
                continue;
            }
            assign_own(out, name, value);
            steps.push(Step::Context(name, std::mem::take(&mut first)));
            self.set(i, name, value);
        }
    }

    /// Puts the session's own values back where statements were made under others: a setting
    /// the session set with its value, one it never set with `RESET` (so that it still shows
    /// where it came from), its identity as it had it.
    fn leave(&mut self, out: &mut Vec<u8>, steps: &mut Vec<Step<'a>>) {
        let Some(own) = self.snap.context.as_deref() else {
            return;
        };
        for (i, (name, value)) in own.settings().enumerate() {
            if self.values.get(i).is_none_or(|v| *v == value) {
                continue;
            }
            let session_set = self
                .snap
                .settings
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name));
            if matches!(name, "session_authorization" | "role") {
                assign_own(out, name, value);
                steps.push(Step::Identity(name));
            } else if session_set {
                assign_own(out, name, value);
                steps.push(Step::Setting(name));
            } else {
                reset_own(out, name);
                steps.push(Step::Setting(name));
            }
            self.set(i, name, value);
        }
    }

    fn set(&mut self, i: usize, name: &str, value: &'a str) {
        self.values[i] = value;
        // Setting the session's authorization ends any SET ROLE.
        if name == "session_authorization"
            && let Some(role) = CONTEXT_SETTINGS.iter().position(|n| *n == "role")
        {
            self.values[role] = "none";
        }
    }
}

/// Sets `name` to `value` for the session through the gateway's own statement, names and
/// values as UTF-8 bytes (see [`restore_requests`]).
fn assign_own(out: &mut Vec<u8>, name: &str, value: &str) {
    frontend::parse(
        out,
        OWN_CONTEXT,
        "SELECT pg_catalog.set_config(pg_catalog.convert_from($1, 'UTF8'), \
         pg_catalog.convert_from($2, 'UTF8'), false)",
        &[BYTEA, BYTEA],
    );
    frontend::bind_text(out, OWN_CONTEXT, &[&hex_bytes(name), &hex_bytes(value)]);
    frontend::execute(out);
    frontend::close_statement(out, OWN_CONTEXT);
    frontend::sync(out);
}

/// Resets `name` (one of [`CONTEXT_SETTINGS`], plain identifiers) through the gateway's own
/// statement.
fn reset_own(out: &mut Vec<u8>, name: &str) {
    frontend::parse(out, OWN_CONTEXT, &format!("RESET {name}"), &[]);
    frontend::bind_text(out, OWN_CONTEXT, &[]);
    frontend::execute(out);
    frontend::close_statement(out, OWN_CONTEXT);
    frontend::sync(out);
}

/// Restores `snap` on a freshly logged-in backend: settings with `set_config`, then session
/// authorization and role, then the prepared statements, each in its own Sync so one refusal
/// costs only that piece, each waiting at most `lock_wait` for a lock (one that waits longer is
/// made at its first use). Fails only on I/O, a timeout, or an identity that cannot be
/// restored.
pub async fn restore(
    backend: &mut Stream,
    snap: &Snapshot,
    (max_message, lock_wait): (usize, Duration),
    deadline: Instant,
) -> Result<Restored, StateError> {
    let (out, steps) = restore_requests(snap, lock_wait);
    // A statement is made at its first use in the client's own bytes, which are in its
    // client_encoding: only a text that reads the same there can be.
    let utf8 = snap.client_encoding.is_empty() || snap.client_encoding.eq_ignore_ascii_case("UTF8");
    let mut restored = Restored::default();
    // Those tried again are judged with the rest.
    let left = snap
        .failed
        .iter()
        .filter(|(_, s)| s.tried_at_rest().is_none());
    restored.stale.extend(left.cloned());
    backend.write_all(&out).await?;
    backend.flush().await?;
    let wait = deadline.saturating_duration_since(Instant::now());
    let mut described = Described::Failed;
    let mut failure = None;
    let mut context_refused = None;
    let mut steps = steps.into_iter();
    let mut step = steps.next();
    while let Some(current) = step {
        let msg = next_message(backend, max_message, deadline, wait).await?;
        match msg.tag() {
            b'E' if failure.is_none() => {
                failure = Some((frontend::error_fields(msg.body()), msg.bytes));
            }
            b'T' => {
                described =
                    frontend::row_shape(msg.body()).map_or(Described::Failed, Described::Rows)
            }
            b'n' => described = Described::NoRows,
            b'Z' => {
                let answer = (
                    failure.take(),
                    std::mem::replace(&mut described, Described::Failed),
                );
                let how = Judging {
                    utf8,
                    context_refused: &mut context_refused,
                    context: snap.context.as_deref(),
                    lock_wait,
                };
                judge(current, answer, how, &mut restored)?;
                step = steps.next();
            }
            _ => {}
        }
    }
    if snap.unnamed.is_some() && !restored.unnamed {
        // It now returns other rows than the client was told: gone is safer than wrong.
        let mut out = Vec::new();
        frontend::close_statement(&mut out, "");
        frontend::sync(&mut out);
        backend.write_all(&out).await?;
        backend.flush().await?;
        while next_message(backend, max_message, deadline, wait)
            .await?
            .tag()
            != b'Z'
        {}
    }
    Ok(restored)
}

/// What [`judge`] weighs an answer with.
struct Judging<'a> {
    /// The connection reads UTF-8 (else only an ASCII text is made again in the client's bytes).
    utf8: bool,
    /// The refusal of the setting that the statements being made need, if one was refused.
    context_refused: &'a mut Option<Vec<u8>>,
    /// The session's own settings, under which a statement left for its first use was made.
    context: Option<&'a PrepareContext>,
    /// How long a try at rest waits for a lock.
    lock_wait: Duration,
}

/// Takes in the answer to one restore step: the error it met, and for a protocol statement how
/// its rows are described now.
fn judge(
    step: Step<'_>,
    (failure, described): (Option<(ErrorFields, Vec<u8>)>, Described),
    how: Judging<'_>,
    restored: &mut Restored,
) -> Result<(), StateError> {
    let Judging {
        utf8,
        context_refused,
        ..
    } = how;
    if let Step::Context(_, true) = step {
        *context_refused = None;
    }
    // A statement made under settings the restore could not set fails at its use with that
    // refusal: made under today's it could mean otherwise.
    let failure = match (step, failure, &*context_refused) {
        (Step::Statement(s), _, Some(refused)) if s.context.is_some() => {
            Some((frontend::error_fields(&refused[5..]), refused.clone()))
        }
        (Step::Unnamed(u), _, Some(refused)) if u.context.is_some() => {
            Some((frontend::error_fields(&refused[5..]), refused.clone()))
        }
        (_, failure, _) => failure,
    };
    match (step, failure) {
        (Step::Context(name, _), Some((e, bytes))) => {
            debug!(setting = name, code = %e.code, "a statement's setting could not be set; its statements fail at their use");
            *context_refused = Some(bytes);
        }
        (Step::Context(..), None) => {}
        (Step::Identity(what), Some((e, _))) => {
            debug!(what, code = %e.code, "the session's identity could not be restored");
            return Err(StateError::Backend(e));
        }
        (Step::Identity(_), None) => {}
        (Step::Setting(name), Some((e, _))) => {
            // The session now runs with the setting's default: said where an operator looks.
            info!(setting = name, code = %e.code, error = %e.message, "a setting could not be restored; it takes its default");
            restored.left_out += 1;
        }
        (Step::Setting(_), None) | (Step::TempSchema, None) => {}
        (Step::TempSchema, Some((e, _))) => {
            debug!(code = %e.code, "the temporary schema could not be made; left out");
            restored.left_out += 1;
        }
        (Step::Statement(s), Some((e, _))) if transient(&e.code) && (utf8 || s.text.is_ascii()) => {
            // A lock (or the like) that the session would not have waited for now: made again
            // at rest under the settings it was prepared under, or at its first use, where an
            // error is the one Postgres gives then.
            debug!(statement = %s.name, code = %e.code, "a prepared statement is made again at rest or at its first use");
            let remake = s.remake(s.context.as_deref().or(how.context), how.lock_wait);
            restored
                .stale
                .push((s.name.clone(), s.stale(StaleAnswer::Remake(remake))));
        }
        (Step::Statement(s), Some((e, bytes))) => {
            // Postgres would meet the same error when it next used the statement.
            debug!(statement = %s.name, code = %e.code, "a prepared statement could not be made again; its use answers that error");
            restored.left_out += 1;
            restored
                .stale
                .push((s.name.clone(), s.stale(StaleAnswer::Failed(bytes.into()))));
        }
        (Step::NoUnnamed, _) | (Step::CarriedCleanup, _) => {}
        (Step::Carried(name, stale, remake), failure) => {
            let code = failure.as_ref().map(|(e, _)| e.code.as_str());
            judge_carried((name, stale, remake), code, described, restored);
        }
        (Step::Unnamed(_), Some((e, _))) => {
            debug!(code = %e.code, "the unnamed statement could not be made again; left out");
            restored.left_out += 1;
        }
        (Step::Unnamed(u), None) if u.described == described => restored.unnamed = true,
        (Step::Unnamed(_), None) => {
            debug!("the unnamed statement now describes other rows; left out");
            restored.left_out += 1;
        }
        (Step::Statement(s), None) if s.described == described => {
            restored.statements.push(s.name.clone());
        }
        (Step::Statement(s), None) => {
            // Its rows no longer look as the client was told: a driver would decode them under
            // the wrong names and types, so its use fails as Postgres fails it.
            debug!(statement = %s.name, "a prepared statement now describes other rows");
            restored.statements.push(s.name.clone());
            restored
                .stale
                .push((s.name.clone(), s.stale(StaleAnswer::ResultChanged)));
        }
    }
    Ok(())
}

/// Takes in the answer to a carried statement's try: made again with the rows the client was
/// told, it is there again; with others, its uses answer that its result changed; a lock still
/// in the way leaves it to be tried again; another error leaves it to its first use.
fn judge_carried(
    (name, stale, remake): (&str, &StaleStatement, &Remake),
    failure: Option<&str>,
    described: Described,
    restored: &mut Restored,
) {
    let mut stale = stale.clone();
    match tried_at_rest(failure, described) {
        TriedAtRest::Made(rows) => {
            restored.statements.push(name.to_owned());
            if remake.same_rows(rows) {
                return;
            }
            stale.answer = StaleAnswer::ResultChanged;
        }
        TriedAtRest::Again => {}
        TriedAtRest::LeftToFirstUse => {
            if let StaleAnswer::Remake(r) = &mut stale.answer {
                r.at_rest = Box::default();
            }
        }
    }
    restored.stale.push((name.to_owned(), stale));
}

/// What a statement's at-rest batch ([`Remake::at_rest`]) came to.
enum TriedAtRest {
    /// Made again, its rows looking as given (`None`: no rows).
    Made(Option<u64>),
    /// A lock (or the like) still in the way: tried again at the next rest.
    Again,
    /// Another error: left to its first use, which answers it.
    LeftToFirstUse,
}

/// Reads the error a try met (its SQLSTATE) and how the statement was described after it.
fn tried_at_rest(failure: Option<&str>, described: Described) -> TriedAtRest {
    match (failure, described.told()) {
        (None, Some(rows)) => TriedAtRest::Made(rows),
        (Some(code), _) if transient(code) => TriedAtRest::Again,
        _ => TriedAtRest::LeftToFirstUse,
    }
}

/// Batches in each statement's [`Remake::at_rest`]: the try, then the clean-up.
const AT_REST_BATCHES: usize = 2;

/// Tries again, while the session is at rest, the statements a revival left to be made at
/// their first use, each in a batch of its own (see [`Remake::at_rest`]): one made again is in
/// `pg_prepared_statements` again before the client's next request runs, whatever that request
/// is; one that still meets a lock is tried at the next rest; one that meets another error is
/// left to its first use, which answers it. Notices and parameter changes the backend sends
/// meanwhile go on to the client.
pub async fn remake_at_rest(
    backend: &mut Stream,
    client: &mut Stream,
    tracker: &mut SessionTracker,
    max_message: usize,
    wait: Duration,
) -> Result<(), StateError> {
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    let mut names = Vec::new();
    for (name, batch) in tracker.remakes_at_rest() {
        out.extend_from_slice(batch);
        names.push(name.to_owned());
    }
    backend.write_all(&out).await?;
    backend.flush().await?;
    for name in names {
        let mut failure = None;
        let mut described = Described::Failed;
        let mut batches = 0;
        while batches < AT_REST_BATCHES {
            let msg = next_message(backend, max_message, deadline, wait).await?;
            match msg.tag() {
                b'E' if failure.is_none() && batches == 0 => {
                    failure = Some(frontend::error_fields(msg.body()))
                }
                b'T' => {
                    described =
                        frontend::row_shape(msg.body()).map_or(Described::Failed, Described::Rows)
                }
                b'n' => described = Described::NoRows,
                b'N' | b'A' | b'S' => client
                    .write_all(&msg.bytes)
                    .await
                    .map_err(StateError::ClientIo)?,
                b'Z' => batches += 1,
                _ => {}
            }
        }
        let code = failure.map(|e| e.code);
        match tried_at_rest(code.as_deref(), described) {
            TriedAtRest::Made(rows) => {
                debug!(statement = %name, "a prepared statement was made again at rest");
                tracker.made_at_rest(&name, rows);
            }
            TriedAtRest::Again => {
                debug!(statement = %name, code = ?code, "a prepared statement still cannot be made again; tried at the next rest");
            }
            TriedAtRest::LeftToFirstUse => {
                debug!(statement = %name, code = ?code, "a prepared statement is left to its first use");
                tracker.stop_trying_at_rest(&name);
            }
        }
    }
    client.flush().await.map_err(StateError::ClientIo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_postgres_shows_them() {
        for (text, ms) in [
            ("0", 0),
            ("250ms", 250),
            ("5s", 5000),
            ("10min", 600_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            ("1500", 1500),
        ] {
            assert_eq!(
                postgres_duration(text),
                Some(Duration::from_millis(ms)),
                "{text}"
            );
        }
        assert_eq!(postgres_duration("5 fortnights"), None);
        let mut snap = Snapshot::default();
        assert_eq!(snap.idle_session_timeout(), None);
        snap.settings
            .push(("idle_session_timeout".into(), "0".into()));
        assert_eq!(snap.idle_session_timeout(), None);
        snap.settings[0].1 = "3s".into();
        assert_eq!(snap.idle_session_timeout(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn text_travels_as_utf8_hex_both_ways() {
        let text = "\"ßchema\", public; naïve café";
        let hex = hex_bytes(text);
        assert!(hex.is_ascii() && hex.starts_with("\\x"));
        assert_eq!(from_hex_utf8(&hex.as_bytes()[2..]), text);
        assert_eq!(from_hex_utf8(b""), "");
    }

    #[test]
    fn snapshot_rows() {
        let limits = SnapshotLimits {
            max_statements: 1,
            max_bytes: 1000,
            max_message: 1000,
            sequences: SequenceCheck::Off,
            lock_wait: Duration::from_millis(20),
        };
        let mut s = Snapshot::default();
        s.absorb(
            "s",
            "search_path".into(),
            "app, public".into(),
            "",
            "u",
            limits,
        );
        s.absorb(
            "a",
            "session_authorization".into(),
            "u".into(),
            "",
            "u",
            limits,
        );
        s.absorb("r", "role".into(), "none".into(), "", "u", limits);
        s.absorb(
            "p",
            "s0".into(),
            "select $1".into(),
            "{23,25}false",
            "u",
            limits,
        );
        s.absorb("x", "temp".into(), "false".into(), "", "u", limits);
        assert!(s.movable());
        assert_eq!(s.statements[0].param_types, [23, 25]);
        assert!(!s.statements[0].from_sql);
        assert_eq!(s.session_authorization, None);
        assert_eq!(s.role, None);
        s.absorb("x", "advisory".into(), "true".into(), "", "u", limits);
        assert!(!s.movable());
        assert_eq!(s.pins.describe(), "session advisory lock");
        let mut s = Snapshot::default();
        s.absorb(
            "p",
            "a".into(),
            "PREPARE a AS select 1".into(),
            "{}true",
            "u",
            limits,
        );
        s.absorb("p", "b".into(), "select 1".into(), "{}false", "u", limits);
        assert!(s.statements[0].from_sql && s.statements[0].param_types.is_empty());
        assert!(s.too_large, "over max_statements");
        let mut s = Snapshot::default();
        let limits = SnapshotLimits {
            max_statements: 10,
            ..limits
        };
        let text = "insert into audit values ('once'); prepare a as select 1";
        s.absorb("p", "a".into(), text.into(), "{}true", "u", limits);
        assert_eq!(s.statements[0].text, " prepare a as select 1");
        assert!(s.movable());
        let twice = "prepare b as select 1; deallocate b; prepare b as select 2";
        s.absorb("p", "b".into(), twice.into(), "{}true", "u", limits);
        assert_eq!(
            s.pins.describe(),
            "PREPARE in a text the gateway cannot attribute"
        );
    }
}
