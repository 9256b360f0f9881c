//! Wake latency: a `local`-backend tenant is put to sleep and woken by a client's connection,
//! over and over, and every cycle splits the client's wait into the backend's own start, a warm
//! login, and what is left (the gateway's overhead). A Postgres-only floor, the same data
//! directory started by the harness itself while the tenant sleeps, shows what no gateway could
//! beat.

use std::fmt::Write as _;
use std::fs;
use std::process::Stdio;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use pgwake_testkit::{free_port, pg_bin_dir, pg_command};

use crate::client::{Login, Transport, connect_select1};
use crate::gateway::{LocalGateway, Spec};
use crate::process::{Guarded, load_average};
use crate::report::{Facts, fmt_ms, met, percentile};

/// How many cycles to run.
#[derive(Clone, Copy, Debug)]
pub struct WakeOptions {
    /// Sleep/wake cycles per transport (plaintext and TLS alternate); each plaintext cycle
    /// also starts Postgres alone once for the floor.
    pub cycles: u32,
}

/// Goals from the issue.
const GOAL_OVERHEAD_P50_MS: f64 = 5.0;
const GOAL_E2E_P50_MS: f64 = 300.0;
const GOAL_E2E_P99_MS: f64 = 500.0;

/// Pause between putting the tenant to sleep and waking it: the postmaster has exited when the
/// sleep call returns, but its last writes and the exit of its children should not overlap the
/// measured wake.
const SETTLE: Duration = Duration::from_millis(500);
/// Warm logins per cycle; their median is the cycle's warm baseline, so one scheduling hiccup
/// does not turn into a negative or inflated overhead.
const WARM_SAMPLES: usize = 3;
/// Limit for one timed connection.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// The gateway's default probe interval; the floor's retry loop uses the same pause.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// One measured sleep/wake cycle through the gateway.
#[derive(Clone, Debug)]
pub struct Cycle {
    /// plaintext or TLS.
    pub transport: &'static str,
    /// Client's connect start until the answer to `select 1`, tenant asleep before.
    pub e2e_ms: f64,
    /// The gateway's `last_wake_ms` for this wake.
    pub start_ms: f64,
    /// Median of the warm connect + `select 1` right after.
    pub warm_ms: f64,
}

impl Cycle {
    /// End-to-end minus backend start minus a warm login: what the wake path adds on top.
    pub fn overhead_ms(&self) -> f64 {
        self.e2e_ms - self.start_ms - self.warm_ms
    }
}

/// One start of Postgres alone.
#[derive(Clone, Debug)]
pub struct FloorCycle {
    /// Spawn until the first successful `select 1` (retrying every 5 ms).
    pub total_ms: f64,
    /// The successful attempt alone: connect, the first login on the fresh server, `select 1`.
    pub first_login_ms: f64,
    /// Median of warm connect + `select 1` right after, directly to Postgres.
    pub warm_ms: f64,
}

impl FloorCycle {
    /// Spawn until the successful attempt began: when the server had become ready, to within
    /// one retry pause.
    pub fn ready_ms(&self) -> f64 {
        self.total_ms - self.first_login_ms
    }

    /// How much slower the first login on a fresh server is than a warm one: that backend
    /// rebuilds the relation cache init file, which every start removes, and reads catalog pages
    /// into the fresh server's shared buffers.
    pub fn penalty_ms(&self) -> f64 {
        self.first_login_ms - self.warm_ms
    }
}

/// Everything the wake scenario measured.
pub struct WakeResults {
    /// Gateway cycles in the order run.
    pub cycles: Vec<Cycle>,
    /// Postgres-only starts.
    pub floor: Vec<FloorCycle>,
    /// Load average before and after.
    pub load: (String, String),
    /// Oddities seen, for the report.
    pub issues: Vec<String>,
}

/// Runs the scenario with the pgwake binary at `binary`.
pub fn run(binary: &std::path::Path, opts: WakeOptions) -> Result<WakeResults> {
    let load_before = load_average();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut gw = LocalGateway::start(
        binary,
        &Spec {
            tenant: "wake",
            // Sleep comes from the admin API; idle sleep must never race a cycle.
            wake: vec!["idle_timeout = \"1h\"".into()],
            limits: vec![],
            settings: vec![],
            revival: vec![],
            auth: vec![],
        },
    )?;
    let login = gw.login();
    let plain = Transport::Plain;
    let tls = Transport::tls(&gw.cert.cert_pem)?;
    let mut issues = Vec::new();

    crate::progress("wake: first connection (initdb and first start, not measured) ...");
    rt.block_on(connect_select1(&login, &plain, Duration::from_secs(120)))
        .with_context(|| format!("first connection: {}", gw.log_tail(5)))?;
    // One unmeasured cycle per transport: the first start after initdb differs (no autoprewarm
    // file yet, first checkpoint), and the client's TLS code runs for the first time.
    for transport in [&plain, &tls] {
        cycle(&rt, &gw, &login, transport)?;
    }

    let data_dir = gw.data_dir();
    let mut cycles = Vec::new();
    let mut floor = Vec::new();
    for i in 0..opts.cycles * 2 {
        // Alternating spreads drift on the machine evenly over both transports.
        let transport = if i % 2 == 0 { &plain } else { &tls };
        if i % 2 == 0 {
            // The floor runs inside the cycles, on the sleeping tenant's data directory, so both
            // see the same machine and the same on-disk state (just after a fast shutdown).
            gw.sleep_tenant()?;
            let f = floor_cycle(&rt, &gw, &data_dir)
                .with_context(|| format!("floor start {}", i / 2 + 1))?;
            crate::progress(format_args!(
                "floor      {:>2}/{} Postgres alone   {:7.1} ms  (first login {:5.1} ms, warm {:5.1} ms)",
                i / 2 + 1,
                opts.cycles,
                f.total_ms,
                f.first_login_ms,
                f.warm_ms
            ));
            floor.push(f);
        }
        let c = cycle(&rt, &gw, &login, transport)
            .with_context(|| format!("cycle {}: {}", i + 1, gw.log_tail(5)))?;
        crate::progress(format_args!(
            "wake cycle {:>2}/{} {:<9} end-to-end {:7.1} ms  start {:7.1} ms  warm {:5.1} ms  overhead {:6.1} ms",
            i + 1,
            opts.cycles * 2,
            c.transport,
            c.e2e_ms,
            c.start_ms,
            c.warm_ms,
            c.overhead_ms()
        ));
        cycles.push(c);
    }
    let stop = gw.stop();
    if let Some(pid) = stop.leftover_postmaster {
        issues.push(format!(
            "the tenant's postmaster (pid {pid}) was still running after the gateway exited"
        ));
    }
    drop(gw);
    Ok(WakeResults {
        cycles,
        floor,
        load: (load_before, load_average()),
        issues,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn cycle(
    rt: &tokio::runtime::Runtime,
    gw: &LocalGateway,
    login: &Login,
    transport: &Transport,
) -> Result<Cycle> {
    gw.sleep_tenant()?;
    sleep(SETTLE);
    let before = gw.status()?;
    if before.state != "asleep" {
        bail!("tenant is {} after the sleep call", before.state);
    }
    let woke_after = now_unix();
    let e2e = rt.block_on(connect_select1(login, transport, CONNECT_LIMIT))?;
    let after = gw.status()?;
    let start_ms = after
        .last_wake_ms
        .ok_or_else(|| anyhow!("no last_wake_ms after a wake"))?;
    // The wake must be this cycle's: the tenant turned awake after the cycle began.
    if after.state != "awake" || after.since < woke_after {
        bail!(
            "after the connection the tenant is {} since {} (cycle began at {woke_after})",
            after.state,
            after.since
        );
    }
    let warm_ms = warm(rt, login, transport)?;
    Ok(Cycle {
        transport: transport.label(),
        e2e_ms: ms(e2e),
        start_ms,
        warm_ms,
    })
}

fn warm(rt: &tokio::runtime::Runtime, login: &Login, transport: &Transport) -> Result<f64> {
    let mut samples = Vec::with_capacity(WARM_SAMPLES);
    for _ in 0..WARM_SAMPLES {
        samples.push(ms(rt.block_on(connect_select1(
            login,
            transport,
            CONNECT_LIMIT,
        ))?));
    }
    crate::report::median(&samples).ok_or_else(|| anyhow!("no warm samples"))
}

fn floor_cycle(
    rt: &tokio::runtime::Runtime,
    gw: &LocalGateway,
    data_dir: &std::path::Path,
) -> Result<FloorCycle> {
    let port = free_port();
    let direct = gw.direct_login(port);
    let log = gw.scratch().join("floor-postgres.log");
    let log_file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let bin = pg_bin_dir()?;
    sleep(SETTLE);
    let started = Instant::now();
    let child = pg_command(bin.join("postgres"))
        .arg("-D")
        .arg(data_dir)
        .args(["-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .context("spawn postgres")?;
    // SIGINT is the fast shutdown the gateway's sleep uses too.
    let mut pg = Guarded::new("postgres", child, log).stopped_with("INT", Duration::from_secs(30));
    let deadline = started + Duration::from_secs(30);
    let (total, first_login) = loop {
        let attempt = Instant::now();
        match rt.block_on(connect_select1(
            &direct,
            &Transport::Plain,
            Duration::from_secs(5),
        )) {
            Ok(_) => break (started.elapsed(), attempt.elapsed()),
            Err(e) => {
                if pg.exited().is_some() {
                    bail!("postgres exited during start-up: {}", pg.log_tail(5));
                }
                if Instant::now() > deadline {
                    bail!("postgres accepted no login within 30 s: {e:#}");
                }
                sleep(RETRY_PAUSE);
            }
        }
    };
    let warm_ms = warm(rt, &direct, &Transport::Plain)?;
    pg.stop();
    Ok(FloorCycle {
        total_ms: ms(total),
        first_login_ms: ms(first_login),
        warm_ms,
    })
}

/// The Markdown section for RESULTS.md.
pub fn render(facts: &Facts, opts: WakeOptions, outcome: &Result<WakeResults, String>) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(&mut out, "Wake latency (local backend)", outcome, |r| {
        &r.load
    }) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| method | {} sleep/wake cycles per transport, plaintext and TLS alternating, after one \
         unmeasured cycle each, and a Postgres-only start before each plaintext cycle; client: \
         tokio-postgres in the harness (SCRAM-SHA-256 login, simple-protocol `select 1`; over TLS \
         SCRAM-SHA-256-PLUS and no session resumption) |",
        opts.cycles
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| measure (ms) | n | p50 | p95 | p99 | min | max | goal | met |\n\
         |---|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for transport in ["plaintext", "TLS"] {
        let cs: Vec<&Cycle> = r
            .cycles
            .iter()
            .filter(|c| c.transport == transport)
            .collect();
        if cs.is_empty() {
            continue;
        }
        let e2e: Vec<f64> = cs.iter().map(|c| c.e2e_ms).collect();
        let start: Vec<f64> = cs.iter().map(|c| c.start_ms).collect();
        let warm: Vec<f64> = cs.iter().map(|c| c.warm_ms).collect();
        let overhead: Vec<f64> = cs.iter().map(|c| c.overhead_ms()).collect();
        let e2e_goal = (transport == "plaintext").then(|| {
            let met = percentile(&e2e, 50.0).is_some_and(|v| v <= GOAL_E2E_P50_MS)
                && percentile(&e2e, 99.0).is_some_and(|v| v <= GOAL_E2E_P99_MS);
            (
                format!("p50 ≤ {GOAL_E2E_P50_MS:.0}, p99 ≤ {GOAL_E2E_P99_MS:.0}"),
                met,
            )
        });
        let overhead_goal = (transport == "plaintext").then(|| {
            let met = percentile(&overhead, 50.0).is_some_and(|v| v <= GOAL_OVERHEAD_P50_MS);
            (format!("p50 ≤ {GOAL_OVERHEAD_P50_MS:.0}"), met)
        });
        row(
            &mut out,
            &format!("end-to-end, {transport}"),
            &e2e,
            e2e_goal,
        );
        row(
            &mut out,
            &format!("backend start (`last_wake_ms`), {transport} cycles"),
            &start,
            None,
        );
        row(
            &mut out,
            &format!("warm connect + select 1 via pgwake, {transport}"),
            &warm,
            None,
        );
        row(
            &mut out,
            &format!("gateway overhead (end-to-end − start − warm), {transport}"),
            &overhead,
            overhead_goal,
        );
    }
    if !r.floor.is_empty() {
        let of = |f: fn(&FloorCycle) -> f64| r.floor.iter().map(f).collect::<Vec<f64>>();
        row(
            &mut out,
            "Postgres alone: spawn → first row (plaintext, retry every 5 ms)",
            &of(|f| f.total_ms),
            None,
        );
        row(
            &mut out,
            "Postgres alone: spawn → start of the successful attempt (compare backend start)",
            &of(FloorCycle::ready_ms),
            None,
        );
        row(
            &mut out,
            "Postgres alone: the successful attempt (first login on the fresh server)",
            &of(|f| f.first_login_ms),
            None,
        );
        row(
            &mut out,
            "Postgres alone: warm connect + select 1",
            &of(|f| f.warm_ms),
            None,
        );
        row(
            &mut out,
            "Postgres alone: first-login penalty (first login − warm)",
            &of(FloorCycle::penalty_ms),
            None,
        );
        // Each floor start ran just before a plaintext cycle: pair them.
        let paired: Vec<f64> = r
            .cycles
            .iter()
            .filter(|c| c.transport == "plaintext")
            .zip(&r.floor)
            .map(|(c, f)| c.e2e_ms - f.total_ms)
            .collect();
        row(
            &mut out,
            "pgwake end-to-end − Postgres alone spawn → first row (paired, plaintext)",
            &paired,
            None,
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Percentiles are nearest-rank over the cycles (with 30 cycles p99 is the maximum). \
         End-to-end runs from the client's TCP connect to the answer of `select 1` while the \
         tenant was asleep. Backend start is the gateway's `last_wake_ms`: spawning `postgres` \
         until a readiness probe (a startup message answered with an authentication request) \
         succeeded. Warm is the median of {WARM_SAMPLES} fresh connections with `select 1` \
         through the gateway right after the wake. Overhead is computed per cycle, then its \
         percentiles are taken. The Postgres-only rows start the tenant's data directory (same \
         settings) directly as the postgres account while the tenant sleeps, after a fast \
         shutdown like the gateway's, and time from spawn to the first successful login and \
         `select 1`, retrying every 5 ms (the gateway's probe interval)."
    );
    if !r.issues.is_empty() {
        let _ = writeln!(out, "\nIssues seen:\n");
        for i in &r.issues {
            let _ = writeln!(out, "- {i}");
        }
    }
    let _ = writeln!(
        out,
        "\n<details><summary>Every cycle (ms)</summary>\n\n\
         | # | transport | end-to-end | backend start | warm | overhead |\n\
         |---:|---|---:|---:|---:|---:|"
    );
    for (i, c) in r.cycles.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            i + 1,
            c.transport,
            fmt_ms(c.e2e_ms),
            fmt_ms(c.start_ms),
            fmt_ms(c.warm_ms),
            fmt_ms(c.overhead_ms())
        );
    }
    let _ = writeln!(
        out,
        "\n| # | Postgres alone: spawn → first row | first login | warm |\n|---:|---:|---:|---:|"
    );
    for (i, f) in r.floor.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            i + 1,
            fmt_ms(f.total_ms),
            fmt_ms(f.first_login_ms),
            fmt_ms(f.warm_ms)
        );
    }
    let _ = writeln!(out, "\n</details>");
    out
}

fn row(out: &mut String, name: &str, values: &[f64], goal: Option<(String, bool)>) {
    let p = |q| percentile(values, q).map_or("—".into(), fmt_ms);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (goal, met) = match goal {
        Some((g, ok)) => (g, met(ok)),
        None => (String::new(), ""),
    };
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {} | {} | {goal} | {met} |",
        values.len(),
        p(50.0),
        p(95.0),
        p(99.0),
        fmt_ms(min),
        fmt_ms(max)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_subtracts_start_and_warm() {
        let c = Cycle {
            transport: "plaintext",
            e2e_ms: 120.0,
            start_ms: 100.0,
            warm_ms: 15.5,
        };
        assert_eq!(c.overhead_ms(), 4.5);
    }

    #[test]
    fn report_marks_goals() {
        let cycles = (0..10)
            .map(|i| Cycle {
                transport: "plaintext",
                e2e_ms: 100.0 + f64::from(i),
                start_ms: 80.0,
                warm_ms: 10.0,
            })
            .collect();
        let r = WakeResults {
            cycles,
            floor: vec![FloorCycle {
                total_ms: 90.0,
                first_login_ms: 12.0,
                warm_ms: 4.0,
            }],
            load: ("0.1 0.2 0.3".into(), "0.4 0.5 0.6".into()),
            issues: vec![],
        };
        let text = render(&Facts { rows: vec![] }, WakeOptions { cycles: 10 }, &Ok(r));
        // Overheads are 10..19 ms: p50 (nearest rank) 14 > 5, so the goal is missed.
        assert!(
            text.contains(
                "| gateway overhead (end-to-end − start − warm), plaintext | 10 | 14.0 |"
            ),
            "{text}"
        );
        assert!(text.contains("| p50 ≤ 5 | **no** |"), "{text}");
        assert!(text.contains("| p50 ≤ 300, p99 ≤ 500 | yes |"), "{text}");
        assert!(!text.contains("TLS cycles"), "{text}");
        let failed = render(
            &Facts { rows: vec![] },
            WakeOptions { cycles: 1 },
            &Err("pgwake did not build".into()),
        );
        assert!(failed.contains("Not measured: pgwake did not build"));
    }
}
