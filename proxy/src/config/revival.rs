//! `[revival]`: sessions that outlive their backend connection, and the keys of their tokens.

use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[revival]`: sessions that outlive their backend connection (park, revive, migrate).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RevivalConfig {
    /// Park idle sessions so their tenant can sleep, and move sessions off a backend that
    /// restarts; only sessions the gateway authenticated can be revived.
    pub enabled: bool,
    /// Keys that seal revival tokens, newest first (the first seals, all open); a random
    /// in-memory key when empty (tokens then die with the process).
    pub keys: Vec<RevivalKeyConfig>,
    /// How long a revival token stays valid; a session parked longer ends at its next message.
    #[serde(with = "super::duration")]
    pub token_ttl: Duration,
    /// Quiet time at a safe point after which the gateway records a session's state (settings,
    /// prepared statements, pins) with one query, so a restart of its backend can move it.
    #[serde(with = "super::duration")]
    pub snapshot_after: Duration,
    /// Quiet time at a safe point after which a movable session parks on its own, even while
    /// its tenant is busy: its backend connection is reset and kept for other sessions of the
    /// same user and startup parameters (with `[reuse]`), or closed; the session is revived on
    /// its next message. Off when unset.
    #[serde(with = "super::duration")]
    pub park_session_after: Option<Duration>,
    /// What an idle but pinned session (open transaction, temp table, advisory lock, LISTEN,
    /// held cursor) does to an idle tenant: keep it awake, or be ended with FATAL.
    pub pinned: PinnedPolicy,
    /// Time a revival may take: wake, reconnect (retried while the backend restarts), login
    /// and restoring settings and statements.
    #[serde(with = "super::duration")]
    pub revive_timeout: Duration,
    /// How long restoring a prepared statement (and the snapshot's look at one, or at the
    /// session's sequence state) waits for a lock another session holds on what it names: past
    /// it the statement is made again at its first use instead (a snapshot that could not look
    /// keeps the session where it is), so a table under migration holds neither the revival
    /// nor an unrelated query. At least 1ms (Postgres reads 0 as no limit).
    #[serde(with = "super::duration")]
    pub restore_lock_wait: Duration,
    /// Named prepared statements a session may hold and still be moved.
    pub max_statements: usize,
    /// Custom settings (`prefix.name`) a session may name and still be moved: Postgres cannot
    /// list them, so the gateway remembers each name it sees a session use.
    pub max_custom_settings: usize,
    /// Largest recorded session state (settings and statement texts) a session may have and
    /// still be moved.
    pub max_snapshot: ByteSize,
    /// When a session that drew from a sequence stays on its backend connection: its
    /// `currval` and `lastval` cannot be carried over.
    pub sequence_state: SequenceStatePolicy,
}

impl Default for RevivalConfig {
    fn default() -> Self {
        RevivalConfig {
            enabled: true,
            keys: Vec::new(),
            token_ttl: Duration::from_secs(24 * 3600),
            snapshot_after: Duration::from_secs(1),
            park_session_after: None,
            pinned: PinnedPolicy::KeepAwake,
            revive_timeout: Duration::from_secs(30),
            restore_lock_wait: Duration::from_millis(20),
            max_statements: 1000,
            max_custom_settings: 256,
            max_snapshot: ByteSize::kib(256),
            sequence_state: SequenceStatePolicy::Auto,
        }
    }
}

/// When a session that drew from a sequence (`nextval`, a serial or identity column) is
/// pinned. Its `currval` and `lastval` cannot be set on another backend without moving the
/// sequence for everyone, so a session that could read them stays where it is until `DISCARD
/// SEQUENCES` or `DISCARD ALL`; a pinned idle session keeps its tenant awake, so the default
/// pins only where the state could be read.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SequenceStatePolicy {
    /// While something could read the state: the session's own text called `currval` or
    /// `lastval`, or the database holds code that calls them (a function or procedure body, a
    /// column default, a view or rule, a trigger's condition, a policy, a check constraint).
    /// Applications that take keys with `RETURNING` or `nextval` move, and their tenants
    /// sleep; a first `currval` after a move in a session that could not read it before
    /// answers ERROR 55000, as on a new connection.
    #[default]
    Auto,
    /// Always: every `currval` and `lastval` answers as on Postgres, and a session that
    /// inserted into a serial column keeps its tenant awake while it is open.
    Pin,
    /// Once the session's own text has called `currval` or `lastval`, whatever the database's
    /// code does.
    PinIfRead,
}

/// What a pinned idle session does to an idle tenant.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PinnedPolicy {
    /// The tenant stays awake while the session is open.
    #[default]
    KeepAwake,
    /// The session is ended with FATAL so the tenant can sleep.
    Terminate,
}

/// `[[revival.keys]]`: one token key.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevivalKeyConfig {
    /// Key id, stored in each token (1 to 255 bytes).
    pub id: String,
    /// The key: 32 bytes, base64 (a missing `Option` reads as `None`).
    pub secret: Option<String>,
    /// A file holding the base64 key instead (e.g. a mounted Kubernetes Secret).
    pub secret_file: Option<PathBuf>,
}

impl std::fmt::Debug for RevivalKeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RevivalKeyConfig")
            .field("id", &self.id)
            .field("secret_file", &self.secret_file)
            .finish_non_exhaustive()
    }
}

impl RevivalConfig {
    /// The token key ring: the configured keys, or a random one.
    pub fn key_ring(&self) -> Result<pgwake_protocol::revival::RevivalKeys, ConfigError> {
        use base64::Engine;
        use pgwake_protocol::revival::{KEY_LEN, RevivalKeys};
        if self.keys.is_empty() {
            return Ok(RevivalKeys::generated());
        }
        let mut keys = Vec::new();
        for (i, k) in self.keys.iter().enumerate() {
            let key = format!("revival.keys[{i}]");
            let text = match (&k.secret, &k.secret_file) {
                (Some(s), None) => s.clone(),
                (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| {
                    invalid(
                        &key,
                        format!("cannot read secret_file {}: {e}", f.display()),
                    )
                })?,
                _ => return Err(invalid(&key, "set exactly one of secret and secret_file")),
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .ok()
                .and_then(|b| <[u8; KEY_LEN]>::try_from(b).ok())
                .ok_or_else(|| {
                    invalid(
                        &key,
                        "the secret must be 32 bytes in base64 (e.g. `openssl rand -base64 32`)",
                    )
                })?;
            keys.push((k.id.clone(), bytes));
        }
        RevivalKeys::new(keys).map_err(|e| invalid("revival.keys", e.to_string()))
    }
}

impl RevivalConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.snapshot_after.is_zero()
            || self.park_session_after.is_some_and(|p| p.is_zero())
            || self.revive_timeout.is_zero()
            || self.token_ttl.is_zero()
        {
            return Err(invalid(
                "revival.snapshot_after",
                "snapshot_after, park_session_after, revive_timeout and token_ttl must be greater \
                 than zero",
            ));
        }
        if self.restore_lock_wait < Duration::from_millis(1) {
            return Err(invalid(
                "revival.restore_lock_wait",
                "restore_lock_wait must be at least 1ms (Postgres reads 0 as no limit)",
            ));
        }
        self.key_ring().map(|_| ())
    }
}
