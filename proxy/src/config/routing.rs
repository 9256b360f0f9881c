//! `[routing]`: how a connection names its tenant, and how an unknown one is answered.

use pgwake_routing::{Rule, TenantId};
use serde::Deserialize;

use super::{ConfigError, invalid};

/// How a client naming a tenant that does not exist (or that it may not reach) is answered.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnknownTenant {
    /// Exactly as a wrong password (`28P01`), after a mock password exchange of equal cost:
    /// tenant names cannot be listed by probing.
    #[default]
    PasswordFailed,
    /// FATAL `08004` "unknown or forbidden tenant"; a tenant that does not exist is named back,
    /// with a configured one a typo away as the hint, else a hint on how to name one.
    Reveal,
}

/// `[routing]`: the tenant resolver's rules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Domain under which the first SNI label names the tenant.
    pub sni_suffix: Option<String>,
    /// Rules tried in order.
    pub rules: Vec<Rule>,
    /// Tenant for connections that name none (sidecar mode).
    pub default_tenant: Option<TenantId>,
    /// How a client naming a tenant that does not exist, or that it may not reach, is answered.
    pub unknown_tenant: UnknownTenant,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            sni_suffix: None,
            rules: vec![
                Rule::Sni,
                Rule::Options,
                Rule::Database,
                Rule::User,
                Rule::Password,
            ],
            default_tenant: None,
            unknown_tenant: UnknownTenant::default(),
        }
    }
}

impl RoutingConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        // Without a suffix the SNI rule can never match; that is allowed (IP-only setups) but
        // only when SNI is not the sole rule.
        if self.rules == [Rule::Sni] && self.sni_suffix.is_none() && self.default_tenant.is_none() {
            return Err(invalid(
                "routing.sni_suffix",
                "the only routing rule is \"sni\" but no sni_suffix is set",
            ));
        }
        Ok(())
    }
}
