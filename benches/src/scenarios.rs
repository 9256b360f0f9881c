//! What the pgbench part of the harness measures: the scenarios that run today and the ones that
//! wait for gateway features.

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
    /// The documented durations: 20 s per throughput run, 10 s for the round trip.
    pub const FULL: Durations = Durations {
        load_secs: 20,
        round_trip_secs: 10,
        warmup_secs: 3,
    };
    /// Short runs so that `--quick` finishes in well under three minutes.
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
    /// Number in the issue's list, shown in the table.
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
}

impl Scenario {
    /// The pgbench command line as a person would type it, for the README and the table notes.
    pub fn command_line(&self) -> String {
        format!("pgbench {}", self.args.join(" "))
    }
}

/// The scenarios of issue 3, in table order.
pub fn scenarios(d: Durations) -> Vec<Scenario> {
    let t = d.load_secs.to_string();
    let load = |extra: &[&str]| -> Vec<String> {
        // -n: no vacuum before the run; the data was vacuumed once at initialization, and a
        // vacuum per run would go through the proxy and add noise.
        let mut a: Vec<String> = ["-n"].iter().chain(extra).map(|s| s.to_string()).collect();
        a.extend(["-c", "16", "-j", "2", "-T", &t].map(String::from));
        a
    };
    vec![
        Scenario {
            number: 1,
            name: "select-only, simple protocol",
            metric: Metric::Tps,
            sslmode: "disable",
            builtin_script: true,
            args: load(&["-S", "-M", "simple"]),
        },
        Scenario {
            number: 2,
            name: "select-only, extended protocol",
            metric: Metric::Tps,
            sslmode: "disable",
            builtin_script: true,
            args: load(&["-S", "-M", "extended"]),
        },
        Scenario {
            number: 3,
            name: "connection churn, plaintext",
            metric: Metric::Tps,
            sslmode: "disable",
            builtin_script: true,
            args: load(&["-C", "-S"]),
        },
        Scenario {
            number: 4,
            name: "connection churn, TLS",
            metric: Metric::Tps,
            sslmode: "require",
            builtin_script: true,
            args: load(&["-C", "-S"]),
        },
        Scenario {
            number: 5,
            name: "single-client round trip (SELECT 1)",
            metric: Metric::LatencyUs,
            sslmode: "disable",
            builtin_script: false,
            args: vec![
                "-n".into(),
                "-c".into(),
                "1".into(),
                "-j".into(),
                "1".into(),
                "-T".into(),
                d.round_trip_secs.to_string(),
                "-f".into(),
                SELECT1_SCRIPT.into(),
            ],
        },
    ]
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

/// A scenario the issue asks for that needs a gateway feature not built yet. Listed, never faked.
#[derive(Clone, Copy, Debug)]
pub struct Later {
    /// What would be measured.
    pub name: &'static str,
    /// The missing feature.
    pub needs: &'static str,
    /// The issue that builds it, once it has a number.
    pub issue: Option<u32>,
}

impl Later {
    /// "skipped: needs <feature> (issue N)".
    pub fn skip_reason(&self) -> String {
        match self.issue {
            Some(n) => format!("skipped: needs {} (issue {n})", self.needs),
            None => format!("skipped: needs {} (a later issue)", self.needs),
        }
    }
}

/// Scenarios that wait for later gateway features. (Wake latency and the memory of connections
/// queued for a wake are measured by the `wake` and `queued` commands.)
pub const LATER: &[Later] = &[
    Later {
        // Unlike a connection queued for a wake, a parked session has logged in and holds its
        // session state while its backend connection is closed.
        name: "parked-session memory: gateway RSS per logged-in idle session whose backend \
               connection was closed",
        needs: "park/revive of idle sessions",
        issue: None,
    },
    Later {
        name: "HTTP /sql: queries per second and latency over POST /sql",
        needs: "the HTTP /sql endpoint",
        issue: None,
    },
    Later {
        name: "revival latency: first query after a parked session is logged back in",
        needs: "park/revive with revival tokens",
        issue: None,
    },
];
