//! Gateway-issued cancel keys and the backend processes they stand for.
//!
//! Clients never see a backend's real key: they get a random one from the gateway, so a cancel
//! request can only reach the backend through this map, and keys cannot be guessed across tenants.

use std::collections::HashMap;
use std::net::SocketAddr;
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

/// Bits at the top of a positive process id that name the issuing replica.
const TAG_BITS: u32 = 10;
/// Bits below the tag that are random.
const RANDOM_BITS: u32 = 31 - TAG_BITS;

/// The replica a gateway-issued key came from, as carried in its process id: a hash of the
/// replica's peer address, so every replica computes any other's tag from the address alone.
/// Two replicas may share a tag; a key is then forwarded to both, and only its owner holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaTag(u16);

impl ReplicaTag {
    /// The tag of the replica reachable at `addr`.
    pub fn of(addr: SocketAddr) -> ReplicaTag {
        let digest = ring::digest::digest(&ring::digest::SHA256, addr.to_string().as_bytes());
        let bytes = digest.as_ref();
        ReplicaTag(u16::from_be_bytes([bytes[0], bytes[1]]) >> (16 - TAG_BITS))
    }

    /// The tag a process id carries (meaningful only for a key issued by a tagging replica).
    pub fn of_pid(pid: i32) -> ReplicaTag {
        ReplicaTag(((pid as u32 & i32::MAX as u32) >> RANDOM_BITS) as u16)
    }

    /// A positive process id with this tag above `random`'s low bits.
    pub fn stamp(self, random: u32) -> i32 {
        ((u32::from(self.0) << RANDOM_BITS) | (random & ((1 << RANDOM_BITS) - 1))) as i32
    }
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

/// Map from gateway-issued keys to backend processes.
#[derive(Default)]
pub struct CancelMap {
    inner: Mutex<HashMap<i32, Entry>>,
    /// The tag issued process ids carry; none: fully random ids (a single replica).
    tag: Option<ReplicaTag>,
}

/// A registered key; dropping it unregisters the key.
pub struct CancelRegistration {
    map: Arc<CancelMap>,
    /// The gateway-issued process id the client sees.
    pub pid: i32,
    /// The gateway-issued secret the client sees.
    pub secret: i32,
}

impl Drop for CancelRegistration {
    fn drop(&mut self) {
        if let Ok(mut m) = self.map.inner.lock() {
            m.remove(&self.pid);
        }
    }
}

impl CancelRegistration {
    /// The backend process this key stands for now.
    pub fn target(&self) -> Option<CancelTarget> {
        let m = self.map.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&self.pid).and_then(|e| e.target.clone())
    }

    /// The count of cancel requests that reached the session while it had no backend
    /// connection: a change means the client asked to cancel what it is waiting for.
    pub fn requests(&self) -> watch::Receiver<u64> {
        let mut m = self.map.inner.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(&self.pid) {
            Some(e) => e.requests().subscribe(),
            None => watch::channel(0).1,
        }
    }

    /// The session left its backend connection: until it is revived, its key reaches no
    /// backend (the connection may serve another session now).
    pub fn detach(&self) {
        let mut m = self.map.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.get_mut(&self.pid) {
            e.target = None;
        }
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
    /// A map whose issued process ids carry `tag`.
    pub fn tagged(tag: ReplicaTag) -> CancelMap {
        CancelMap {
            inner: Mutex::default(),
            tag: Some(tag),
        }
    }

    /// The tag this replica's keys carry, when it tags them.
    pub fn tag(&self) -> Option<ReplicaTag> {
        self.tag
    }

    /// Issues a fresh random key for `target`.
    pub fn register(self: &Arc<Self>, target: CancelTarget) -> CancelRegistration {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Positive pids, like a real server's, for clients that assume so.
            let pid = match self.tag {
                Some(tag) => tag.stamp(rand::random()),
                None => rand::random::<i32>() & i32::MAX,
            };
            if pid == 0 || m.contains_key(&pid) {
                continue;
            }
            let secret = rand::random::<i32>();
            let entry = Entry {
                secret,
                target: Some(target),
                requests: None,
            };
            m.insert(pid, entry);
            return CancelRegistration {
                map: self.clone(),
                pid,
                secret,
            };
        }
    }

    /// Points an issued key at another backend process (the session moved); the client keeps
    /// its key.
    pub fn retarget(&self, pid: i32, target: CancelTarget) {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = m.get_mut(&pid) {
            entry.target = Some(target);
        }
    }

    /// Where a key a client presented leads, its secret compared in constant time.
    pub fn lookup(&self, key: &CancelKey) -> Option<CancelRoute> {
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.get_mut(&key.pid)?;
        let ok: bool = e.secret.to_be_bytes()[..].ct_eq(&key.secret[..]).into();
        if !ok {
            return None;
        }
        Some(match &e.target {
            Some(t) => CancelRoute::Backend(t.clone()),
            None => CancelRoute::Session(e.requests().clone()),
        })
    }

    /// Number of live keys.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
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
        map.retarget(reg.pid, target());
        assert!(matches!(map.lookup(&key), Some(CancelRoute::Backend(_))));
    }

    #[test]
    fn tagged_keys_name_their_replica() {
        let a = ReplicaTag::of("10.0.0.1:6433".parse().unwrap());
        let b = ReplicaTag::of("10.0.0.2:6433".parse().unwrap());
        assert_ne!(a, b);
        assert_eq!(a, ReplicaTag::of("10.0.0.1:6433".parse().unwrap()));
        let map = Arc::new(CancelMap::tagged(a));
        for _ in 0..100 {
            let reg = map.register(target());
            assert!(reg.pid > 0);
            assert_eq!(ReplicaTag::of_pid(reg.pid), a);
        }
        for random in [0, 1, u32::MAX] {
            let pid = b.stamp(random);
            assert!(pid >= 0);
            assert_eq!(ReplicaTag::of_pid(pid), b);
        }
    }
}
