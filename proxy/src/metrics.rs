//! Every metric the gateway exports, declared in one place with its help text.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

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
    errors: IntCounterVec,
    /// Seconds from accepting a connection to the client's first ReadyForQuery.
    pub startup_duration: Histogram,
}

impl Metrics {
    /// Creates and registers all metrics.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let connections_accepted = counter(
            "pgwake_connections_accepted_total",
            "Client connections accepted.",
        );
        let connections_closed = counter(
            "pgwake_connections_closed_total",
            "Client connections closed.",
        );
        let cancels_forwarded = counter(
            "pgwake_cancels_forwarded_total",
            "Cancel requests matched and forwarded to a backend.",
        );
        let bytes = IntCounterVec::new(
            Opts::new("pgwake_relayed_bytes_total", "Bytes relayed, by direction."),
            &["direction"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(bytes.clone()))
            .expect("unique metric");
        let errors = IntCounterVec::new(
            Opts::new(
                "pgwake_errors_total",
                "Connections that ended in an error, by kind.",
            ),
            &["kind"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(errors.clone()))
            .expect("unique metric");
        let connections_active =
            IntGauge::new("pgwake_connections_active", "Client connections open now.")
                .expect("valid metric");
        registry
            .register(Box::new(connections_active.clone()))
            .expect("unique metric");
        let startup_duration = Histogram::with_opts(
            HistogramOpts::new(
                "pgwake_startup_duration_seconds",
                "Time from accepting a connection to the client's first ReadyForQuery.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        registry
            .register(Box::new(startup_duration.clone()))
            .expect("unique metric");
        Metrics {
            connections_accepted,
            connections_active,
            connections_closed,
            bytes_client_to_backend: bytes.with_label_values(&["client_to_backend"]),
            bytes_backend_to_client: bytes.with_label_values(&["backend_to_client"]),
            cancels_forwarded,
            errors,
            startup_duration,
            registry,
        }
    }

    /// Counts a connection that ended with an error of this kind.
    pub fn error(&self, kind: &'static str) {
        self.errors.with_label_values(&[kind]).inc();
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
