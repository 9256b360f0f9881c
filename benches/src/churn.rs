//! Connection churn with backend connection reuse: `pgbench -C -S` (a new connection per
//! transaction) in two groups, each against Postgres direct, PgBouncer in session mode (which
//! keeps its server connections) and pgwake, with reuse on and off:
//! - TLS + SCRAM: every client logs in with SCRAM over TLS; pgwake authenticates clients itself
//!   (gateway authentication), with `[reuse]` on and off.
//! - plaintext, trust: Postgres trusts loopback; pgwake's tenant is passthrough (no gateway
//!   credentials), with `reuse_passthrough` and without.
//!
//! Each proxy row carries the proxy's CPU time per connection, read from /proc around each run,
//! and every row pgbench's own CPU time per connection (its rusage), which bounds what any target
//! can reach on these shared CPUs: the TLS handshake and SCRAM's key derivation are the client's
//! work whatever it connects to.

use std::fmt::Write as _;
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use crate::process::{ProcSample, clock_ticks_per_second, load_average};
use crate::report::{Facts, median};
use crate::targets::{Auth, Environment, Target, TargetKind, Variant};

/// What the issue asks of pgwake with reuse, per group: the row and its ratio over PgBouncer.
const GOALS: [(&str, f64); 2] = [(REUSE_ON, 2.0), (PASSTHROUGH_REUSE, 1.0)];
/// The gateway-authenticated row with `[reuse]` on.
const REUSE_ON: &str = "pgwake, reuse on";
/// The passthrough row with `reuse_passthrough`.
const PASSTHROUGH_REUSE: &str = "pgwake passthrough, reuse_passthrough";
/// The groups, in table order: title and the pgbench `sslmode` of every row in it.
const GROUPS: [(&str, &str); 2] = [("TLS + SCRAM", "require"), ("plaintext, trust", "disable")];

/// How much to run.
#[derive(Clone, Copy, Debug)]
pub struct ChurnOptions {
    /// Interleaved repetitions.
    pub reps: u32,
    /// Seconds per pgbench run.
    pub secs: u32,
    /// pgbench scale factor.
    pub scale: u32,
}

/// One row of the table: a target and its runs.
#[derive(Clone, Debug)]
pub struct Row {
    /// Which group (index into the group titles).
    pub group: usize,
    /// Label.
    pub name: &'static str,
    /// Connections (= transactions) per second, one per repetition.
    pub tps: Vec<f64>,
    /// Proxy CPU per connection, µs, one per repetition (none for direct).
    pub cpu_us: Vec<f64>,
    /// pgbench's own CPU (user + system) per connection, µs, one per repetition.
    pub client_us: Vec<f64>,
}

/// `pgwake_backend_reuse_total` of one reuse gateway.
#[derive(Clone, Debug)]
pub struct Counters {
    /// The row it belongs to.
    pub name: &'static str,
    /// hit, miss, stale, untrusted.
    pub counts: [f64; 4],
}

/// What the churn run measured.
#[derive(Clone, Debug)]
pub struct ChurnResults {
    /// Every target of both groups.
    pub rows: Vec<Row>,
    /// The reuse gateways' counters.
    pub reuse: Vec<Counters>,
    /// The pgbench command line (without the `sslmode`, given per group).
    pub command: String,
    /// Load average before and after.
    pub load: (String, String),
    /// Versions for the facts table.
    pub software: Vec<(&'static str, String)>,
}

/// A target to measure: its group, label, endpoint and, for a reuse gateway, its admin port.
struct Planned {
    group: usize,
    name: &'static str,
    target: Target,
    admin: Option<u16>,
}

/// The environment's direct and PgBouncer targets, as rows of `group`; an error when PgBouncer
/// did not start.
fn direct_and_bouncer(env: &Environment, group: usize) -> Result<Vec<Planned>> {
    let mut out = Vec::new();
    for t in &env.targets {
        let name = match t.kind {
            TargetKind::Direct => "direct Postgres",
            TargetKind::PgBouncer => "PgBouncer (session mode)",
            TargetKind::Pgwake => continue,
        };
        out.push(Planned {
            group,
            name,
            target: t.clone(),
            admin: None,
        });
    }
    if !out.iter().any(|p| p.target.kind == TargetKind::PgBouncer) {
        let why = env
            .skipped
            .iter()
            .find(|(k, _)| *k == TargetKind::PgBouncer)
            .map_or("unknown", |(_, w)| w.as_str());
        bail!("PgBouncer is needed for this comparison: {why}");
    }
    Ok(out)
}

/// A pgwake variant as a row of `group`; `counted` when its reuse counters are reported.
fn gateway(group: usize, name: &'static str, v: Variant, counted: bool) -> Planned {
    Planned {
        group,
        name,
        target: v.target,
        admin: counted.then_some(v.admin),
    }
}

/// Starts both environments (SCRAM and trust Postgres, each with its PgBouncer) and the four
/// pgwake instances.
fn start(binary: &Path, scale: u32) -> Result<(Vec<Environment>, Vec<Planned>)> {
    let mut scram = Environment::start(scale, Auth::Scram, Err("started by churn"))?;
    let mut plan = direct_and_bouncer(&scram, 0)?;
    let on = scram.start_pgwake_variant(binary, "pgwake-reuse", "")?;
    let off = scram.start_pgwake_variant(binary, "pgwake-noreuse", "[reuse]\nenabled = false\n")?;
    plan.push(gateway(0, REUSE_ON, on, true));
    plan.push(gateway(0, "pgwake, reuse off", off, false));
    let mut trust = Environment::start(scale, Auth::Trust, Err("started by churn"))?;
    plan.extend(direct_and_bouncer(&trust, 1)?);
    // No credentials in a trust environment: the tenant is passthrough.
    let shared = trust.start_pgwake_variant(
        binary,
        "pgwake-passthrough-reuse",
        "reuse_passthrough = true\n",
    )?;
    let alone = trust.start_pgwake_variant(binary, "pgwake-passthrough", "")?;
    plan.push(gateway(1, PASSTHROUGH_REUSE, shared, true));
    plan.push(gateway(1, "pgwake passthrough, no reuse", alone, false));
    Ok((vec![scram, trust], plan))
}

/// Starts the targets and runs the interleaved repetitions.
pub fn run(binary: &Path, opts: ChurnOptions) -> Result<ChurnResults> {
    let load_before = load_average();
    let (envs, plan) = start(binary, opts.scale)?;
    let pgbench = envs[0].pgbench.clone();
    let args: Vec<String> = ["-n", "-C", "-S", "-c", "16", "-j", "2", "-T"]
        .iter()
        .map(|s| s.to_string())
        .chain([opts.secs.to_string()])
        .collect();
    let warmup: Vec<String> = ["-n", "-C", "-S", "-c", "4", "-j", "2", "-T", "1"]
        .map(String::from)
        .to_vec();
    for p in &plan {
        crate::progress(format_args!("churn: warming up {} ...", p.name));
        pgbench.run(&p.target.endpoint, GROUPS[p.group].1, &warmup)?;
    }
    let mut rows: Vec<Row> = plan
        .iter()
        .map(|p| Row {
            group: p.group,
            name: p.name,
            tps: Vec::new(),
            cpu_us: Vec::new(),
            client_us: Vec::new(),
        })
        .collect();
    for rep in 0..opts.reps as usize {
        for i in 0..plan.len() {
            // Rotated order spreads drift over every target.
            let idx = (i + rep) % plan.len();
            let m = measure(&pgbench, &plan[idx], &args)?;
            crate::progress(format_args!(
                "churn rep {}/{} {} / {}: {:.0} tps, {} µs proxy and {:.0} µs pgbench CPU per \
                 connection",
                rep + 1,
                opts.reps,
                GROUPS[plan[idx].group].0,
                plan[idx].name,
                m.tps,
                m.proxy_us.map_or("—".into(), |c| format!("{c:.0}")),
                m.client_us,
            ));
            rows[idx].tps.push(m.tps);
            rows[idx].cpu_us.extend(m.proxy_us);
            rows[idx].client_us.push(m.client_us);
            sleep(Duration::from_secs(1));
        }
    }
    let reuse = plan
        .iter()
        .filter_map(|p| Some((p.name, p.admin?)))
        .map(|(name, admin)| counters(name, admin))
        .collect::<Result<Vec<_>>>()?;
    let software = software(&envs[0]);
    drop(envs);
    if let Some(c) = reuse.iter().find(|c| c.counts[0] == 0.0) {
        return Err(anyhow!("{} never reused a connection", c.name));
    }
    Ok(ChurnResults {
        rows,
        reuse,
        command: format!("pgbench {}", args.join(" ")),
        load: (load_before, load_average()),
        software,
    })
}

/// What one pgbench run measured.
struct Measured {
    tps: f64,
    /// The proxy's CPU µs per connection (none for direct).
    proxy_us: Option<f64>,
    /// pgbench's own CPU µs per connection.
    client_us: f64,
}

/// CPU time (user + system) of this process's children that have been waited for, in µs.
fn children_cpu_us() -> Result<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_CHILDREN)?;
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    Ok(us(u.user_time()) + us(u.system_time()))
}

/// One pgbench run against `p`. pgbench is the only child waited for meanwhile, so the change
/// in the children's rusage is its CPU.
fn measure(pgbench: &crate::pgbench::Pgbench, p: &Planned, args: &[String]) -> Result<Measured> {
    let t = &p.target;
    let before = t.proxy_pid.map(ProcSample::read).transpose()?;
    let client_before = children_cpu_us()?;
    let summary = pgbench.run(&t.endpoint, GROUPS[p.group].1, args)?;
    let client_us = (children_cpu_us()? - client_before) / summary.transactions.max(1) as f64;
    if summary.transactions == 0 || summary.failed > 0 {
        bail!("{}: {} failed transactions", p.name, summary.failed);
    }
    let cpu = match before {
        Some(b) => {
            // Let the proxy finish with the last connections before sampling.
            sleep(Duration::from_millis(300));
            let a = ProcSample::read(t.proxy_pid.unwrap_or_default())?;
            let ticks = a.cpu_ticks.saturating_sub(b.cpu_ticks) as f64;
            let clk_tck = clock_ticks_per_second() as f64;
            Some(ticks / clk_tck * 1e6 / summary.transactions as f64)
        }
        None => None,
    };
    Ok(Measured {
        tps: summary.tps,
        proxy_us: cpu,
        client_us,
    })
}

/// The reuse counters of the gateway whose admin port is `admin`.
fn counters(name: &'static str, admin: u16) -> Result<Counters> {
    let metrics = crate::http::request(admin, "GET", "/metrics", Duration::from_secs(5))?.body;
    let count = |outcome: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("pgwake_backend_reuse_total{"))
            .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    Ok(Counters {
        name,
        counts: ["hit", "miss", "stale", "untrusted"].map(count),
    })
}

/// Versions of the measured programs.
fn software(env: &Environment) -> Vec<(&'static str, String)> {
    vec![
        ("PostgreSQL", env.postgres_version.clone()),
        (
            "pgbench",
            env.pgbench.version().unwrap_or_else(|| "unknown".into()),
        ),
        (
            "PgBouncer",
            env.pgbouncer_version
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        ),
    ]
}

/// The Markdown section for RESULTS.md.
pub fn render(command: &str, opts: ChurnOptions, outcome: &Result<ChurnResults, String>) -> String {
    let mut out = String::new();
    let software = outcome
        .as_ref()
        .map(|r| r.software.clone())
        .unwrap_or_default();
    let facts = Facts::collect(command, software);
    let Some(r) = facts.open_section(
        &mut out,
        "Connection churn with backend connection reuse",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "| method | `{}`, {} interleaved repetitions of {} s over both groups; PgBouncer: \
         `pool_mode = session`, plain password in its auth file; proxy CPU from /proc per run |",
        r.command, opts.reps, opts.secs
    );
    let _ = writeln!(
        out,
        "| TLS + SCRAM | `sslmode=require`, SCRAM-SHA-256 logins everywhere (libpq picks \
         SCRAM-SHA-256-PLUS where offered); pgwake: gateway authentication (static credentials \
         file with the backend's verifier), `[reuse]` defaults or `enabled = false` |"
    );
    let _ = writeln!(
        out,
        "| plaintext, trust | `sslmode=disable`, Postgres `trust` for host connections, \
         PgBouncer `auth_type = trust`; pgwake: a `fixed` passthrough tenant (no gateway \
         credentials), `reuse_passthrough = true` or not |"
    );
    for c in &r.reuse {
        let [hit, miss, stale, untrusted] = c.counts;
        let _ = writeln!(
            out,
            "| reuse counters, {} | hit {hit:.0}, miss {miss:.0}, stale {stale:.0}, untrusted \
             {untrusted:.0} |",
            c.name
        );
    }
    for (group, (title, _)) in GROUPS.iter().enumerate() {
        render_group(&mut out, title, group, &r.rows);
    }
    out
}

/// One group's table and its goal line.
fn render_group(out: &mut String, title: &str, group: usize, rows: &[Row]) {
    let rows: Vec<&Row> = rows.iter().filter(|row| row.group == group).collect();
    let bouncer = rows
        .iter()
        .find(|row| row.name.starts_with("PgBouncer"))
        .and_then(|row| median(&row.tps));
    let _ = writeln!(
        out,
        "\n### {title}\n\n\
         | target | median tps | min–max | vs PgBouncer | proxy CPU µs/connection | pgbench CPU \
         µs/connection |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    for row in &rows {
        let med = median(&row.tps).unwrap_or(0.0);
        let min = row.tps.iter().copied().fold(f64::INFINITY, f64::min);
        let max = row.tps.iter().copied().fold(0.0, f64::max);
        let ratio = bouncer.map_or("—".into(), |b| format!("{:.2}×", med / b));
        let cpu = median(&row.cpu_us).map_or("—".into(), |c| format!("{c:.0}"));
        let client = median(&row.client_us).map_or("—".into(), |c| format!("{c:.0}"));
        let _ = writeln!(
            out,
            "| {} | {med:.0} | {min:.0}–{max:.0} | {ratio} | {cpu} | {client} |",
            row.name
        );
    }
    let (goal_row, goal) = GOALS[group];
    let ours = rows.iter().find(|row| row.name == goal_row);
    let ours_tps = ours.and_then(|row| median(&row.tps));
    if let (Some(ours_tps), Some(b)) = (ours_tps, bouncer) {
        let ratio = ours_tps / b;
        let verdict = if ratio >= goal { "met" } else { "not met" };
        let _ = writeln!(
            out,
            "\nGoal: {goal_row} ≥ {goal}× PgBouncer session mode: **{ratio:.2}×, {verdict}**."
        );
        if let Some(client) = ours.and_then(|row| median(&row.client_us)) {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            let ceiling = cpus * 1e6 / client;
            let _ = writeln!(
                out,
                "\nCeiling: pgbench alone spends {client:.0} µs of CPU per connection in that row, \
                 so on {cpus:.0} CPUs no target can pass {ceiling:.0} connections/s \
                 ({:.2}× PgBouncer's median) even if the proxy and Postgres cost nothing.",
                ceiling / b
            );
        }
    }
}
