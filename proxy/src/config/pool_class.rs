//! `[[pool_class]]`: classes of pre-warmed CloudNativePG clusters.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// What putting a `pool` tenant to sleep does with its cluster.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PoolRelease {
    /// Delete the Cluster (ephemeral tenants); the next wake claims a fresh one.
    Delete,
    /// Hibernate it and keep it bound to the tenant; the next wake wakes the same cluster.
    #[default]
    Hibernate,
}

/// `[[pool_class]]`: pre-warmed CloudNativePG clusters that `pool` tenants claim on their first
/// wake.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolClassConfig {
    /// Class name: the `pgwake.io/pool` label value and the prefix of generated cluster names.
    pub name: String,
    /// Namespace of the class's clusters and of its Lease (default `[kubernetes] namespace`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Warm (unclaimed) clusters to keep.
    #[serde(default = "default_min_warm")]
    pub min_warm: usize,
    /// What sleep does: `hibernate` (default, keeps the data) or `delete`.
    #[serde(default)]
    pub release: PoolRelease,
    /// A CloudNativePG `Cluster` manifest (YAML or JSON) new warm clusters are made from.
    pub template: PathBuf,
    /// How often the replenisher checks the warm count (it also runs after each claim).
    #[serde(default = "default_replenish_interval", with = "super::duration")]
    pub replenish_interval: Duration,
    /// How long the replenisher's Lease (`pgwake-pool-<name>`) is valid without renewal; another
    /// replica takes over replenishing this long after the holder stops renewing.
    #[serde(default = "default_lease_duration", with = "super::duration")]
    pub lease_duration: Duration,
    /// How long a claimed cluster may stay without a binding (its claimant died between claim
    /// and binding) before the replenisher returns it to the warm pool.
    #[serde(default = "default_orphan_grace", with = "super::duration")]
    pub orphan_grace: Duration,
}

fn default_min_warm() -> usize {
    1
}

fn default_replenish_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_lease_duration() -> Duration {
    Duration::from_secs(15)
}

fn default_orphan_grace() -> Duration {
    Duration::from_secs(60)
}

/// Longest pool class name: generated cluster names (`<class>-xxxxx`) and their `-rw` Service
/// names must stay DNS labels.
pub(super) const MAX_POOL_CLASS_NAME: usize = 40;

/// True for a value Kubernetes accepts as a label value that starts and ends alphanumeric.
pub(super) fn label_value_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Checks every class; returns their names, which `pool` tenants refer to.
pub(super) fn validate_all(classes: &[PoolClassConfig]) -> Result<HashSet<&str>, ConfigError> {
    let mut names = HashSet::new();
    for (i, c) in classes.iter().enumerate() {
        let name_ok = (1..=MAX_POOL_CLASS_NAME).contains(&c.name.len())
            && c.name.starts_with(|ch: char| ch.is_ascii_lowercase())
            && c.name
                .ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            && c.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(invalid(
                format!("pool_class[{i}].name"),
                format!(
                    "{:?}: use 1 to {MAX_POOL_CLASS_NAME} lower-case letters, digits or '-', \
                     starting with a letter",
                    c.name
                ),
            ));
        }
        if !names.insert(c.name.as_str()) {
            return Err(invalid(
                format!("pool_class[{i}].name"),
                format!("pool class \"{}\" is configured twice", c.name),
            ));
        }
        if c.lease_duration < Duration::from_secs(1) {
            return Err(invalid(
                format!("pool_class[{i}].lease_duration"),
                "must be at least 1s",
            ));
        }
        if c.orphan_grace < Duration::from_secs(1) {
            return Err(invalid(
                format!("pool_class[{i}].orphan_grace"),
                "must be at least 1s, longer than a claim takes to be bound",
            ));
        }
        if c.replenish_interval.is_zero() || c.replenish_interval > c.lease_duration / 3 {
            return Err(invalid(
                format!("pool_class[{i}].replenish_interval"),
                "must be greater than zero and at most a third of lease_duration, so the \
                 replenisher renews its lease in time",
            ));
        }
    }
    Ok(names)
}
