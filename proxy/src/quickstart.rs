//! `pgwake quickstart`: a ready-to-use gateway on this machine in one command, with a config, a
//! self-signed certificate and a local Postgres data directory per tenant under one folder.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use pgwake_routing::TenantId;
use pgwake_routing::backend::LocalBackend;
use rand::Rng;

use crate::config::Config;
use crate::server::local_settings;

/// What the quickstart was asked for.
pub struct QuickstartOptions {
    /// Folder for config, certificate and data (reused when it exists).
    pub dir: PathBuf,
    /// Tenants to create (first run only).
    pub tenants: Vec<TenantId>,
    /// Postgres listener port.
    pub port: u16,
    /// Admin listener port.
    pub admin_port: u16,
    /// Idle time before a tenant sleeps.
    pub idle_timeout: Duration,
}

/// Writes `dir/pgwake.toml`, the certificate and the data directories unless they exist, and
/// returns the config path.
pub async fn prepare(opts: &QuickstartOptions) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(&opts.dir).with_context(|| format!("create {}", opts.dir.display()))?;
    let config_path = opts.dir.join("pgwake.toml");
    if !config_path.exists() {
        write_certificate(&opts.dir)?;
        let password: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(20)
            .map(char::from)
            .collect();
        let tenants: String = opts
            .tenants
            .iter()
            .map(|t| format!("\n[[tenant]]\nid = \"{t}\"\nbackend = {{ kind = \"local\" }}\n"))
            .collect();
        let text = format!(
            r#"# Written by `pgwake quickstart`; edit freely, later runs reuse it.
[listen]
postgres = "127.0.0.1:{port}"
admin = "127.0.0.1:{admin}"

[tls]
cert = "cert.pem"
key = "key.pem"

[routing]
sni_suffix = "db.localtest"
rules = ["sni", "options", "database", "user"]

[wake]
idle_timeout = "{idle}"

[local]
data_dir = "data"
superuser = "pgwake"
password = "{password}"
{tenants}"#,
            port = opts.port,
            admin = opts.admin_port,
            idle = humantime::format_duration(opts.idle_timeout),
        );
        fs::write(&config_path, text).context("write pgwake.toml")?;
        fs::set_permissions(&config_path, fs::Permissions::from_mode(0o600))?;
    }
    let config = Config::load(&config_path)?;
    if let Some(local) = &config.local {
        let backend = LocalBackend::new(local_settings(local, config.wake.wake_timeout))?;
        for t in &config.tenants {
            backend.stop_stale(&t.id).await;
            backend.ensure_initialized(&t.id).await?;
        }
    }
    Ok(config_path)
}

fn write_certificate(dir: &Path) -> anyhow::Result<()> {
    let names = vec![
        "*.db.localtest".to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    let ck = rcgen::generate_simple_self_signed(names).context("generate a certificate")?;
    fs::write(dir.join("cert.pem"), ck.cert.pem())?;
    let key = dir.join("key.pem");
    fs::write(&key, ck.signing_key.serialize_pem())?;
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// The lines printed before serving: how to connect and how to watch tenants.
pub fn banner(config: &Config, dir: &Path) -> String {
    let pg = config.listen.postgres;
    let user = config
        .local
        .as_ref()
        .map(|l| l.superuser.as_str())
        .unwrap_or("postgres");
    let password = config
        .local
        .as_ref()
        .map(|l| l.password.as_str())
        .unwrap_or("");
    let mut out = format!(
        "pgwake quickstart: {} tenant(s) in {}\n  postgres: {} (TLS, self-signed certificate)\n",
        config.tenants.len(),
        dir.display(),
        pg
    );
    if let Some(admin) = config.listen.admin {
        out.push_str(&format!("  admin:    http://{admin}\n"));
    }
    out.push_str("\nConnect (the first connection wakes the tenant's database):\n");
    for t in &config.tenants {
        out.push_str(&format!(
            "  psql \"host={t}.db.localtest hostaddr={ip} port={port} sslmode=require user={user} password={password} dbname=postgres\"\n",
            t = t.id,
            ip = pg.ip(),
            port = pg.port(),
        ));
    }
    if let Some(admin) = config.listen.admin {
        out.push_str(&format!(
            "\nWatch tenants sleep and wake:\n  curl -s http://{admin}/v1/tenants\n  \
             curl -s -X POST -H 'Content-Type: application/json' http://{admin}/v1/tenants/<id>/sleep   (or /wake)\n"
        ));
    }
    out.push_str(&format!(
        "\nA tenant sleeps after {} without connections. Stop with Ctrl-C.\n",
        humantime::format_duration(config.wake.idle_timeout)
    ));
    out
}
