//! `pgwake quickstart`: a ready-to-use gateway on this machine in one command, with a config, a
//! local certificate authority and a server certificate it signed, and a local Postgres data
//! directory per tenant.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use pgwake_routing::TenantId;
use pgwake_routing::backend::{ClaimError, LocalBackend, can_enter, server_account};
use rand::Rng;
use tracing::info;

use super::local_settings;
use crate::config::Config;

/// What the quickstart was asked for. Every value given applies to an existing folder too:
/// ports and the idle timeout for this run (its `pgwake.toml` keeps its own), tenants added
/// to its `pgwake.toml` for good.
pub struct QuickstartOptions {
    /// Folder for config, certificates and (when the server account can enter it) data.
    pub dir: PathBuf,
    /// Tenants to serve (default: `alpha` in a new folder).
    pub tenants: Option<Vec<TenantId>>,
    /// Postgres listener port (default 6432 in a new folder).
    pub port: Option<u16>,
    /// Admin listener port (default 9090 in a new folder).
    pub admin_port: Option<u16>,
    /// HTTP listener port, `POST /sql` and WebSocket (default 8443 in a new folder).
    pub http_port: Option<u16>,
    /// Idle time before a tenant sleeps (default 60 s in a new folder).
    pub idle_timeout: Option<Duration>,
}

/// Defaults of a new quickstart folder.
const DEFAULT_TENANT: &str = "alpha";
const DEFAULT_PORT: u16 = 6432;
const DEFAULT_ADMIN_PORT: u16 = 9090;
/// Default port of the HTTPS listener (also given to folders written before it existed).
pub const DEFAULT_HTTP_PORT: u16 = 8443;
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The role a new folder's clients log in as: it owns each tenant's `postgres` database and is
/// not a superuser (CloudNativePG's name for its application owner).
const OWNER: &str = "app";

/// Where data directories go when the server account cannot enter the quickstart folder.
const SHARED_DATA_ROOT: &str = "/var/lib/pgwake";

/// The CA certificate clients pin, beside the config.
pub const CA_FILE: &str = "ca.pem";

/// Writes `dir/pgwake.toml`, the certificates and the data directories unless they exist, and
/// returns the configuration to serve: the folder's, with what `opts` gives applied. A folder
/// from an earlier version (a self-signed `cert.pem` and no CA) gets a CA and a certificate
/// signed by it.
///
/// Nothing is stopped or written while another gateway serves the folder's tenants, and every
/// busy port is reported at once, naming the key and the flag that change it, before anything
/// is written: a refused run leaves the folder as it found it.
pub async fn prepare(opts: &QuickstartOptions) -> anyhow::Result<Config> {
    let existing = opts.dir.join("pgwake.toml").exists();
    let mut backend = None;
    if existing {
        // A gateway serving the folder holds its ports too: name it rather than them.
        let dir =
            fs::canonicalize(&opts.dir).with_context(|| format!("open {}", opts.dir.display()))?;
        let config = load(&dir, opts)?;
        if config.local.as_ref().is_some_and(|l| l.data_dir.exists()) {
            backend = claim(&config, &dir)?;
        }
        check_ports(&listeners(&config), Some(&dir.join("pgwake.toml")))?;
    } else {
        check_ports(&new_listeners(opts), None)?;
    }
    fs::create_dir_all(&opts.dir).with_context(|| format!("create {}", opts.dir.display()))?;
    let dir =
        fs::canonicalize(&opts.dir).with_context(|| format!("open {}", opts.dir.display()))?;
    let config_path = dir.join("pgwake.toml");
    if !dir.join(CA_FILE).exists() {
        write_certificates(&dir)?;
    }
    if !existing {
        write_config(&dir, &config_path, opts)?;
    } else if let Some(tenants) = &opts.tenants {
        add_tenants(&config_path, tenants)?;
    }
    let config = load(&dir, opts)?;
    if backend.is_none() {
        backend = claim(&config, &dir)?;
    }
    if let Some(backend) = backend {
        for t in &config.tenants {
            backend.stop_stale(&t.id).await;
            backend.ensure_initialized(&t.id).await?;
        }
    }
    Ok(config)
}

/// The folder's `pgwake.toml` with what `opts` gives for this run applied.
fn load(dir: &Path, opts: &QuickstartOptions) -> anyhow::Result<Config> {
    let config_path = dir.join("pgwake.toml");
    let mut config = Config::load(&config_path)
        .with_context(|| format!("invalid configuration in {}", config_path.display()))?;
    apply(&mut config, opts);
    Ok(config)
}

/// The local backend of `config`, holding the lock that says this process serves its tenants;
/// fails naming the quickstart that holds it.
fn claim(config: &Config, dir: &Path) -> anyhow::Result<Option<LocalBackend>> {
    let Some(local) = &config.local else {
        return Ok(None);
    };
    let backend = LocalBackend::new(local_settings(local, config.wake.wake_timeout))?;
    backend.claim().map_err(|e| match e {
        ClaimError::InUse { pid, .. } => anyhow::anyhow!(
            "{e} (a quickstart on {dir}): stop it first ({}), or use another --dir",
            match pid {
                Some(p) => format!("Ctrl-C where it runs, or kill {p}"),
                None => "Ctrl-C where it runs".into(),
            },
            dir = dir.display()
        ),
        ClaimError::Io(_) => anyhow::anyhow!("local.data_dir: {e}"),
    })?;
    Ok(Some(backend))
}

/// Removes what `pgwake quickstart` made in `dir`: stops the Postgres servers a gateway that is
/// gone left running, deletes the data directories (inside the folder or under
/// `/var/lib/pgwake`) and the folder itself. Refused while a gateway serves the folder. Returns
/// what was removed, one line each.
pub async fn remove(dir: &Path) -> anyhow::Result<String> {
    let config_path = dir.join("pgwake.toml");
    if !config_path.exists() {
        anyhow::bail!(
            "{} holds no quickstart (no pgwake.toml): nothing removed",
            dir.display()
        );
    }
    let dir = fs::canonicalize(dir).with_context(|| format!("open {}", dir.display()))?;
    let config = Config::load(&config_path)
        .with_context(|| format!("invalid configuration in {}", config_path.display()))?;
    let mut removed = Vec::new();
    if let Some(local) = &config.local {
        let backend = LocalBackend::new(local_settings(local, config.wake.wake_timeout))?;
        backend.claim().map_err(|e| match e {
            ClaimError::InUse { .. } => {
                anyhow::anyhow!("{e}: stop it first (Ctrl-C where it runs); nothing removed")
            }
            ClaimError::Io(_) => anyhow::anyhow!("local.data_dir: {e}"),
        })?;
        for t in &config.tenants {
            backend.stop_stale(&t.id).await;
        }
        let data = &local.data_dir;
        // Only folders the quickstart chose: a hand-edited data_dir may hold other data.
        let ours = data.starts_with(&dir) || data.parent() == Some(Path::new(SHARED_DATA_ROOT));
        if ours && data.exists() {
            fs::remove_dir_all(data).with_context(|| format!("remove {}", data.display()))?;
            removed.push(format!("removed {} (data directories)", data.display()));
        } else if data.exists() {
            removed.push(format!(
                "kept {}: local.data_dir points outside the quickstart's folders; remove it \
                 yourself if it is no longer needed",
                data.display()
            ));
        }
    }
    fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
    removed.push(format!(
        "removed {} (config, certificates and keys)",
        dir.display()
    ));
    Ok(removed.join("\n"))
}

/// Writes the `pgwake.toml` of a new folder.
fn write_config(dir: &Path, config_path: &Path, opts: &QuickstartOptions) -> anyhow::Result<()> {
    let data_dir = choose_data_dir(dir)?;
    let secret = || -> String {
        rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(20)
            .map(char::from)
            .collect()
    };
    let (password, owner_password) = (secret(), secret());
    let default_tenants = [TenantId::parse(DEFAULT_TENANT)?];
    let tenants: String = opts
        .tenants
        .as_deref()
        .unwrap_or(&default_tenants)
        .iter()
        .map(tenant_table)
        .collect();
    let text = format!(
        r#"# Written by `pgwake quickstart`; edit freely, later runs reuse it.
[listen]
postgres = "127.0.0.1:{port}"
admin = "127.0.0.1:{admin}"
http = "127.0.0.1:{http}"

[tls]
cert = "cert.pem"
key = "key.pem"

[routing]
sni_suffix = "db.localtest"
rules = ["sni", "options", "database", "user", "password"]
# Listening on loopback only: a client naming a tenant that does not exist is told so.
unknown_tenant = "reveal"

[wake]
idle_timeout = "{idle}"

[local]
data_dir = "{data_dir}"
superuser = "pgwake"
password = "{password}"
# The printed URLs log in as the owner: it owns each tenant's database, not the server.
owner = "{OWNER}"
owner_password = "{owner_password}"
{tenants}"#,
        port = opts.port.unwrap_or(DEFAULT_PORT),
        admin = opts.admin_port.unwrap_or(DEFAULT_ADMIN_PORT),
        http = opts.http_port.unwrap_or(DEFAULT_HTTP_PORT),
        idle = humantime::format_duration(opts.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT)),
    );
    fs::write(config_path, text).context("write pgwake.toml")?;
    fs::set_permissions(config_path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// The `[[tenant]]` table of a quickstart tenant.
fn tenant_table(id: &TenantId) -> String {
    format!("\n[[tenant]]\nid = \"{id}\"\nbackend = {{ kind = \"local\" }}\n")
}

/// Appends to an existing `pgwake.toml` the tenants of `wanted` it does not have yet; tenants
/// it has and `wanted` does not name stay (their data too).
fn add_tenants(config_path: &Path, wanted: &[TenantId]) -> anyhow::Result<()> {
    let config = Config::load(config_path)
        .with_context(|| format!("invalid configuration in {}", config_path.display()))?;
    let missing: Vec<&TenantId> = wanted
        .iter()
        .filter(|w| !config.tenants.iter().any(|t| &t.id == *w))
        .collect();
    let unnamed: Vec<String> = config
        .tenants
        .iter()
        .filter(|t| !wanted.contains(&t.id))
        .map(|t| t.id.to_string())
        .collect();
    if !unnamed.is_empty() {
        info!(
            tenants = %unnamed.join(","),
            config = %config_path.display(),
            "tenants not named by --tenants stay: remove their [[tenant]] tables to stop serving them"
        );
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut text = fs::read_to_string(config_path).context("read pgwake.toml")?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    for id in &missing {
        text.push_str(&tenant_table(id));
    }
    fs::write(config_path, text).context("write pgwake.toml")?;
    let added: Vec<String> = missing.iter().map(|t| t.to_string()).collect();
    info!(tenants = %added.join(","), config = %config_path.display(), "tenants added");
    Ok(())
}

/// Applies the ports and idle timeout given for this run; gives a folder written before the
/// quickstart served HTTP its listener.
fn apply(config: &mut Config, opts: &QuickstartOptions) {
    if let Some(p) = opts.port {
        config.listen.postgres.set_port(p);
    }
    if let (Some(p), Some(admin)) = (opts.admin_port, config.listen.admin.as_mut()) {
        admin.set_port(p);
    }
    let ip = config.listen.postgres.ip();
    let http = config
        .listen
        .http
        .get_or_insert_with(|| SocketAddr::new(ip, DEFAULT_HTTP_PORT));
    if let Some(p) = opts.http_port {
        http.set_port(p);
    }
    if let Some(idle) = opts.idle_timeout {
        config.wake.idle_timeout = idle;
    }
}

/// A listener the quickstart opens: its address, and the config key and the flag that set it.
struct Listener {
    addr: SocketAddr,
    key: &'static str,
    flag: &'static str,
}

/// The listeners `config` opens.
fn listeners(config: &Config) -> Vec<Listener> {
    [
        (Some(config.listen.postgres), "listen.postgres", "--port"),
        (config.listen.admin, "listen.admin", "--admin-port"),
        (config.listen.http, "listen.http", "--http-port"),
    ]
    .into_iter()
    .filter_map(|(addr, key, flag)| {
        Some(Listener {
            addr: addr?,
            key,
            flag,
        })
    })
    .collect()
}

/// The listeners the config [`write_config`] writes for `opts` opens.
fn new_listeners(opts: &QuickstartOptions) -> Vec<Listener> {
    let at = |port: Option<u16>, default| {
        SocketAddr::from((Ipv4Addr::LOCALHOST, port.unwrap_or(default)))
    };
    vec![
        Listener {
            addr: at(opts.port, DEFAULT_PORT),
            key: "listen.postgres",
            flag: "--port",
        },
        Listener {
            addr: at(opts.admin_port, DEFAULT_ADMIN_PORT),
            key: "listen.admin",
            flag: "--admin-port",
        },
        Listener {
            addr: at(opts.http_port, DEFAULT_HTTP_PORT),
            key: "listen.http",
            flag: "--http-port",
        },
    ]
}

/// Fails when any listener's address is taken (by another program, or by another of the
/// listeners), naming each with its key and flag and a free port to use instead; `config` is
/// the existing folder's `pgwake.toml`, where the keys are.
fn check_ports(listeners: &[Listener], config: Option<&Path>) -> anyhow::Result<()> {
    // Held until the end, so that two listeners given one port show as a conflict, and no
    // suggested port is one of ours.
    let mut held = Vec::new();
    let mut busy = Vec::new();
    for l in listeners {
        match std::net::TcpListener::bind(l.addr) {
            Ok(socket) => held.push(socket),
            Err(e) => busy.push((l, e)),
        }
    }
    if busy.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::new();
    let mut instead = Vec::new();
    for (l, e) in &busy {
        lines.push(format!("  {} ({}, {}): {e}", l.addr, l.key, l.flag));
        if let Some(free) = free_port_after(l.addr, &mut held) {
            instead.push(format!("{} {free}", l.flag));
        }
    }
    let taken = match busy.len() {
        1 => "a port the quickstart needs is taken".to_owned(),
        n => format!("{n} ports the quickstart needs are taken"),
    };
    let (outcome, fix) = match config {
        Some(path) => (
            "nothing was started",
            format!("change them in {}, or for this run with", path.display()),
        ),
        None => ("nothing was written", "pick free ones with".to_owned()),
    };
    let example = match instead.is_empty() {
        true => String::new(),
        false => format!(", e.g. {} (free now)", instead.join(" ")),
    };
    anyhow::bail!(
        "{taken} (another program or quickstart uses them); {outcome}:\n{}\n{fix} the flags{example}",
        lines.join("\n")
    )
}

/// A port above `addr`'s that can be listened on now; the socket joins `held`, so the next
/// call finds another.
fn free_port_after(addr: SocketAddr, held: &mut Vec<std::net::TcpListener>) -> Option<u16> {
    let first = addr.port().checked_add(1)?;
    (first..=first.saturating_add(100)).find(|&port| {
        std::net::TcpListener::bind(SocketAddr::new(addr.ip(), port))
            .map(|socket| held.push(socket))
            .is_ok()
    })
}

/// `data` inside the quickstart folder, unless the gateway is root and the account the servers
/// run as cannot enter that folder (a home folder of mode 700): then a folder of its own under
/// `/var/lib/pgwake`, named after the quickstart folder so two of them never share one.
fn choose_data_dir(dir: &Path) -> anyhow::Result<String> {
    let Some(account) = server_account(None)? else {
        return Ok("data".into());
    };
    if can_enter(account, dir) {
        return Ok("data".into());
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, dir.as_os_str().as_encoded_bytes());
    let hash: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.trim_start_matches('.'))
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or("quickstart");
    let root = Path::new(SHARED_DATA_ROOT);
    fs::create_dir_all(root).with_context(|| format!("create {}", root.display()))?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", root.display()))?;
    Ok(root.join(format!("{name}-{hash}")).display().to_string())
}

/// A local CA (`ca.pem`, its key `ca-key.pem` 0600) and a server certificate it signs
/// (`cert.pem`, `key.pem` 0600) for `localhost`, `127.0.0.1` and `*.db.localtest`, marked for
/// server authentication as strict verifiers (Node, Java, Go) require.
fn write_certificates(dir: &Path) -> anyhow::Result<()> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(DnType::CommonName, "pgwake quickstart local CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().context("generate the CA key")?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca, ca_key).context("sign the CA certificate")?;

    let mut leaf = CertificateParams::new(vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "*.db.localtest".to_owned(),
    ])
    .context("certificate names")?;
    leaf.distinguished_name = rcgen::DistinguishedName::new();
    leaf.distinguished_name
        .push(DnType::CommonName, "pgwake quickstart");
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().context("generate the server key")?;
    let cert = leaf
        .signed_by(&leaf_key, &ca)
        .context("sign the server certificate")?;

    let secret = |name: &str, text: String| -> anyhow::Result<()> {
        let path = dir.join(name);
        // Created 0600 before the key is written, so it is never readable by others.
        let _ = fs::remove_file(&path);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("create {}", path.display()))?;
        std::io::Write::write_all(&mut &file, text.as_bytes())
            .with_context(|| format!("write {}", path.display()))
    };
    secret("ca-key.pem", ca_key_pem)?;
    secret("key.pem", leaf_key.serialize_pem())?;
    fs::write(dir.join("cert.pem"), cert.pem()).context("write cert.pem")?;
    fs::write(dir.join(CA_FILE), ca.pem()).context("write ca.pem")?;
    Ok(())
}

/// Bytes a file name must escape inside a URL's query value; `/` and `.` stay readable.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'+')
    .add(b'=')
    .add(b'?')
    .add(b'\'');

/// The connection strings printed for one tenant and tested by the client tests.
pub struct TenantUrls {
    /// `postgres://` URL for libpq, psycopg, asyncpg, pgx, postgres.js (and node-postgres when
    /// Node trusts the CA): TLS without verification, tenant in the database name.
    pub url: String,
    /// The same with `sslmode=verify-full` against the local CA.
    pub verified_url: String,
    /// The pgjdbc form.
    pub jdbc: String,
    /// For `neon(...)`: the serverless driver carries the password itself, no sslmode.
    pub serverless: String,
}

/// The connection strings for `tenant`, with the database name `<tenant>.postgres` naming it
/// (no DNS name needed), logged in as the owner role (as the superuser in a folder written
/// before the quickstart made one).
pub fn tenant_urls(config: &Config, dir: &Path, tenant: &TenantId) -> TenantUrls {
    let pg = config.listen.postgres;
    let (user, password) = config
        .local
        .as_ref()
        .map(|l| {
            l.owner_login()
                .unwrap_or((l.superuser.as_str(), l.password.as_str()))
        })
        .unwrap_or(("postgres", ""));
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let (user, password) = (enc(user), enc(password));
    let host = match pg.ip() {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let port = pg.port();
    let db = format!("{tenant}.postgres");
    let base = format!("postgres://{user}:{password}@{host}:{port}/{db}");
    let ca = dir.join(CA_FILE);
    TenantUrls {
        url: format!("{base}?sslmode=require"),
        verified_url: format!(
            "{base}?sslmode=verify-full&sslrootcert={}",
            percent_encoding::utf8_percent_encode(&ca.display().to_string(), QUERY_VALUE)
        ),
        jdbc: format!(
            "jdbc:postgresql://{host}:{port}/{db}?sslmode=require&user={user}&password={password}"
        ),
        serverless: base,
    }
}

/// The lines printed before serving: how to connect from each kind of client and how to watch
/// tenants.
pub fn banner(config: &Config, dir: &Path) -> String {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let ca = dir.join(CA_FILE);
    let mut out = format!(
        "pgwake quickstart: {} tenant(s) in {}\n  postgres: {} (TLS)\n",
        config.tenants.len(),
        dir.display(),
        config.listen.postgres
    );
    if let Some(http) = config.listen.http {
        out.push_str(&format!(
            "  http:     https://{http} (POST /sql and WebSocket, for serverless drivers)\n"
        ));
    }
    if let Some(admin) = config.listen.admin {
        out.push_str(&format!("  admin:    http://{admin}\n"));
    }
    if let Some(local) = &config.local {
        let why = match local.data_dir.starts_with(&dir) {
            true => "",
            false => " (outside the quickstart folder, which the server account cannot enter)",
        };
        out.push_str(&format!("  data:     {}{why}\n", local.data_dir.display()));
        if let Some((owner, _)) = local.owner_login() {
            out.push_str(&format!(
                "  role:     {owner} owns each tenant's database and is not a superuser; for a \
                 superuser, log in as {} with local.password from pgwake.toml\n",
                local.superuser
            ));
        }
    }
    out.push_str(&format!(
        "  CA:       {} (signed the server certificate; pin it for verified TLS)\n",
        ca.display()
    ));
    out.push_str(
        "\nConnect (the first connection wakes the tenant's database; the database name \
         <tenant>.postgres picks the tenant):\n",
    );
    for t in &config.tenants {
        let u = tenant_urls(config, &dir, &t.id);
        out.push_str(&format!(
            "  tenant {id}\n    psql \"{url}\"\n    URL (psycopg, asyncpg, pgx, postgres.js, node-postgres*): {url}\n    \
             JDBC: {jdbc}\n    verified TLS (libpq, psycopg, asyncpg, pgx, node-postgres): {verified}\n",
            id = t.id,
            url = u.url,
            jdbc = u.jdbc,
            verified = u.verified_url,
        ));
    }
    out.push_str(&format!(
        "  * Node: node-postgres verifies the certificate even with sslmode=require, so trust the CA:\n    \
         export NODE_EXTRA_CA_CERTS={}\n",
        ca.display()
    ));
    if let (Some(http), Some(first)) = (config.listen.http, config.tenants.first()) {
        let u = tenant_urls(config, &dir, &first.id);
        out.push_str(&format!(
            "\nServerless driver (@neondatabase/serverless; Node with NODE_EXTRA_CA_CERTS as above):\n  \
             neonConfig.fetchEndpoint = () => 'https://{http}/sql';\n  \
             neonConfig.wsProxy = () => '{http}/v2';\n  \
             const sql = neon('{}');\n",
            u.serverless
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
