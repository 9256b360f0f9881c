//! The gateway's configuration: one TOML file, every key overridable by `PGWAKE_<SECTION>__<KEY>`
//! environment variables, validated once at start-up with errors that name the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use pgwake_routing::{Endpoint, Rule, TenantId};
use serde::Deserialize;

/// Top-level sections; only environment variables naming one of them are read as overrides.
const SECTIONS: &[&str] = &[
    "listen",
    "tls",
    "limits",
    "routing",
    "backend",
    "wake",
    "local",
    "auth",
    "kubernetes",
    "http",
    "revival",
    "reuse",
    "admin",
];

/// A configuration problem, naming the key and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or environment could not be read or parsed.
    #[error("{0}")]
    Parse(#[from] Box<figment::Error>),
    /// A value parsed but is not usable.
    #[error("{key}: {problem}")]
    Invalid {
        /// Dotted key path.
        key: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

/// The whole configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listening sockets.
    pub listen: ListenConfig,
    /// The admin API's access control.
    #[serde(default)]
    pub admin: AdminConfig,
    /// Certificates for client TLS.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Sizes and timeouts.
    #[serde(default)]
    pub limits: Limits,
    /// How tenants are found in a connection.
    #[serde(default)]
    pub routing: RoutingConfig,
    /// How the gateway talks to backends.
    #[serde(default)]
    pub backend: BackendConfig,
    /// Waking and idle sleep.
    #[serde(default)]
    pub wake: WakeConfig,
    /// The embedded local backend.
    #[serde(default)]
    pub local: Option<LocalConfig>,
    /// Client authentication at the gateway.
    #[serde(default)]
    pub auth: AuthConfig,
    /// The Kubernetes API, for `cnpg` and `pool` tenants.
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// SQL over HTTP and Postgres over WebSocket (the `listen.http` listener).
    #[serde(default)]
    pub http: HttpConfig,
    /// Parking, reviving and migrating sessions.
    #[serde(default)]
    pub revival: RevivalConfig,
    /// Keeping the backend connections of departed clients for the next client.
    #[serde(default)]
    pub reuse: ReuseConfig,
    /// Pools of pre-warmed clusters for `pool` tenants.
    #[serde(default, rename = "pool_class")]
    pub pool_classes: Vec<PoolClassConfig>,
    /// The tenants served.
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
}

/// `[admin]`: who may use the admin API's tenant endpoints.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// A file holding a bearer token that `/v1/…` requests must present (`Authorization:
    /// Bearer …`); none: no token (bind the admin listener to a private address).
    pub token_file: Option<PathBuf>,
}

/// `[listen]`: where the gateway accepts connections.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// Postgres protocol listener.
    pub postgres: SocketAddr,
    /// Admin HTTP listener (`/metrics`, `/healthz`, `/readyz`); none when absent.
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// Accept clients that do not use TLS. Off by default: passwords would cross in clear.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// HTTP listener for `POST /sql` and WebSocket tunnels (serverless drivers); none when
    /// absent. Same certificates as the Postgres listener.
    #[serde(default)]
    pub http: Option<SocketAddr>,
}

/// `[tls]`: the default certificate and more chosen by SNI.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Further certificates, each used for the server names it lists.
    #[serde(default)]
    pub certs: Vec<SniCert>,
}

/// `[[tls.certs]]`: a certificate for some server names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SniCert {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Names it serves: exact (`db.example.com`) or one wildcard label (`*.db.example.com`).
    pub server_names: Vec<String>,
}

/// `[limits]`: bounds on what a client or backend may cost.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest startup-phase message accepted from a client (startup, password, SASL).
    pub max_startup_message: ByteSize,
    /// Largest single message relayed in either direction once connected.
    pub max_message: ByteSize,
    /// Time a client has to negotiate TLS and send its startup message.
    #[serde(with = "humantime_serde")]
    pub startup_timeout: Duration,
    /// Time a client has, once its startup message is in, to finish authenticating (the whole
    /// SCRAM exchange, or its cleartext password over WebSocket).
    #[serde(with = "humantime_serde")]
    pub auth_timeout: Duration,
    /// Client connections the gateway holds at once (Postgres and WebSocket, logged in or not);
    /// more get FATAL 53300. Lowered at start-up to what the process's file limit can hold.
    pub max_client_connections: usize,
    /// Client connections still negotiating or authenticating; when full, the oldest of them is
    /// ended to make room for a new one. Lowered like `max_client_connections`.
    pub max_unauthenticated_connections: usize,
    /// Time to open a TCP connection (and TLS) to a backend.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time the login exchange with the backend may take, password round trips included.
    #[serde(with = "humantime_serde")]
    pub login_timeout: Duration,
    /// On SIGTERM, how long sessions may go on before they are ended.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Relay buffer per direction per connection.
    pub relay_buffer: ByteSize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_startup_message: ByteSize::kib(10),
            max_message: ByteSize::gib(1),
            startup_timeout: Duration::from_secs(10),
            auth_timeout: Duration::from_secs(15),
            max_client_connections: 10_000,
            max_unauthenticated_connections: 1_000,
            connect_timeout: Duration::from_secs(5),
            login_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
            relay_buffer: ByteSize::kib(16),
        }
    }
}

/// How a client naming a tenant that does not exist (or that it may not reach) is answered.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnknownTenant {
    /// Exactly as a wrong password (`28P01`), after a mock password exchange of equal cost:
    /// tenant names cannot be listed by probing.
    #[default]
    PasswordFailed,
    /// FATAL `08004` "unknown or forbidden tenant", with a hint on how to name one.
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

/// TLS on the gateway's link to a backend, with libpq's meanings.
///
/// The default is `disable` while authentication is relayed: a backend reached over TLS offers
/// SCRAM-SHA-256-PLUS, and SCRAM's downgrade protection then refuses libpq clients (default
/// `channel_binding=prefer`) whose own TLS link ends at the gateway.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendTls {
    /// Never.
    #[default]
    Disable,
    /// When the backend offers it.
    Prefer,
    /// Always; refuse a backend without TLS.
    Require,
}

/// `[backend]`: defaults for backend connections.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// TLS to backends.
    pub tls: BackendTls,
    /// CA certificates (PEM) that backend certificates must chain to; when set, certificates and
    /// host names are verified, otherwise the link is encrypted but not authenticated.
    pub ca: Option<PathBuf>,
}

/// `[wake]`: the accept queue, wake retries and idle sleep.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WakeConfig {
    /// How long a connection waits for its tenant to wake before FATAL 57P03.
    #[serde(with = "humantime_serde")]
    pub wake_timeout: Duration,
    /// Connections that may wait for one tenant; more get FATAL 53300 at once.
    pub max_waiters_per_tenant: usize,
    /// Connections that may wait across all tenants.
    pub max_waiters_total: usize,
    /// Attempts one wake makes before the tenant is marked failed.
    pub attempts: u32,
    /// Pause after a failed attempt (doubling each time).
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// How long a failed tenant refuses connections before the next wake.
    #[serde(with = "humantime_serde")]
    pub failed_retry_delay: Duration,
    /// A tenant with no connections for this long is put to sleep (per-tenant override:
    /// `idle_timeout` in `[[tenant]]`).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How often idle tenants are looked for.
    #[serde(with = "humantime_serde")]
    pub idle_check_interval: Duration,
    /// Tell clients that must wait "waking database …" with a NoticeResponse; sent after the
    /// gateway's AuthenticationOk (clients refuse notices earlier), so only for tenants the
    /// gateway authenticates.
    pub wake_notice: bool,
}

impl Default for WakeConfig {
    fn default() -> Self {
        WakeConfig {
            wake_timeout: Duration::from_secs(30),
            max_waiters_per_tenant: 1000,
            max_waiters_total: 10_000,
            attempts: 3,
            retry_backoff: Duration::from_millis(200),
            failed_retry_delay: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            idle_check_interval: Duration::from_secs(1),
            wake_notice: false,
        }
    }
}

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
    /// How long a fast shutdown may take before an immediate one.
    #[serde(default = "default_stop_timeout", with = "humantime_serde")]
    pub stop_timeout: Duration,
    /// Time between readiness probes while a server starts.
    #[serde(default = "default_probe_interval", with = "humantime_serde")]
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

/// `[kubernetes]`: how the gateway reaches the Kubernetes API.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// A kubeconfig file; unset: the in-cluster ServiceAccount, `KUBECONFIG` or ~/.kube/config.
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig (default: its current context).
    pub context: Option<String>,
    /// Namespace of tenants' clusters when a tenant names none (default: the client's).
    pub namespace: Option<String>,
    /// User named in readiness probes (any name works).
    pub probe_user: Option<String>,
    /// Serve every `Cluster` in `namespace` that carries `discover_label` as a tenant (the
    /// label's value is the tenant id), added and removed while the gateway runs.
    pub discover: bool,
    /// The label discovery looks for.
    pub discover_label: Option<String>,
    /// Who checks passwords of discovered tenants (default `gateway`, against the cluster's
    /// `<cluster>-app` Secret).
    pub discover_auth: Option<AuthMode>,
    /// Idle timeout of discovered tenants (default `[wake] idle_timeout`).
    #[serde(default, with = "humantime_serde")]
    pub discover_idle_timeout: Option<Duration>,
}

/// `[http]`: limits of `POST /sql` and its pool of backend connections.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Largest request body; a larger one is answered 413.
    pub max_request_size: ByteSize,
    /// Largest response body; a larger result is answered 507.
    pub max_response_size: ByteSize,
    /// Memory one `/sql` response may take while it is built; beyond it the body goes to an
    /// unnamed temporary file (in `$TMPDIR`) and is sent from there.
    pub response_memory: ByteSize,
    /// Time a `/sql` request may take once its backend connection is ready.
    #[serde(with = "humantime_serde")]
    pub query_timeout: Duration,
    /// Pooled backend connections per (tenant, user, database).
    pub pool_max_per_key: usize,
    /// Pooled backend connections in total.
    pub pool_max_total: usize,
    /// Idle pooled connections older than this are closed.
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// How long a request waits for a pool slot when the bounds are reached.
    #[serde(with = "humantime_serde")]
    pub pool_acquire_timeout: Duration,
    /// Time a client has to send a request's headers (HTTP/1.1), and the longest a kept-alive
    /// connection may sit idle between requests.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body; a slower one is answered 408.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_request_size: ByteSize::mib(10),
            max_response_size: ByteSize::mib(10),
            response_memory: ByteSize::mib(1),
            query_timeout: Duration::from_secs(300),
            pool_max_per_key: 20,
            pool_max_total: 500,
            pool_idle_timeout: Duration::from_secs(60),
            pool_acquire_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

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
    #[serde(default = "default_replenish_interval", with = "humantime_serde")]
    pub replenish_interval: Duration,
    /// How long the replenisher's Lease (`pgwake-pool-<name>`) is valid without renewal; another
    /// replica takes over replenishing this long after the holder stops renewing.
    #[serde(default = "default_lease_duration", with = "humantime_serde")]
    pub lease_duration: Duration,
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

/// Longest pool class name: generated cluster names (`<class>-xxxxx`) and their `-rw` Service
/// names must stay DNS labels.
const MAX_POOL_CLASS_NAME: usize = 40;

/// True for a value Kubernetes accepts as a label value that starts and ends alphanumeric.
fn label_value_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `[auth]`: settings shared by every tenant the gateway authenticates.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Failed attempts evaluated per (client IP, tenant) and per (tenant, user) before further
    /// attempts are refused unread.
    pub throttle_free_failures: u32,
    /// Wait after the last free failure; doubles with each further evaluated failure.
    #[serde(with = "humantime_serde")]
    pub throttle_base: Duration,
    /// Longest throttle wait.
    #[serde(with = "humantime_serde")]
    pub throttle_max: Duration,
    /// Entries the throttle remembers of each count ((client IP, tenant), (tenant, user)).
    pub throttle_capacity: u64,
    /// Highest SCRAM iteration count the gateway derives keys for when logging in to a backend
    /// with a password: a backend could otherwise make it burn CPU.
    pub max_backend_iterations: u32,
    /// How long verifiers fetched by `auth_query` are cached.
    #[serde(with = "humantime_serde")]
    pub auth_query_ttl: Duration,
    /// Key for the salts of mock exchanges with unknown users; set it so replicas and
    /// restarts answer alike (random per process when unset).
    pub mock_secret: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            throttle_free_failures: 3,
            throttle_base: Duration::from_secs(1),
            throttle_max: Duration::from_secs(300),
            throttle_capacity: 100_000,
            max_backend_iterations: 100_000,
            auth_query_ttl: Duration::from_secs(60),
            mock_secret: None,
        }
    }
}

/// `[revival]`: sessions that outlive their backend connection (park, revive, migrate).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RevivalConfig {
    /// Park idle sessions so their tenant can sleep, and move sessions off a backend that
    /// restarts; only sessions the gateway authenticated can be revived.
    pub enabled: bool,
    /// Keys that seal revival tokens, newest first (the first seals, all open); a random
    /// in-memory key when empty (tokens then die with the process).
    pub keys: Vec<RevivalKeyConfig>,
    /// How long a revival token stays valid; a session parked longer ends at its next message.
    #[serde(with = "humantime_serde")]
    pub token_ttl: Duration,
    /// Quiet time at a safe point after which the gateway records a session's state (settings,
    /// prepared statements, pins) with one query, so a restart of its backend can move it.
    #[serde(with = "humantime_serde")]
    pub snapshot_after: Duration,
    /// What an idle but pinned session (open transaction, temp table, advisory lock, LISTEN,
    /// held cursor) does to an idle tenant: keep it awake, or be ended with FATAL.
    pub pinned: PinnedPolicy,
    /// Time a revival may take: wake, reconnect (retried while the backend restarts), login
    /// and restoring settings and statements.
    #[serde(with = "humantime_serde")]
    pub revive_timeout: Duration,
    /// Named prepared statements a session may hold and still be moved.
    pub max_statements: usize,
    /// Largest recorded session state (settings and statement texts) a session may have and
    /// still be moved.
    pub max_snapshot: ByteSize,
}

impl Default for RevivalConfig {
    fn default() -> Self {
        RevivalConfig {
            enabled: true,
            keys: Vec::new(),
            token_ttl: Duration::from_secs(24 * 3600),
            snapshot_after: Duration::from_secs(1),
            pinned: PinnedPolicy::KeepAwake,
            revive_timeout: Duration::from_secs(30),
            max_statements: 1000,
            max_snapshot: ByteSize::kib(256),
        }
    }
}

/// `[reuse]`: backend connections of clients that left at a safe point, reset with
/// `DISCARD ALL` and kept for the next client with the same tenant and startup parameters.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReuseConfig {
    /// Keep connections for reuse; only sessions the gateway authenticated take part.
    pub enabled: bool,
    /// Idle connections kept for one tenant and set of startup parameters.
    pub max_idle_per_key: usize,
    /// Idle connections kept in all (the oldest of another key gives way when full).
    pub max_idle_total: usize,
    /// An idle connection kept longer than this is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Time the reset (`DISCARD ALL`) of a returned connection may take.
    #[serde(with = "humantime_serde")]
    pub reset_timeout: Duration,
}

impl Default for ReuseConfig {
    fn default() -> Self {
        ReuseConfig {
            enabled: true,
            max_idle_per_key: 16,
            max_idle_total: 256,
            idle_timeout: Duration::from_secs(60),
            reset_timeout: Duration::from_secs(2),
        }
    }
}

/// What a pinned idle session does to an idle tenant.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PinnedPolicy {
    /// The tenant stays awake while the session is open.
    #[default]
    KeepAwake,
    /// The session is ended with FATAL so the tenant can sleep.
    Terminate,
}

/// `[[revival.keys]]`: one token key.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevivalKeyConfig {
    /// Key id, stored in each token (1 to 255 bytes).
    pub id: String,
    /// The key: 32 bytes, base64.
    #[serde(default)]
    pub secret: Option<String>,
    /// A file holding the base64 key instead (e.g. a mounted Kubernetes Secret).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

impl std::fmt::Debug for RevivalKeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RevivalKeyConfig")
            .field("id", &self.id)
            .field("secret_file", &self.secret_file)
            .finish_non_exhaustive()
    }
}

impl RevivalConfig {
    /// The token key ring: the configured keys, or a random one.
    pub fn key_ring(&self) -> Result<pgwake_protocol::revival::RevivalKeys, ConfigError> {
        use base64::Engine;
        use pgwake_protocol::revival::{KEY_LEN, RevivalKeys};
        if self.keys.is_empty() {
            return Ok(RevivalKeys::generated());
        }
        let mut keys = Vec::new();
        for (i, k) in self.keys.iter().enumerate() {
            let key = format!("revival.keys[{i}]");
            let text = match (&k.secret, &k.secret_file) {
                (Some(s), None) => s.clone(),
                (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| {
                    invalid(
                        &key,
                        format!("cannot read secret_file {}: {e}", f.display()),
                    )
                })?,
                _ => return Err(invalid(&key, "set exactly one of secret and secret_file")),
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .ok()
                .and_then(|b| <[u8; KEY_LEN]>::try_from(b).ok())
                .ok_or_else(|| {
                    invalid(
                        &key,
                        "the secret must be 32 bytes in base64 (e.g. `openssl rand -base64 32`)",
                    )
                })?;
            keys.push((k.id.clone(), bytes));
        }
        RevivalKeys::new(keys).map_err(|e| invalid("revival.keys", e.to_string()))
    }
}

/// Who checks a client's password for a tenant.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// The gateway, against the tenant's credential source; a wrong password never wakes it.
    Gateway,
    /// The backend (the login is relayed); such sessions cannot be revived later.
    Passthrough,
}

/// Where the gateway finds a tenant's users and their secrets.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CredentialsConfig {
    /// A file of `"user" "secret"` lines (a SCRAM verifier, or a password), like PgBouncer's
    /// auth_file; `pgwake passwd USER` prints a line.
    Static {
        /// The file.
        file: PathBuf,
    },
    /// Verifiers looked up on the tenant's own database (which must then be awake).
    AuthQuery {
        /// Role the gateway logs in as to run the query.
        user: String,
        /// Its password.
        password: String,
        /// Database to connect to.
        #[serde(default = "default_auth_database")]
        database: String,
        /// Query taking the user name as `$1` and returning (name, verifier).
        #[serde(default = "default_auth_query")]
        query: String,
    },
    /// The local backend's superuser and password from `[local]`.
    Local,
    /// A Kubernetes Secret with `username` and `password` keys, like the `<cluster>-app`
    /// Secret CloudNativePG makes; watched, so a rotated password applies at once.
    KubernetesSecret {
        /// Secret name (default for `cnpg` tenants: `<cluster>-app`).
        #[serde(default)]
        secret: Option<String>,
        /// Its namespace (default: the cluster's, else `[kubernetes] namespace`).
        #[serde(default)]
        namespace: Option<String>,
    },
}

fn default_auth_database() -> String {
    "postgres".into()
}

fn default_auth_query() -> String {
    "SELECT usename, passwd FROM pgwake.user_lookup($1)".into()
}

/// `[[tenant]]`: one tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant id.
    pub id: TenantId,
    /// Where its database runs.
    pub backend: TenantBackend,
    /// Overrides `[wake] idle_timeout`.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// Who checks passwords (default: the gateway when credentials are known, else passthrough).
    #[serde(default)]
    pub auth: Option<AuthMode>,
    /// Where the tenant's users come from (default for local tenants: `local`).
    #[serde(default)]
    pub credentials: Option<CredentialsConfig>,
    /// Client networks allowed (empty: all).
    #[serde(default)]
    pub allow: Vec<ipnet::IpNet>,
    /// Client networks refused (checked first).
    #[serde(default)]
    pub deny: Vec<ipnet::IpNet>,
    /// Client connections this tenant may hold at once (none: only the gateway's cap); more
    /// get FATAL 53300.
    #[serde(default)]
    pub max_client_connections: Option<usize>,
}

impl TenantConfig {
    /// The credential source in force: the configured one, or `local` for local tenants.
    pub fn effective_credentials(&self) -> Option<CredentialsConfig> {
        match (&self.credentials, &self.backend) {
            (Some(c), _) => Some(c.clone()),
            (None, TenantBackend::Local) => Some(CredentialsConfig::Local),
            (None, _) => None,
        }
    }

    /// The auth mode in force.
    pub fn effective_auth(&self) -> AuthMode {
        self.auth
            .unwrap_or(if self.effective_credentials().is_some() {
                AuthMode::Gateway
            } else {
                AuthMode::Passthrough
            })
    }
}

/// A tenant's compute backend.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum TenantBackend {
    /// An always-on Postgres at `address` (`host:port`).
    Fixed {
        /// `host:port`.
        address: String,
        /// Overrides `[backend] tls` for this tenant.
        #[serde(default)]
        tls: Option<BackendTls>,
    },
    /// A Postgres server the gateway starts and stops itself (see `[local]`).
    Local,
    /// A CloudNativePG `Cluster`, woken by its `cnpg.io/hibernation` annotation.
    Cnpg {
        /// Cluster name.
        cluster: String,
        /// Its namespace (default `[kubernetes] namespace`).
        #[serde(default)]
        namespace: Option<String>,
        /// `host:port` to connect to instead of `<cluster>-rw.<namespace>.svc:5432`.
        #[serde(default)]
        endpoint: Option<String>,
    },
    /// A cluster claimed from a `[[pool_class]]` on the first wake and bound to the tenant.
    Pool {
        /// The pool class's name.
        class: String,
    },
}

impl Config {
    /// Reads `path`, applies `PGWAKE_*` overrides and validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        // Only `PGWAKE_<SECTION>__…` variables are config keys; others (PGWAKE_LOG) are not.
        let env = Env::prefixed("PGWAKE_")
            .filter(|key| {
                let key = key.as_str().to_ascii_lowercase();
                SECTIONS.iter().any(|s| {
                    key.strip_prefix(s)
                        .is_some_and(|rest| rest.starts_with("__") || rest.starts_with('.'))
                })
            })
            .split("__");
        let mut config: Config = Figment::new()
            .merge(Toml::file_exact(path))
            .merge(env)
            .extract()
            .map_err(Box::new)?;
        // Absolute, because Postgres servers of the local backend run in their own data
        // directory and would read a relative socket or data path from there.
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let base = std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf());
        config.resolve_paths(&base);
        config.validate()?;
        Ok(config)
    }

    /// Relative file names in the config are relative to the config file.
    fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(tls) = &mut self.tls {
            fix(&mut tls.cert);
            fix(&mut tls.key);
            for c in &mut tls.certs {
                fix(&mut c.cert);
                fix(&mut c.key);
            }
        }
        if let Some(ca) = &mut self.backend.ca {
            fix(ca);
        }
        for t in &mut self.tenants {
            if let Some(CredentialsConfig::Static { file }) = &mut t.credentials {
                fix(file);
            }
        }
        if let Some(k) = &mut self.kubernetes.kubeconfig {
            fix(k);
        }
        if let Some(f) = &mut self.admin.token_file {
            fix(f);
        }
        for k in &mut self.revival.keys {
            if let Some(f) = &mut k.secret_file {
                fix(f);
            }
        }
        for c in &mut self.pool_classes {
            fix(&mut c.template);
        }
        if let Some(local) = &mut self.local {
            fix(&mut local.data_dir);
            if let Some(bin) = &mut local.bin_dir {
                fix(bin);
            }
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.is_none() && !self.listen.allow_plaintext {
            return Err(invalid(
                "tls",
                "no certificate configured and listen.allow_plaintext is false: add [tls] cert \
                 and key, or allow plaintext explicitly",
            ));
        }
        if self.http.pool_max_per_key == 0 || self.http.pool_max_total == 0 {
            return Err(invalid(
                "http.pool_max_per_key",
                "pool bounds must be at least 1 (http.pool_max_per_key, http.pool_max_total)",
            ));
        }
        if self.http.header_timeout.is_zero() || self.http.body_timeout.is_zero() {
            return Err(invalid(
                "http.header_timeout",
                "http.header_timeout and http.body_timeout must be greater than zero",
            ));
        }
        if self.routing.rules.contains(&Rule::Sni) && self.routing.sni_suffix.is_none() {
            // Without a suffix the SNI rule can never match; that is allowed (IP-only setups)
            // but only when SNI is not the sole rule.
            if self.routing.rules.len() == 1 && self.routing.default_tenant.is_none() {
                return Err(invalid(
                    "routing.sni_suffix",
                    "the only routing rule is \"sni\" but no sni_suffix is set",
                ));
            }
        }
        let mut classes = std::collections::HashSet::new();
        for (i, c) in self.pool_classes.iter().enumerate() {
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
            if !classes.insert(c.name.as_str()) {
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
            if c.replenish_interval.is_zero() || c.replenish_interval > c.lease_duration / 3 {
                return Err(invalid(
                    format!("pool_class[{i}].replenish_interval"),
                    "must be greater than zero and at most a third of lease_duration, so the \
                     replenisher renews its lease in time",
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if !seen.insert(&t.id) {
                return Err(invalid(
                    format!("tenant[{i}].id"),
                    format!("tenant \"{}\" is configured twice", t.id),
                ));
            }
            match &t.backend {
                TenantBackend::Fixed { address, .. } => {
                    if Endpoint::parse(address).is_none() {
                        return Err(invalid(
                            format!("tenant[{i}].backend.address"),
                            format!("{address:?} is not host:port"),
                        ));
                    }
                }
                TenantBackend::Local if self.local.is_none() => {
                    return Err(invalid(
                        format!("tenant[{i}].backend"),
                        "kind = \"local\" needs a [local] section with data_dir and password",
                    ));
                }
                TenantBackend::Local => {}
                TenantBackend::Cnpg { endpoint, .. } => {
                    if let Some(e) = endpoint
                        && Endpoint::parse(e).is_none()
                    {
                        return Err(invalid(
                            format!("tenant[{i}].backend.endpoint"),
                            format!("{e:?} is not host:port"),
                        ));
                    }
                }
                TenantBackend::Pool { class } => {
                    if !classes.contains(class.as_str()) {
                        return Err(invalid(
                            format!("tenant[{i}].backend.class"),
                            format!("no [[pool_class]] is named {class:?}"),
                        ));
                    }
                    if !label_value_ok(t.id.as_str()) {
                        return Err(invalid(
                            format!("tenant[{i}].id"),
                            "a pool tenant's id is a Kubernetes label value: it must start and \
                             end with a letter or digit",
                        ));
                    }
                }
            }
            if t.effective_auth() == AuthMode::Gateway && t.effective_credentials().is_none() {
                return Err(invalid(
                    format!("tenant[{i}].credentials"),
                    "auth = \"gateway\" needs a credential source (static, auth_query, local or kubernetes_secret)",
                ));
            }
            if let Some(CredentialsConfig::KubernetesSecret { secret: None, .. }) = &t.credentials
                && !matches!(t.backend, TenantBackend::Cnpg { .. })
            {
                return Err(invalid(
                    format!("tenant[{i}].credentials.secret"),
                    "kind = \"kubernetes_secret\" needs a secret name unless the tenant is a cnpg cluster",
                ));
            }
            if matches!(t.effective_credentials(), Some(CredentialsConfig::Local))
                && self.local.is_none()
            {
                return Err(invalid(
                    format!("tenant[{i}].credentials"),
                    "kind = \"local\" credentials need a [local] section",
                ));
            }
        }
        // A discovered tenant can be the default; it is known only once its cluster is listed.
        if let Some(d) = &self.routing.default_tenant
            && !seen.contains(d)
            && !self.kubernetes.discover
        {
            return Err(invalid(
                "routing.default_tenant",
                format!("tenant \"{d}\" is not configured"),
            ));
        }
        let w = &self.wake;
        if w.wake_timeout.is_zero() || w.idle_check_interval.is_zero() {
            return Err(invalid(
                "wake.wake_timeout",
                "wake_timeout and idle_check_interval must be greater than zero",
            ));
        }
        if w.max_waiters_per_tenant == 0 || w.max_waiters_total == 0 || w.attempts == 0 {
            return Err(invalid(
                "wake.max_waiters_per_tenant",
                "max_waiters_per_tenant, max_waiters_total and attempts must be at least 1",
            ));
        }
        let r = &self.revival;
        if r.snapshot_after.is_zero() || r.revive_timeout.is_zero() || r.token_ttl.is_zero() {
            return Err(invalid(
                "revival.snapshot_after",
                "snapshot_after, revive_timeout and token_ttl must be greater than zero",
            ));
        }
        self.revival.key_ring()?;
        let u = &self.reuse;
        if u.enabled && (u.max_idle_per_key == 0 || u.max_idle_total == 0) {
            return Err(invalid(
                "reuse.max_idle_per_key",
                "max_idle_per_key and max_idle_total must be at least 1 (or set reuse.enabled = false)",
            ));
        }
        if u.idle_timeout.is_zero() || u.reset_timeout.is_zero() {
            return Err(invalid(
                "reuse.idle_timeout",
                "idle_timeout and reset_timeout must be greater than zero",
            ));
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.startup_timeout", l.startup_timeout),
            ("limits.connect_timeout", l.connect_timeout),
            ("limits.login_timeout", l.login_timeout),
            ("limits.auth_timeout", l.auth_timeout),
        ] {
            if v.is_zero() {
                return Err(invalid(key, "must be greater than zero"));
            }
        }
        if l.max_client_connections == 0 || l.max_unauthenticated_connections == 0 {
            return Err(invalid(
                "limits.max_client_connections",
                "max_client_connections and max_unauthenticated_connections must be at least 1",
            ));
        }
        if let Some(t) = self
            .tenants
            .iter()
            .find(|t| t.max_client_connections == Some(0))
        {
            return Err(invalid(
                "tenant.max_client_connections",
                format!(
                    "tenant {} allows no connection: set at least 1, or remove the key",
                    t.id
                ),
            ));
        }
        if l.max_startup_message.as_u64() < 64 || l.max_startup_message.as_u64() > 1 << 20 {
            return Err(invalid(
                "limits.max_startup_message",
                "must be between 64B and 1MiB",
            ));
        }
        if l.max_message.as_u64() < 1 << 10 || l.max_message.as_u64() > 1 << 30 {
            return Err(invalid(
                "limits.max_message",
                "must be between 1KiB and 1GiB",
            ));
        }
        if l.relay_buffer.as_u64() < 1 << 10 || l.relay_buffer.as_u64() > 16 << 20 {
            return Err(invalid(
                "limits.relay_buffer",
                "must be between 1KiB and 16MiB",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads `text` inside a figment Jail: Jails run one at a time, so no other test's
    /// PGWAKE_* variables can leak into this load.
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn load(text: &str) -> Result<Config, ConfigError> {
        let mut out = None;
        figment::Jail::expect_with(|jail| {
            let path = jail.directory().join("pgwake.toml");
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            out = Some(Config::load(&path));
            Ok(())
        });
        out.expect("the jail ran")
    }

    const EXAMPLE: &str = r#"
[listen]
postgres = "127.0.0.1:6432"
admin = "127.0.0.1:9090"
[tls]
cert = "cert.pem"
key = "key.pem"
[routing]
sni_suffix = "db.localtest"
rules = ["sni", "options", "database", "user"]
[[tenant]]
id = "alpha"
backend = { kind = "fixed", address = "127.0.0.1:5433" }
"#;

    #[test]
    fn example_parses_with_defaults() {
        let c = load(EXAMPLE).unwrap();
        assert_eq!(c.tenants.len(), 1);
        assert_eq!(c.limits.max_startup_message, ByteSize::kib(10));
        assert_eq!(c.limits.startup_timeout, Duration::from_secs(10));
        assert_eq!(c.limits.shutdown_grace, Duration::from_secs(30));
        assert!(c.tls.unwrap().cert.is_absolute());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn relative_config_paths_become_absolute() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "pgwake.toml",
                &format!("{EXAMPLE}[local]\ndata_dir = \"data\"\npassword = \"pw\"\n"),
            )?;
            let c = Config::load(Path::new("pgwake.toml")).map_err(|e| e.to_string())?;
            assert!(c.local.unwrap().data_dir.is_absolute());
            assert!(c.tls.unwrap().cert.is_absolute());
            Ok(())
        });
    }

    #[test]
    fn shipped_example_is_valid() {
        let c = load(include_str!("../../deploy/local/pgwake.toml")).unwrap();
        assert_eq!(c.tenants.len(), 2);
        assert_eq!(c.tenants[1].idle_timeout, Some(Duration::from_secs(60)));
    }

    #[test]
    fn reuse_defaults_and_bounds() {
        let c = load(EXAMPLE).unwrap();
        assert!(c.reuse.enabled);
        assert_eq!(c.reuse.max_idle_per_key, 16);
        let c = load(&format!("{EXAMPLE}[reuse]\nenabled = false\n")).unwrap();
        assert!(!c.reuse.enabled);
        let err = load(&format!("{EXAMPLE}[reuse]\nmax_idle_total = 0\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("reuse.max_idle_per_key"), "{err}");
    }

    #[test]
    fn kubernetes_secrets_need_a_name_outside_cnpg() {
        let fixed = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }\n\
             credentials = { kind = \"kubernetes_secret\" }",
        );
        let err = load(&fixed).unwrap_err().to_string();
        assert!(err.contains("credentials.secret"), "{err}");
        load(&fixed.replace(
            "kind = \"kubernetes_secret\" }",
            "kind = \"kubernetes_secret\", secret = \"alpha-app\" }",
        ))
        .unwrap();
        let cnpg = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"cnpg\", cluster = \"alpha\" }\n\
             credentials = { kind = \"kubernetes_secret\" }",
        );
        let c = load(&format!("{cnpg}[kubernetes]\ndiscover = true\n")).unwrap();
        assert!(c.kubernetes.discover);
    }

    #[test]
    fn local_tenants_need_a_local_section() {
        let text = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"local\" }\nidle_timeout = \"30s\"",
        );
        let err = load(&text).unwrap_err().to_string();
        assert!(err.contains("[local]"), "{err}");
        let c = load(&format!(
            "{text}[local]\ndata_dir = \"data\"\npassword = \"pw\"\n"
        ))
        .unwrap();
        assert_eq!(c.tenants[0].idle_timeout, Some(Duration::from_secs(30)));
        assert!(c.local.unwrap().data_dir.is_absolute());
        assert_eq!(c.wake.wake_timeout, Duration::from_secs(30));
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = load(&EXAMPLE.replace("admin =", "admn ="))
            .unwrap_err()
            .to_string();
        assert!(err.contains("admn"), "{err}");
        let err = load(&format!(
            "{EXAMPLE}\n[limits]\nstartup_timeout = \"soon\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("startup_timeout"), "{err}");
    }

    #[test]
    fn revival_keys() {
        let c = load(EXAMPLE).unwrap();
        assert!(c.revival.enabled);
        assert_eq!(c.revival.key_ring().unwrap().sealing_id(), "generated");
        let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let c = load(&format!(
            "{EXAMPLE}[revival]\npinned = \"terminate\"\n[[revival.keys]]\nid = \"new\"\nsecret = \"{key}\"\n[[revival.keys]]\nid = \"old\"\nsecret = \"{key}\"\n"
        ))
        .unwrap();
        assert_eq!(c.revival.pinned, PinnedPolicy::Terminate);
        assert_eq!(c.revival.key_ring().unwrap().sealing_id(), "new");
        assert!(!format!("{c:?}").contains(key), "no key in Debug");
        let err = load(&format!(
            "{EXAMPLE}[[revival.keys]]\nid = \"short\"\nsecret = \"AAEC\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("revival.keys[0]"), "{err}");
    }

    #[test]
    fn pool_classes_are_checked() {
        let pool = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"pool\", class = \"small\" }",
        );
        let class = "[[pool_class]]\nname = \"small\"\nmin_warm = 3\nrelease = \"delete\"\ntemplate = \"cluster.yaml\"\n";
        let c = load(&format!("{pool}{class}")).unwrap();
        let p = &c.pool_classes[0];
        assert_eq!((p.min_warm, p.release), (3, PoolRelease::Delete));
        assert!(p.template.is_absolute());
        assert_eq!(p.lease_duration, Duration::from_secs(15));
        let err = load(&pool).unwrap_err().to_string();
        assert!(err.contains("tenant[0].backend.class"), "{err}");
        let err = load(&format!("{pool}{}", class.replace("small", "Small")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool_class[0].name"), "{err}");
        let err = load(&format!("{pool}{class}replenish_interval = \"10s\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("replenish_interval"), "{err}");
        let err = load(&format!(
            "{}{class}",
            pool.replace("\"alpha\"", "\"alpha_\"")
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("label value"), "{err}");
    }

    #[test]
    fn plaintext_needs_opt_in() {
        let text = EXAMPLE.replace("[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n", "");
        let err = load(&text).unwrap_err().to_string();
        assert!(err.contains("allow_plaintext"), "{err}");
        let ok = text.replace("[listen]\n", "[listen]\nallow_plaintext = true\n");
        load(&ok).unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = load(&EXAMPLE.replace("127.0.0.1:5433", "nowhere"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("tenant[0].backend.address"), "{err}");
        let err = load(&format!("{EXAMPLE}[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"h:1\" }}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("configured twice"), "{err}");
        let err = load(&EXAMPLE.replace("id = \"alpha\"", "id = \"al.pha\""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid tenant id"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn environment_overrides() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("pgwake.toml", EXAMPLE)?;
            jail.set_env("PGWAKE_LIMITS__STARTUP_TIMEOUT", "2s");
            jail.set_env("PGWAKE_LISTEN__POSTGRES", "127.0.0.1:7000");
            jail.set_env("PGWAKE_LOG", "debug");
            let c = Config::load(Path::new("pgwake.toml")).map_err(|e| e.to_string())?;
            assert_eq!(c.limits.startup_timeout, Duration::from_secs(2));
            assert_eq!(c.listen.postgres.port(), 7000);
            Ok(())
        });
    }
}
