//! A token bucket per address: how often one client may have cancels forwarded, and how often
//! one peer may ask this replica to cancel.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Rate and burst of a [`RateLimiter`], and how many addresses it tracks.
#[derive(Clone, Copy, Debug)]
pub struct RateSettings {
    /// Requests per second once the burst is spent.
    pub rate: f64,
    /// Requests allowed at once.
    pub burst: u32,
    /// Addresses tracked at most.
    pub capacity: usize,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-address token buckets with a bounded number of addresses.
pub struct RateLimiter {
    settings: RateSettings,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl RateLimiter {
    /// An empty limiter.
    pub fn new(settings: RateSettings) -> RateLimiter {
        RateLimiter {
            settings,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request's token for `addr`; false when it is over its rate.
    pub fn allow(&self, addr: IpAddr) -> bool {
        self.allow_at(addr, Instant::now())
    }

    fn allow_at(&self, addr: IpAddr, now: Instant) -> bool {
        let s = self.settings;
        let burst = f64::from(s.burst);
        let refill =
            |b: &Bucket| (b.tokens + now.duration_since(b.at).as_secs_f64() * s.rate).min(burst);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(&addr) && buckets.len() >= s.capacity {
            // A full bucket says nothing a missing one would not.
            buckets.retain(|_, b| refill(b) < burst);
            if buckets.len() >= s.capacity {
                // Flooded from more addresses than tracked: newcomers wait rather than
                // reset everyone's limit.
                return false;
            }
        }
        let bucket = buckets.entry(addr).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens = refill(bucket);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn burst_then_rate_per_address_within_capacity() {
        let limiter = RateLimiter::new(RateSettings {
            rate: 2.0,
            burst: 3,
            capacity: 2,
        });
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let t0 = Instant::now();
        assert!((0..3).all(|_| limiter.allow_at(a, t0)));
        assert!(!limiter.allow_at(a, t0));
        assert!(
            limiter.allow_at(b, t0),
            "another address has its own bucket"
        );
        assert!(
            !limiter.allow_at(c, t0),
            "over capacity while both are in use"
        );
        let later = t0 + Duration::from_millis(500);
        assert!(
            limiter.allow_at(a, later),
            "one token back after half a second"
        );
        assert!(!limiter.allow_at(a, later));
        let much_later = t0 + Duration::from_secs(10);
        assert!(
            limiter.allow_at(c, much_later),
            "refilled buckets make room"
        );
    }
}
