//! Caps on client connections: in all, per tenant, and for connections still logging in.
//!
//! A connection that has not logged in yet has proven nothing but costs a socket, so those have
//! their own, smaller cap. When it is full, a connection still logging in is ended to make room:
//! of those that got least far (a login that has started its password exchange is further
//! than one that has only sent its startup message), the oldest. A flood of stalled logins,
//! however fast new ones come, then ends its own connections first and delays nobody whose login
//! takes milliseconds, and every stalled one still ends by `limits.auth_timeout` at the latest.
//!
//! Listeners that serve short requests (the admin API) have a [`ListenerCap`] of their own,
//! counted beside the client caps when those are fitted to the file limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pgwake_routing::TenantId;
use tokio_util::sync::CancellationToken;

/// The caps in force (after fitting them to the process's file limit).
#[derive(Clone, Copy, Debug)]
pub struct CapacitySettings {
    /// Client connections in all (logged in or not).
    pub max_clients: usize,
    /// Client connections that have not finished logging in.
    pub max_unauthenticated: usize,
}

/// File descriptors kept for the listening sockets, backend sockets being opened, files and
/// logs when caps are fitted to the file limit (the admin listener's connections come on top).
const RESERVED_FILES: u64 = 64;

impl CapacitySettings {
    /// Lowers the caps so that every capped connection, with its backend connection, fits in
    /// `open_files` file descriptors, keeping a reserve for everything else and `other_listeners`
    /// for the connections other listeners may hold at once (their own caps); connections still
    /// logging in then get at most half of the room, so that making room for a new login never
    /// runs into the cap on all connections.
    ///
    /// `backend_bound` is the most backend connections the gateway can hold at once, when the
    /// configuration bounds them (every tenant has `max_backend_connections`): clients then get
    /// what those leave, since parked sessions hold none. Without a bound each client may hold
    /// one, so clients get half.
    pub fn fitted_to(
        self,
        open_files: u64,
        backend_bound: Option<u64>,
        other_listeners: u64,
    ) -> CapacitySettings {
        let usable = open_files.saturating_sub(RESERVED_FILES + other_listeners);
        let half = usable / 2;
        let room = backend_bound
            .map_or(half, |b| usable.saturating_sub(b).max(half))
            .max(2) as usize;
        CapacitySettings {
            max_clients: self.max_clients.min(room),
            max_unauthenticated: self.max_unauthenticated.min(room / 2),
        }
    }
}

/// Counts of open client connections, shared by the Postgres and WebSocket listeners.
pub struct Capacity {
    settings: CapacitySettings,
    clients: AtomicUsize,
    per_tenant: Mutex<HashMap<TenantId, usize>>,
    logging_in: Mutex<LoggingIn>,
}

#[derive(Default)]
struct LoggingIn {
    next: u64,
    /// By how far each got, then oldest first; cancelling a token ends that connection.
    open: BTreeMap<Place, CancellationToken>,
}

/// A connection's place among those logging in: how far its login got, then its age.
type Place = (u8, u64);

/// Why a connection is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// The gateway's cap on client connections.
    #[error("too many client connections to the gateway (limit {0})")]
    Gateway(usize),
    /// The tenant's cap on client connections.
    #[error("too many client connections for tenant {tenant} (limit {limit})")]
    Tenant {
        /// The tenant.
        tenant: TenantId,
        /// Its cap.
        limit: usize,
    },
}

impl Capacity {
    /// Counters for these caps.
    pub fn new(settings: CapacitySettings) -> Arc<Capacity> {
        Arc::new(Capacity {
            settings,
            clients: AtomicUsize::new(0),
            per_tenant: Mutex::new(HashMap::new()),
            logging_in: Mutex::new(LoggingIn::default()),
        })
    }

    /// The caps in force.
    pub fn settings(&self) -> CapacitySettings {
        self.settings
    }

    /// Counts a new client connection, as logging in; ends the oldest connection still logging
    /// in when that cap is full. Returns whether the caller ended someone.
    pub fn open(self: &Arc<Self>) -> (ClientSlot, bool) {
        self.clients.fetch_add(1, Ordering::AcqRel);
        let token = CancellationToken::new();
        let mut l = self.lock_logging_in();
        let mut evicted = false;
        while l.open.len() >= self.settings.max_unauthenticated {
            let Some((_, oldest)) = l.open.pop_first() else {
                break;
            };
            oldest.cancel();
            evicted = true;
        }
        let place = (0, l.next);
        l.next += 1;
        l.open.insert(place, token.clone());
        drop(l);
        let slot = ClientSlot {
            capacity: self.clone(),
            logging_in: Some(place),
            ended: Some(token),
            tenant: None,
        };
        (slot, evicted)
    }

    /// Client connections open now.
    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::Acquire)
    }

    /// Client connections still logging in now.
    pub fn logging_in(&self) -> usize {
        self.lock_logging_in().open.len()
    }

    fn lock_logging_in(&self) -> MutexGuard<'_, LoggingIn> {
        self.logging_in.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_tenants(&self) -> MutexGuard<'_, HashMap<TenantId, usize>> {
        self.per_tenant.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The connections one request-serving listener holds: at most `max`. When it is full, the
/// connection that has waited longest without a request in flight is ended to make room, so
/// idle or trickling connections cannot lock out a new client (a scraper, a probe) and a
/// flood ends its own connections first; with every one busy, the new one is refused.
pub struct ListenerCap {
    max: usize,
    open: Mutex<ListenerConnections>,
}

#[derive(Default)]
struct ListenerConnections {
    next: u64,
    /// Connections with a request in flight.
    busy: usize,
    /// The others, longest waiting first; cancelling a token ends that connection.
    waiting: BTreeMap<u64, CancellationToken>,
}

impl ListenerCap {
    /// A cap of `max` connections.
    pub fn new(max: usize) -> Arc<ListenerCap> {
        Arc::new(ListenerCap {
            max,
            open: Mutex::new(ListenerConnections::default()),
        })
    }

    /// Counts a new connection, ending the longest waiting one when the cap is full; `None`
    /// when every connection has a request in flight.
    pub fn open(self: &Arc<Self>) -> Option<ListenerSlot> {
        let mut open = self.lock();
        if open.busy + open.waiting.len() >= self.max {
            let (_, longest) = open.waiting.pop_first()?;
            longest.cancel();
        }
        let token = CancellationToken::new();
        let place = open.next;
        open.next += 1;
        open.waiting.insert(place, token.clone());
        drop(open);
        Some(ListenerSlot {
            cap: self.clone(),
            waiting: Some(place),
            ended: token,
        })
    }

    /// Connections open now.
    pub fn open_now(&self) -> usize {
        let open = self.lock();
        open.busy + open.waiting.len()
    }

    fn lock(&self) -> MutexGuard<'_, ListenerConnections> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One connection's place under a [`ListenerCap`], for its whole life.
pub struct ListenerSlot {
    cap: Arc<ListenerCap>,
    /// Its place among the waiting connections; `None` while a request is in flight.
    waiting: Option<u64>,
    ended: CancellationToken,
}

impl ListenerSlot {
    /// The token cancelled when the connection must end to make room.
    pub fn eviction(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// A request is in flight: the connection is not ended to make room until it is done.
    pub fn busy(&mut self) {
        let Some(place) = self.waiting.take() else {
            return;
        };
        let mut open = self.cap.lock();
        // Not listed any more once it was ended to make room.
        if open.waiting.remove(&place).is_some() {
            open.busy += 1;
        } else {
            self.waiting = Some(place);
        }
    }

    /// Its request is done: it waits for the next one, as the newest waiting connection.
    pub fn done(&mut self) {
        if self.waiting.is_some() {
            return;
        }
        let mut open = self.cap.lock();
        open.busy -= 1;
        let place = open.next;
        open.next += 1;
        open.waiting.insert(place, self.ended.clone());
        self.waiting = Some(place);
    }
}

impl Drop for ListenerSlot {
    fn drop(&mut self) {
        let mut open = self.cap.lock();
        match self.waiting {
            Some(place) => {
                open.waiting.remove(&place);
            }
            None => open.busy -= 1,
        }
    }
}

/// One client connection's place in the counts, for its whole life.
pub struct ClientSlot {
    capacity: Arc<Capacity>,
    logging_in: Option<Place>,
    /// Cancelled to end the connection to make room; dropped at login, after which nothing
    /// cancels it (a logged-in session, parked ones included, should not carry it).
    ended: Option<CancellationToken>,
    tenant: Option<TenantId>,
}

impl ClientSlot {
    /// Completes when the connection must end to make room (it was the oldest still logging
    /// in); never once it has logged in.
    pub fn evicted(&self) -> impl Future<Output = ()> + Send + '_ {
        let ended = self.ended.as_ref();
        async move {
            match ended {
                Some(t) => t.cancelled().await,
                None => std::future::pending().await,
            }
        }
    }

    /// The token cancelled when the connection must end to make room, for a caller that lends
    /// the slot out meanwhile (after login, one nothing cancels).
    pub fn eviction(&self) -> CancellationToken {
        self.ended.clone().unwrap_or_default()
    }

    /// Refuses the connection when the gateway holds more client connections than its cap.
    pub fn check_gateway(&self) -> Result<(), Full> {
        let max = self.capacity.settings.max_clients;
        if self.capacity.clients() > max {
            return Err(Full::Gateway(max));
        }
        Ok(())
    }

    /// Counts the connection against its tenant's cap (`None`: no cap), or refuses it.
    pub fn claim_tenant(&mut self, tenant: &TenantId, limit: Option<usize>) -> Result<(), Full> {
        if self.tenant.is_some() {
            return Ok(());
        }
        let mut counts = self.capacity.lock_tenants();
        let n = counts.entry(tenant.clone()).or_default();
        if let Some(limit) = limit
            && *n >= limit
        {
            if *n == 0 {
                counts.remove(tenant);
            }
            return Err(Full::Tenant {
                tenant: tenant.clone(),
                limit,
            });
        }
        *n += 1;
        self.tenant = Some(tenant.clone());
        Ok(())
    }

    /// The connection's login got further (its password exchange began): it makes room for
    /// newer connections only after every one that got less far.
    pub fn progressed(&mut self) {
        let Some((step, id)) = self.logging_in.filter(|(step, _)| *step < u8::MAX) else {
            return;
        };
        let mut l = self.capacity.lock_logging_in();
        // Not listed any more once it was ended to make room.
        if let Some(token) = l.open.remove(&(step, id)) {
            l.open.insert((step + 1, id), token);
            self.logging_in = Some((step + 1, id));
        }
    }

    /// The connection logged in: it no longer counts as logging in and is never evicted.
    pub fn logged_in(&mut self) {
        self.ended = None;
        if let Some(place) = self.logging_in.take() {
            self.capacity.lock_logging_in().open.remove(&place);
        }
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.logged_in();
        self.capacity.clients.fetch_sub(1, Ordering::AcqRel);
        if let Some(t) = self.tenant.take() {
            let mut counts = self.capacity.lock_tenants();
            if let Some(n) = counts.get_mut(&t) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&t);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(max_clients: usize, max_unauthenticated: usize) -> Arc<Capacity> {
        Capacity::new(CapacitySettings {
            max_clients,
            max_unauthenticated,
        })
    }

    #[test]
    fn the_oldest_connection_logging_in_makes_room() {
        let cap = capacity(10, 2);
        let (a, _) = cap.open();
        let (mut b, _) = cap.open();
        b.logged_in();
        let (c, evicted) = cap.open();
        assert!(!evicted, "b logged in: room for c");
        let (_d, evicted) = cap.open();
        assert!(evicted);
        assert!(a.eviction().is_cancelled(), "a was the oldest logging in");
        assert!(!b.eviction().is_cancelled() && !c.eviction().is_cancelled());
        assert_eq!(cap.logging_in(), 2);
        assert_eq!(cap.clients(), 4);
        drop(a);
        assert_eq!(cap.clients(), 3);
    }

    #[test]
    fn connections_that_got_further_are_ended_last() {
        let cap = capacity(10, 2);
        let (mut honest, _) = cap.open();
        let (stalled, _) = cap.open();
        honest.progressed();
        let (_newer, evicted) = cap.open();
        assert!(evicted);
        assert!(
            stalled.eviction().is_cancelled(),
            "the one that got less far goes first"
        );
        assert!(!honest.eviction().is_cancelled(), "though it is the oldest");
        drop(stalled);
        assert_eq!(cap.logging_in(), 2);
        honest.logged_in();
        assert_eq!(cap.logging_in(), 1);
    }

    #[test]
    fn gateway_and_tenant_caps_refuse_and_count_down() {
        let cap = capacity(2, 10);
        let t = TenantId::parse("t").unwrap();
        let (mut a, _) = cap.open();
        let (mut b, _) = cap.open();
        assert!(a.check_gateway().is_ok());
        let (c, _) = cap.open();
        assert_eq!(c.check_gateway(), Err(Full::Gateway(2)));
        drop(c);
        a.claim_tenant(&t, Some(1)).unwrap();
        assert!(matches!(
            b.claim_tenant(&t, Some(1)),
            Err(Full::Tenant { limit: 1, .. })
        ));
        drop(a);
        b.claim_tenant(&t, Some(1)).unwrap();
        assert_eq!(cap.lock_tenants().get(&t), Some(&1));
        drop(b);
        assert!(cap.lock_tenants().is_empty());
    }

    #[test]
    fn caps_fit_the_file_limit() {
        let s = CapacitySettings {
            max_clients: 10_000,
            max_unauthenticated: 1_000,
        };
        let fitted = s.fitted_to(256, None, 0);
        assert_eq!(fitted.max_clients, 96);
        assert_eq!(fitted.max_unauthenticated, 48);
        assert_eq!(s.fitted_to(1 << 20, None, 0).max_clients, 10_000);
        // Bounded backend connections leave the rest to clients (parked sessions hold none).
        let bounded = s.fitted_to(20_000, Some(2_000), 0);
        assert_eq!(bounded.max_clients, 10_000);
        assert_eq!(s.fitted_to(12_064, Some(2_000), 0).max_clients, 10_000);
        assert_eq!(s.fitted_to(12_063, Some(2_000), 0).max_clients, 9_999);
        // A bound above half the room never gives clients less than half.
        assert_eq!(s.fitted_to(256, Some(10_000), 0).max_clients, 96);
        // Other listeners' caps come out of the room first.
        assert_eq!(s.fitted_to(256, None, 64).max_clients, 64);
    }

    #[test]
    fn a_full_listener_ends_its_longest_waiting_connection() {
        let cap = ListenerCap::new(2);
        let mut scraping = cap.open().unwrap();
        let idle = cap.open().unwrap();
        scraping.busy();
        let newer = cap.open().unwrap();
        assert!(idle.ended.is_cancelled(), "the waiting one made room");
        assert!(
            !scraping.ended.is_cancelled(),
            "a request in flight is never ended"
        );
        drop(idle);
        assert_eq!(cap.open_now(), 2);
        scraping.done();
        // The scraper now waits for its next request, newer than `newer`.
        let newest = cap.open().unwrap();
        assert!(newer.ended.is_cancelled() && !scraping.ended.is_cancelled());
        drop(newer);
        let (mut a, mut b) = (scraping, newest);
        a.busy();
        b.busy();
        assert!(cap.open().is_none(), "every connection busy: refused");
        drop(a);
        assert_eq!(cap.open_now(), 1);
    }
}
