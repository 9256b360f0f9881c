//! What the pgbench part of the harness (the relay section) measures, and what issue 17 asks of
//! pgwake in each scenario.

use crate::pgbench::SELECT1_SCRIPT;

/// How long each kind of run lasts.
#[derive(Clone, Copy, Debug)]
pub struct Durations {
    /// Seconds of each throughput scenario (`-T`).
    pub load_secs: u32,
    /// Seconds of the single-client round-trip scenario.
    pub round_trip_secs: u32,
    /// Seconds of the warm-up run made once per target before the first repetition.
    pub warmup_secs: u32,
}

impl Durations {
    /// The documented durations: 10 s per run (issue 17's setup).
    pub const FULL: Durations = Durations {
        load_secs: 10,
        round_trip_secs: 10,
        warmup_secs: 3,
    };
    /// Short runs for `--quick`: 5 s each, so the relay section takes about three minutes.
    pub const QUICK: Durations = Durations {
        load_secs: 5,
        round_trip_secs: 5,
        warmup_secs: 1,
    };
}

/// Which pgbench figure a scenario reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Transactions per second; higher is better.
    Tps,
    /// Average latency in microseconds; lower is better.
    LatencyUs,
}

impl Metric {
    /// The unit shown next to the scenario name.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Tps => "tps",
            Metric::LatencyUs => "µs avg latency",
        }
    }
}

/// One pgbench run shape, executed against every target.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Number in the list, shown in the table.
    pub number: u8,
    /// Short description for the table.
    pub name: &'static str,
    /// What the table shows for it.
    pub metric: Metric,
    /// libpq `sslmode` for the client side.
    pub sslmode: &'static str,
    /// Whether it uses a built-in pgbench script, whose reported scale must match the data.
    pub builtin_script: bool,
    /// pgbench arguments (the connection comes from the environment).
    pub args: Vec<String>,
    /// What pgwake must reach against PgBouncer here, if anything.
    pub goal: Option<Goal>,
}

impl Scenario {
    /// "plaintext" or "TLS", from the client's sslmode.
    pub fn transport(&self) -> &'static str {
        if self.sslmode == "disable" {
            "plaintext"
        } else {
            "TLS"
        }
    }

    /// The pgbench command line as a person would type it, for the README and the table notes.
    pub fn command_line(&self) -> String {
        format!("pgbench {}", self.args.join(" "))
    }
}

/// What issue 17 asks of pgwake against PgBouncer in a scenario, checked from the figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// Throughput at least `min_tps` × PgBouncer's, proxy CPU per transaction at most
    /// `max_cpu` × PgBouncer's.
    Relay {
        /// Minimum ratio of medians, pgwake tps / PgBouncer tps.
        min_tps: f64,
        /// Maximum ratio of medians, pgwake CPU µs/tx / PgBouncer's.
        max_cpu: f64,
    },
    /// Latency at most `max_latency` × PgBouncer's.
    RoundTrip {
        /// Maximum ratio of medians, pgwake latency / PgBouncer latency.
        max_latency: f64,
    },
}

/// Issue 17's relay goal for `-S` simple and extended, plaintext and TLS.
const RELAY_GOAL: Goal = Goal::Relay {
    min_tps: 1.15,
    max_cpu: 0.8,
};
/// Issue 17's goal for the one-client round trip: no slower than PgBouncer.
const ROUND_TRIP_GOAL: Goal = Goal::RoundTrip { max_latency: 1.0 };

/// The scenarios in table order: each shape in plaintext and then with TLS on every target
/// (`sslmode=require`).
pub fn scenarios(d: Durations) -> Vec<Scenario> {
    let t = d.load_secs.to_string();
    let load = |extra: &[&str]| -> Vec<String> {
        // -n: no vacuum before the run; the data was vacuumed once at initialization, and a
        // vacuum per run would go through the proxy and add noise.
        let mut a: Vec<String> = ["-n"].iter().chain(extra).map(|s| s.to_string()).collect();
        a.extend(["-c", "16", "-j", "2", "-T", &t].map(String::from));
        a
    };
    let round_trip: Vec<String> = [
        "-n",
        "-c",
        "1",
        "-j",
        "1",
        "-T",
        &d.round_trip_secs.to_string(),
        "-f",
        SELECT1_SCRIPT,
    ]
    .map(String::from)
    .to_vec();
    let shape = |name, metric, builtin_script, args, goal| Scenario {
        number: 0,
        name,
        metric,
        sslmode: "disable",
        builtin_script,
        args,
        goal,
    };
    let shapes = [
        shape(
            "select-only, simple protocol",
            Metric::Tps,
            true,
            load(&["-S", "-M", "simple"]),
            Some(RELAY_GOAL),
        ),
        shape(
            "select-only, extended protocol",
            Metric::Tps,
            true,
            load(&["-S", "-M", "extended"]),
            Some(RELAY_GOAL),
        ),
        shape(
            "connection churn (passthrough login)",
            Metric::Tps,
            true,
            load(&["-C", "-S"]),
            None,
        ),
        shape(
            "one-client round trip (SELECT 1)",
            Metric::LatencyUs,
            false,
            round_trip,
            Some(ROUND_TRIP_GOAL),
        ),
    ];
    let mut out: Vec<Scenario> = Vec::new();
    for shape in shapes {
        for sslmode in ["disable", "require"] {
            out.push(Scenario {
                number: out.len() as u8 + 1,
                sslmode,
                ..shape.clone()
            });
        }
    }
    out
}

/// The warm-up run made once per target: it fills caches and pools, and proves the target
/// accepts logins before any measured run.
pub fn warmup_args(d: Durations) -> Vec<String> {
    [
        "-n",
        "-S",
        "-c",
        "4",
        "-j",
        "2",
        "-T",
        &d.warmup_secs.to_string(),
    ]
    .map(String::from)
    .to_vec()
}
