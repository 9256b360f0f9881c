//! Admission before authentication: per-tenant CIDR allow and deny lists.

use std::net::IpAddr;

use ipnet::IpNet;

/// Which client addresses may reach a tenant: denied if any `deny` entry matches, else allowed
/// if `allow` is empty or any entry matches.
#[derive(Clone, Debug, Default)]
pub struct AccessList {
    /// Networks allowed (empty: all).
    pub allow: Vec<IpNet>,
    /// Networks refused, checked first.
    pub deny: Vec<IpNet>,
}

impl AccessList {
    /// True when `ip` may connect.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            // A v4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        if self.deny.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|n| n.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(v: &[&str]) -> Vec<IpNet> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn deny_wins_and_empty_allow_allows() {
        let list = AccessList {
            allow: nets(&["10.0.0.0/8", "127.0.0.1/32"]),
            deny: nets(&["10.1.0.0/16"]),
        };
        assert!(list.permits("10.2.3.4".parse().unwrap()));
        assert!(!list.permits("10.1.3.4".parse().unwrap()));
        assert!(!list.permits("192.168.1.1".parse().unwrap()));
        assert!(list.permits("::ffff:127.0.0.1".parse().unwrap()));
        assert!(AccessList::default().permits("192.168.1.1".parse().unwrap()));
    }
}
