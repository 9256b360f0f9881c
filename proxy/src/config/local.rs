//! `[local]`: the Postgres servers the gateway itself starts and stops.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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

fn default_superuser() -> String {
    "pgwake".into()
}

fn default_stop_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_probe_interval() -> Duration {
    Duration::from_millis(5)
}
