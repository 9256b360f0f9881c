//! A pgwake gateway serving `local`-backend tenants (one for the wake and queue scenarios, many
//! for the scale scenario): its config, its admin API, and a stop that also makes sure no
//! Postgres it started outlives it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pgwake_testkit::{TestCert, free_port};

use crate::client::Login;
use crate::http;
use crate::process::{Guarded, Stopped};
use crate::targets::serve_pgwake;

/// The superuser password of the harness's local tenants.
const PASSWORD: &str = "pgwake-bench-local";

/// How a local-tenant gateway is configured beyond the defaults.
pub struct Spec<'a> {
    /// Tenant id.
    pub tenant: &'a str,
    /// Lines of the `[wake]` section.
    pub wake: Vec<String>,
    /// Lines of `[limits]`.
    pub limits: Vec<String>,
    /// Extra `postgresql.conf` lines for the tenant (`[local.settings]`, values as Postgres
    /// reads them, e.g. `pre_auth_delay = "'40s'"`).
    pub settings: Vec<String>,
    /// Lines of `[revival]`.
    pub revival: Vec<String>,
    /// Lines of `[auth]` (e.g. the throttle's settings).
    pub auth: Vec<String>,
}

/// One tenant as `GET /v1/tenants` shows it.
#[derive(Clone, Debug)]
pub struct TenantStatus {
    /// asleep, waking, awake, sleeping or failed.
    pub state: String,
    /// When it entered that state, seconds since the Unix epoch.
    pub since: f64,
    /// Connections waiting for a wake.
    pub waiters: u64,
    /// Duration of the last successful wake (spawn until a readiness probe got an answer).
    pub last_wake_ms: Option<f64>,
}

/// What happened when the gateway was stopped.
#[derive(Clone, Debug)]
pub struct StopReport {
    /// How the gateway process itself went.
    pub gateway: Stopped,
    /// A tenant postmaster still running after the gateway exited (which the harness then
    /// stopped): its PID.
    pub leftover_postmaster: Option<i32>,
}

/// A running gateway with local tenants. Field order is drop order: the gateway stops first,
/// then the data directories are checked for a postmaster that outlived it, then the folder goes.
pub struct LocalGateway {
    guard: Guarded,
    /// The tenant id (the first one, when it serves several).
    pub tenant: String,
    /// Every tenant it serves, `tenant` first.
    tenants: Vec<String>,
    /// Postgres protocol port.
    pub port: u16,
    /// Admin port.
    pub admin: u16,
    /// The gateway's certificate (self-signed, for `localhost`).
    pub cert: TestCert,
    stopped: Option<StopReport>,
    dir: tempfile::TempDir,
}

impl LocalGateway {
    /// Writes the config into a fresh temporary folder and starts `binary` on it.
    pub fn start(binary: &Path, spec: &Spec<'_>) -> Result<LocalGateway> {
        LocalGateway::start_with_listen(binary, spec, &[])
    }

    /// Like [`LocalGateway::start`], with more lines in `[listen]` (e.g. `http = "…"`).
    pub fn start_with_listen(
        binary: &Path,
        spec: &Spec<'_>,
        listen: &[String],
    ) -> Result<LocalGateway> {
        let tenants = [(spec.tenant.to_owned(), Vec::new())];
        LocalGateway::start_inner(binary, spec, listen, &tenants)
    }

    /// Like [`LocalGateway::start`], serving `spec.tenant` and the `more` tenants, all with the
    /// same extra `[[tenant]]` lines (e.g. `max_backend_connections = 60`).
    pub fn start_tenants(
        binary: &Path,
        spec: &Spec<'_>,
        more: &[String],
        tenant_lines: &[String],
    ) -> Result<LocalGateway> {
        let tenants: Vec<(String, Vec<String>)> = std::iter::once(spec.tenant.to_owned())
            .chain(more.iter().cloned())
            .map(|id| (id, tenant_lines.to_vec()))
            .collect();
        LocalGateway::start_inner(binary, spec, &[], &tenants)
    }

    /// Like [`LocalGateway::start`], serving `tenants` (the first of which is `spec.tenant`),
    /// each with its own extra `[[tenant]]` lines.
    pub fn start_each(
        binary: &Path,
        spec: &Spec<'_>,
        tenants: &[(String, Vec<String>)],
    ) -> Result<LocalGateway> {
        if tenants.first().is_none_or(|(id, _)| id != spec.tenant) {
            bail!("the first tenant must be the spec's, {}", spec.tenant);
        }
        LocalGateway::start_inner(binary, spec, &[], tenants)
    }

    fn start_inner(
        binary: &Path,
        spec: &Spec<'_>,
        listen: &[String],
        tenants: &[(String, Vec<String>)],
    ) -> Result<LocalGateway> {
        let dir = tempfile::Builder::new()
            .prefix("pgwake-bench-local-")
            .tempdir()
            .context("create the gateway folder")?;
        // The tenant's data lives below; the postgres account must be able to walk through.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
        let cert = TestCert::new(&["localhost", "127.0.0.1"]);
        cert.write_to(dir.path())?;
        let (port, admin) = (free_port(), free_port());
        let lines = |v: &[String]| v.join("\n");
        let mut config = format!(
            "[listen]\n\
             postgres = \"127.0.0.1:{port}\"\n\
             admin = \"127.0.0.1:{admin}\"\n\
             allow_plaintext = true\n\
             {listen}\n\
             \n\
             [tls]\n\
             cert = \"cert.pem\"\n\
             key = \"key.pem\"\n\
             \n\
             [routing]\n\
             rules = [\"database\"]\n\
             \n\
             [limits]\n{limits}\n\
             \n\
             [wake]\n{wake}\n\
             \n\
             [revival]\n{revival}\n\
             \n\
             [auth]\n{auth}\n\
             \n\
             [local]\n\
             data_dir = \"data\"\n\
             password = \"{PASSWORD}\"\n\
             [local.settings]\n{settings}\n",
            listen = lines(listen),
            limits = lines(&spec.limits),
            wake = lines(&spec.wake),
            revival = lines(&spec.revival),
            auth = lines(&spec.auth),
            settings = lines(&spec.settings),
        );
        for (id, extra) in tenants {
            config.push_str(&format!(
                "\n[[tenant]]\nid = \"{id}\"\nbackend = {{ kind = \"local\" }}\n{}\n",
                lines(extra)
            ));
        }
        let tenants: Vec<String> = tenants.iter().map(|(id, _)| id.clone()).collect();
        let config_path = dir.path().join("pgwake.toml");
        fs::write(&config_path, config)?;
        let binary = binary.to_path_buf();
        let guard = serve_pgwake(
            &binary,
            &config_path,
            &dir.path().join("pgwake.log"),
            port,
            admin,
        )?
        // After SIGTERM the gateway drains sessions and then stops its tenants' servers with a
        // fast shutdown, which takes longer than a proxy's exit.
        .stopped_with("TERM", Duration::from_secs(60));
        Ok(LocalGateway {
            guard,
            tenant: spec.tenant.to_owned(),
            tenants,
            port,
            admin,
            cert,
            stopped: None,
            dir,
        })
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The last lines of the gateway's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.guard.log_tail(lines)
    }

    /// The tenant's Postgres data directory (created by the gateway's first wake).
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir_of(&self.tenant)
    }

    /// The Postgres data directory of one of the gateway's tenants.
    pub fn data_dir_of(&self, tenant: &str) -> PathBuf {
        self.dir.path().join("data").join(tenant).join("data")
    }

    /// The port the tenant's running Postgres listens on (line 4 of its `postmaster.pid`).
    pub fn postgres_port(&self) -> Result<u16> {
        let pid_file = self.data_dir().join("postmaster.pid");
        let text = fs::read_to_string(&pid_file)
            .with_context(|| format!("read {}", pid_file.display()))?;
        text.lines()
            .nth(3)
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| anyhow!("no port in {}", pid_file.display()))
    }

    /// A folder for the harness's own files next to the gateway's.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// How a client logs in to the tenant through the gateway.
    pub fn login(&self) -> Login {
        self.login_to(&self.tenant)
    }

    /// How a client logs in to one of the gateway's tenants.
    pub fn login_to(&self, tenant: &str) -> Login {
        Login {
            port: self.port,
            user: "pgwake".into(),
            password: PASSWORD.into(),
            dbname: format!("{tenant}.postgres"),
        }
    }

    /// How a client logs in to the tenant's Postgres directly on `port`.
    pub fn direct_login(&self, port: u16) -> Login {
        Login {
            port,
            user: "pgwake".into(),
            password: PASSWORD.into(),
            dbname: "postgres".into(),
        }
    }

    /// The value of an unlabelled metric of `GET /metrics`.
    pub fn metric(&self, name: &str) -> Result<f64> {
        let r = http::request(self.admin, "GET", "/metrics", Duration::from_secs(5))?;
        Ok(r.body
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0))
    }

    /// Every series of a labelled metric of `GET /metrics`, by the value of `label`.
    pub fn labelled_metrics(&self, name: &str, label: &str) -> Result<Vec<(String, f64)>> {
        let r = http::request(self.admin, "GET", "/metrics", Duration::from_secs(5))?;
        let prefix = format!("{name}{{{label}=\"");
        Ok(r.body
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&prefix)?;
                let (value, after) = rest.split_once("\"}")?;
                Some((value.to_owned(), after.trim().parse().ok()?))
            })
            .collect())
    }

    /// The tenant's row of `GET /v1/tenants`.
    pub fn status(&self) -> Result<TenantStatus> {
        let r = http::request(self.admin, "GET", "/v1/tenants", Duration::from_secs(5))?;
        if r.status != 200 {
            bail!("GET /v1/tenants answered {}: {}", r.status, r.body);
        }
        parse_status(&r.body, &self.tenant)
    }

    /// Puts the tenant to sleep with `POST /v1/tenants/{id}/sleep`, which answers once it is
    /// asleep. A client that just closed its connection may still count for a moment (409), so
    /// that answer is retried for a few seconds.
    pub fn sleep_tenant(&self) -> Result<()> {
        let path = format!("/v1/tenants/{}/sleep", self.tenant);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = http::request(self.admin, "POST", &path, Duration::from_secs(60))?;
            match r.status {
                200 => return Ok(()),
                409 if Instant::now() < deadline => sleep(Duration::from_millis(10)),
                _ => bail!("POST {path} answered {}: {}", r.status, r.body),
            }
        }
    }

    /// Stops the gateway with SIGTERM, then stops tenant postmasters that survived it (which
    /// would be a gateway bug, reported in the result: the first one's PID). Idempotent.
    pub fn stop(&mut self) -> StopReport {
        if let Some(done) = &self.stopped {
            return done.clone();
        }
        let gateway = self.guard.stop();
        let leftover_postmaster = self
            .tenants
            .iter()
            .filter_map(|t| stop_postmaster(&self.data_dir_of(t)))
            .collect::<Vec<_>>()
            .first()
            .copied();
        let report = StopReport {
            gateway,
            leftover_postmaster,
        };
        self.stopped = Some(report.clone());
        report
    }
}

impl Drop for LocalGateway {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

pub(crate) fn parse_status(body: &str, tenant: &str) -> Result<TenantStatus> {
    let all: serde_json::Value = serde_json::from_str(body).context("parse /v1/tenants")?;
    let t = all
        .as_array()
        .and_then(|a| a.iter().find(|t| t["id"] == tenant))
        .ok_or_else(|| anyhow!("tenant {tenant} missing from /v1/tenants: {body}"))?;
    let count = |k: &str| t[k].as_u64().ok_or_else(|| anyhow!("{k} missing in {t}"));
    Ok(TenantStatus {
        state: t["state"]
            .as_str()
            .ok_or_else(|| anyhow!("state missing in {t}"))?
            .to_owned(),
        since: t["since"].as_f64().unwrap_or(0.0),
        waiters: count("waiters")?,
        last_wake_ms: t["last_wake_ms"].as_f64(),
    })
}

/// Stops every process of the Postgres server of `data_dir` that is still running, and returns
/// the postmaster's PID if there was one.
///
/// It runs only after the gateway has exited, so whatever is left is an orphan that nobody will
/// use: an immediate shutdown (SIGQUIT) is enough, then SIGKILL. Processes are found by their
/// command line, which names the data directory (a temporary path of this run), so a reused PID
/// is never hit. A backend forked while the server was still starting keeps the postmaster's
/// command line; with `pre_auth_delay` it sleeps with SIGTERM blocked and the postmaster does not
/// signal it on shutdown, so it is stopped by name as well.
pub fn stop_postmaster(data_dir: &Path) -> Option<i32> {
    let postmaster: i32 = fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()?;
    if !processes_of(data_dir).contains(&postmaster) {
        return None;
    }
    for signal in [Signal::SIGQUIT, Signal::SIGKILL] {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = processes_of(data_dir);
            if left.is_empty() {
                return Some(postmaster);
            }
            if Instant::now() > deadline {
                break;
            }
            for pid in left {
                let _ = kill(Pid::from_raw(pid), signal);
            }
            sleep(Duration::from_millis(50));
        }
    }
    Some(postmaster)
}

/// Live processes (zombies have an empty command line) whose command line names `data_dir`.
fn processes_of(data_dir: &Path) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .any(|arg| Path::new(&*String::from_utf8_lossy(arg)) == data_dir)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_status_is_read_from_the_admin_list() {
        let body = r#"[{"id":"a","backend":"local","state":"asleep","since":1.0,"connections":0,
            "waiters":0,"last_wake_ms":null,"last_error":null},
            {"id":"wake","backend":"local","state":"awake","since":1700000000.5,"connections":2,
            "waiters":7,"last_wake_ms":81.25,"last_error":null}]"#;
        let s = parse_status(body, "wake").unwrap();
        assert_eq!(s.state, "awake");
        assert_eq!(s.waiters, 7);
        assert_eq!(s.last_wake_ms, Some(81.25));
        assert_eq!(s.since, 1700000000.5);
        assert_eq!(parse_status(body, "a").unwrap().last_wake_ms, None);
        assert!(parse_status(body, "missing").is_err());
    }
}
