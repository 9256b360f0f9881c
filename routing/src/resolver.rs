//! Finding the tenant a connection is for, from its TLS server name and startup parameters.
//!
//! Rules run in the configured order; every rule that names a tenant must name the same one.
//! What a rule used is stripped from the parameters before they reach the backend.

use std::fmt;

use serde::Deserialize;
use thiserror::Error;

use crate::TenantId;

/// One way of naming a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rule {
    /// TLS SNI `<tenant>.<sni_suffix>`.
    Sni,
    /// `options` holding `endpoint=<tenant>` or `--tenant=<tenant>`.
    Options,
    /// Database name `<tenant>.<database>`.
    Database,
    /// User name `<user>.<tenant>`.
    User,
    /// The password, as `endpoint=<tenant>;<password>` or `endpoint=<tenant>$<password>`, for
    /// clients that can send neither SNI nor `options`. It is read during authentication, so it
    /// applies only when no other rule named a tenant (see [`tenant_in_password`]).
    Password,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::Sni => "TLS server name",
            Rule::Options => "options parameter",
            Rule::Database => "database name",
            Rule::User => "user name",
            Rule::Password => "password",
        })
    }
}

/// Where the resolved tenant came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A rule matched.
    Rule(Rule),
    /// No rule matched and the configured default applied (sidecar mode).
    Default,
}

/// The resolver's part of the configuration.
#[derive(Clone, Debug, Default)]
pub struct ResolverConfig {
    /// Rules in the order they are tried.
    pub rules: Vec<Rule>,
    /// Domain under which the first SNI label is the tenant, e.g. `db.example.com`.
    pub sni_suffix: Option<String>,
    /// Tenant used when no rule names one.
    pub default_tenant: Option<TenantId>,
}

/// A tenant found for a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The tenant.
    pub tenant: TenantId,
    /// The first source that named it.
    pub source: Source,
}

/// No single tenant could be found.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ResolveError {
    /// Two sources named different tenants.
    #[error(
        "the {first_rule} names tenant \"{first}\" but the {second_rule} names tenant \"{second}\""
    )]
    Conflict {
        /// First rule that matched.
        first_rule: Rule,
        /// Tenant it named.
        first: String,
        /// The rule that disagreed.
        second_rule: Rule,
        /// Tenant that one named.
        second: String,
    },
    /// Nothing named a tenant and there is no default.
    #[error("no tenant named in the connection")]
    NotNamed,
}

/// Applies the configured rules to a connection.
#[derive(Clone, Debug)]
pub struct TenantResolver {
    config: ResolverConfig,
}

/// A rule's finding and how to strip what it used.
struct Match {
    rule: Rule,
    tenant: TenantId,
    rewrite: Option<(&'static str, Option<String>)>,
}

impl TenantResolver {
    /// A resolver for this configuration.
    pub fn new(config: ResolverConfig) -> Self {
        TenantResolver { config }
    }

    /// Finds the tenant for a connection and strips the routing parts from `params`
    /// (startup parameters as sent).
    pub fn resolve(
        &self,
        sni: Option<&str>,
        params: &mut Vec<(String, String)>,
    ) -> Result<Resolved, ResolveError> {
        let get = |params: &Vec<(String, String)>, key: &str| {
            params
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let user = get(params, "user");
        let database = get(params, "database");
        // libpq sends the user name as the database when none is given; a `<user>.<tenant>`
        // name must not then be read as `<tenant>.<database>` too.
        let database_is_user = database.is_none() || database == user;
        let user_rule = self.config.rules.contains(&Rule::User);

        let mut matches: Vec<Match> = Vec::new();
        for &rule in &self.config.rules {
            let found = match rule {
                Rule::Sni => sni.and_then(|s| self.tenant_in_sni(s)).map(|t| (t, None)),
                Rule::Options => get(params, "options")
                    .and_then(|o| tenant_in_options(&o))
                    .map(|(t, rest)| (t, Some(("options", (!rest.is_empty()).then_some(rest))))),
                Rule::Database if database_is_user && user_rule => None,
                Rule::Database => database
                    .as_deref()
                    .and_then(|d| d.split_once('.'))
                    .and_then(|(t, db)| {
                        let t = TenantId::parse(t).ok()?;
                        (!db.is_empty()).then(|| (t, Some(("database", Some(db.to_owned())))))
                    }),
                // Only a client that named no tenant is asked for its password in the clear.
                Rule::Password => None,
                Rule::User => {
                    user.as_deref()
                        .and_then(|u| u.rsplit_once('.'))
                        .and_then(|(u, t)| {
                            let t = TenantId::parse(t).ok()?;
                            (!u.is_empty()).then(|| (t, Some(("user", Some(u.to_owned())))))
                        })
                }
            };
            if let Some((tenant, rewrite)) = found {
                if let Some(first) = matches.first()
                    && first.tenant != tenant
                {
                    return Err(ResolveError::Conflict {
                        first_rule: first.rule,
                        first: first.tenant.to_string(),
                        second_rule: rule,
                        second: tenant.to_string(),
                    });
                }
                matches.push(Match {
                    rule,
                    tenant,
                    rewrite,
                });
            }
        }

        let Some(first) = matches.first() else {
            return match &self.config.default_tenant {
                Some(t) => Ok(Resolved {
                    tenant: t.clone(),
                    source: Source::Default,
                }),
                None => Err(ResolveError::NotNamed),
            };
        };
        let resolved = Resolved {
            tenant: first.tenant.clone(),
            source: Source::Rule(first.rule),
        };
        for m in matches {
            if let Some((key, value)) = m.rewrite {
                set_param(params, key, value.clone());
                if key == "user" && database_is_user && database.is_some() {
                    set_param(params, "database", value);
                }
            }
        }
        Ok(resolved)
    }

    /// Whether a connection that named no tenant may name it in its password
    /// ([`Rule::Password`]); a default tenant makes that moot.
    pub fn routes_by_password(&self) -> bool {
        self.config.rules.contains(&Rule::Password) && self.config.default_tenant.is_none()
    }

    fn tenant_in_sni(&self, sni: &str) -> Option<TenantId> {
        let suffix = self.config.sni_suffix.as_deref()?;
        let sni = sni.trim_end_matches('.').to_ascii_lowercase();
        let label = sni
            .strip_suffix(&suffix.trim_matches('.').to_ascii_lowercase())?
            .strip_suffix('.')?;
        TenantId::parse(label).ok()
    }
}

/// Splits a cleartext password of the form `endpoint=<tenant>;<password>` or
/// `endpoint=<tenant>$<password>` into the tenant and the real password; `None` when it has
/// another form or the tenant id is invalid.
pub fn tenant_in_password(password: &str) -> Option<(TenantId, &str)> {
    let rest = password.strip_prefix("endpoint=")?;
    // Tenant ids never hold either separator, so the first one ends the id.
    let at = rest.find([';', '$'])?;
    let tenant = TenantId::parse(&rest[..at]).ok()?;
    Some((tenant, &rest[at + 1..]))
}

fn set_param(params: &mut Vec<(String, String)>, key: &str, value: Option<String>) {
    match value {
        None => params.retain(|(k, _)| k != key),
        Some(v) => match params.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => params.push((key.to_owned(), v)),
        },
    }
}

/// Splits libpq `options` into words: whitespace separates, a backslash escapes the next byte.
/// Returns each word raw (as sent) and unescaped.
fn option_words(options: &str) -> Vec<(String, String)> {
    let mut words = Vec::new();
    let (mut raw, mut value) = (String::new(), String::new());
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            raw.push(c);
            if let Some(n) = chars.next() {
                raw.push(n);
                value.push(n);
            }
        } else if c.is_whitespace() {
            if !raw.is_empty() {
                words.push((std::mem::take(&mut raw), std::mem::take(&mut value)));
            }
        } else {
            raw.push(c);
            value.push(c);
        }
    }
    if !raw.is_empty() {
        words.push((raw, value));
    }
    words
}

/// The tenant named in `options` and the options with those words removed.
fn tenant_in_options(options: &str) -> Option<(TenantId, String)> {
    let mut tenant = None;
    let mut rest = Vec::new();
    for (raw, value) in option_words(options) {
        let named = value
            .strip_prefix("endpoint=")
            .or_else(|| value.strip_prefix("--tenant="))
            .and_then(|t| TenantId::parse(t).ok());
        match named {
            Some(t) if tenant.is_none() => tenant = Some(t),
            // A second, different tenant in the same options is ambiguous: keep the word, so
            // the backend sees and rejects it rather than the gateway guessing.
            _ => rest.push(raw),
        }
    }
    tenant.map(|t| (t, rest.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(rules: &[Rule]) -> TenantResolver {
        TenantResolver::new(ResolverConfig {
            rules: rules.to_vec(),
            sni_suffix: Some("db.localtest".into()),
            default_tenant: None,
        })
    }

    fn params(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ALL: &[Rule] = &[Rule::Sni, Rule::Options, Rule::Database, Rule::User];

    #[test]
    fn sni_first_label_under_suffix() {
        let r = resolver(ALL);
        let mut p = params(&[("user", "bob"), ("database", "postgres")]);
        let got = r.resolve(Some("Alpha.DB.localtest"), &mut p).unwrap();
        assert_eq!(got.tenant.as_str(), "alpha");
        assert_eq!(got.source, Source::Rule(Rule::Sni));
        assert_eq!(p, params(&[("user", "bob"), ("database", "postgres")]));
        assert!(r.resolve(Some("alpha.other.test"), &mut p).is_err());
        assert!(r.resolve(Some("x.alpha.db.localtest"), &mut p).is_err());
        assert!(r.resolve(Some("db.localtest"), &mut p).is_err());
    }

    #[test]
    fn options_are_stripped() {
        let r = resolver(ALL);
        let mut p = params(&[
            ("user", "bob"),
            ("options", "-c work_mem=1MB endpoint=alpha"),
        ]);
        assert_eq!(r.resolve(None, &mut p).unwrap().tenant.as_str(), "alpha");
        assert_eq!(
            p,
            params(&[("user", "bob"), ("options", "-c work_mem=1MB")])
        );
        let mut p = params(&[("user", "bob"), ("options", "--tenant=beta")]);
        assert_eq!(r.resolve(None, &mut p).unwrap().tenant.as_str(), "beta");
        assert_eq!(p, params(&[("user", "bob")]));
        let mut p = params(&[("options", "-c search_path=a\\ b endpoint=alpha")]);
        r.resolve(None, &mut p).unwrap();
        assert_eq!(p, params(&[("options", "-c search_path=a\\ b")]));
    }

    #[test]
    fn database_prefix_and_user_suffix() {
        let r = resolver(ALL);
        let mut p = params(&[("user", "bob"), ("database", "alpha.app")]);
        assert_eq!(r.resolve(None, &mut p).unwrap().tenant.as_str(), "alpha");
        assert_eq!(p, params(&[("user", "bob"), ("database", "app")]));
        let mut p = params(&[("user", "bob.alpha"), ("database", "app")]);
        assert_eq!(r.resolve(None, &mut p).unwrap().tenant.as_str(), "alpha");
        assert_eq!(p, params(&[("user", "bob"), ("database", "app")]));
    }

    #[test]
    fn defaulted_database_follows_the_user() {
        let r = resolver(ALL);
        let mut p = params(&[("user", "bob.alpha"), ("database", "bob.alpha")]);
        let got = r.resolve(None, &mut p).unwrap();
        assert_eq!(got.tenant.as_str(), "alpha");
        assert_eq!(p, params(&[("user", "bob"), ("database", "bob")]));
    }

    #[test]
    fn agreeing_sources_are_all_stripped() {
        let r = resolver(ALL);
        let mut p = params(&[
            ("user", "bob"),
            ("database", "alpha.app"),
            ("options", "endpoint=alpha"),
        ]);
        let got = r.resolve(Some("alpha.db.localtest"), &mut p).unwrap();
        assert_eq!(got.source, Source::Rule(Rule::Sni));
        assert_eq!(p, params(&[("user", "bob"), ("database", "app")]));
    }

    #[test]
    fn conflicts_name_both() {
        let r = resolver(ALL);
        let mut p = params(&[("user", "bob"), ("database", "beta.app")]);
        let err = r.resolve(Some("alpha.db.localtest"), &mut p).unwrap_err();
        assert_eq!(
            err,
            ResolveError::Conflict {
                first_rule: Rule::Sni,
                first: "alpha".into(),
                second_rule: Rule::Database,
                second: "beta".into(),
            }
        );
        assert!(err.to_string().contains("\"alpha\"") && err.to_string().contains("\"beta\""));
    }

    #[test]
    fn rule_order_and_selection() {
        let r = resolver(&[Rule::Options]);
        let mut p = params(&[("user", "bob"), ("database", "alpha.app")]);
        assert_eq!(
            r.resolve(Some("alpha.db.localtest"), &mut p),
            Err(ResolveError::NotNamed)
        );
        assert_eq!(p[1].1, "alpha.app");
    }

    #[test]
    fn default_tenant() {
        let r = TenantResolver::new(ResolverConfig {
            rules: ALL.to_vec(),
            sni_suffix: None,
            default_tenant: Some(TenantId::parse("side").unwrap()),
        });
        let mut p = params(&[("user", "bob"), ("database", "postgres")]);
        let got = r.resolve(Some("alpha.db.localtest"), &mut p).unwrap();
        assert_eq!((got.tenant.as_str(), got.source), ("side", Source::Default));
    }

    #[test]
    fn a_password_can_name_the_tenant() {
        let (t, rest) = tenant_in_password("endpoint=alpha;s3cret;x$y").unwrap();
        assert_eq!((t.as_str(), rest), ("alpha", "s3cret;x$y"));
        let (t, rest) = tenant_in_password("endpoint=beta-1$").unwrap();
        assert_eq!((t.as_str(), rest), ("beta-1", ""));
        assert!(tenant_in_password("s3cret").is_none());
        assert!(tenant_in_password("endpoint=alpha").is_none());
        assert!(tenant_in_password("endpoint=al pha;x").is_none());
        assert!(tenant_in_password("endpoint=;x").is_none());
    }

    #[test]
    fn the_password_rule_names_nothing_before_authentication() {
        let r = resolver(&[Rule::Sni, Rule::Password]);
        assert!(r.routes_by_password());
        let mut p = params(&[("user", "app"), ("database", "db")]);
        assert_eq!(r.resolve(None, &mut p), Err(ResolveError::NotNamed));
        assert!(!resolver(&[Rule::Sni]).routes_by_password());
    }
}
