//! Recording a session's state on its backend with plain SQL, and restoring it on a new backend
//! connection: session-level settings first, then prepared statements (a `search_path` change
//! alters what a statement means).
//!
//! Not carried over, by design: notifications (LISTEN pins a session instead), sequence state
//! (`currval`, `lastval`), unnamed statements and portals, and anything a session keeps in
//! extension-private memory. Prepared statements are re-parsed with their recorded parameter
//! type OIDs, which hold on the same cluster (a tenant's database after a sleep or restart).

use std::time::Duration;

use pgwake_protocol::frontend::{self, ErrorFields};
use pgwake_protocol::{Pins, SessionTracker};
use tokio::io::AsyncWriteExt;
use tokio::time::{Instant, timeout_at};

use crate::stream::Stream;
use crate::wire::read_message;

/// One query reads everything a revival needs and the pins the protocol cannot show: each row
/// is (kind, name, value, extra), all text.
const SNAPSHOT_SQL: &str = "\
SELECT 's', name, current_setting(name), NULL FROM pg_settings \
 WHERE source = 'session' AND name NOT IN \
 ('transaction_isolation', 'transaction_read_only', 'transaction_deferrable') \
UNION ALL SELECT 'a', 'session_authorization', current_setting('session_authorization'), NULL \
UNION ALL SELECT 'r', 'role', current_setting('role'), NULL \
UNION ALL SELECT 'p', name, statement, parameter_types::oid[]::text || from_sql::text \
 FROM pg_prepared_statements \
UNION ALL SELECT 'x', 'temp', (EXISTS (SELECT FROM pg_class \
 WHERE relnamespace = pg_my_temp_schema()))::text, NULL \
UNION ALL SELECT 'x', 'advisory', (EXISTS (SELECT FROM pg_locks \
 WHERE locktype = 'advisory' AND pid = pg_backend_pid()))::text, NULL \
UNION ALL SELECT 'x', 'listen', (EXISTS (SELECT FROM pg_listening_channels()))::text, NULL \
UNION ALL SELECT 'x', 'cursor', (EXISTS (SELECT FROM pg_cursors))::text, NULL";

/// A named prepared statement as `pg_prepared_statements` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedStatement {
    /// Statement name.
    pub name: String,
    /// Its text (for SQL-level statements, the whole `PREPARE ...`).
    pub text: String,
    /// Parameter type OIDs.
    pub param_types: Vec<u32>,
    /// Made with SQL `PREPARE` rather than a protocol Parse.
    pub from_sql: bool,
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
    /// Pins the stream and the SQL checks found.
    pub pins: Pins,
    /// Bytes of settings and statement text held.
    pub size: usize,
    /// Over a size or count limit: the session stays where it is.
    pub too_large: bool,
}

impl Snapshot {
    /// A snapshot that marks the session as not movable (the query failed, or revival is not
    /// possible for it), so it is not retried until the client sends something.
    pub fn unmovable(at_message: u64) -> Snapshot {
        Snapshot {
            at_message,
            too_large: true,
            ..Snapshot::default()
        }
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
    // Custom settings are not in pg_settings: ask for the ones the client set by name (the
    // tracker accepts only identifier characters, so quoting is plain).
    let custom: Vec<String> = tracker
        .custom_settings()
        .filter(|n| !n.contains('\''))
        .map(|n| format!("'{n}'"))
        .collect();
    if !custom.is_empty() {
        sql.push_str(&format!(
            " UNION ALL SELECT 's', n, current_setting(n, true), NULL \
             FROM unnest(ARRAY[{}]::text[]) AS n WHERE current_setting(n, true) IS NOT NULL",
            custom.join(",")
        ));
    }
    let mut out = Vec::with_capacity(sql.len() + 8);
    frontend::query(&mut out, &sql);
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
    loop {
        let msg = timeout_at(deadline, read_message(backend, limits.max_message))
            .await
            .map_err(|_| StateError::Timeout(wait))??
            .ok_or_else(|| StateError::Protocol("message length out of range".into()))?;
        match msg.tag() {
            b'D' => {
                let row = frontend::data_row(msg.body())
                    .filter(|r| r.len() == 4)
                    .ok_or_else(|| StateError::Protocol("malformed row".into()))?;
                let text = |i: usize| {
                    row[i]
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default()
                };
                snap.absorb(&text(0), text(1), text(2), &text(3), login_user, limits);
            }
            b'E' => failure = Some(frontend::error_fields(msg.body())),
            b'Z' => break,
            b'N' | b'A' | b'S' => client
                .write_all(&msg.bytes)
                .await
                .map_err(StateError::ClientIo)?,
            b'T' | b'C' => {}
            other => {
                return Err(StateError::Protocol(format!(
                    "message type {:?} during the snapshot",
                    other as char
                )));
            }
        }
    }
    match failure {
        Some(e) => Err(StateError::Backend(e)),
        None => Ok(snap),
    }
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
                self.statements.push(PreparedStatement {
                    name,
                    text: value,
                    param_types,
                    from_sql: from_sql == "true",
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

/// Restores `snap` on a freshly logged-in backend: session authorization, settings and role
/// with `set_config`, then the prepared statements. Any error fails the whole restore.
pub async fn restore(
    backend: &mut Stream,
    snap: &Snapshot,
    max_message: usize,
    deadline: Instant,
) -> Result<(), StateError> {
    let mut out = Vec::with_capacity(256 + snap.size * 2);
    let mut assignments: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = &snap.session_authorization {
        assignments.push(("session_authorization", a));
    }
    assignments.extend(snap.settings.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(r) = &snap.role {
        assignments.push(("role", r));
    }
    let mut syncs = 0;
    if !assignments.is_empty() {
        frontend::parse(&mut out, "", "SELECT set_config($1, $2, false)", &[25, 25]);
        for (name, value) in assignments {
            frontend::bind_text(&mut out, "", &[name, value]);
            frontend::execute(&mut out);
        }
        frontend::sync(&mut out);
        syncs += 1;
    }
    let protocol: Vec<&PreparedStatement> =
        snap.statements.iter().filter(|s| !s.from_sql).collect();
    if !protocol.is_empty() {
        for s in protocol {
            frontend::parse(&mut out, &s.name, &s.text, &s.param_types);
        }
        frontend::sync(&mut out);
        syncs += 1;
    }
    for s in snap.statements.iter().filter(|s| s.from_sql) {
        frontend::query(&mut out, &s.text);
        syncs += 1;
    }
    if syncs == 0 {
        return Ok(());
    }
    backend.write_all(&out).await?;
    backend.flush().await?;
    let wait = deadline.saturating_duration_since(Instant::now());
    let mut failure = None;
    while syncs > 0 {
        let msg = timeout_at(deadline, read_message(backend, max_message))
            .await
            .map_err(|_| StateError::Timeout(wait))??
            .ok_or_else(|| StateError::Protocol("message length out of range".into()))?;
        match msg.tag() {
            b'Z' => syncs -= 1,
            b'E' if failure.is_none() => failure = Some(frontend::error_fields(msg.body())),
            _ => {}
        }
    }
    match failure {
        Some(e) => Err(StateError::Backend(e)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_rows() {
        let limits = SnapshotLimits {
            max_statements: 1,
            max_bytes: 1000,
            max_message: 1000,
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
    }
}
