//! A pool of logged-in backend connections, bounded per key and in total, with an idle timeout.
//!
//! The pool itself is generic: any key (HTTP `/sql` uses [`PoolKey`], tenant + user + database)
//! and any connection type that can say whether it is still usable ([`PoolConnection`]).
//! [`BackendConn`] is the connection kind the gateway pools: a backend login made with the
//! gateway's kept login material, reset before it is reused (HTTP `/sql`). Client-session reuse
//! (`crate::reuse`) keeps only idle connections here, with [`Pool::detach`] and [`Pool::adopt`].
//!
//! Each open connection holds one permit of its key's semaphore and one of the total semaphore,
//! idle or not, so the bounds cannot be exceeded. A connection is put back only by
//! [`Pooled::release`] (or [`Pool::adopt`]); dropping a [`Pooled`] closes it, so every error path
//! discards.

use std::collections::HashMap;
use std::hash::Hash;
use std::io;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::ThreadId;
use std::time::Duration;

use pgwake_protocol::frontend;
use pgwake_routing::{Endpoint, TenantId};
use tokio::io::{AsyncRead, BufReader, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::statements::StatementCache;
use crate::cancel::CancelRegistration;
use crate::stream::Stream;

/// Bounds and timeouts of a pool.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// Connections open at once for one key (idle and in use).
    pub max_per_key: usize,
    /// Connections open at once in the whole pool.
    pub max_total: usize,
    /// An idle connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
    /// How long a caller waits for a free slot when the bounds are reached.
    pub acquire_timeout: Duration,
}

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum PoolError<E> {
    /// Every slot stayed busy until the acquire timeout.
    #[error("no backend connection free within {0:?}")]
    Exhausted(Duration),
    /// Opening a new connection failed.
    #[error(transparent)]
    Open(E),
}

/// A connection the pool can hold.
pub trait PoolConnection: Send + Sized + 'static {
    /// Whether an idle connection can still be handed out, checked without waiting (a backend
    /// that closed or spoke unasked is not).
    fn usable(&mut self) -> bool;

    /// Whether the connection is polled by the calling thread's event loop. Taking one that is
    /// not costs a [`PoolConnection::move_here`], so the pool prefers those that are.
    fn is_local(&self) -> bool {
        true
    }

    /// Re-registers the connection with the calling thread's event loop, so a request on
    /// another session thread than the one that opened it is not woken through that thread.
    /// An error means the connection is unusable.
    fn move_here(self) -> io::Result<Self> {
        Ok(self)
    }
}

/// One key's idle connections and its bound.
struct KeySlots<C> {
    permits: Arc<Semaphore>,
    idle: Vec<Idle<C>>,
}

struct Idle<C> {
    conn: C,
    since: Instant,
    permits: Permits,
}

/// A connection's claim on its key's bound and the total bound.
struct Permits {
    _key: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

/// Counts for metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections open (idle and in use).
    pub open: usize,
    /// Connections idle in the pool.
    pub idle: usize,
}

/// Pooled connections of type `C` by key `K`.
pub struct Pool<K, C> {
    settings: PoolSettings,
    total: Arc<Semaphore>,
    keys: Mutex<HashMap<K, KeySlots<C>>>,
    /// Connections idle in `keys`, changed under its lock; read without it, so that metrics
    /// taken after each request do not contend for the lock.
    idle: AtomicUsize,
    /// Wakes callers waiting for a slot when a connection is released or closed.
    freed: Notify,
}

impl<K: Hash + Eq + Clone + Send + 'static, C: PoolConnection> Pool<K, C> {
    /// An empty pool.
    pub fn new(settings: PoolSettings) -> Arc<Self> {
        Arc::new(Pool {
            total: Arc::new(Semaphore::new(settings.max_total)),
            settings,
            keys: Mutex::new(HashMap::new()),
            idle: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, KeySlots<C>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection for `key` (newest first), else a new one from `open` while the bounds
    /// allow, else waits for a slot up to the acquire timeout.
    pub async fn get<E, F, Fut>(
        self: &Arc<Self>,
        key: &K,
        open: F,
    ) -> Result<Pooled<K, C>, PoolError<E>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let deadline = Instant::now() + self.settings.acquire_timeout;
        // The first look goes without a place in the wait list: most find a connection.
        let mut armed = false;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            if armed {
                freed.as_mut().enable();
            }
            let (reused, key_permits, stale) = self.take_idle(key);
            drop(stale);
            if let Some(p) = reused {
                match p.moved_here() {
                    Some(p) => return Ok(p),
                    None => continue,
                }
            }
            if let Ok(key_permit) = key_permits.try_acquire_owned() {
                match self.total.clone().try_acquire_owned() {
                    Ok(total_permit) => {
                        let permits = Permits {
                            _key: key_permit,
                            _total: total_permit,
                        };
                        let conn = open().await.map_err(PoolError::Open)?;
                        return Ok(self.wrap(key, conn, permits, false));
                    }
                    Err(_) => {
                        // The total bound is reached: close another key's oldest idle
                        // connection rather than wait, if there is one.
                        drop(key_permit);
                        if self.evict_oldest_idle().is_some() {
                            continue;
                        }
                    }
                }
            }
            if !armed {
                // Look again from the wait list, so a slot freed in between is not missed.
                armed = true;
                continue;
            }
            tokio::select! {
                _ = freed => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(PoolError::Exhausted(self.settings.acquire_timeout));
                }
            }
        }
    }

    /// Pops a usable idle connection for `key`; returns the key's semaphore and the stale
    /// connections found on the way (closed by the caller, outside the lock).
    #[allow(clippy::type_complexity)]
    fn take_idle(
        self: &Arc<Self>,
        key: &K,
    ) -> (Option<Pooled<K, C>>, Arc<Semaphore>, Vec<Idle<C>>) {
        let mut keys = self.lock();
        // Looked up before `entry`, which would clone the key on every request.
        if !keys.contains_key(key) {
            keys.insert(
                key.clone(),
                KeySlots {
                    permits: Arc::new(Semaphore::new(self.settings.max_per_key)),
                    idle: Vec::new(),
                },
            );
        }
        let slots = keys.get_mut(key).expect("inserted above");
        let mut stale = Vec::new();
        // The newest connection this thread's event loop polls first, then the newest of any
        // (taken out in place: the list stays oldest first for eviction).
        let local = slots.idle.iter().rposition(|i| i.conn.is_local());
        let mut first = local.map(|i| slots.idle.remove(i));
        while let Some(mut idle) = first.take().or_else(|| slots.idle.pop()) {
            self.idle.fetch_sub(1, Ordering::Relaxed);
            if idle.since.elapsed() < self.settings.idle_timeout && idle.conn.usable() {
                let permits = slots.permits.clone();
                let pooled = self.wrap(key, idle.conn, idle.permits, true);
                return (Some(pooled), permits, stale);
            }
            stale.push(idle);
        }
        (None, slots.permits.clone(), stale)
    }

    fn wrap(self: &Arc<Self>, key: &K, conn: C, permits: Permits, reused: bool) -> Pooled<K, C> {
        Pooled {
            conn: Some(conn),
            permits: Some(permits),
            key: key.clone(),
            pool: self.clone(),
            reused,
        }
    }

    fn evict_oldest_idle(&self) -> Option<Idle<C>> {
        let mut keys = self.lock();
        let (_, slots) = keys
            .iter_mut()
            .filter(|(_, s)| !s.idle.is_empty())
            .min_by_key(|(_, s)| s.idle[0].since)?;
        self.idle.fetch_sub(1, Ordering::Relaxed);
        Some(slots.idle.remove(0))
    }

    fn put_back(&self, key: K, conn: C, permits: Permits) {
        let mut keys = self.lock();
        if let Some(slots) = keys.get_mut(&key) {
            slots.idle.push(Idle {
                conn,
                since: Instant::now(),
                permits,
            });
            self.idle.fetch_add(1, Ordering::Relaxed);
        }
        drop(keys);
        self.freed.notify_waiters();
    }

    /// Takes the oldest idle connection of a key that `matches` out of the pool, for the caller
    /// to close (it stops counting against the bounds).
    pub fn evict_oldest_where(&self, matches: impl Fn(&K) -> bool) -> Option<C> {
        let mut keys = self.lock();
        let (_, slots) = keys
            .iter_mut()
            .filter(|(k, s)| matches(k) && !s.idle.is_empty())
            .min_by_key(|(_, s)| s.idle[0].since)?;
        let idle = slots.idle.remove(0);
        self.idle.fetch_sub(1, Ordering::Relaxed);
        drop(keys);
        self.freed.notify_waiters();
        Some(idle.conn)
    }

    /// Takes a usable idle connection for `key` out of the pool for good (it stops counting
    /// against the bounds), for callers that keep only idle connections here. Also returns how
    /// many stale or expired connections were closed on the way.
    pub fn detach(&self, key: &K) -> (Option<C>, usize) {
        let timeout = self.settings.idle_timeout;
        let mut stale = Vec::new();
        let mut found = None;
        {
            let mut keys = self.lock();
            if let Some(slots) = keys.get_mut(key) {
                while let Some(mut idle) = slots.idle.pop() {
                    self.idle.fetch_sub(1, Ordering::Relaxed);
                    if idle.since.elapsed() < timeout && idle.conn.usable() {
                        found = Some(idle.conn);
                        break;
                    }
                    stale.push(idle);
                }
            }
        }
        let closed = stale.len();
        drop(stale);
        if found.is_some() || closed > 0 {
            self.freed.notify_waiters();
        }
        (found, closed)
    }

    /// Keeps `conn`, opened outside the pool, idle for `key` if the bounds allow (closing
    /// another key's oldest idle connection at the total bound); hands it back otherwise.
    pub fn adopt(&self, key: K, conn: C) -> Result<(), C> {
        let key_permits = self
            .lock()
            .entry(key.clone())
            .or_insert_with(|| KeySlots {
                permits: Arc::new(Semaphore::new(self.settings.max_per_key)),
                idle: Vec::new(),
            })
            .permits
            .clone();
        let Ok(key_permit) = key_permits.try_acquire_owned() else {
            return Err(conn);
        };
        let total_permit = match self.total.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                drop(self.evict_oldest_idle());
                match self.total.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => return Err(conn),
                }
            }
        };
        let permits = Permits {
            _key: key_permit,
            _total: total_permit,
        };
        self.put_back(key, conn, permits);
        Ok(())
    }

    /// Closes idle connections past the idle timeout and forgets keys with nothing open.
    pub fn reap(&self) {
        let timeout = self.settings.idle_timeout;
        let max_per_key = self.settings.max_per_key;
        let mut expired = Vec::new();
        {
            let mut keys = self.lock();
            for slots in keys.values_mut() {
                let (old, fresh): (Vec<_>, Vec<_>) = std::mem::take(&mut slots.idle)
                    .into_iter()
                    .partition(|i| i.since.elapsed() >= timeout);
                slots.idle = fresh;
                self.idle.fetch_sub(old.len(), Ordering::Relaxed);
                expired.extend(old);
            }
            keys.retain(|_, s| !s.idle.is_empty() || s.permits.available_permits() < max_per_key);
        }
        if !expired.is_empty() {
            drop(expired);
            self.freed.notify_waiters();
        }
    }

    /// Connections open and idle now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            open: self.settings.max_total - self.total.available_permits(),
            idle: self.idle.load(Ordering::Relaxed),
        }
    }
}

/// A connection taken from the pool. [`Pooled::release`] puts it back; dropping it closes it.
pub struct Pooled<K: Hash + Eq + Clone + Send + 'static, C: PoolConnection> {
    conn: Option<C>,
    permits: Option<Permits>,
    key: K,
    pool: Arc<Pool<K, C>>,
    reused: bool,
}

impl<K: Hash + Eq + Clone + Send + 'static, C: PoolConnection> Pooled<K, C> {
    /// True when the connection served an earlier caller (it may have gone stale since).
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// This connection, polled by the calling thread's event loop; `None` when moving it there
    /// failed (it is closed and its slot freed).
    fn moved_here(mut self) -> Option<Self> {
        let conn = self.conn.take()?;
        if conn.is_local() {
            self.conn = Some(conn);
            return Some(self);
        }
        match conn.move_here() {
            Ok(conn) => {
                self.conn = Some(conn);
                Some(self)
            }
            Err(_) => {
                self.permits.take();
                self.pool.freed.notify_waiters();
                None
            }
        }
    }

    /// Returns the connection to the pool for the next caller with the same key.
    pub fn release(mut self) {
        if let (Some(conn), Some(permits)) = (self.conn.take(), self.permits.take()) {
            self.pool.put_back(self.key.clone(), conn, permits);
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static, C: PoolConnection> Drop for Pooled<K, C> {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            self.permits.take();
            self.pool.freed.notify_waiters();
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static, C: PoolConnection> Deref for Pooled<K, C> {
    type Target = C;
    fn deref(&self) -> &C {
        self.conn
            .as_ref()
            .expect("present until released or dropped")
    }
}

impl<K: Hash + Eq + Clone + Send + 'static, C: PoolConnection> DerefMut for Pooled<K, C> {
    fn deref_mut(&mut self) -> &mut C {
        self.conn
            .as_mut()
            .expect("present until released or dropped")
    }
}

/// Who a pooled backend connection is logged in as.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The tenant.
    pub tenant: TenantId,
    /// The Postgres user.
    pub user: String,
    /// The database.
    pub database: String,
}

/// A backend connection logged in by the gateway, outside any client session.
pub struct BackendConn {
    /// The connection, reads buffered (writes pass straight through).
    pub stream: BufReader<Stream>,
    /// Where it is connected.
    pub endpoint: Endpoint,
    /// The backend's cancel key, registered so a later client session can be given a key for it.
    pub cancel: Option<CancelRegistration>,
    /// Transaction status from the last ReadyForQuery (`I`, `T` or `E`).
    pub status: u8,
    /// Session state from an earlier user may remain: reset before the next use.
    pub needs_reset: bool,
    /// Statements prepared on it for `/sql`, emptied by every reset.
    pub statements: StatementCache,
    /// The thread whose event loop polls the connection.
    home: ThreadId,
}

impl BackendConn {
    /// A connection just logged in at `endpoint`, with its backend's cancel key registered.
    pub fn new(stream: Stream, endpoint: Endpoint, cancel: CancelRegistration) -> BackendConn {
        BackendConn {
            stream: BufReader::new(stream),
            endpoint,
            status: b'I',
            needs_reset: false,
            statements: StatementCache::default(),
            cancel: Some(cancel),
            home: std::thread::current().id(),
        }
    }

    /// Appends the messages that reset the session (a rollback if a transaction is open, then
    /// `DISCARD ALL`) to `out`, when a reset is due; returns how many ReadyForQuery replies they
    /// will produce. Callers pipeline them in front of their own messages.
    pub fn take_reset(&mut self, out: &mut Vec<u8>) -> usize {
        if !self.needs_reset && self.status == b'I' {
            return 0;
        }
        self.needs_reset = false;
        // DISCARD ALL deallocates every prepared statement.
        self.statements.clear();
        frontend::reset(out, self.status != b'I')
    }
}

impl PoolConnection for BackendConn {
    fn usable(&mut self) -> bool {
        self.stream.buffer().is_empty() && silent(self.stream.get_mut())
    }

    fn is_local(&self) -> bool {
        self.home == std::thread::current().id()
    }

    fn move_here(self) -> io::Result<Self> {
        // Only taken when usable, so the read buffer is empty and nothing is lost with it.
        let stream = self.stream.into_inner().rebind()?;
        Ok(BackendConn {
            stream: BufReader::new(stream),
            home: std::thread::current().id(),
            ..self
        })
    }
}

/// True when an idle backend connection has nothing to say, checked without waiting: readable
/// means it closed (a fast shutdown on sleep, an administrator's terminate) or sent a FATAL
/// error.
pub(crate) fn silent<S: AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Pin::new(stream).poll_read(&mut cx, &mut buf), Poll::Pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake connection for the pool's bookkeeping: an id, a switch for "still usable", and
    /// whether it is on the caller's event loop or can be moved there.
    struct FakeConn {
        id: usize,
        alive: Arc<std::sync::atomic::AtomicBool>,
        local: bool,
        movable: bool,
    }

    impl FakeConn {
        fn new(id: usize, alive: &Arc<std::sync::atomic::AtomicBool>) -> FakeConn {
            FakeConn {
                id,
                alive: alive.clone(),
                local: true,
                movable: true,
            }
        }
    }

    impl PoolConnection for FakeConn {
        fn usable(&mut self) -> bool {
            self.alive.load(std::sync::atomic::Ordering::Relaxed)
        }

        fn is_local(&self) -> bool {
            self.local
        }

        fn move_here(self) -> io::Result<Self> {
            if !self.movable {
                return Err(io::Error::other("fake: cannot move"));
            }
            Ok(FakeConn {
                local: true,
                ..self
            })
        }
    }

    fn pool(max_per_key: usize, max_total: usize) -> Arc<Pool<&'static str, FakeConn>> {
        Pool::new(PoolSettings {
            max_per_key,
            max_total,
            idle_timeout: Duration::from_secs(60),
            acquire_timeout: Duration::from_millis(50),
        })
    }

    async fn get(
        p: &Arc<Pool<&'static str, FakeConn>>,
        key: &'static str,
        id: usize,
        alive: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Pooled<&'static str, FakeConn>, PoolError<()>> {
        p.get(&key, move || async move { Ok(FakeConn::new(id, alive)) })
            .await
    }

    #[tokio::test]
    async fn released_connections_are_reused_and_dropped_ones_closed() {
        let p = pool(2, 10);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let a = get(&p, "k", 1, &alive).await.ok().unwrap();
        assert!(!a.reused());
        a.release();
        assert_eq!(p.stats(), PoolStats { open: 1, idle: 1 });
        let again = get(&p, "k", 2, &alive).await.ok().unwrap();
        assert_eq!((again.id, again.reused()), (1, true));
        drop(again);
        assert_eq!(p.stats(), PoolStats { open: 0, idle: 0 });
    }

    #[tokio::test]
    async fn bounds_per_key_and_in_total_hold() {
        let p = pool(1, 2);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let a = get(&p, "a", 1, &alive).await.ok().unwrap();
        assert!(matches!(
            get(&p, "a", 2, &alive).await,
            Err(PoolError::Exhausted(_))
        ));
        let b = get(&p, "b", 3, &alive).await.ok().unwrap();
        assert!(matches!(
            get(&p, "c", 4, &alive).await,
            Err(PoolError::Exhausted(_))
        ));
        // An idle connection of another key gives way to a new key at the total bound.
        b.release();
        let c = get(&p, "c", 5, &alive).await.ok().unwrap();
        assert_eq!(c.id, 5);
        assert_eq!(p.stats(), PoolStats { open: 2, idle: 0 });
        // A waiter gets the slot as soon as it is released.
        let waiter = {
            let p = p.clone();
            let alive = alive.clone();
            tokio::spawn(async move { get(&p, "a", 6, &alive).await.map(|c| c.id).ok() })
        };
        tokio::task::yield_now().await;
        a.release();
        assert_eq!(waiter.await.unwrap(), Some(1));
        drop(c);
    }

    #[tokio::test]
    async fn adopted_connections_count_only_while_idle() {
        let p = pool(1, 2);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conn = |id| FakeConn::new(id, &alive);
        assert!(p.adopt("a", conn(1)).is_ok());
        // The key's bound is reached: handed back.
        assert_eq!(p.adopt("a", conn(2)).err().map(|c| c.id), Some(2));
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(p.adopt("b", conn(3)).is_ok());
        // The total bound is reached: the oldest idle connection (a's) gives way.
        assert!(p.adopt("c", conn(4)).is_ok());
        assert_eq!(p.detach(&"a").0.map(|c| c.id), None);
        assert_eq!(p.detach(&"b").0.map(|c| c.id), Some(3));
        // A detached connection no longer counts.
        assert_eq!(p.stats(), PoolStats { open: 1, idle: 1 });
        alive.store(false, std::sync::atomic::Ordering::Relaxed);
        let (found, stale) = p.detach(&"c");
        assert!(found.is_none());
        assert_eq!(stale, 1);
        assert_eq!(p.stats(), PoolStats { open: 0, idle: 0 });
    }

    #[tokio::test]
    async fn stale_and_expired_connections_are_not_reused() {
        let p = Pool::new(PoolSettings {
            max_per_key: 4,
            max_total: 4,
            idle_timeout: Duration::from_millis(20),
            acquire_timeout: Duration::from_millis(50),
        });
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        get(&p, "k", 1, &alive).await.ok().unwrap().release();
        alive.store(false, std::sync::atomic::Ordering::Relaxed);
        let fresh_alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let c = get(&p, "k", 2, &fresh_alive).await.ok().unwrap();
        assert_eq!((c.id, c.reused()), (2, false));
        c.release();
        tokio::time::sleep(Duration::from_millis(30)).await;
        p.reap();
        assert_eq!(p.stats(), PoolStats { open: 0, idle: 0 });
    }

    #[tokio::test]
    async fn connections_of_this_event_loop_go_first_and_others_are_moved_here() {
        let p = pool(4, 4);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let elsewhere = |id, movable| FakeConn {
            local: false,
            movable,
            ..FakeConn::new(id, &alive)
        };
        assert!(p.adopt("k", elsewhere(1, false)).is_ok());
        assert!(p.adopt("k", FakeConn::new(2, &alive)).is_ok());
        assert!(p.adopt("k", elsewhere(3, true)).is_ok());
        // The local one, though not the newest.
        let c = get(&p, "k", 9, &alive).await.ok().unwrap();
        assert_eq!((c.id, c.reused()), (2, true));
        drop(c);
        // Then the newest, moved here on the way out.
        let c = get(&p, "k", 9, &alive).await.ok().unwrap();
        assert_eq!((c.id, c.local), (3, true));
        drop(c);
        // One that cannot be moved is closed, its slot freed, and a new one opened.
        let c = get(&p, "k", 9, &alive).await.ok().unwrap();
        assert_eq!((c.id, c.reused()), (9, false));
        assert_eq!(p.stats(), PoolStats { open: 1, idle: 0 });
    }
}
