//! Tenant identity.

use std::fmt;

use thiserror::Error;

/// A tenant's id: 1 to 63 characters of ASCII letters, digits, `-` and `_` (a DNS label, so it can
/// be the first label of an SNI name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

/// A string that cannot be a tenant id.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid tenant id {0:?}: use 1 to 63 ASCII letters, digits, '-' or '_'")]
pub struct InvalidTenantId(pub String);

impl TenantId {
    /// Checks and wraps a tenant id.
    pub fn parse(s: &str) -> Result<TenantId, InvalidTenantId> {
        let ok = (1..=63).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(TenantId(s.to_owned()))
        } else {
            Err(InvalidTenantId(s.to_owned()))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for TenantId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        TenantId::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(TenantId::parse("alpha-1_b").is_ok());
        assert!(TenantId::parse("").is_err());
        assert!(TenantId::parse("a.b").is_err());
        assert!(TenantId::parse(&"x".repeat(64)).is_err());
    }
}
