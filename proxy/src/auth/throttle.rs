//! Failed-authentication throttle, counted two ways: per (client IP, tenant), so one address
//! cannot guess through many user names, and per (tenant, user), so many addresses cannot guess
//! one user's password.
//!
//! An attempt is *reserved* when its proof (or password) arrives, before it is checked: it counts
//! as a failure at once, so connections opened together and answered together cannot all slip
//! past the count (a password verified against the same credential moments ago, as `/sql`
//! clients resend with each request, is a known success and reserves nothing; being blocked
//! still refuses it). With `free_failures = N`, exactly N attempts are evaluated; the next is
//! refused for `base`, and every further evaluated failure doubles the wait up to `max`. A
//! success takes back only its own (IP, tenant, user) failures, so logging in as one user does
//! not clear guesses made for another.
//!
//! With a [`SharedThrottle`] attached, the fleet's counts (kept on Kubernetes Leases) block
//! attempts too; this replica's own counts work as without it.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::sync::Cache;
use pgwake_routing::TenantId;

pub use super::ThrottleSettings;
use super::shared_throttle::SharedThrottle;

/// Failures counted under one key, and until when further attempts are refused.
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    failures: u32,
    blocked_until: Option<Instant>,
}

/// One who: the key under each count.
type Address = (IpAddr, TenantId);
type Account = (TenantId, String);
type Attempter = (IpAddr, TenantId, String);

/// Failure counts per (client IP, tenant) and per (tenant, user).
pub struct Throttle {
    settings: ThrottleSettings,
    /// The three caches change together under this lock, so a reservation sees every earlier
    /// one.
    counts: Mutex<Counts>,
    /// The fleet's counts, when failures are shared across replicas.
    shared: Option<Arc<SharedThrottle>>,
}

struct Counts {
    by_address: Cache<Address, Record>,
    by_account: Cache<Account, Record>,
    /// Each attempter's share of both counts, taken back by its success.
    by_attempter: Cache<Attempter, u32>,
}

impl Throttle {
    /// A throttle with these settings; records expire once they cannot matter any more.
    pub fn new(settings: ThrottleSettings) -> Throttle {
        let idle = settings.max * 4;
        let capacity = settings.capacity;
        let counts = Counts {
            by_address: Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(idle)
                .build(),
            by_account: Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(idle)
                .build(),
            by_attempter: Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(idle)
                .build(),
        };
        Throttle {
            settings,
            counts: Mutex::new(counts),
            shared: None,
        }
    }

    /// This throttle, also blocking on the fleet's counts and recording outcomes there.
    pub fn with_shared(mut self, shared: Arc<SharedThrottle>) -> Throttle {
        self.shared = Some(shared);
        self
    }

    fn shared_wait(&self, ip: IpAddr, tenant: &TenantId, user: &str) -> Option<Duration> {
        self.shared.as_ref()?.blocked_for(ip, tenant, user)
    }

    /// Tells the fleet's counts how an evaluated attempt ended (a no-op without them).
    pub async fn share_outcome(&self, ip: IpAddr, tenant: &TenantId, user: &str, failed: bool) {
        if let Some(shared) = &self.shared {
            shared.record(ip, tenant, user, failed).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long attempts from `ip` for `user` of `tenant` must still wait, if at all (a cheap
    /// look before any work; [`Throttle::reserve`] is the authority).
    pub fn blocked_for(&self, ip: IpAddr, tenant: &TenantId, user: &str) -> Option<Duration> {
        let counts = self.lock();
        let now = Instant::now();
        let address = counts.by_address.get(&(ip, tenant.clone()));
        let account = counts.by_account.get(&(tenant.clone(), user.to_owned()));
        let local = [address, account]
            .into_iter()
            .flatten()
            .filter_map(|r| r.blocked_until?.checked_duration_since(now))
            .max();
        drop(counts);
        local.max(self.shared_wait(ip, tenant, user))
    }

    /// Reserves an attempt whose proof just arrived: counts it as a failure now, or refuses it
    /// (with the wait left) when either count is blocked.
    pub fn reserve(&self, ip: IpAddr, tenant: &TenantId, user: &str) -> Result<(), Duration> {
        let counts = self.lock();
        let now = Instant::now();
        let address = (ip, tenant.clone());
        let account = (tenant.clone(), user.to_owned());
        let a = counts.by_address.get(&address).unwrap_or_default();
        let b = counts.by_account.get(&account).unwrap_or_default();
        let wait = [a, b]
            .iter()
            .filter_map(|r| r.blocked_until?.checked_duration_since(now))
            .max()
            .max(self.shared_wait(ip, tenant, user));
        if let Some(wait) = wait {
            return Err(wait);
        }
        counts.by_address.insert(address, self.failed(a, now));
        counts.by_account.insert(account, self.failed(b, now));
        let attempter = (ip, tenant.clone(), user.to_owned());
        let mine = counts.by_attempter.get(&attempter).unwrap_or(0);
        counts.by_attempter.insert(attempter, mine + 1);
        Ok(())
    }

    /// A reserved attempt succeeded: takes back this attempter's failures (its reservation
    /// included) from both counts; other users' and other addresses' failures stay.
    pub fn success(&self, ip: IpAddr, tenant: &TenantId, user: &str) {
        let counts = self.lock();
        let attempter = (ip, tenant.clone(), user.to_owned());
        // Most successes have nothing to take back; a look is cheaper than a removal.
        if !counts.by_attempter.contains_key(&attempter) {
            return;
        }
        let Some(mine) = counts.by_attempter.remove(&attempter) else {
            return;
        };
        let settle = |r: Record| -> Option<Record> {
            let failures = r.failures.saturating_sub(mine);
            (failures > 0).then(|| Record {
                failures,
                blocked_until: r
                    .blocked_until
                    .filter(|_| failures >= self.settings.free_failures),
            })
        };
        let address = (ip, tenant.clone());
        if let Some(r) = counts.by_address.get(&address) {
            match settle(r) {
                Some(r) => counts.by_address.insert(address, r),
                None => counts.by_address.invalidate(&address),
            }
        }
        let account = (tenant.clone(), user.to_owned());
        if let Some(r) = counts.by_account.get(&account) {
            match settle(r) {
                Some(r) => counts.by_account.insert(account, r),
                None => counts.by_account.invalidate(&account),
            }
        }
    }

    /// The record after one more failure: blocked once the free failures are used up.
    fn failed(&self, r: Record, now: Instant) -> Record {
        let s = &self.settings;
        let failures = r.failures + 1;
        let blocked_until = (failures >= s.free_failures).then(|| {
            let doublings = (failures - s.free_failures).min(20);
            now + (s.base * 2u32.pow(doublings)).min(s.max)
        });
        Record {
            failures,
            blocked_until,
        }
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
            capacity: 100,
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn exactly_the_free_failures_are_evaluated_then_waits_double() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        for _ in 0..3 {
            assert!(t.reserve(ip("10.0.0.1"), &a, "u").is_ok());
        }
        let first = t.reserve(ip("10.0.0.1"), &a, "u").unwrap_err();
        assert!(first <= Duration::from_secs(1) && first > Duration::from_millis(900));
        assert!(
            t.blocked_for(ip("10.0.0.1"), &a, "other").is_some(),
            "same address"
        );
        assert!(
            t.blocked_for(ip("10.0.0.2"), &a, "u").is_some(),
            "same account"
        );
        assert!(t.blocked_for(ip("10.0.0.2"), &a, "other").is_none());
    }

    #[test]
    fn reservations_count_before_their_outcome() {
        // Sixty proofs arriving together: only the free ones are evaluated.
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        let evaluated = (0..60)
            .filter(|_| t.reserve(ip("10.0.0.1"), &a, "victim").is_ok())
            .count();
        assert_eq!(evaluated, 3);
    }

    #[test]
    fn a_success_takes_back_only_its_own_failures() {
        let t = throttle(3);
        let a = TenantId::parse("a").unwrap();
        let me = ip("10.0.0.1");
        // Two wrong guesses for victim, then a good login as pgwake, repeatedly.
        t.reserve(me, &a, "victim").unwrap();
        t.reserve(me, &a, "victim").unwrap();
        t.reserve(me, &a, "pgwake").unwrap();
        t.success(me, &a, "pgwake");
        assert!(
            t.reserve(me, &a, "victim").is_ok(),
            "the third guess is free"
        );
        assert!(
            t.reserve(me, &a, "victim").is_err(),
            "pgwake's login did not clear victim's guesses"
        );
        // A user's own success clears what it owes.
        let u = throttle(3);
        u.reserve(me, &a, "pgwake").unwrap();
        u.reserve(me, &a, "pgwake").unwrap();
        u.reserve(me, &a, "pgwake").unwrap();
        u.success(me, &a, "pgwake");
        assert!(u.blocked_for(me, &a, "pgwake").is_none());
        for _ in 0..3 {
            assert!(
                u.reserve(me, &a, "victim").is_ok(),
                "nothing left of pgwake's"
            );
        }
    }
}
