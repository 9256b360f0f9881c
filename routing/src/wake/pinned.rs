//! The sessions that cannot leave their backend connections, per tenant, as the sessions report
//! them through their wake claims: what keeps a tenant awake past its idle timeout, what holds
//! the places under its backend cap, and what `pgwake_sessions_pinned` counts.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use pgwake_protocol::Pins;
use serde::Serialize;
use tokio::time::Instant;

use crate::TenantId;

/// Who a session's client is, as the operator sees it beside a session that keeps its tenant
/// awake: from the startup message and the connection (the load balancer's PROXY header when
/// there is one).
#[derive(Clone, Debug)]
pub struct SessionClient {
    /// The client's `application_name` startup parameter.
    pub application_name: Option<String>,
    /// The client's address.
    pub address: SocketAddr,
}

/// A session pinned to its backend connection, as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PinnedSession {
    /// The pins' names, as `pgwake_sessions_pinned` labels them (`advisory_lock`, …).
    pub reasons: Vec<&'static str>,
    /// The same in words.
    pub description: String,
    /// The client's `application_name`, when it sent one.
    pub application_name: Option<String>,
    /// The client's address.
    pub client: String,
    /// Since when it has been pinned (for these reasons or others), seconds since the Unix
    /// epoch.
    pub since: f64,
}

impl PinnedSession {
    /// One line for logs and error messages: its reasons and who its client is.
    fn line(&self) -> String {
        let (what, from) = (&self.description, &self.client);
        match self.application_name.as_deref().filter(|a| !a.is_empty()) {
            Some(app) => format!("{what} (application \"{app}\" from {from})"),
            None => format!("{what} (from {from})"),
        }
    }

    /// `sessions` in words, for a log line or an error message: how many, and the first few
    /// with their reasons and clients; `None` when there are none.
    pub fn describe_all(sessions: &[PinnedSession]) -> Option<String> {
        if sessions.is_empty() {
            return None;
        }
        let mut named: Vec<String> = sessions
            .iter()
            .take(NAMED_IN_MESSAGE)
            .map(PinnedSession::line)
            .collect();
        if sessions.len() > NAMED_IN_MESSAGE {
            named.push(format!("{} more", sessions.len() - NAMED_IN_MESSAGE));
        }
        let count = match sessions.len() {
            1 => "1 session pinned".to_owned(),
            n => format!("{n} sessions pinned"),
        };
        Some(format!("{count}: {}", named.join("; ")))
    }
}

struct Entry {
    session: PinnedSession,
    /// When the session last had traffic, as of the snapshot that found it pinned.
    quiet_since: Instant,
}

/// Every tenant's pinned sessions. Sessions write their own entry through their wake claim;
/// the coordinator's status, the idle sleeper, the connector (for a capped tenant's waits) and
/// the metrics read them.
#[derive(Default)]
pub struct PinnedSessions {
    tenants: Mutex<HashMap<TenantId, BTreeMap<u64, Entry>>>,
    next_id: AtomicU64,
}

/// Pinned sessions listed by name in one message: enough to find the application, few enough
/// for a line.
const NAMED_IN_MESSAGE: usize = 3;

impl PinnedSessions {
    /// A number no other session's entry has.
    pub(super) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, BTreeMap<u64, Entry>>> {
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records what pins session `id` of `tenant` (nothing: the entry goes), found by a
    /// snapshot taken `quiet_for` after the session's last traffic. A session pinned before
    /// keeps its `since`.
    pub(super) fn set(
        &self,
        tenant: &TenantId,
        id: u64,
        pins: Pins,
        client: &SessionClient,
        quiet_for: Duration,
    ) {
        let mut tenants = self.lock();
        if pins.is_empty() {
            Self::remove_locked(&mut tenants, tenant, id);
            return;
        }
        let sessions = tenants.entry(tenant.clone()).or_default();
        let since = sessions.get(&id).map_or_else(
            || super::epoch_seconds(SystemTime::now()),
            |e| e.session.since,
        );
        let now = Instant::now();
        sessions.insert(
            id,
            Entry {
                session: PinnedSession {
                    reasons: pins.labels().collect(),
                    description: pins.describe(),
                    application_name: client.application_name.clone(),
                    client: client.address.to_string(),
                    since,
                },
                quiet_since: now.checked_sub(quiet_for).unwrap_or(now),
            },
        );
    }

    /// Takes session `id`'s entry out (its claim ended).
    pub(super) fn remove(&self, tenant: &TenantId, id: u64) {
        Self::remove_locked(&mut self.lock(), tenant, id);
    }

    fn remove_locked(
        tenants: &mut HashMap<TenantId, BTreeMap<u64, Entry>>,
        tenant: &TenantId,
        id: u64,
    ) {
        if let Some(sessions) = tenants.get_mut(tenant) {
            sessions.remove(&id);
            if sessions.is_empty() {
                tenants.remove(tenant);
            }
        }
    }

    /// The tenant's pinned sessions, longest pinned first.
    pub fn of(&self, tenant: &TenantId) -> Vec<PinnedSession> {
        let mut out: Vec<PinnedSession> = self
            .lock()
            .get(tenant)
            .map(|s| s.values().map(|e| e.session.clone()).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.since.total_cmp(&b.since));
        out
    }

    /// How many of the tenant's pinned sessions have had no traffic for `quiet` or longer.
    pub(super) fn quiet_for(&self, tenant: &TenantId, quiet: Duration) -> usize {
        self.lock().get(tenant).map_or(0, |s| {
            s.values()
                .filter(|e| e.quiet_since.elapsed() >= quiet)
                .count()
        })
    }

    /// Pinned sessions of every tenant by reason (a session with several counts under each).
    pub fn by_reason(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for entry in self.lock().values().flat_map(|s| s.values()) {
            for reason in &entry.session.reasons {
                *out.entry(*reason).or_default() += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_keep_their_start_and_go_with_their_pins() {
        let registry = PinnedSessions::default();
        let t = TenantId::parse("t").unwrap();
        let client = SessionClient {
            application_name: Some("billing-worker".into()),
            address: "10.0.0.7:51000".parse().unwrap(),
        };
        let anonymous = SessionClient {
            application_name: None,
            address: "10.0.0.8:52000".parse().unwrap(),
        };
        let (a, b) = (registry.new_id(), registry.new_id());
        registry.set(&t, a, Pins::ADVISORY_LOCK, &client, Duration::ZERO);
        let since = registry.of(&t)[0].since;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let both = Pins::ADVISORY_LOCK | Pins::TEMP_OBJECTS;
        registry.set(&t, a, both, &client, Duration::from_secs(2));
        registry.set(&t, b, Pins::LISTEN, &anonymous, Duration::ZERO);
        let sessions = registry.of(&t);
        assert_eq!(sessions.len(), 2);
        assert_eq!(sessions[0].since, since, "pinned since its first pin");
        assert_eq!(sessions[0].reasons, ["temp_objects", "advisory_lock"]);
        assert_eq!(sessions[0].client, "10.0.0.7:51000");
        assert_eq!(registry.quiet_for(&t, Duration::from_secs(2)), 1);
        assert_eq!(
            registry.by_reason(),
            BTreeMap::from([("advisory_lock", 1), ("listen", 1), ("temp_objects", 1)])
        );
        let words = PinnedSession::describe_all(&sessions).unwrap();
        assert_eq!(
            words,
            "2 sessions pinned: temporary objects, session advisory lock \
             (application \"billing-worker\" from 10.0.0.7:51000); LISTEN (from 10.0.0.8:52000)"
        );
        registry.set(&t, a, Pins::none(), &client, Duration::ZERO);
        registry.remove(&t, b);
        assert!(registry.of(&t).is_empty());
        assert_eq!(PinnedSession::describe_all(&[]), None);
        assert!(registry.by_reason().is_empty());
    }
}
