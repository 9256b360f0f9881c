//! `[local]`: the Postgres servers the gateway itself starts and stops.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// `[local]`: Postgres servers this gateway starts and stops itself.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalConfig {
    /// Folder with one data directory per tenant (created when missing).
    pub data_dir: PathBuf,
    /// Folder with `initdb` and `postgres` (default: found on PATH or /usr/lib/postgresql).
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
    /// Account the servers run as when the gateway is root (default `postgres`).
    #[serde(default)]
    pub run_as: Option<String>,
    /// Superuser `initdb` creates in each tenant's cluster.
    #[serde(default = "default_superuser")]
    pub superuser: String,
    /// Its password.
    pub password: String,
    /// A role created with each tenant's cluster that owns its `postgres` database without
    /// being a superuser (as Neon's `<database>_owner` and CloudNativePG's `app`), for clients
    /// that need no superuser; the gateway checks its password as the superuser's.
    #[serde(default)]
    pub owner: Option<String>,
    /// The owner's password (given with `owner`).
    #[serde(default)]
    pub owner_password: Option<String>,
    /// Extra `postgresql.conf` settings, written when a data directory is created.
    #[serde(default)]
    pub settings: std::collections::BTreeMap<String, String>,
    /// How long a fast shutdown may take before an immediate one (for a server still starting:
    /// an immediate one before the postmaster is killed).
    #[serde(default = "default_stop_timeout", with = "super::duration")]
    pub stop_timeout: Duration,
    /// Time between readiness probes while a server starts.
    #[serde(default = "default_probe_interval", with = "super::duration")]
    pub probe_interval: Duration,
}

impl LocalConfig {
    /// The owner role and its password given together, and not the superuser's name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (&self.owner, &self.owner_password) {
            (Some(owner), Some(_)) if owner.is_empty() => {
                Err(invalid("local.owner", "must not be empty"))
            }
            (Some(owner), Some(_)) if *owner == self.superuser => Err(invalid(
                "local.owner",
                format!("must differ from local.superuser (\"{owner}\")"),
            )),
            (Some(_), None) => Err(invalid(
                "local.owner_password",
                "missing: local.owner needs a password",
            )),
            (None, Some(_)) => Err(invalid(
                "local.owner",
                "missing: local.owner_password is given without a role",
            )),
            _ => Ok(()),
        }
    }

    /// The owner role and its password, when configured.
    pub fn owner_login(&self) -> Option<(&str, &str)> {
        self.owner.as_deref().zip(self.owner_password.as_deref())
    }
}

fn default_superuser() -> String {
    "pgwake".into()
}

fn default_stop_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_probe_interval() -> Duration {
    Duration::from_millis(5)
}
