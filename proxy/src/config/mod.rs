//! The gateway's configuration: one TOML file, every key overridable by `PGWAKE_<SECTION>__<KEY>`
//! environment variables, validated once at start-up with errors that name the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::Deserialize;

mod auth;
mod backend;
pub mod duration;
mod http;
mod kubernetes;
mod limits;
mod listen;
mod local;
mod peer;
mod pool_class;
mod problems;
mod reuse;
mod revival;
mod routing;
mod tenant;
mod wake;

pub use auth::AuthConfig;
pub use backend::{BackendConfig, BackendTls};
pub use http::HttpConfig;
pub use kubernetes::{KubeRoute, KubernetesConfig};
pub use limits::Limits;
pub use listen::{AdminConfig, ListenConfig, SniCert, TlsConfig};
pub use local::LocalConfig;
pub use peer::PeerConfig;
pub use pool_class::{PoolClassConfig, PoolRelease};
pub use reuse::ReuseConfig;
pub use revival::{PinnedPolicy, RevivalConfig, RevivalKeyConfig, SequenceStatePolicy};
pub use routing::{RoutingConfig, UnknownTenant};
pub use tenant::{AuthMode, CredentialsConfig, TenantBackend, TenantConfig};
pub use wake::WakeConfig;

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
    "peer",
];

/// A configuration problem, naming the key and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or environment could not be read or parsed: every problem found, one line
    /// each, naming the key as it was written.
    #[error("{0}")]
    Parse(String),
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

/// Refuses `key` with `problem` unless every one of `values` is at least 1.
fn positive(key: &str, values: &[usize], problem: &str) -> Result<(), ConfigError> {
    match values.contains(&0) {
        true => Err(invalid(key, problem)),
        false => Ok(()),
    }
}

/// Refuses `key` with `problem` unless every one of `times` is longer than zero.
fn nonzero(key: &str, times: &[Duration], problem: &str) -> Result<(), ConfigError> {
    match times.iter().any(Duration::is_zero) {
        true => Err(invalid(key, problem)),
        false => Ok(()),
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
    /// Forwarding cancel requests between replicas (the `listen.peer` listener).
    #[serde(default)]
    pub peer: PeerConfig,
    /// Pools of pre-warmed clusters for `pool` tenants.
    #[serde(default, rename = "pool_class")]
    pub pool_classes: Vec<PoolClassConfig>,
    /// The tenants served.
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<TenantConfig>,
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
        let figment = Figment::new().merge(Toml::file_exact(path)).merge(env);
        let mut config: Config = problems::extract(&figment).map_err(ConfigError::Parse)?;
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
        if let Some(f) = &mut self.peer.token_file {
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

    /// Each section checks itself; what spans sections is checked here.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.is_none() && !self.listen.allow_plaintext {
            return Err(invalid(
                "tls",
                "no certificate configured and listen.allow_plaintext is false: add [tls] cert \
                 and key, or allow plaintext explicitly",
            ));
        }
        self.listen.validate()?;
        self.admin.validate()?;
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        self.limits.validate()?;
        self.auth.validate()?;
        self.http.validate()?;
        self.routing.validate()?;
        self.wake.validate()?;
        self.kubernetes.validate()?;
        self.revival.validate()?;
        self.reuse.validate()?;
        self.peer.validate(self.listen.peer)?;
        if let Some(local) = &self.local {
            local.validate()?;
        }
        let classes = pool_class::validate_all(&self.pool_classes)?;
        let tenants = tenant::validate_all(&self.tenants, self.local.is_some(), &classes)?;
        // A discovered tenant can be the default; it is known only once its cluster is listed.
        if let Some(d) = &self.routing.default_tenant
            && !tenants.contains(d)
            && !self.kubernetes.discover
        {
            return Err(invalid(
                "routing.default_tenant",
                format!("tenant \"{d}\" is not configured"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytesize::ByteSize;
    use pgwake_routing::PredictPolicy;

    use super::*;

    /// Asserts that `text` is refused with an error naming `key`.
    fn refused(text: &str, key: &str) {
        let err = load(text).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }

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
        let c = load(include_str!("../../../deploy/local/pgwake.toml")).unwrap();
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
        refused(
            &format!("{EXAMPLE}[reuse]\nmax_idle_total = 0\n"),
            "reuse.max_idle_per_key",
        );
        let passthrough = EXAMPLE.replace(
            "address = \"127.0.0.1:5433\" }",
            "address = \"127.0.0.1:5433\" }\nreuse_passthrough = true",
        );
        assert!(load(&passthrough).unwrap().tenants[0].reuse_passthrough);
        let gateway = passthrough.replace(
            "reuse_passthrough",
            "credentials = { kind = \"static\", file = \"users.txt\" }\nreuse_passthrough",
        );
        refused(&gateway, "tenant[0].reuse_passthrough");
    }

    #[test]
    fn kubernetes_secrets_need_a_name_outside_cnpg() {
        let fixed = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }\n\
             credentials = { kind = \"kubernetes_secret\" }",
        );
        refused(&fixed, "credentials.secret");
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
    fn activity_ttl_has_a_default_and_a_floor() {
        let c = load(EXAMPLE).unwrap();
        assert_eq!(c.kubernetes.activity_ttl(), Duration::from_secs(15));
        let c = load(&format!("{EXAMPLE}[kubernetes]\nactivity_ttl = \"3s\"\n")).unwrap();
        assert_eq!(c.kubernetes.activity_ttl(), Duration::from_secs(3));
        refused(
            &format!("{EXAMPLE}[kubernetes]\nactivity_ttl = \"200ms\"\n"),
            "kubernetes.activity_ttl",
        );
    }

    #[test]
    fn run_predictions_wake_ahead_unless_told_otherwise_gateway_wide_or_per_tenant() {
        let c = load(EXAMPLE).unwrap();
        assert_eq!(c.wake.predict, PredictPolicy::Wake);
        assert_eq!(c.tenants[0].predict, None);
        let text = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }\npredict = \"off\"",
        );
        let c = load(&format!(
            "{text}[wake]\npredict = \"wake_and_sleep\"\npredict_sleep_grace = \"5s\"\n"
        ))
        .unwrap();
        assert_eq!(c.wake.predict, PredictPolicy::WakeAndSleep);
        assert_eq!(c.wake.predict_sleep_grace, Duration::from_secs(5));
        assert_eq!(c.tenants[0].predict, Some(PredictPolicy::Off));
        let err = load(&format!("{EXAMPLE}[wake]\npredict = \"always\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("wake.predict"), "{err}");
        assert!(err.contains("wake_and_sleep"), "{err}");
    }

    #[test]
    fn local_tenants_need_a_local_section() {
        let text = EXAMPLE.replace(
            "backend = { kind = \"fixed\", address = \"127.0.0.1:5433\" }",
            "backend = { kind = \"local\" }\nidle_timeout = \"30s\"",
        );
        refused(&text, "[local]");
        let c = load(&format!(
            "{text}[local]\ndata_dir = \"data\"\npassword = \"pw\"\n"
        ))
        .unwrap();
        assert_eq!(c.tenants[0].idle_timeout, Some(Duration::from_secs(30)));
        assert!(c.local.unwrap().data_dir.is_absolute());
        assert_eq!(c.wake.wake_timeout, Duration::from_secs(30));
    }

    #[test]
    fn a_local_owner_comes_with_its_password_and_is_not_the_superuser() {
        let local = |extra: &str| {
            format!("{EXAMPLE}[local]\ndata_dir = \"data\"\npassword = \"pw\"\n{extra}")
        };
        refused(&local("owner = \"app\"\n"), "local.owner_password");
        refused(&local("owner_password = \"o\"\n"), "local.owner");
        let same = local("owner = \"pgwake\"\nowner_password = \"o\"\n");
        refused(&same, "must differ from local.superuser");
        let c = load(&local("owner = \"app\"\nowner_password = \"o\"\n")).unwrap();
        assert_eq!(c.local.unwrap().owner_login(), Some(("app", "o")));
    }

    #[test]
    fn peer_forwarding_needs_a_service_a_token_and_a_reachable_address() {
        let with = |listen: &str, peer: &str| {
            let text = EXAMPLE.replace(
                "admin = \"127.0.0.1:9090\"\n",
                &format!("admin = \"127.0.0.1:9090\"\npeer = \"{listen}\"\n"),
            );
            load(&format!("{text}\n[peer]\n{peer}\n")).map_err(|e| e.to_string())
        };
        let err = with("0.0.0.0:6433", "token_file = \"t\"").unwrap_err();
        assert!(err.starts_with("peer.service"), "{err}");
        let err = with("0.0.0.0:6433", "service = \"pgwake\"").unwrap_err();
        assert!(err.starts_with("peer.token_file"), "{err}");
        let both = "service = \"pgwake\"\ntoken_file = \"t\"";
        let err = with("0.0.0.0:6433", both).unwrap_err();
        assert!(err.starts_with("peer.advertise"), "{err}");
        let c = with(
            "0.0.0.0:6433",
            &format!("{both}\nadvertise = \"10.0.0.5:6433\""),
        )
        .unwrap();
        assert_eq!(
            c.peer.advertised(c.listen.peer.unwrap()),
            Some("10.0.0.5:6433".parse().unwrap())
        );
        let c = with("10.0.0.6:6433", both).unwrap();
        assert_eq!(c.peer.advertised(c.listen.peer.unwrap()), c.listen.peer);
        let err = with("10.0.0.6:6433", &format!("{both}\nforward_rate = 0.0")).unwrap_err();
        assert!(err.starts_with("peer.forward_rate"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        refused(&EXAMPLE.replace("admin =", "admn ="), "admn");
        refused(
            &format!("{EXAMPLE}\n[limits]\nstartup_timeout = \"soon\"\n"),
            "startup_timeout",
        );
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
        refused(
            &format!("{EXAMPLE}[[revival.keys]]\nid = \"short\"\nsecret = \"AAEC\"\n"),
            "revival.keys[0]",
        );
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
        assert_eq!(p.orphan_grace, Duration::from_secs(60));
        refused(
            &format!("{pool}{class}orphan_grace = \"0s\"\n"),
            "pool_class[0].orphan_grace",
        );
        refused(&pool, "tenant[0].backend.class");
        refused(
            &format!("{pool}{}", class.replace("small", "Small")),
            "pool_class[0].name",
        );
        refused(
            &format!("{pool}{class}replenish_interval = \"10s\"\n"),
            "replenish_interval",
        );
        refused(
            &format!("{}{class}", pool.replace("\"alpha\"", "\"alpha_\"")),
            "label value",
        );
    }

    #[test]
    fn plaintext_needs_opt_in() {
        let text = EXAMPLE.replace("[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n", "");
        refused(&text, "allow_plaintext");
        let ok = text.replace("[listen]\n", "[listen]\nallow_plaintext = true\n");
        load(&ok).unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        refused(
            &EXAMPLE.replace("127.0.0.1:5433", "nowhere"),
            "tenant[0].backend.address",
        );
        refused(
            &format!(
                "{EXAMPLE}[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"h:1\" }}\n"
            ),
            "configured twice",
        );
        refused(
            &EXAMPLE.replace("id = \"alpha\"", "id = \"al.pha\""),
            "invalid tenant id",
        );
    }

    #[test]
    fn proxy_protocol_and_certificate_watch() {
        let c = load(EXAMPLE).unwrap();
        assert!(c.listen.proxy_protocol_from.is_empty());
        assert_eq!(c.listen.proxy_protocol_max_header, ByteSize::kib(4));
        assert_eq!(c.tls.unwrap().watch_interval, Duration::from_secs(10));
        let with = EXAMPLE.replace(
            "admin = \"127.0.0.1:9090\"",
            "admin = \"127.0.0.1:9090\"\nproxy_protocol_from = [\"10.0.0.0/8\", \"fd00::/8\"]",
        );
        assert_eq!(load(&with).unwrap().listen.proxy_protocol_from.len(), 2);
        refused(
            &with.replace("10.0.0.0/8", "10.0.0.0/99"),
            "proxy_protocol_from",
        );
        refused(
            &with.replace(
                "proxy_protocol_from",
                "proxy_protocol_max_header = \"100B\"\nproxy_protocol_from",
            ),
            "listen.proxy_protocol_max_header",
        );
        refused(
            &EXAMPLE.replace(
                "key = \"key.pem\"",
                "key = \"key.pem\"\nwatch_interval = \"0s\"",
            ),
            "tls.watch_interval",
        );
    }

    #[test]
    fn session_threads_default_and_bound() {
        assert_eq!(load(EXAMPLE).unwrap().listen.session_threads, 0);
        let set = |n: &str| {
            EXAMPLE.replace(
                "admin = \"127.0.0.1:9090\"",
                &format!("admin = \"127.0.0.1:9090\"\nsession_threads = {n}"),
            )
        };
        assert_eq!(load(&set("3")).unwrap().listen.session_threads, 3);
        refused(&set("5000"), "listen.session_threads");
    }

    #[test]
    fn parse_errors_name_the_key_as_written_one_line_each() {
        let with = |extra: &str| load(&format!("{EXAMPLE}{extra}")).unwrap_err().to_string();
        let unknown = with("[wake]\nidle_timout = \"1m\"\n");
        assert!(
            unknown.ends_with(
                "wake.idle_timout: unknown key; the keys here are wake_timeout, \
                 max_waiters_per_tenant, max_waiters_total, attempts, retry_backoff, \
                 failed_retry_delay, idle_timeout, idle_check_interval, wake_notice, predict, \
                 predict_margin, predict_sleep_grace, predict_run_gap, predict_history_file, \
                 predict_history_max_size"
            ),
            "{unknown}"
        );
        let words = with("[wake]\nidle_timeout = \"1 minute\"\n");
        assert!(
            words.ends_with("wake.idle_timeout: invalid duration \"1 minute\": write numbers with a unit (ms, s, m, h or d), such as \"500ms\", \"30s\" or \"1m30s\""),
            "{words}"
        );
        let tenant = with("[[tenant]]\nid = \"beta\"\nbackend = { kind = \"nosuch\" }\n");
        assert!(tenant.contains("tenant[1].backend"), "{tenant}");
        for err in [&unknown, &words, &tenant] {
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(!err.contains("default.") && !err.contains('`'), "{err}");
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn an_environment_variable_is_named_as_set() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("pgwake.toml", EXAMPLE)?;
            jail.set_env("PGWAKE_WAKE__IDLE_TIMEOUT", "1 minute");
            let err = Config::load(Path::new("pgwake.toml"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(
                    "environment variable PGWAKE_WAKE__IDLE_TIMEOUT: invalid duration \"1 minute\""
                ),
                "{err}"
            );
            Ok(())
        });
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
