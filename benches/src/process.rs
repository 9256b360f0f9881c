//! Child processes the harness owns, and what /proc says about them.
//!
//! Everything here is read from /proc or done with `kill(1)`, so it adds nothing to the measured
//! path beyond a few file reads between runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A child process that is stopped by its PID when dropped, so an error or a panic anywhere in the
/// harness still leaves no proxy running.
pub struct Guarded {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
    signal: &'static str,
    limit: Duration,
}

/// How a stop went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The child had already exited (or was stopped before).
    Already,
    /// It exited this long after the stop signal.
    After(Duration),
    /// It ignored the stop signal for the whole limit and was killed.
    Killed,
}

impl Guarded {
    /// Takes ownership of a spawned child whose output goes to `log`. It is stopped with SIGTERM
    /// and killed if still there 5 s later.
    pub fn new(name: &'static str, child: Child, log: PathBuf) -> Guarded {
        Guarded {
            name,
            child: Some(child),
            log,
            signal: "TERM",
            limit: Duration::from_secs(5),
        }
    }

    /// Stops the child with `signal` (a `kill -s` name such as `INT`) instead, waiting up to
    /// `limit` before killing it.
    pub fn stopped_with(mut self, signal: &'static str, limit: Duration) -> Guarded {
        self.signal = signal;
        self.limit = limit;
        self
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `Some(status)` once the child has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last lines of the child's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Asks the child to stop with its stop signal (SIGTERM unless set otherwise: both PgBouncer
    /// and pgwake treat it as "shut down now"), then kills it if it has not gone within the limit.
    pub fn stop(&mut self) -> Stopped {
        let Some(mut child) = self.child.take() else {
            return Stopped::Already;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return Stopped::Already;
        }
        let sent = Instant::now();
        let _ = Command::new("kill")
            .args(["-s", self.signal, &child.id().to_string()])
            .status();
        while sent.elapsed() < self.limit {
            if let Ok(Some(_)) = child.try_wait() {
                return Stopped::After(sent.elapsed());
            }
            sleep(Duration::from_millis(5));
        }
        eprintln!(
            "{} (pid {}) ignored SIG{} for {:?}; killing it",
            self.name,
            child.id(),
            self.signal,
            self.limit
        );
        let _ = child.kill();
        let _ = child.wait();
        Stopped::Killed
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg`, as printed there.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// The last `lines` lines of a log file (empty if it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// CPU time and memory of one process at one moment.
#[derive(Clone, Copy, Debug)]
pub struct ProcSample {
    /// utime + stime of all its threads, in clock ticks.
    pub cpu_ticks: u64,
    /// Resident set size in KiB.
    pub rss_kib: u64,
}

impl ProcSample {
    /// Reads `/proc/PID/stat` and `/proc/PID/status`.
    pub fn read(pid: u32) -> Result<ProcSample> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("read /proc/{pid}/stat"))?;
        let status = fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("read /proc/{pid}/status"))?;
        Ok(ProcSample {
            cpu_ticks: parse_stat_cpu_ticks(&stat)
                .with_context(|| format!("parse /proc/{pid}/stat"))?,
            rss_kib: parse_status_rss_kib(&status)
                .with_context(|| format!("parse VmRSS in /proc/{pid}/status"))?,
        })
    }
}

/// utime + stime (fields 14 and 15) from a `/proc/PID/stat` line. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name, the first field is field 3 (state); utime is field 14.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` in KiB from `/proc/PID/status`.
pub fn parse_status_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Clock ticks per second for /proc CPU times (`getconf CLK_TCK`, almost always 100).
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// The scheduler autogroup of a process (e.g. `/autogroup-42`), from `/proc/PID/autogroup`.
/// With autogroup scheduling on, each session (setsid) gets its own CPU share, so processes
/// compared with each other must share one; `None` when the file is missing.
pub fn autogroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?;
    text.split_whitespace().next().map(str::to_owned)
}

/// `/proc/sys/kernel/sched_autogroup_enabled` as written there ("1" on, "0" off).
pub fn autogroup_enabled() -> String {
    fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown (no /proc/sys/kernel/sched_autogroup_enabled)".into())
}

/// Checks that every `(name, pid)` runs in the harness's own autogroup; returns a sentence for
/// the report, loud when one does not.
pub fn same_scheduling(processes: &[(String, u32)]) -> String {
    let own = autogroup(std::process::id());
    let odd: Vec<String> = processes
        .iter()
        .filter_map(|(name, pid)| {
            let theirs = autogroup(*pid);
            (theirs != own).then(|| {
                format!(
                    "{name} (pid {pid}) in {}",
                    theirs.as_deref().unwrap_or("unknown")
                )
            })
        })
        .collect();
    let names: Vec<&str> = processes.iter().map(|(n, _)| n.as_str()).collect();
    if odd.is_empty() {
        format!(
            "{} share the harness's autogroup ({}); pgbench is the harness's own child",
            names.join(", "),
            own.as_deref().unwrap_or("no autogroup")
        )
    } else {
        format!(
            "**NOT the same scheduling**: harness in {}, {}",
            own.as_deref().unwrap_or("unknown"),
            odd.join(", ")
        )
    }
}

/// Output of a command's stdout, trimmed, or `None` if it could not run or failed.
pub fn command_output(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Raises this process's open-files limit (children inherit it) towards `wanted`: the soft
/// limit up to the hard one, and the hard one too where that is allowed (root outside a
/// container). Returns the soft limit in force, which may be below `wanted`.
pub fn raise_nofile(wanted: u64) -> Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("getrlimit")?;
    if soft >= wanted {
        return Ok(soft);
    }
    if hard < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return Ok(wanted);
    }
    let target = wanted.min(hard);
    setrlimit(Resource::RLIMIT_NOFILE, target, hard).context("setrlimit")?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        // A name with a space and a parenthesis must not shift the fields.
        let stat = "4242 (pg bouncer) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    1234 567 0 0 20 0 1 0 100 10000000 2000 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(1234 + 567));
    }

    #[test]
    fn rss_is_read_from_status() {
        let status = "Name:\tpgbouncer\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\nThreads:\t1\n";
        assert_eq!(parse_status_rss_kib(status), Some(5120));
    }

    #[test]
    fn own_children_share_the_autogroup() {
        let line = same_scheduling(&[("this process".into(), std::process::id())]);
        assert!(!line.contains("NOT"), "{line}");
    }

    #[test]
    fn own_process_can_be_sampled() {
        let s = ProcSample::read(std::process::id()).unwrap();
        assert!(s.rss_kib > 0);
    }
}
