//! Failed-authentication throttle keyed by (client IP, tenant): after a number of failures,
//! each further failure doubles the wait before the next attempt is even read.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use moka::sync::Cache;
use pgwake_routing::TenantId;

/// Throttle settings.
#[derive(Clone, Debug)]
pub struct ThrottleSettings {
    /// Failures allowed before attempts are throttled.
    pub free_failures: u32,
    /// Wait after the first throttled failure.
    pub base: Duration,
    /// Longest wait.
    pub max: Duration,
    /// Most (IP, tenant) pairs tracked; the least recently used are forgotten first.
    pub capacity: u64,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    failures: u32,
    blocked_until: Option<Instant>,
}

/// Failure counts per (client IP, tenant).
pub struct Throttle {
    settings: ThrottleSettings,
    records: Cache<(IpAddr, TenantId), Record>,
}

impl Throttle {
    /// A throttle with these settings; records expire once they cannot matter any more.
    pub fn new(settings: ThrottleSettings) -> Throttle {
        let records = Cache::builder()
            .max_capacity(settings.capacity)
            .time_to_idle(settings.max * 4)
            .build();
        Throttle { settings, records }
    }

    /// How long this client must still wait before another attempt, if at all.
    pub fn blocked_for(&self, ip: IpAddr, tenant: &TenantId) -> Option<Duration> {
        let until = self.records.get(&(ip, tenant.clone()))?.blocked_until?;
        until.checked_duration_since(Instant::now())
    }

    /// Records a failed attempt.
    pub fn failure(&self, ip: IpAddr, tenant: &TenantId) {
        let s = &self.settings;
        self.records
            .entry((ip, tenant.clone()))
            .and_upsert_with(|old| {
                let failures = old.map(|e| e.into_value().failures).unwrap_or(0) + 1;
                let blocked_until = (failures > s.free_failures).then(|| {
                    let doublings = (failures - s.free_failures - 1).min(20);
                    Instant::now() + (s.base * 2u32.pow(doublings)).min(s.max)
                });
                Record {
                    failures,
                    blocked_until,
                }
            });
    }

    /// Records a success, which clears the client's history.
    pub fn success(&self, ip: IpAddr, tenant: &TenantId) {
        self.records.invalidate(&(ip, tenant.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_after_free_failures_with_doubling_and_clears_on_success() {
        let t = Throttle::new(ThrottleSettings {
            free_failures: 2,
            base: Duration::from_secs(1),
            max: Duration::from_secs(3),
            capacity: 100,
        });
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let tenant = TenantId::parse("a").unwrap();
        t.failure(ip, &tenant);
        t.failure(ip, &tenant);
        assert!(t.blocked_for(ip, &tenant).is_none());
        t.failure(ip, &tenant);
        let first = t.blocked_for(ip, &tenant).unwrap();
        assert!(first <= Duration::from_secs(1) && first > Duration::from_millis(900));
        t.failure(ip, &tenant);
        assert!(t.blocked_for(ip, &tenant).unwrap() > Duration::from_millis(1900));
        t.failure(ip, &tenant);
        assert!(t.blocked_for(ip, &tenant).unwrap() <= Duration::from_secs(3));
        assert!(t.blocked_for(other, &tenant).is_none());
        t.success(ip, &tenant);
        assert!(t.blocked_for(ip, &tenant).is_none());
    }
}
