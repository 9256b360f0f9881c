//! Running `pgbench` against one endpoint and reading its summary.
//!
//! pgbench generates all the load; the harness only spawns it, waits, and parses the few summary
//! lines it prints at the end.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

/// How clients log in, the same on all three targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Auth {
    /// No password check anywhere (Postgres `trust`, PgBouncer `auth_type = trust`): connection
    /// churn then measures connection handling, not SCRAM's deliberately slow key derivation.
    Trust,
    /// SCRAM-SHA-256: Postgres checks direct and relayed (pgwake) logins, PgBouncer checks its
    /// own clients against the auth file. Realistic, but churn becomes mostly PBKDF2 time.
    Scram,
}

impl fmt::Display for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Auth::Trust => "trust",
            Auth::Scram => "scram-sha-256",
        })
    }
}

/// Where pgbench connects and how it logs in. Passed as libpq environment variables so the
/// command line stays the one documented for each scenario.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// Login user.
    pub user: String,
    /// Login password (SCRAM against Postgres or PgBouncer; relayed by pgwake).
    pub password: String,
    /// Database holding the pgbench tables.
    pub dbname: String,
}

/// The custom script of the round-trip scenario, relative to the pgbench working directory.
pub const SELECT1_SCRIPT: &str = "select1.sql";

/// A pgbench binary from the same PostgreSQL installation as the server.
#[derive(Clone, Debug)]
pub struct Pgbench {
    /// Path of the `pgbench` executable.
    pub program: PathBuf,
    /// Where pgbench runs and finds its custom scripts, so command lines in the report name
    /// scripts without a temporary path.
    pub workdir: PathBuf,
}

/// The numbers pgbench prints at the end of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// "scaling factor: N" (1 for custom scripts, the table's scale for built-in ones).
    pub scale: Option<u32>,
    /// "number of transactions actually processed".
    pub transactions: u64,
    /// "number of failed transactions" (pgbench 15+; 0 when absent).
    pub failed: u64,
    /// "latency average" in milliseconds.
    pub latency_ms: f64,
    /// The `tps = N (...)` figure. Without `-C` it excludes the initial connection time; with
    /// `-C` pgbench includes reconnection times, which is what churn measures.
    pub tps: f64,
}

impl Pgbench {
    /// Runs pgbench with `args` against `endpoint` using `sslmode`, and parses its summary.
    /// A non-zero exit (for example a client aborted) is an error carrying pgbench's stderr.
    pub fn run(&self, endpoint: &Endpoint, sslmode: &str, args: &[String]) -> Result<Summary> {
        let out = self
            .command(endpoint, sslmode)
            .args(args)
            .output()
            .with_context(|| format!("run {}", self.program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "pgbench {} exited with {}: {}",
                args.join(" "),
                out.status,
                last_lines(&stderr, 4)
            );
        }
        parse_summary(&stdout).with_context(|| {
            format!(
                "parse pgbench output: {}\n{}",
                last_lines(&stdout, 6),
                last_lines(&stderr, 4)
            )
        })
    }

    /// Creates the pgbench tables at `scale` (`pgbench -i -s SCALE`), vacuumed and analyzed.
    pub fn initialize(&self, endpoint: &Endpoint, scale: u32) -> Result<()> {
        let out = self
            .command(endpoint, "disable")
            .args(["-i", "-q", "-s", &scale.to_string()])
            .output()
            .context("run pgbench -i")?;
        if !out.status.success() {
            bail!(
                "pgbench -i -s {scale} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A pgbench command whose libpq settings all come from the environment. Inherited `PG*`
    /// variables are removed so a developer's own PGSERVICE or PGOPTIONS cannot change a run.
    fn command(&self, endpoint: &Endpoint, sslmode: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.current_dir(&self.workdir);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PG") {
                cmd.env_remove(key);
            }
        }
        cmd.env("PGHOST", "127.0.0.1")
            .env("PGPORT", endpoint.port.to_string())
            .env("PGUSER", &endpoint.user)
            .env("PGPASSWORD", &endpoint.password)
            .env("PGDATABASE", &endpoint.dbname)
            .env("PGSSLMODE", sslmode)
            .env("PGAPPNAME", "pgwake-bench");
        cmd
    }

    /// `pgbench --version`, e.g. "pgbench (PostgreSQL) 15.6".
    pub fn version(&self) -> Option<String> {
        crate::process::command_output(&self.program, &["--version"])
    }
}

/// Reads the summary block pgbench prints on stdout.
pub fn parse_summary(stdout: &str) -> Result<Summary> {
    let mut scale = None;
    let mut transactions = None;
    let mut failed = 0;
    let mut latency_ms = None;
    let mut tps = None;
    for line in stdout.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("scaling factor:") {
            scale = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("number of transactions actually processed:") {
            // "123456" or "123456/160000" when -t was used.
            transactions = first_number(v).map(|n| n as u64);
        } else if let Some(v) = line.strip_prefix("number of failed transactions:") {
            failed = first_number(v).map_or(0, |n| n as u64);
        } else if let Some(v) = line.strip_prefix("latency average =") {
            // pgbench always prints this one in milliseconds.
            latency_ms = first_number(v);
        } else if let Some(v) = line.strip_prefix("tps =") {
            // pgbench 14+ prints one tps line; older ones printed two, the second one
            // "excluding connections establishing". Keep the last, which is the steady-state one.
            tps = first_number(v);
        }
    }
    Ok(Summary {
        scale,
        transactions: transactions
            .ok_or_else(|| anyhow!("no 'number of transactions actually processed' line"))?,
        failed,
        latency_ms: latency_ms.ok_or_else(|| anyhow!("no 'latency average' line"))?,
        tps: tps.ok_or_else(|| anyhow!("no 'tps =' line"))?,
    })
}

/// The first decimal number in `s` (digits and at most one dot).
fn first_number(s: &str) -> Option<f64> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    let rest = &s[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// Writes the custom scripts the scenarios use into `dir`, pgbench's working directory.
pub fn write_scripts(dir: &Path) -> Result<()> {
    std::fs::write(dir.join(SELECT1_SCRIPT), "SELECT 1;\n").context("write select1.sql")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Output of pgbench 15 for `-S -c 16 -j 2 -T 5`.
    const STEADY: &str = "\
pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: select only>
scaling factor: 10
query mode: simple
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 5 s
number of transactions actually processed: 123456
number of failed transactions: 0 (0.000%)
latency average = 0.648 ms
initial connection time = 21.117 ms
tps = 24691.204 (without initial connection time)
";

    // Output of pgbench 15 for `-C -S`: the tps line includes reconnection times.
    const CHURN: &str = "\
transaction type: <builtin: select only>
scaling factor: 10
query mode: simple
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 5 s
number of transactions actually processed: 4321
number of failed transactions: 3 (0.069%)
latency average = 18.512 ms
average connection time = 17.903 ms
tps = 864.2 (including reconnection times)
";

    #[test]
    fn parses_steady_state_summary() {
        let s = parse_summary(STEADY).unwrap();
        assert_eq!(
            s,
            Summary {
                scale: Some(10),
                transactions: 123456,
                failed: 0,
                latency_ms: 0.648,
                tps: 24691.204
            }
        );
    }

    #[test]
    fn parses_churn_summary() {
        let s = parse_summary(CHURN).unwrap();
        assert_eq!(s.transactions, 4321);
        assert_eq!(s.failed, 3);
        assert_eq!(s.tps, 864.2);
        assert_eq!(s.latency_ms, 18.512);
    }

    #[test]
    fn missing_tps_is_an_error() {
        let text = STEADY.replace("tps = 24691.204 (without initial connection time)", "");
        assert!(parse_summary(&text).is_err());
    }

    #[test]
    fn transactions_with_a_target_count() {
        let text = STEADY.replace("123456", "160/160");
        assert_eq!(parse_summary(&text).unwrap().transactions, 160);
    }
}
