//! The cancel keys clients hold and the backend processes they stand for.
//!
//! A client is given the process id of the backend it logged in on, so what it knows as its
//! own pid is what `pg_backend_pid()`, `pg_stat_activity` and its own notifications say, with a
//! secret of the gateway's: a cancel request can only reach a backend through this map, and
//! secrets cannot be guessed across tenants. Backends of different tenants share process ids,
//! so one id may stand for several keys, told apart by their secrets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pgwake_protocol::CancelKey;
use pgwake_protocol::backend::cancel_request;
use pgwake_routing::Endpoint;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::timeout;

/// The backend process a gateway key cancels.
#[derive(Clone, Debug)]
pub struct CancelTarget {
    /// Backend address.
    pub endpoint: Endpoint,
    /// Backend process id.
    pub pid: i32,
    /// Backend secret.
    pub secret: Bytes,
}

/// Where a cancel request for a key goes.
pub enum CancelRoute {
    /// The session runs on this backend process.
    Backend(CancelTarget),
    /// The session has no backend connection (parked, or being revived): it is told itself,
    /// so a request waiting for a wake or a slot ends, and no backend that now serves another
    /// session is reached.
    Session(Arc<watch::Sender<u64>>),
}

impl CancelRoute {
    /// Delivers the request.
    pub async fn deliver(self, connect_timeout: Duration) -> std::io::Result<()> {
        match self {
            CancelRoute::Backend(target) => forward_cancel(&target, connect_timeout).await,
            CancelRoute::Session(requests) => {
                requests.send_modify(|n| *n += 1);
                Ok(())
            }
        }
    }

    /// Where it goes, for logs.
    pub fn describe(&self) -> String {
        match self {
            CancelRoute::Backend(t) => t.endpoint.to_string(),
            CancelRoute::Session(_) => "the session (no backend connection)".into(),
        }
    }
}

/// One issued key: its secret, the backend process it stands for (none while the session has
/// no backend connection), and the session's own count of cancel requests.
struct Entry {
    secret: i32,
    target: Option<CancelTarget>,
    /// Made when first asked for: most sessions are never cancelled while they have no
    /// backend connection, and thousands may be parked.
    requests: Option<Arc<watch::Sender<u64>>>,
}

impl Entry {
    fn requests(&mut self) -> &Arc<watch::Sender<u64>> {
        self.requests
            .get_or_insert_with(|| Arc::new(watch::channel(0).0))
    }
}

/// Map from the keys clients hold to backend processes.
#[derive(Default)]
pub struct CancelMap {
    inner: Mutex<HashMap<i32, Vec<Entry>>>,
}

/// A registered key; dropping it unregisters the key.
pub struct CancelRegistration {
    map: Arc<CancelMap>,
    /// The process id the client sees: its login backend's.
    pub pid: i32,
    /// The gateway-issued secret the client sees.
    pub secret: i32,
}

impl Drop for CancelRegistration {
    fn drop(&mut self) {
        let mut m = self.map.lock();
        if let Some(entries) = m.get_mut(&self.pid) {
            entries.retain(|e| e.secret != self.secret);
            if entries.is_empty() {
                m.remove(&self.pid);
            }
        }
    }
}

impl CancelRegistration {
    fn with_entry<T>(&self, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let mut m = self.map.lock();
        m.get_mut(&self.pid)?
            .iter_mut()
            .find(|e| e.secret == self.secret)
            .map(f)
    }

    /// The backend process this key stands for now.
    pub fn target(&self) -> Option<CancelTarget> {
        self.with_entry(|e| e.target.clone()).flatten()
    }

    /// True while the session runs on the backend process whose id the client was given: that
    /// process must not serve another session while this one lives (the other would be reached
    /// by what this client does with its pid).
    pub fn on_own_backend(&self) -> bool {
        self.target().is_some_and(|t| t.pid == self.pid)
    }

    /// The count of cancel requests that reached the session while it had no backend
    /// connection: a change means the client asked to cancel what it is waiting for.
    pub fn requests(&self) -> watch::Receiver<u64> {
        self.with_entry(|e| e.requests().subscribe())
            .unwrap_or_else(|| watch::channel(0).1)
    }

    /// The session left its backend connection: until it is revived, its key reaches no
    /// backend (the connection may serve another session now).
    pub fn detach(&self) {
        self.with_entry(|e| e.target = None);
    }

    /// Points the key at another backend process (the session moved); the client keeps its key.
    pub fn retarget(&self, target: CancelTarget) {
        self.with_entry(|e| e.target = Some(target));
    }
}

/// Cancels a backend query if dropped while armed: the request that ran it went away (its
/// client left, or it timed out) before the answer was complete. Postgres would otherwise run
/// the query to its end, holding the connection and keeping the tenant awake.
pub struct CancelOnDrop {
    armed: Option<(CancelTarget, Duration)>,
}

impl CancelOnDrop {
    /// A guard for the query running on `target` (none: nothing to cancel).
    pub fn new(target: Option<CancelTarget>, connect_timeout: Duration) -> CancelOnDrop {
        CancelOnDrop {
            armed: target.map(|t| (t, connect_timeout)),
        }
    }

    /// The query finished: nothing to cancel.
    pub fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((target, wait)) = self.armed.take() {
            cancel_in_background(target, wait);
        }
    }
}

/// Sends a CancelRequest to `target` from a background task, for callers that cannot wait
/// (their client is gone).
pub fn cancel_in_background(target: CancelTarget, connect_timeout: Duration) {
    // Not inside a runtime only while the process exits, when nothing is left to cancel.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            if let Err(e) = forward_cancel(&target, connect_timeout).await {
                tracing::debug!(error = %e, backend = %target.endpoint, "cancel of an abandoned query not delivered");
            }
        });
    }
}

impl CancelMap {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Vec<Entry>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Issues a key for `target`: its process id, and a fresh random secret.
    pub fn register(self: &Arc<Self>, target: CancelTarget) -> CancelRegistration {
        let pid = target.pid;
        let mut m = self.lock();
        let entries = m.entry(pid).or_default();
        let secret = loop {
            let secret = rand::random::<i32>();
            if entries.iter().all(|e| e.secret != secret) {
                break secret;
            }
        };
        // Most process ids stand for one key: room for one, not the four a first push makes.
        entries.reserve_exact(1);
        entries.push(Entry {
            secret,
            target: Some(target),
            requests: None,
        });
        CancelRegistration {
            map: self.clone(),
            pid,
            secret,
        }
    }

    /// Where a key a client presented leads, its secret compared in constant time.
    pub fn lookup(&self, key: &CancelKey) -> Option<CancelRoute> {
        let mut m = self.lock();
        let entries = m.get_mut(&key.pid)?;
        // Every secret of the id is compared, so the time taken tells nothing of which matched.
        let mut found = None;
        for (i, e) in entries.iter().enumerate() {
            if bool::from(e.secret.to_be_bytes()[..].ct_eq(&key.secret[..])) {
                found = Some(i);
            }
        }
        let e = &mut entries[found?];
        Some(match &e.target {
            Some(t) => CancelRoute::Backend(t.clone()),
            None => CancelRoute::Session(e.requests().clone()),
        })
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// True when no key is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sends a CancelRequest to the backend and waits until it has read it.
pub async fn forward_cancel(
    target: &CancelTarget,
    connect_timeout: Duration,
) -> std::io::Result<()> {
    let addr = (target.endpoint.host.as_str(), target.endpoint.port);
    let mut s = timeout(connect_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    s.write_all(&cancel_request(target.pid, &target.secret))
        .await?;
    // The server closes the connection once it has handled the request.
    let mut sink = [0u8; 16];
    let _ = timeout(connect_timeout, s.read(&mut sink)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> CancelTarget {
        CancelTarget {
            endpoint: Endpoint::parse("127.0.0.1:5432").unwrap(),
            pid: 1,
            secret: Bytes::from_static(b"abcd"),
        }
    }

    #[test]
    fn keys_match_exactly_and_unregister_on_drop() {
        let map = Arc::new(CancelMap::default());
        let reg = map.register(target());
        let key = CancelKey {
            pid: reg.pid,
            secret: Bytes::copy_from_slice(&reg.secret.to_be_bytes()),
        };
        assert!(map.lookup(&key).is_some());
        let wrong = CancelKey {
            pid: reg.pid,
            secret: Bytes::copy_from_slice(&reg.secret.wrapping_add(1).to_be_bytes()),
        };
        assert!(map.lookup(&wrong).is_none());
        drop(reg);
        assert!(map.lookup(&key).is_none());
        assert!(map.is_empty());
    }

    #[tokio::test]
    async fn a_detached_key_reaches_its_session_and_no_backend() {
        let map = Arc::new(CancelMap::default());
        let reg = map.register(target());
        let key = CancelKey {
            pid: reg.pid,
            secret: Bytes::copy_from_slice(&reg.secret.to_be_bytes()),
        };
        let mut requests = reg.requests();
        reg.detach();
        assert!(reg.target().is_none());
        let route = map.lookup(&key).unwrap();
        assert!(matches!(route, CancelRoute::Session(_)));
        route.deliver(Duration::from_millis(10)).await.unwrap();
        assert!(requests.has_changed().unwrap());
        assert_eq!(*requests.borrow_and_update(), 1);
        reg.retarget(target());
        assert!(matches!(map.lookup(&key), Some(CancelRoute::Backend(_))));
    }

    #[test]
    fn one_pid_holds_keys_of_several_backends_apart() {
        let map = Arc::new(CancelMap::default());
        let a = map.register(target());
        let mut other = target();
        other.endpoint = Endpoint::parse("127.0.0.2:5432").unwrap();
        let b = map.register(other);
        assert_eq!((a.pid, b.pid), (1, 1));
        assert_ne!(a.secret, b.secret);
        let key = |reg: &CancelRegistration| CancelKey {
            pid: reg.pid,
            secret: Bytes::copy_from_slice(&reg.secret.to_be_bytes()),
        };
        let Some(CancelRoute::Backend(t)) = map.lookup(&key(&b)) else {
            panic!("b's key leads to its backend");
        };
        assert_eq!(t.endpoint.host, "127.0.0.2");
        assert!(a.on_own_backend());
        a.detach();
        assert!(!a.on_own_backend());
        assert!(matches!(
            map.lookup(&key(&b)),
            Some(CancelRoute::Backend(_))
        ));
        drop(b);
        assert_eq!(map.len(), 1);
        assert!(matches!(
            map.lookup(&key(&a)),
            Some(CancelRoute::Session(_))
        ));
    }
}
