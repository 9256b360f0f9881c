//! Failed-authentication throttle. It bounds guessing three ways without ever refusing the right
//! password from a source that did not fail:
//!
//! - per source (the client's IPv4 address, or its IPv6 /64, which one host usually holds
//!   whole) and tenant: a source that used up its free failures waits for every user of the
//!   tenant, with a wait that doubles with each further failure;
//! - per (tenant, user): once the user's failures from all sources together use up the free
//!   failures, the account is *under attack* for a doubling wait. Sources that failed against
//!   it then wait as above, and a source with no failure on record gets exactly one
//!   evaluated attempt at a time: a wrong one makes it wait, a right one proves it (a source
//!   that logged in as the user lately is never held back by the account's count). So
//!   guessing from many sources costs one source per guess, while the user logging in from
//!   anywhere that did not fail is let in.
//!
//! An attempt is *reserved* when its proof (or password) arrives, before it is checked: it counts
//! as a failure at once, so connections opened together and answered together cannot all slip
//! past the count (a password verified against the same credential moments ago, as `/sql`
//! clients resend with each request, is a known success and reserves nothing; being blocked
//! still refuses it). With `free_failures = N`, exactly N attempts from a source are evaluated;
//! the next is refused for `base`, and every further evaluated failure doubles the wait up to
//! `max`. A success takes back only its own (source, tenant, user) failures, so logging in as
//! one user does not clear guesses made for another. An unproven source's attempts on an
//! account under attack wait for its attempt in flight (within the login's deadline) rather
//! than being refused, so a client opening several connections at once is not turned away.
//!
//! - per source across tenants: made-up tenant names do not buy fresh free failures. Once a
//!   source's failures on all tenants together use up `source_free_failures`, its attempts on
//!   every tenant wait, doubling as above. This count is keyed by the source alone, so names
//!   sprayed from one source add no entries to it and cannot evict it: evicting the source's
//!   (source, tenant) records to reset a backoff leaves the source's own count in place.
//!
//! A blocked attempt is delayed rather than refused: it waits out the current wait and is then
//! evaluated, if the wait ends before the attempt's deadline (the login's); only an attempt
//! whose wait outlasts its deadline is refused. Each evaluated attempt is reserved (and so
//! extends the wait) before the next waiter can go, so a blocked source's attempts are
//! evaluated one at a time and guessing stays as slow as refusing made it, while an honest
//! client sharing the address with a failing one gets in late instead of being turned away.
//! Its success takes its own reservation back, shortening the wait to what the remaining
//! failures call for.
//!
//! With a [`SharedThrottle`] attached, the fleet's counts (kept on Kubernetes Leases) block
//! attempts too, by the same rules; this replica's own counts work as without it.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::sync::Cache;
use pgwake_routing::TenantId;
use tokio::sync::Notify;

pub use super::ThrottleSettings;
use super::shared_throttle::SharedThrottle;

/// Failures counted under one key, and until when further attempts are refused.
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    failures: u32,
    blocked_until: Option<Instant>,
}

impl Record {
    fn wait(&self, now: Instant) -> Option<Duration> {
        self.blocked_until?.checked_duration_since(now)
    }
}

/// One attempter's attempts not taken back: checks still running, and failures.
#[derive(Clone, Copy, Debug, Default)]
struct Attempts {
    in_flight: u32,
    failed: u32,
}

/// One who: the key under each count.
type Address = (IpAddr, TenantId);
type Account = (TenantId, String);
type Attempter = (IpAddr, TenantId, String);

/// The source a client address counts as: an IPv4 address as it is (an IPv4-mapped IPv6
/// address as IPv4), an IPv6 address as its /64, since one host usually holds a whole /64 and
/// could otherwise guess from as many addresses as it likes.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

/// What the counts say about an attempt that is ready to be checked.
enum Decision {
    Go,
    Refuse(Duration),
    /// The account is under attack and this unproven source has an attempt in flight: its
    /// outcome decides.
    Wait,
}

/// Failure counts per (source, tenant) and per (tenant, user).
pub struct Throttle {
    settings: ThrottleSettings,
    /// The caches change together under this lock, so a reservation sees every earlier one.
    counts: Mutex<Counts>,
    /// Woken whenever a reserved attempt settles (for attempts waiting on one).
    settled: Notify,
    /// The fleet's counts, when failures are shared across replicas.
    shared: Option<Arc<SharedThrottle>>,
}

struct Counts {
    by_address: Cache<Address, Record>,
    /// Failures per source across tenants, so made-up tenant names are not free.
    by_source: Cache<IpAddr, Record>,
    by_account: Cache<Account, Record>,
    /// Each attempter's share of both counts, taken back by its success.
    by_attempter: Cache<Attempter, Attempts>,
    /// Sources that logged in as a user lately: the account's count never holds them back.
    proven: Cache<Attempter, ()>,
}

/// A reserved attempt being checked. [`Reservation::success`] takes it back; dropped otherwise
/// (a wrong password, a client gone mid-check), it stays counted as a failure.
pub struct Reservation<'a> {
    throttle: &'a Throttle,
    attempter: Attempter,
}

impl Reservation<'_> {
    /// The attempt succeeded: takes back this attempter's failures and this reservation.
    pub fn success(self) {
        let (ip, tenant, user) = &self.attempter;
        self.throttle.settle(*ip, tenant, user, true);
        std::mem::forget(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let (ip, tenant, user) = &self.attempter;
        self.throttle.settle(*ip, tenant, user, false);
    }
}

impl Throttle {
    /// A throttle with these settings; records expire once they cannot matter any more.
    pub fn new(settings: ThrottleSettings) -> Throttle {
        let idle = settings.max * 4;
        let capacity = settings.capacity;
        fn cache<K, V>(capacity: u64, idle: Duration) -> Cache<K, V>
        where
            K: std::hash::Hash + Eq + Send + Sync + 'static,
            V: Clone + Send + Sync + 'static,
        {
            Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(idle)
                .build()
        }
        let counts = Counts {
            by_address: cache(capacity, idle),
            by_source: cache(capacity, idle),
            by_account: cache(capacity, idle),
            by_attempter: cache(capacity, idle),
            proven: cache(capacity, idle),
        };
        Throttle {
            settings,
            counts: Mutex::new(counts),
            settled: Notify::new(),
            shared: None,
        }
    }

    /// This throttle, also blocking on the fleet's counts and recording outcomes there.
    pub fn with_shared(mut self, shared: Arc<SharedThrottle>) -> Throttle {
        self.shared = Some(shared);
        self
    }

    fn shared_wait(&self, source: IpAddr, tenant: &TenantId, user: &str) -> Option<Duration> {
        self.shared.as_ref()?.blocked_for(source, tenant, user)
    }

    /// Tells the fleet's counts how an evaluated attempt ended (a no-op without them).
    pub async fn share_outcome(&self, ip: IpAddr, tenant: &TenantId, user: &str, failed: bool) {
        if let Some(shared) = &self.shared {
            shared.record(source_of(ip), tenant, user, failed).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long attempts from `ip` for `user` of `tenant` must still wait, if at all (a cheap
    /// look before any work; [`Throttle::reserve`] is the authority).
    pub fn blocked_for(&self, ip: IpAddr, tenant: &TenantId, user: &str) -> Option<Duration> {
        let source = source_of(ip);
        let counts = self.lock();
        let now = Instant::now();
        let address = counts.by_address.get(&(source, tenant.clone()));
        let across = counts.by_source.get(&source);
        let attempter = (source, tenant.clone(), user.to_owned());
        let failed = counts
            .by_attempter
            .get(&attempter)
            .is_some_and(|a| a.failed > 0);
        let account = counts
            .by_account
            .get(&(tenant.clone(), user.to_owned()))
            .filter(|_| failed && !counts.proven.contains_key(&attempter));
        let local = [address, across, account]
            .into_iter()
            .flatten()
            .filter_map(|r| r.wait(now))
            .max();
        drop(counts);
        local.max(self.shared_wait(source, tenant, user))
    }

    /// Reserves an attempt whose proof just arrived: counts it as a failure now, or, when the
    /// counts block it, waits the block out and tries again, refusing it (with the wait left)
    /// only when the wait would outlast `deadline`. An unproven source's attempt on an account
    /// under attack first waits for the source's attempt in flight, if any.
    pub async fn reserve(
        &self,
        ip: IpAddr,
        tenant: &TenantId,
        user: &str,
        deadline: Instant,
    ) -> Result<Reservation<'_>, Duration> {
        let source = source_of(ip);
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            // Registered before the counts are read, so a settling in between still wakes it.
            settled.as_mut().enable();
            match self.decide(source, tenant, user) {
                Decision::Go => {
                    return Ok(Reservation {
                        throttle: self,
                        attempter: (source, tenant.clone(), user.to_owned()),
                    });
                }
                Decision::Refuse(wait) => {
                    if Instant::now() + wait > deadline {
                        return Err(wait);
                    }
                    // Whoever wakes first and is reserved extends the wait for the others, so
                    // the waiters are evaluated one per wait.
                    tracing::debug!(%source, %tenant, wait_ms = wait.as_millis() as u64, "login attempt delayed by the throttle");
                    tokio::time::sleep(wait).await;
                }
                Decision::Wait => settled.await,
            }
        }
    }

    /// Checks the counts for an attempt and, when it may go, counts it.
    fn decide(&self, source: IpAddr, tenant: &TenantId, user: &str) -> Decision {
        let counts = self.lock();
        let now = Instant::now();
        let address = (source, tenant.clone());
        let account = (tenant.clone(), user.to_owned());
        let attempter = (source, tenant.clone(), user.to_owned());
        let a = counts.by_address.get(&address).unwrap_or_default();
        let b = counts.by_account.get(&account).unwrap_or_default();
        let c = counts.by_source.get(&source).unwrap_or_default();
        let mut mine = counts.by_attempter.get(&attempter).unwrap_or_default();
        let blocked = a.wait(now).max(c.wait(now));
        if let Some(wait) = blocked.max(self.shared_wait(source, tenant, user)) {
            return Decision::Refuse(wait);
        }
        if let Some(wait) = b.wait(now)
            && !counts.proven.contains_key(&attempter)
        {
            if mine.failed > 0 {
                return Decision::Refuse(wait);
            }
            if mine.in_flight > 0 {
                return Decision::Wait;
            }
        }
        let (free, source_free) = (
            self.settings.free_failures,
            self.settings.source_free_failures,
        );
        counts.by_address.insert(address, self.failed(a, now, free));
        counts.by_account.insert(account, self.failed(b, now, free));
        counts
            .by_source
            .insert(source, self.failed(c, now, source_free));
        mine.in_flight += 1;
        counts.by_attempter.insert(attempter, mine);
        Decision::Go
    }

    /// A login succeeded without a reservation (a password recalled as verified): takes back
    /// this attempter's failures from both counts, as a reserved success does.
    pub fn success(&self, ip: IpAddr, tenant: &TenantId, user: &str) {
        let source = source_of(ip);
        let counts = self.lock();
        let attempter = (source, tenant.clone(), user.to_owned());
        // Most successes have nothing to take back; a look is cheaper than a removal.
        if !counts.by_attempter.contains_key(&attempter) {
            if !counts.proven.contains_key(&attempter) {
                counts.proven.insert(attempter, ());
            }
            return;
        }
        drop(counts);
        self.take_back(source, tenant, user, 0);
    }

    /// A reservation ended: a success takes back this attempter's failures and the
    /// reservation and proves the source; a failure stays counted.
    fn settle(&self, source: IpAddr, tenant: &TenantId, user: &str, succeeded: bool) {
        if succeeded {
            self.take_back(source, tenant, user, 1);
        } else {
            let counts = self.lock();
            let attempter = (source, tenant.clone(), user.to_owned());
            let mut mine = counts.by_attempter.get(&attempter).unwrap_or_default();
            mine.in_flight = mine.in_flight.saturating_sub(1);
            mine.failed += 1;
            counts.by_attempter.insert(attempter, mine);
        }
        self.settled.notify_waiters();
    }

    /// Takes this attempter's failures and `reserved` of its attempts in flight back from
    /// both counts, and proves its source for the user.
    fn take_back(&self, source: IpAddr, tenant: &TenantId, user: &str, reserved: u32) {
        let counts = self.lock();
        let attempter = (source, tenant.clone(), user.to_owned());
        let mut mine = counts.by_attempter.get(&attempter).unwrap_or_default();
        let back = mine.failed + reserved.min(mine.in_flight);
        mine.in_flight -= reserved.min(mine.in_flight);
        mine.failed = 0;
        if mine.in_flight == 0 {
            counts.by_attempter.invalidate(&attempter);
        } else {
            counts.by_attempter.insert(attempter.clone(), mine);
        }
        counts.proven.insert(attempter, ());
        let now = Instant::now();
        let free = self.settings.free_failures;
        let settle = |r: Record, free: u32| -> Option<Record> {
            let failures = r.failures.saturating_sub(back);
            // The wait the remaining failures call for, never longer than the one in force: a
            // success does not leave behind the doubling its own reservation added.
            let remaining = self.blocked_until(failures, now, free);
            (failures > 0).then(|| Record {
                failures,
                blocked_until: r.blocked_until.zip(remaining).map(|(a, b)| a.min(b)),
            })
        };
        if let Some(r) = counts.by_source.get(&source) {
            match settle(r, self.settings.source_free_failures) {
                Some(r) => counts.by_source.insert(source, r),
                None => counts.by_source.invalidate(&source),
            }
        }
        let address = (source, tenant.clone());
        if let Some(r) = counts.by_address.get(&address) {
            match settle(r, free) {
                Some(r) => counts.by_address.insert(address, r),
                None => counts.by_address.invalidate(&address),
            }
        }
        let account = (tenant.clone(), user.to_owned());
        if let Some(r) = counts.by_account.get(&account) {
            match settle(r, free) {
                Some(r) => counts.by_account.insert(account, r),
                None => counts.by_account.invalidate(&account),
            }
        }
    }

    /// The record after one more failure: blocked once the `free` failures are used up.
    fn failed(&self, r: Record, now: Instant, free: u32) -> Record {
        let failures = r.failures + 1;
        Record {
            failures,
            blocked_until: self.blocked_until(failures, now, free),
        }
    }

    /// Until when `failures` block from `now`, with `free` failures before the first wait.
    fn blocked_until(&self, failures: u32, now: Instant, free: u32) -> Option<Instant> {
        let s = &self.settings;
        (failures >= free).then(|| {
            let doublings = (failures - free).min(20);
            now + (s.base * 2u32.pow(doublings)).min(s.max)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(free_failures: u32) -> Throttle {
        Throttle::new(ThrottleSettings {
            free_failures,
            base: Duration::from_secs(1),
            max: Duration::from_secs(3),
            source_free_failures: 1000,
            capacity: 100,
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// One attempt that fails (reserved, then dropped): whether it was evaluated.
    async fn guess(t: &Throttle, from: &str, tenant: &TenantId, user: &str) -> bool {
        t.reserve(ip(from), tenant, user, Instant::now())
            .await
            .is_ok()
    }

    /// One attempt with the right password: whether it was let in.
    async fn login(t: &Throttle, from: &str, tenant: &TenantId, user: &str) -> bool {
        match t.reserve(ip(from), tenant, user, Instant::now()).await {
            Ok(r) => {
                r.success();
                true
            }
            Err(_) => false,
        }
    }

    #[tokio::test]
    async fn exactly_the_free_failures_are_evaluated_then_waits_double() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        for _ in 0..3 {
            assert!(guess(&t, "10.0.0.1", &a, "u").await);
        }
        let first = t
            .reserve(ip("10.0.0.1"), &a, "u", Instant::now())
            .await
            .err()
            .unwrap();
        assert!(first <= Duration::from_secs(1) && first > Duration::from_millis(900));
        assert!(
            t.blocked_for(ip("10.0.0.1"), &a, "other").is_some(),
            "same source"
        );
        assert!(
            t.blocked_for(ip("10.0.0.2"), &a, "u").is_none(),
            "another source that never failed is not held back by the account's count"
        );
        assert!(t.blocked_for(ip("10.0.0.2"), &a, "other").is_none());
    }

    #[tokio::test]
    async fn reservations_count_before_their_outcome() {
        // Sixty proofs arriving together: only the free ones are evaluated.
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        let mut held = Vec::new();
        for _ in 0..60 {
            if let Ok(r) = t
                .reserve(ip("10.0.0.1"), &a, "victim", Instant::now())
                .await
            {
                held.push(r);
            }
        }
        assert_eq!(held.len(), 3);
    }

    #[tokio::test]
    async fn a_success_takes_back_only_its_own_failures() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        let me = "10.0.0.1";
        // Two wrong guesses for victim, then a good login as pgwake.
        assert!(guess(&t, me, &a, "victim").await);
        assert!(guess(&t, me, &a, "victim").await);
        assert!(login(&t, me, &a, "pgwake").await);
        assert!(guess(&t, me, &a, "victim").await, "the third guess is free");
        assert!(
            !guess(&t, me, &a, "victim").await,
            "pgwake's login did not clear victim's guesses"
        );
        // A user's own success clears what it owes.
        let u = throttle(3);
        assert!(guess(&u, me, &a, "pgwake").await);
        assert!(guess(&u, me, &a, "pgwake").await);
        assert!(login(&u, me, &a, "pgwake").await);
        assert!(u.blocked_for(ip(me), &a, "pgwake").is_none());
        for _ in 0..3 {
            assert!(
                guess(&u, me, &a, "victim").await,
                "nothing left of pgwake's"
            );
        }
    }

    #[tokio::test]
    async fn guesses_from_one_source_never_lock_the_user_out_elsewhere() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        for _ in 0..3 {
            assert!(guess(&t, "127.0.0.9", &a, "pgwake").await);
        }
        assert!(
            !guess(&t, "127.0.0.9", &a, "pgwake").await,
            "the guesser waits"
        );
        for _ in 0..10 {
            assert!(login(&t, "127.0.0.10", &a, "pgwake").await);
        }
        assert!(!login(&t, "127.0.0.9", &a, "pgwake").await, "still waits");
    }

    #[tokio::test]
    async fn an_account_under_attack_gives_each_new_source_one_guess() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        for i in 1..=3 {
            assert!(guess(&t, &format!("10.0.1.{i}"), &a, "pgwake").await);
        }
        // Under attack: a new source's one wrong guess blocks it for this user at once.
        assert!(guess(&t, "10.0.2.1", &a, "pgwake").await);
        assert!(!guess(&t, "10.0.2.1", &a, "pgwake").await);
        // A new source with the right password still gets in, and so do its later logins.
        assert!(login(&t, "10.0.2.2", &a, "pgwake").await);
        assert!(login(&t, "10.0.2.2", &a, "pgwake").await);
        // Another user of the tenant is untouched.
        assert!(guess(&t, "10.0.2.1", &a, "other").await);
    }

    #[tokio::test]
    async fn a_new_sources_attempts_on_an_attacked_account_wait_for_the_first() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        for i in 1..=3 {
            assert!(guess(&t, &format!("10.0.1.{i}"), &a, "pgwake").await);
        }
        let first = t
            .reserve(ip("10.0.2.2"), &a, "pgwake", Instant::now())
            .await
            .ok()
            .unwrap();
        let second = t.reserve(ip("10.0.2.2"), &a, "pgwake", Instant::now());
        tokio::pin!(second);
        assert!(
            futures_util::FutureExt::now_or_never(second.as_mut()).is_none(),
            "waits for the first"
        );
        first.success();
        assert!(second.await.is_ok(), "let in once the source proved itself");
    }

    #[test]
    fn ipv6_sources_are_their_64_prefix() {
        assert_eq!(source_of(ip("2001:db8:1:2:3:4:5:6")), ip("2001:db8:1:2::"));
        assert_eq!(source_of(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(source_of(ip("10.0.0.1")), ip("10.0.0.1"));
    }
}
