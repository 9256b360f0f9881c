//! Every metric the gateway exports, declared in one place with its help text.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use pgwake_routing::wake::PredictionCounts;
use pgwake_routing::{Phase, TenantStatus, WakeEvent};
use prometheus::core::Collector;
use prometheus::{
    CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every `kind` that `pgwake_errors_total` counts. Each starts at zero, so that `rate()`,
/// `increase()` and alerts on one kind work from the first scrape rather than from the second
/// error of that kind.
pub const ERROR_KINDS: &[&str] = &[
    "auth_failed",
    "auth_throttled",
    "auth_timeout",
    "auth_unavailable",
    "backend_io",
    "backend_login",
    "backend_not_ready",
    "backend_protocol",
    "backend_queue_full",
    "backend_unreachable",
    "backend_wait_timeout",
    "client_io",
    "client_protocol",
    "gateway_full",
    "http_response_spill",
    "http_response_too_large",
    "idle_in_transaction",
    "internal",
    "login_evicted",
    "login_refused",
    "login_timeout",
    "pinned_session_ended",
    "plaintext_refused",
    "proxy_header",
    "revival_failed",
    "routing",
    "shutdown",
    "startup_timeout",
    "tenant_forbidden",
    "tenant_full",
    "tls_handshake",
    "tls_reload",
    "unknown_tenant",
    "wake_failed",
    "wake_queue_full",
    "wake_timeout",
];

/// Outcomes of `pgwake_backend_waits_total`, each started at zero.
const BACKEND_WAIT_OUTCOMES: &[&str] = &["kept", "slot", "timeout", "queue_full"];
/// Outcomes of `pgwake_auth_attempts_total`, each started at zero.
/// `unknown_tenant`: the mock exchange of a client naming a tenant that does not exist or
/// refuses its address, which the client sees as a failed password.
const AUTH_OUTCOMES: &[&str] = &["ok", "failed", "throttled", "error", "unknown_tenant"];
/// Reasons a session leaves its backend (`pgwake_parks_total`, `pgwake_revivals_total`).
const PARK_REASONS: &[&str] = &["idle_sleep", "backend_ended", "migrate", "session_idle"];
/// Outcomes of wakes and revivals.
const OUTCOMES: &[&str] = &["ok", "error"];
/// Outcomes of `pgwake_backend_reuse_total`.
const REUSE_OUTCOMES: &[&str] = &["hit", "miss", "stale", "untrusted"];
/// Outcomes of `pgwake_backend_reuse_returns_total`.
const REUSE_RETURN_OUTCOMES: &[&str] = &["kept", "not_safe", "reset_failed", "full"];

/// Outcomes of `pgwake_peer_cancels_total`, by side: a replica forwarding a key it did not
/// issue, and the replica answering it.
const PEER_CANCEL_OUTCOMES: &[(&str, &[&str])] = &[
    (
        "forwarded",
        &[
            "cancelled",
            "unknown_key",
            "rate_limited",
            "peer_rate_limited",
            "refused",
            "unroutable",
            "failed",
        ],
    ),
    (
        "served",
        &["cancelled", "unknown_key", "rate_limited", "refused"],
    ),
];

/// The gateway-wide counters the admin API's `GET /v1/summary` reports (the status page's
/// totals), read from the metrics below.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Totals {
    /// Client connections accepted since start.
    pub connections_accepted: u64,
    /// Client connections open now.
    pub connections_active: i64,
    /// Client sessions parked now.
    pub sessions_parked: i64,
    /// Wakes that succeeded.
    pub wakes_ok: u64,
    /// Wakes that failed.
    pub wakes_failed: u64,
    /// Connections that ended in an error, by kind.
    pub errors: BTreeMap<String, u64>,
    /// Client authentications, by outcome (`ok`, `failed`, `throttled`, `error`).
    pub auth_attempts: BTreeMap<String, u64>,
    /// Bytes relayed from clients to backends.
    pub bytes_client_to_backend: u64,
    /// Bytes relayed from backends to clients.
    pub bytes_backend_to_client: u64,
}

/// Sums a labelled counter's series by the value of one of its labels.
fn sum_by_label(counters: &IntCounterVec, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for family in counters.collect() {
        for metric in family.get_metric() {
            let Some(pair) = metric.get_label().iter().find(|p| p.name() == label) else {
                continue;
            };
            *out.entry(pair.value().to_owned()).or_default() +=
                metric.get_counter().get_value() as u64;
        }
    }
    out
}

/// The gateway's metrics and the registry they are exported from.
pub struct Metrics {
    registry: Registry,
    /// Client connections accepted.
    pub connections_accepted: IntCounter,
    /// Client connections open now.
    pub connections_active: IntGauge,
    /// Client connections closed.
    pub connections_closed: IntCounter,
    /// Bytes relayed from clients to backends.
    pub bytes_client_to_backend: IntCounter,
    /// Bytes relayed from backends to clients.
    pub bytes_backend_to_client: IntCounter,
    /// Cancel requests forwarded to a backend.
    pub cancels_forwarded: IntCounter,
    peer_cancels: IntCounterVec,
    errors: IntCounterVec,
    /// Seconds from accepting a connection to the client's first ReadyForQuery.
    pub startup_duration: Histogram,
    wake_duration: HistogramVec,
    auth_attempts: IntCounterVec,
    /// Key derivations (PBKDF2) run to check a client's cleartext password, against a real
    /// verifier or the stand-in of a user or tenant that does not exist.
    pub password_hashes: IntCounter,
    wakes: IntCounterVec,
    waiters: IntGauge,
    tenants: IntGaugeVec,
    tenant_awake: CounterVec,
    runs: IntCounterVec,
    prewakes: IntCounterVec,
    predictive_sleeps: IntCounter,
    /// Backend connections open in the SQL-over-HTTP pool (idle and in use).
    pub http_pool_open: IntGauge,
    /// Idle backend connections in the SQL-over-HTTP pool.
    pub http_pool_idle: IntGauge,
    http_requests: IntCounterVec,
    /// `http_requests` for status 200, looked up once rather than per request.
    http_ok: IntCounter,
    /// Client sessions parked now (connected, without a backend connection).
    pub sessions_parked: IntGauge,
    parks: IntCounterVec,
    revivals: IntCounterVec,
    session_pins: IntCounterVec,
    sessions_pinned: IntGaugeVec,
    revival_duration: Histogram,
    reuse: IntCounterVec,
    reuse_returns: IntCounterVec,
    /// Backend connections kept idle for reuse by the next client.
    pub reuse_idle: IntGauge,
    backend_waits: IntCounterVec,
}

/// Creates metrics and registers each with the gateway's registry. Names and help texts are
/// fixed in this file, so a failure to create or register one is a bug, found by any test.
struct Registrar(Registry);

impl Registrar {
    fn add<M: Collector + Clone + 'static>(&self, metric: prometheus::Result<M>) -> M {
        let metric = metric.expect("valid metric");
        self.0
            .register(Box::new(metric.clone()))
            .expect("unique metric");
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels))
    }

    /// The relayed-bytes counters: client to backend, backend to client.
    fn relayed_bytes(&self) -> (IntCounter, IntCounter) {
        let bytes = self.counter_vec(
            "pgwake_relayed_bytes_total",
            "Bytes relayed, by direction.",
            &["direction"],
        );
        (
            bytes.with_label_values(&["client_to_backend"]),
            bytes.with_label_values(&["backend_to_client"]),
        )
    }

    fn seconds_vec(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.add(CounterVec::new(Opts::new(name, help), labels))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(Histogram::with_opts(opts))
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels))
    }
}

impl Metrics {
    /// Creates and registers all metrics.
    pub fn new() -> Metrics {
        let r = Registrar(Registry::new());
        let (to_backend, to_client) = r.relayed_bytes();
        let pooling = Pooling::register(&r);
        let moving = Moving::register(&r);
        let checking = Checking::register(&r);
        let waking = Waking::register(&r);
        let metrics = Metrics {
            connections_accepted: r.counter(
                "pgwake_connections_accepted_total",
                "Client connections accepted.",
            ),
            connections_closed: r.counter(
                "pgwake_connections_closed_total",
                "Client connections closed.",
            ),
            cancels_forwarded: r.counter(
                "pgwake_cancels_forwarded_total",
                "Cancel requests matched and forwarded to a backend.",
            ),
            peer_cancels: r.counter_vec(
                "pgwake_peer_cancels_total",
                "Cancel requests for keys another replica issued: forwarded to it (by its \
                 answer), or served for it (by this replica's answer).",
                &["side", "outcome"],
            ),
            bytes_client_to_backend: to_backend,
            bytes_backend_to_client: to_client,
            errors: r.counter_vec(
                "pgwake_errors_total",
                "Connections that ended in an error, by kind.",
                &["kind"],
            ),
            connections_active: r
                .gauge("pgwake_connections_active", "Client connections open now."),
            startup_duration: r.histogram(
                "pgwake_startup_duration_seconds",
                "Time from accepting a connection to the client's first ReadyForQuery.",
                STARTUP_BUCKETS,
            ),
            wake_duration: waking.wake_duration,
            wakes: waking.wakes,
            waiters: waking.waiters,
            tenants: waking.tenants,
            tenant_awake: waking.tenant_awake,
            runs: waking.runs,
            prewakes: waking.prewakes,
            predictive_sleeps: waking.predictive_sleeps,
            auth_attempts: checking.auth_attempts,
            password_hashes: checking.password_hashes,
            sessions_parked: moving.sessions_parked,
            parks: moving.parks,
            revivals: moving.revivals,
            session_pins: moving.session_pins,
            sessions_pinned: moving.sessions_pinned,
            revival_duration: moving.revival_duration,
            http_pool_open: pooling.http_pool_open,
            http_pool_idle: pooling.http_pool_idle,
            http_ok: pooling.http_requests.with_label_values(&["200"]),
            http_requests: pooling.http_requests,
            reuse: pooling.reuse,
            reuse_returns: pooling.reuse_returns,
            reuse_idle: pooling.reuse_idle,
            backend_waits: pooling.backend_waits,
            registry: r.0,
        };
        metrics.start_known_series();
        metrics
    }

    /// Counters with labels exist only once a label set is used; the known ones are created
    /// at zero so that dashboards and alerts see them before the first event.
    fn start_known_series(&self) {
        for kind in ERROR_KINDS {
            self.errors.with_label_values(&[kind]);
        }
        for outcome in AUTH_OUTCOMES {
            self.auth_attempts.with_label_values(&[outcome]);
        }
        for reason in PARK_REASONS {
            self.parks.with_label_values(&[reason]);
            for outcome in OUTCOMES {
                self.revivals.with_label_values(&[reason, outcome]);
            }
        }
        for (_, _, reason) in pgwake_protocol::Pins::ALL {
            self.session_pins.with_label_values(&[reason]);
            self.sessions_pinned.with_label_values(&[reason]);
        }
        for outcome in REUSE_OUTCOMES {
            self.reuse.with_label_values(&[outcome]);
        }
        for outcome in REUSE_RETURN_OUTCOMES {
            self.reuse_returns.with_label_values(&[outcome]);
        }
        for (side, outcomes) in PEER_CANCEL_OUTCOMES {
            for outcome in *outcomes {
                self.peer_cancels.with_label_values(&[side, outcome]);
            }
        }
        for outcome in BACKEND_WAIT_OUTCOMES {
            self.backend_waits.with_label_values(&[outcome]);
        }
    }

    /// Counts a connection that ended with an error of this kind (one of [`ERROR_KINDS`]).
    pub fn error(&self, kind: &'static str) {
        debug_assert!(
            ERROR_KINDS.contains(&kind),
            "error kind {kind:?} is missing from metrics::ERROR_KINDS"
        );
        self.errors.with_label_values(&[kind]).inc();
    }

    /// Creates the per-backend series (wakes by outcome, awake time) of a backend kind that
    /// tenants use, at zero, so that wake alerts see them before the first wake.
    pub fn backend_in_use(&self, backend: &'static str) {
        for outcome in OUTCOMES {
            self.wakes.with_label_values(&[backend, outcome]);
            self.wake_duration.with_label_values(&[backend, outcome]);
        }
        self.tenant_awake.with_label_values(&[backend]);
    }

    /// Counts an answered `POST /sql` by its status (a handful of values: 200, 400, 413, 507).
    pub fn http_request(&self, status: u16) {
        if status == 200 {
            return self.http_ok.inc();
        }
        self.http_requests
            .with_label_values(&[&status.to_string()])
            .inc();
    }

    /// Counts a cancel request for another replica's key, by side (`forwarded`, `served`) and
    /// outcome (see `PEER_CANCEL_OUTCOMES`).
    pub fn peer_cancel(&self, side: &'static str, outcome: &'static str) {
        self.peer_cancels.with_label_values(&[side, outcome]).inc();
    }

    /// Counts a client authentication attempt by outcome.
    pub fn auth_attempt(&self, outcome: &'static str) {
        self.auth_attempts.with_label_values(&[outcome]).inc();
    }

    /// Records a finished wake.
    pub fn wake_finished(&self, event: &WakeEvent) {
        let outcome = if event.ok { "ok" } else { "error" };
        self.wake_duration
            .with_label_values(&[event.backend, outcome])
            .observe(event.duration.as_secs_f64());
        self.wakes
            .with_label_values(&[event.backend, outcome])
            .inc();
    }

    /// Counts a session leaving its backend connection.
    pub fn parked(&self, reason: &'static str) {
        self.parks.with_label_values(&[reason]).inc();
    }

    /// Counts a snapshot that found a session pinned, under each of its reasons.
    pub fn pinned(&self, pins: pgwake_protocol::Pins) {
        for reason in pins.labels() {
            self.session_pins.with_label_values(&[reason]).inc();
        }
    }

    /// Sets `pgwake_sessions_pinned` from the pinned sessions of every tenant by reason;
    /// reasons without any go to zero.
    pub fn set_pinned(&self, by_reason: &BTreeMap<&'static str, usize>) {
        for (_, _, reason) in pgwake_protocol::Pins::ALL {
            let n = by_reason.get(reason).copied().unwrap_or(0);
            self.sessions_pinned
                .with_label_values(&[reason])
                .set(n as i64);
        }
    }

    /// Records a revival: its reason, and its duration when it succeeded.
    pub fn revived(&self, reason: &'static str, took: Option<std::time::Duration>) {
        let outcome = if took.is_some() { "ok" } else { "error" };
        self.revivals.with_label_values(&[reason, outcome]).inc();
        if let Some(d) = took {
            self.revival_duration.observe(d.as_secs_f64());
        }
    }

    /// Counts how a gateway-authenticated login got its backend connection (`hit`, `miss`,
    /// `stale`).
    pub fn reuse(&self, outcome: &'static str) {
        self.reuse.with_label_values(&[outcome]).inc();
    }

    /// Counts how a session that had to wait for a backend connection of a capped tenant got
    /// one (`kept`, `slot`) or gave up (`timeout`, `queue_full`); sessions that did not wait are
    /// not counted.
    pub fn backend_wait(&self, waited: bool, outcome: &'static str) {
        if waited {
            self.backend_waits.with_label_values(&[outcome]).inc();
        }
    }

    /// Counts what became of a departed client's backend connection.
    pub fn reuse_return(&self, outcome: &'static str) {
        self.reuse_returns.with_label_values(&[outcome]).inc();
    }

    /// The gateway-wide counters as they are now.
    pub fn totals(&self) -> Totals {
        let wakes = sum_by_label(&self.wakes, "outcome");
        Totals {
            connections_accepted: self.connections_accepted.get(),
            connections_active: self.connections_active.get(),
            sessions_parked: self.sessions_parked.get(),
            wakes_ok: wakes.get("ok").copied().unwrap_or(0),
            wakes_failed: wakes.get("error").copied().unwrap_or(0),
            errors: sum_by_label(&self.errors, "kind"),
            auth_attempts: sum_by_label(&self.auth_attempts, "outcome"),
            bytes_client_to_backend: self.bytes_client_to_backend.get(),
            bytes_backend_to_client: self.bytes_backend_to_client.get(),
        }
    }

    /// Sets the tenant gauges and awake-time counters from a snapshot of the coordinator.
    pub fn set_tenants(
        &self,
        status: &[TenantStatus],
        waiters: usize,
        awake_by_kind: &HashMap<&'static str, f64>,
        predictions: &PredictionCounts,
    ) {
        let catch_up = |counter: &IntCounter, total: &AtomicU64| {
            let more = total.load(Ordering::Relaxed).saturating_sub(counter.get());
            counter.inc_by(more);
        };
        catch_up(
            &self.runs.with_label_values(&["awake"]),
            &predictions.runs_found_awake,
        );
        catch_up(
            &self.runs.with_label_values(&["asleep"]),
            &predictions.runs_found_asleep,
        );
        catch_up(
            &self.prewakes.with_label_values(&["used"]),
            &predictions.prewakes_used,
        );
        catch_up(
            &self.prewakes.with_label_values(&["wasted"]),
            &predictions.prewakes_wasted,
        );
        catch_up(&self.predictive_sleeps, &predictions.predictive_sleeps);
        for (kind, total) in awake_by_kind {
            let counter = self.tenant_awake.with_label_values(&[kind]);
            let more = total - counter.get();
            if more > 0.0 {
                counter.inc_by(more);
            }
        }
        for phase in Phase::ALL {
            let n = status.iter().filter(|t| t.state == phase).count();
            self.tenants
                .with_label_values(&[phase.as_str()])
                .set(n as i64);
        }
        self.waiters.set(waiters as i64);
    }

    /// The Prometheus text exposition of all metrics.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Buckets of `pgwake_startup_duration_seconds`.
const STARTUP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets of `pgwake_wake_duration_seconds`.
const WAKE_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0,
];
/// Buckets of `pgwake_revival_duration_seconds`.
const REVIVAL_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The metrics of waking and sleeping: wakes, their waiters, tenants' states and running time,
/// and the runs and predictions of predictive wake.
struct Waking {
    wake_duration: HistogramVec,
    wakes: IntCounterVec,
    waiters: IntGauge,
    tenants: IntGaugeVec,
    tenant_awake: CounterVec,
    runs: IntCounterVec,
    prewakes: IntCounterVec,
    predictive_sleeps: IntCounter,
}

impl Waking {
    fn register(r: &Registrar) -> Waking {
        Waking {
            wake_duration: r.histogram_vec(
                "pgwake_wake_duration_seconds",
                "Time a wake took, by backend kind and outcome.",
                WAKE_BUCKETS,
                &["backend", "outcome"],
            ),
            wakes: r.counter_vec(
                "pgwake_wakes_total",
                "Wakes finished, by backend kind and outcome.",
                &["backend", "outcome"],
            ),
            waiters: r.gauge(
                "pgwake_wake_waiters",
                "Connections waiting in accept queues for a tenant to wake.",
            ),
            tenants: r.gauge_vec("pgwake_tenants", "Tenants by state.", &["state"]),
            tenant_awake: r.seconds_vec(
                "pgwake_tenant_awake_seconds_total",
                "Seconds tenants' databases spent waking, awake or going to sleep, by backend kind.",
                &["backend"],
            ),
            runs: r.counter_vec(
                "pgwake_runs_total",
                "Runs (a tenant's first connection after a sleep or a quiet gap), by whether it \
                 found the tenant awake or asleep.",
                &["found"],
            ),
            prewakes: r.counter_vec(
                "pgwake_prewakes_total",
                "Wakes ahead of a predicted run, by outcome (used: the run came; wasted: it did not).",
                &["outcome"],
            ),
            predictive_sleeps: r.counter(
                "pgwake_predictive_sleeps_total",
                "Sleeps before the idle timeout because the next run was predicted far away.",
            ),
        }
    }
}

/// The metrics of sessions that leave their backend connection: parks, revivals, pins.
struct Moving {
    sessions_parked: IntGauge,
    parks: IntCounterVec,
    revivals: IntCounterVec,
    session_pins: IntCounterVec,
    sessions_pinned: IntGaugeVec,
    revival_duration: Histogram,
}

impl Moving {
    fn register(r: &Registrar) -> Moving {
        Moving {
            sessions_parked: r.gauge(
                "pgwake_sessions_parked",
                "Client sessions parked now: connected, without a backend connection.",
            ),
            parks: r.counter_vec(
                "pgwake_parks_total",
                "Sessions that left their backend connection, by reason (idle_sleep, \
                 backend_ended, migrate, session_idle).",
                &["reason"],
            ),
            revivals: r.counter_vec(
                "pgwake_revivals_total",
                "Sessions logged back in to a backend, by why they had left (idle_sleep, \
                 backend_ended, migrate, session_idle) and outcome (ok, error).",
                &["reason", "outcome"],
            ),
            session_pins: r.counter_vec(
                "pgwake_session_pins_total",
                "Snapshots that found a session pinned to its backend connection, by reason \
                 (a snapshot with several reasons counts under each).",
                &["reason"],
            ),
            sessions_pinned: r.gauge_vec(
                "pgwake_sessions_pinned",
                "Sessions pinned to their backend connection now (they keep their tenant awake \
                 and hold their place under its max_backend_connections), by reason (a session \
                 with several counts under each).",
                &["reason"],
            ),
            revival_duration: r.histogram(
                "pgwake_revival_duration_seconds",
                "Time a successful revival took: wake (if any), login, restoring settings and \
                 statements.",
                REVIVAL_BUCKETS,
            ),
        }
    }
}

/// The metrics of the gateway's own checks of client passwords.
struct Checking {
    auth_attempts: IntCounterVec,
    password_hashes: IntCounter,
}

impl Checking {
    fn register(r: &Registrar) -> Checking {
        Checking {
            auth_attempts: r.counter_vec(
                "pgwake_auth_attempts_total",
                "Client authentications at the gateway, by outcome (ok, failed, throttled, error).",
                &["outcome"],
            ),
            password_hashes: r.counter(
                "pgwake_password_hashes_total",
                "Key derivations (PBKDF2) run to check clients' cleartext passwords (/sql, \
                 WebSocket, a tenant named in the password), for users and tenants that exist \
                 and the same work for those that do not; a password verified moments before \
                 is recalled without one.",
            ),
        }
    }
}

/// The metrics of backend connections held apart from sessions: the `/sql` pool and reuse.
struct Pooling {
    http_pool_open: IntGauge,
    http_pool_idle: IntGauge,
    http_requests: IntCounterVec,
    reuse: IntCounterVec,
    reuse_returns: IntCounterVec,
    reuse_idle: IntGauge,
    backend_waits: IntCounterVec,
}

impl Pooling {
    fn register(r: &Registrar) -> Pooling {
        Pooling {
            http_pool_open: r.gauge(
                "pgwake_http_pool_connections",
                "Backend connections open in the SQL-over-HTTP pool (idle and in use).",
            ),
            http_pool_idle: r.gauge(
                "pgwake_http_pool_idle_connections",
                "Idle backend connections in the SQL-over-HTTP pool.",
            ),
            http_requests: r.counter_vec(
                "pgwake_http_requests_total",
                "SQL-over-HTTP requests answered, by HTTP status.",
                &["status"],
            ),
            reuse: r.counter_vec(
                "pgwake_backend_reuse_total",
                "Logins taking part in reuse (gateway-authenticated, or passthrough with \
                 reuse_passthrough) by how they got a backend connection: hit (a kept \
                 connection), miss (a new login), stale (a kept connection found closed or on an \
                 old address and dropped), untrusted (a passthrough login the backend asked a \
                 password for: never kept).",
                &["outcome"],
            ),
            reuse_returns: r.counter_vec(
                "pgwake_backend_reuse_returns_total",
                "Backend connections of departed clients, by what became of them: kept, \
                 not_safe (in a transaction, busy or pinned), reset_failed, full.",
                &["outcome"],
            ),
            reuse_idle: r.gauge(
                "pgwake_backend_reuse_idle_connections",
                "Backend connections kept idle for reuse by the next client.",
            ),
            backend_waits: r.counter_vec(
                "pgwake_backend_waits_total",
                "Sessions that waited for a backend connection of a tenant at its \
                 max_backend_connections, by outcome: kept (took a kept connection), slot (a \
                 fresh login), timeout, queue_full.",
                &["outcome"],
            ),
        }
    }
}
