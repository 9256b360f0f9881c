//! Connection churn with backend connection reuse: `pgbench -C -S` (a new connection per
//! transaction) in two groups, each against Postgres direct, PgBouncer in session mode (which
//! keeps its server connections) and pgwake, with reuse on and off:
//! - TLS + SCRAM: every client logs in with SCRAM over TLS; pgwake authenticates clients itself
//!   (gateway authentication), with `[reuse]` on and off.
//! - plaintext, trust: Postgres trusts loopback; pgwake's tenant is passthrough (no gateway
//!   credentials), with `reuse_passthrough` and without.
//!
//! The peers pgcat and PgDog (session mode) join both groups when their binaries are there, and
//! the TLS + SCRAM group has the floor of a login too: the bare acceptor of
//! `examples/login_floor.rs` (TLS handshake and SCRAM against the same verifier, then constant
//! answers, no backend).
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

use crate::peers::floor_binary;
use crate::pgbench::Auth;
use crate::pgbench::Endpoint;
use crate::process::{Guarded, ProcSample, clock_ticks_per_second, load_average};
use crate::report::{Facts, median};
use crate::targets::{Environment, Target, TargetKind, Variant};

/// What the issue asks of pgwake with reuse, per group: the row and its ratio over PgBouncer.
const GOALS: [(&str, f64); 2] = [(REUSE_ON, 2.0), (PASSTHROUGH_REUSE, 1.0)];
/// The gateway-authenticated row with `[reuse]` on.
const REUSE_ON: &str = "pgwake, reuse on";
/// The passthrough row with `reuse_passthrough`.
const PASSTHROUGH_REUSE: &str = "pgwake passthrough, reuse_passthrough";
/// The groups, in table order: title and the pgbench `sslmode` of every row in it.
const GROUPS: [(&str, &str); 2] = [("TLS + SCRAM", "require"), ("plaintext, trust", "disable")];
/// The login floor's row.
const LOGIN_FLOOR: &str = "bare TLS + SCRAM acceptor (floor)";
/// Issue 29: pgwake's CPU per TLS + SCRAM login (reuse on) at most this × the floor's.
const LOGIN_FLOOR_MAX: f64 = 1.3;
/// Issue 29: pgwake's logins per CPU-second at least this × PgBouncer's.
const LOGINS_PER_CPU_MIN: f64 = 2.0;

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
    /// Targets left out (a peer or floor binary missing, or one that did not start), with why.
    pub skipped: Vec<String>,
}

/// A target to measure: its group, label, endpoint and, for a reuse gateway, its admin port.
struct Planned {
    group: usize,
    name: &'static str,
    target: Target,
    admin: Option<u16>,
}

/// The environment's direct, PgBouncer and peer targets, as rows of `group`; an error when
/// PgBouncer did not start.
fn direct_and_bouncer(env: &Environment, group: usize) -> Result<Vec<Planned>> {
    let mut out = Vec::new();
    for t in &env.targets {
        let name = match (t.kind, group) {
            (TargetKind::Direct, _) => "direct Postgres",
            (TargetKind::PgBouncer, _) => "PgBouncer (session mode)",
            // pgcat has no SCRAM for clients: in the SCRAM group they log in with MD5.
            (TargetKind::Pgcat, 0) => "pgcat (session mode, MD5 client logins)",
            (TargetKind::Pgcat, _) => "pgcat (session mode)",
            (TargetKind::PgDog, _) => "PgDog (session mode)",
            _ => continue,
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

/// Everything `start` started: both environments, the login floor (when its binary is there),
/// and the plan. Field order is drop order: the floor stops before the environments.
struct Started {
    floor: Option<Guarded>,
    envs: Vec<Environment>,
    plan: Vec<Planned>,
    skipped: Vec<String>,
}

/// Starts both environments (SCRAM and trust Postgres, each with its PgBouncer and peers), the
/// four pgwake instances and the login floor.
fn start(binary: &Path, scale: u32) -> Result<Started> {
    let mut scram = Environment::start(scale, Auth::Scram, Err("started by churn"))?;
    scram.start_peers(Auth::Scram)?;
    let mut plan = direct_and_bouncer(&scram, 0)?;
    let mut skipped = Vec::new();
    let floor = match start_login_floor(&scram) {
        Ok((guard, target)) => {
            plan.push(Planned {
                group: 0,
                name: LOGIN_FLOOR,
                target,
                admin: None,
            });
            Some(guard)
        }
        Err(e) => {
            skipped.push(format!("{LOGIN_FLOOR}: {e:#}"));
            None
        }
    };
    let on = scram.start_pgwake_variant(binary, "pgwake-reuse", "")?;
    let off = scram.start_pgwake_variant(binary, "pgwake-noreuse", "[reuse]\nenabled = false\n")?;
    plan.push(gateway(0, REUSE_ON, on, true));
    plan.push(gateway(0, "pgwake, reuse off", off, false));
    let mut trust = Environment::start(scale, Auth::Trust, Err("started by churn"))?;
    trust.start_peers(Auth::Trust)?;
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
    for (group, env) in [&scram, &trust].into_iter().enumerate() {
        for (kind, why) in &env.skipped {
            if matches!(kind, TargetKind::Pgcat | TargetKind::PgDog) {
                skipped.push(format!("{kind} ({}): {why}", GROUPS[group].0));
            }
        }
    }
    Ok(Started {
        floor,
        envs: vec![scram, trust],
        plan,
        skipped,
    })
}

/// Starts the bare TLS + SCRAM acceptor with the SCRAM environment's certificate and the
/// backend's verifier (the file pgwake's gateway authentication reads).
fn start_login_floor(env: &Environment) -> Result<(Guarded, Target)> {
    let program = floor_binary("login_floor").map_err(|e| anyhow!("{e}"))?;
    let users = env.dir().join("pgwake-users.txt");
    let (cert, key) = env.tls_files();
    let port = pgwake_testkit::free_port();
    let log = env.dir().join("login-floor.log");
    crate::progress(format_args!("starting the login floor ..."));
    let log_file = std::fs::File::create(&log)?;
    let child = std::process::Command::new(&program)
        .arg(port.to_string())
        .arg(cert)
        .arg(key)
        .arg(&users)
        .stdin(std::process::Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()?;
    let mut guard = Guarded::new("login_floor", child, log);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = guard.exited() {
            bail!("exited with {status}: {}", guard.log_tail(5));
        }
        if std::time::Instant::now() > deadline {
            bail!("not listening within 10 s");
        }
        sleep(Duration::from_millis(50));
    }
    let direct = env.direct()?;
    let target = Target {
        kind: TargetKind::LoginFloor,
        endpoint: Endpoint { port, ..direct },
        proxy_pid: Some(guard.pid()),
    };
    Ok((guard, target))
}

/// Starts the targets and runs the interleaved repetitions.
pub fn run(binary: &Path, opts: ChurnOptions) -> Result<ChurnResults> {
    let load_before = load_average();
    let Started {
        floor,
        envs,
        plan,
        skipped,
    } = start(binary, opts.scale)?;
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
    drop(floor);
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
        skipped,
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
    let mut out = vec![
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
    ];
    for (peer, version) in &env.peer_versions {
        out.push((
            match peer {
                crate::peers::Peer::Pgcat => "pgcat",
                crate::peers::Peer::PgDog => "PgDog",
            },
            version.clone(),
        ));
    }
    out
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
    if !r.skipped.is_empty() {
        let _ = writeln!(out, "\nTargets skipped:\n");
        for why in &r.skipped {
            let _ = writeln!(
                out,
                "- {}",
                why.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
    }
    out
}

/// Issue 29's CPU goals of one group, from the medians of proxy CPU per connection: the gateway
/// row against the login floor (at most 1.3×, TLS + SCRAM only), against PgBouncer in logins
/// per CPU-second (at least 2×, TLS + SCRAM only) and against each peer (at most 1×).
fn cpu_goals(out: &mut String, group: usize, rows: &[&Row]) {
    let (ours_name, _) = GOALS[group];
    let cpu = |prefix: &str| {
        rows.iter()
            .find(|row| row.name.starts_with(prefix))
            .and_then(|row| median(&row.cpu_us))
    };
    let Some(ours) = cpu(ours_name) else {
        return;
    };
    let verdict = |ok: bool| if ok { "met" } else { "not met" };
    let mut lines = Vec::new();
    if group == 0 {
        match cpu(LOGIN_FLOOR) {
            Some(floor) => lines.push(format!(
                "{ours_name} CPU per login ≤ {LOGIN_FLOOR_MAX}× the bare acceptor's: {ours:.0} \
                 against {floor:.0} µs, **{:.2}×, {}**",
                ours / floor,
                verdict(ours / floor <= LOGIN_FLOOR_MAX)
            )),
            None => lines.push(format!("{ours_name} against the login floor: not measured")),
        }
        if let Some(bouncer) = cpu("PgBouncer") {
            let ratio = bouncer / ours;
            lines.push(format!(
                "{ours_name} logins per CPU-second ≥ {LOGINS_PER_CPU_MIN}× PgBouncer's: \
                 {:.0} against {:.0}, **{ratio:.2}×, {}**",
                1e6 / ours,
                1e6 / bouncer,
                verdict(ratio >= LOGINS_PER_CPU_MIN)
            ));
        }
    }
    for peer in ["pgcat", "PgDog"] {
        match cpu(peer) {
            Some(theirs) => lines.push(format!(
                "{ours_name} CPU per connection ≤ {peer}'s: {ours:.0} against {theirs:.0} µs, \
                 **{:.2}×, {}**",
                ours / theirs,
                verdict(ours <= theirs)
            )),
            None => lines.push(format!("{ours_name} against {peer}: not measured")),
        }
    }
    let _ = writeln!(out, "\nIssue 29's goals, from the medians above:\n");
    for line in lines {
        let _ = writeln!(out, "- {line}.");
    }
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
    cpu_goals(out, group, &rows);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: usize, name: &'static str, cpu: f64) -> Row {
        Row {
            group,
            name,
            tps: vec![100.0],
            cpu_us: vec![cpu],
            client_us: vec![4000.0],
        }
    }

    #[test]
    fn issue_29_goals_compare_cpu_per_login_with_floor_bouncer_and_peers() {
        let rows = [
            row(0, "PgBouncer (session mode)", 4353.0),
            row(0, "pgcat (session mode, MD5 client logins)", 492.0),
            row(0, LOGIN_FLOOR, 434.0),
            row(0, REUSE_ON, 754.0),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let mut out = String::new();
        cpu_goals(&mut out, 0, &refs);
        assert!(
            out.contains("754 against 434 µs, **1.74×, not met**"),
            "{out}"
        );
        assert!(out.contains("1326 against 230, **5.77×, met**"), "{out}");
        assert!(
            out.contains("754 against 492 µs, **1.53×, not met**"),
            "{out}"
        );
        assert!(out.contains("against PgDog: not measured"), "{out}");
        // The plaintext group has no floor and no PgBouncer ratio goal, only the peers.
        let plain = [
            row(1, PASSTHROUGH_REUSE, 100.0),
            row(1, "PgDog (session mode)", 120.0),
        ];
        let refs: Vec<&Row> = plain.iter().collect();
        let mut out = String::new();
        cpu_goals(&mut out, 1, &refs);
        assert!(
            !out.contains("floor") && !out.contains("PgBouncer"),
            "{out}"
        );
        assert!(out.contains("100 against 120 µs, **0.83×, met**"), "{out}");
    }
}
