//! The admin listener: Prometheus metrics, liveness, readiness, the tenant API
//! (`GET /v1/tenants`, `GET /v1/summary`, `POST /v1/tenants/{id}/wake`,
//! `POST /v1/tenants/{id}/sleep`, `POST /v1/tenants/{id}/migrate`: sessions move to a fresh
//! backend connection at their next safe point), and a status page at `/` that reads the API.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tracing::{Instrument, debug, debug_span};

use pgwake_routing::{TenantId, WakeCoordinator, WakeError};

use crate::capacity::{ListenerCap, ListenerSlot};
use crate::metrics::{Metrics, Totals};

/// The status page: one self-contained HTML file (inline CSS and script, nothing fetched from
/// elsewhere) that polls `/v1/tenants` and `/v1/summary`.
const STATUS_PAGE: &str = include_str!("status.html");

/// What the page may do: run its own inline script and styles, fetch from this listener only,
/// and never be framed by another page.
const STATUS_PAGE_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
    style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// What the admin endpoints report on.
pub struct AdminState {
    /// Metrics to export.
    pub metrics: Arc<Metrics>,
    /// Tenants and their states.
    pub coordinator: Arc<WakeCoordinator>,
    /// False once shutdown has begun, so load balancers stop sending clients.
    pub ready: AtomicBool,
    /// The bearer token `/v1/…` requests must present, when one is configured.
    pub token: Option<String>,
    /// Host names requests may name besides IP addresses and `localhost` (`admin.hosts`).
    pub hosts: Vec<String>,
    /// When the gateway started, for the uptime in `/v1/summary`.
    pub started: Instant,
}

/// The answer of `GET /v1/summary`: gateway-wide numbers for the status page.
#[derive(serde::Serialize)]
struct Summary {
    /// The gateway's version.
    version: &'static str,
    /// The gateway's clock, seconds since the Unix epoch: the page shows the tenants' times
    /// relative to it, not to the browser's clock.
    now: f64,
    /// Seconds since the gateway started serving.
    uptime_s: f64,
    /// Tenants the gateway serves.
    tenants: usize,
    /// Connections waiting for a wake, across all tenants.
    waiters: usize,
    #[serde(flatten)]
    totals: Totals,
}

impl AdminState {
    /// Why this request may not use the admin API, if it may not.
    ///
    /// The listener is usually bound to a loopback or cluster-internal address, which a web page
    /// on the same machine can still reach: so no request from a browser page (they carry
    /// `Origin`), POSTs only with `Content-Type: application/json` (which a page cannot send
    /// across origins without a preflight this API never answers), and the token when set. A
    /// page whose own name was rebound to this address sends same-origin requests without
    /// `Origin`, but with its name as `Host`: only IP addresses, `localhost` and the names in
    /// `admin.hosts` are answered (liveness and readiness, which tell nothing, to any).
    fn refusal(&self, req: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
        let headers = req.headers();
        let probe = matches!(req.uri().path(), "/healthz" | "/readyz");
        if !probe && !self.names_this_listener(req) {
            return Some(json_error(
                StatusCode::MISDIRECTED_REQUEST,
                "this Host is not the admin listener's: send one Host header (and no other \
                 host in the request line) naming its IP address or localhost, or list the \
                 name in admin.hosts",
            ));
        }
        if headers.contains_key(hyper::header::ORIGIN) {
            return Some(json_error(
                StatusCode::FORBIDDEN,
                "requests from web pages (with an Origin header) are refused",
            ));
        }
        if req.method() == Method::POST {
            let json = headers
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.split(';').next().is_some_and(|t| t.trim() == JSON));
            if !json {
                return Some(json_error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "POST needs Content-Type: application/json",
                ));
            }
        }
        if let Some(token) = &self.token
            && req.uri().path().starts_with("/v1/")
        {
            let presented = headers
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_default();
            let ok: bool = presented.as_bytes().ct_eq(token.as_bytes()).into();
            if !ok {
                return Some(json_error(
                    StatusCode::UNAUTHORIZED,
                    "the admin API needs Authorization: Bearer <admin.token_file's token>",
                ));
            }
        }
        None
    }
}

impl AdminState {
    /// Whether the request names this listener wherever it names a host: at most one `Host`
    /// header (two could be read differently by a proxy in front), and the request line's host
    /// when it is an absolute URI (which HTTP/1.1 servers take over the header). A request
    /// with neither (HTTP/1.0) names nothing a rebound page could have chosen.
    fn names_this_listener(&self, req: &Request<Incoming>) -> bool {
        let mut hosts = req.headers().get_all(hyper::header::HOST).iter();
        let (host, second) = (hosts.next(), hosts.next());
        let header_ok = host.is_none_or(|h| h.to_str().is_ok_and(|h| self.answers_to(h)));
        let line_ok = req
            .uri()
            .authority()
            .is_none_or(|a| self.answers_to(a.as_str()));
        second.is_none() && header_ok && line_ok
    }

    /// Whether a host (name or address, with an optional numeric port) is exactly one this
    /// listener answers to.
    fn answers_to(&self, host: &str) -> bool {
        let port_ok = |port: Option<&str>| {
            port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
        };
        let name = match host.strip_prefix('[') {
            // An IPv6 literal, "[::1]" or "[::1]:9090", and nothing else after the bracket.
            Some(rest) => {
                return rest.split_once(']').is_some_and(|(ip, after)| {
                    let port = match after {
                        "" => None,
                        p => match p.strip_prefix(':') {
                            Some(p) => Some(p),
                            None => return false,
                        },
                    };
                    ip.parse::<std::net::Ipv6Addr>().is_ok() && port_ok(port)
                });
            }
            None => match host.rsplit_once(':') {
                Some((name, port)) if port_ok(Some(port)) => name,
                Some(_) => return false,
                None => host,
            },
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name == "localhost"
            || self
                .hosts
                .iter()
                .any(|h| h.trim_end_matches('.').eq_ignore_ascii_case(&name))
    }
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap_or_default()
}

fn status_page() -> Response<Full<Bytes>> {
    Response::builder()
        .header("content-type", "text/html; charset=utf-8")
        .header("cache-control", "no-store")
        .header("content-security-policy", STATUS_PAGE_POLICY)
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .body(Full::new(Bytes::from_static(STATUS_PAGE.as_bytes())))
        .unwrap_or_default()
}

const PLAIN: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

fn json_error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message.into() });
    text(status, JSON, body.to_string())
}

async fn tenant_action(state: &AdminState, id: &str, action: &str) -> Response<Full<Bytes>> {
    let Ok(tenant) = TenantId::parse(id) else {
        return json_error(StatusCode::NOT_FOUND, format!("no tenant {id:?}"));
    };
    if action == "migrate" {
        return match state.coordinator.migrate(&tenant) {
            Ok(sessions) => text(
                StatusCode::OK,
                JSON,
                serde_json::json!({ "tenant": tenant.as_str(), "sessions": sessions }).to_string(),
            ),
            Err(_) => json_error(StatusCode::NOT_FOUND, format!("no tenant {id:?}")),
        };
    }
    let result = match action {
        "wake" => state.coordinator.wake(&tenant).await,
        "sleep" => state.coordinator.sleep(&tenant).await,
        _ => return json_error(StatusCode::NOT_FOUND, "unknown action"),
    };
    match result {
        Ok(()) => {
            let status = state.coordinator.status();
            let t = status.iter().find(|t| t.id == tenant.as_str());
            text(
                StatusCode::OK,
                JSON,
                serde_json::to_string(&t).unwrap_or_default(),
            )
        }
        Err(WakeError::UnknownTenant(_)) => {
            json_error(StatusCode::NOT_FOUND, format!("no tenant {id:?}"))
        }
        Err(e @ (WakeError::Busy(_) | WakeError::ActiveElsewhere)) => {
            json_error(StatusCode::CONFLICT, e.to_string())
        }
        Err(e @ WakeError::QueueFull { .. }) => {
            json_error(StatusCode::TOO_MANY_REQUESTS, e.to_string())
        }
        Err(e) => json_error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if let Some(refused) = state.refusal(req) {
        return refused;
    }
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::GET, "/metrics") => {
            state.metrics.set_tenants(
                &state.coordinator.status(),
                state.coordinator.waiters_total(),
                &state.coordinator.awake_seconds_by_kind(),
                state.coordinator.prediction_counts(),
            );
            let pinned = state.coordinator.pinned_sessions().by_reason();
            state.metrics.set_pinned(&pinned);
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                state.metrics.render(),
            )
        }
        (&Method::GET, "/") => status_page(),
        (&Method::GET, "/healthz") => text(StatusCode::OK, PLAIN, "ok\n"),
        (&Method::GET, "/readyz") if state.ready.load(Ordering::Relaxed) => {
            text(StatusCode::OK, PLAIN, "ready\n")
        }
        (&Method::GET, "/readyz") => {
            text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "shutting down\n")
        }
        (&Method::GET, "/v1/tenants") => text(
            StatusCode::OK,
            JSON,
            serde_json::to_string(&state.coordinator.status()).unwrap_or_default(),
        ),
        (&Method::GET, "/v1/summary") => {
            let summary = Summary {
                version: env!("CARGO_PKG_VERSION"),
                now: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
                uptime_s: state.started.elapsed().as_secs_f64(),
                tenants: state.coordinator.tenant_count(),
                waiters: state.coordinator.waiters_total(),
                totals: state.metrics.totals(),
            };
            text(
                StatusCode::OK,
                JSON,
                serde_json::to_string(&summary).unwrap_or_default(),
            )
        }
        (&Method::POST, p) if p.starts_with("/v1/tenants/") => {
            match p["/v1/tenants/".len()..].split_once('/') {
                Some((id, action)) => tenant_action(state, id, action).await,
                None => json_error(StatusCode::NOT_FOUND, "not found"),
            }
        }
        (_, "/" | "/metrics" | "/healthz" | "/readyz" | "/v1/tenants" | "/v1/summary") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "method not allowed\n",
        ),
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n"),
    }
}

/// What admin connections may cost (`[admin]`): how many at once, and how long each may take
/// to send a request head or wait between requests.
#[derive(Clone, Copy, Debug)]
pub struct AdminLimits {
    /// Connections at once (`admin.max_connections`).
    pub max_connections: usize,
    /// Time to send a whole request head (`admin.header_timeout`).
    pub header_timeout: Duration,
    /// Longest wait between requests (`admin.idle_timeout`).
    pub idle_timeout: Duration,
}

/// Serves the admin endpoints until the process exits. Connections beyond
/// `limits.max_connections` end the one waiting longest; each is closed when its request head
/// takes longer than `limits.header_timeout` or it waits longer than `limits.idle_timeout`
/// between requests, so neither idle nor trickling clients can take the gateway's file
/// descriptors from its Postgres clients.
pub async fn serve(listener: TcpListener, state: Arc<AdminState>, limits: AdminLimits) {
    let never = tokio_util::sync::CancellationToken::new();
    let cap = ListenerCap::new(limits.max_connections);
    while let Some((tcp, peer)) = crate::front::accept_next(&listener, &never, "admin").await {
        let Some(slot) = cap.open() else {
            debug!(%peer, max = limits.max_connections, "admin listener full of requests in flight; connection refused");
            continue;
        };
        let span = debug_span!("admin", %peer);
        tokio::spawn(connection(tcp, slot, state.clone(), limits).instrument(span));
    }
}

/// Serves one admin connection within its deadlines, or until it must make room.
async fn connection(
    tcp: TcpStream,
    mut slot: ListenerSlot,
    state: Arc<AdminState>,
    limits: AdminLimits,
) {
    let pace = Arc::new(Pace::new());
    let requests = pace.clone();
    let service = service_fn(move |req| {
        let (state, pace) = (state.clone(), requests.clone());
        async move {
            let _busy = pace.busy();
            Ok::<_, Infallible>(route(&state, &req).await)
        }
    });
    let io = PacedIo {
        inner: tcp,
        pace: pace.clone(),
    };
    let conn = http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let evicted = slot.eviction();
    loop {
        let deadline = pace.deadline(limits);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = evicted.cancelled() => {
                debug!("admin connection closed to make room for a newer one");
                return;
            }
            _ = pace.changed.notified() => match pace.in_flight() {
                true => slot.busy(),
                false => slot.done(),
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                if deadline.is_some() =>
            {
                if pace.deadline(limits).is_some_and(|d| d <= tokio::time::Instant::now()) {
                    debug!(?limits.header_timeout, ?limits.idle_timeout, "admin connection too slow or idle; closing it");
                    return;
                }
            }
        }
    }
}

/// Where one admin connection is between requests: a request in flight has no deadline; a
/// request head under way must be complete `header_timeout` after its first byte (a new
/// connection's, after it opened); with neither, the next request must begin within
/// `idle_timeout`.
struct Pace {
    state: std::sync::Mutex<PaceState>,
    changed: Notify,
}

struct PaceState {
    in_flight: usize,
    /// When the last request ended.
    quiet_since: tokio::time::Instant,
    /// When the request head being read began.
    head_since: Option<tokio::time::Instant>,
}

impl Pace {
    fn new() -> Pace {
        let now = tokio::time::Instant::now();
        Pace {
            state: std::sync::Mutex::new(PaceState {
                in_flight: 0,
                quiet_since: now,
                head_since: Some(now),
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PaceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn in_flight(&self) -> bool {
        self.lock().in_flight > 0
    }

    /// When the connection is too slow or too idle, unless a request is in flight.
    fn deadline(&self, limits: AdminLimits) -> Option<tokio::time::Instant> {
        let s = self.lock();
        match (s.in_flight, s.head_since) {
            (0, Some(head)) => Some(head + limits.header_timeout),
            (0, None) => Some(s.quiet_since + limits.idle_timeout),
            _ => None,
        }
    }

    /// Bytes arrived: between requests they begin the next request's head.
    fn received(&self) {
        let mut s = self.lock();
        if s.in_flight == 0 && s.head_since.is_none() {
            s.head_since = Some(tokio::time::Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    /// A request is in flight until the guard drops.
    fn busy(self: &Arc<Self>) -> Busy {
        self.lock().in_flight += 1;
        self.changed.notify_one();
        Busy(self.clone())
    }
}

/// A request in flight on its admin connection.
struct Busy(Arc<Pace>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight -= 1;
        s.quiet_since = tokio::time::Instant::now();
        s.head_since = None;
        drop(s);
        self.0.changed.notify_one();
    }
}

/// The admin connection's socket, telling its [`Pace`] when bytes arrive.
struct PacedIo {
    inner: TcpStream,
    pace: Arc<Pace>,
}

impl AsyncRead for PacedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.pace.received();
        }
        read
    }
}

impl AsyncWrite for PacedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
