//! The HTTP listener for serverless drivers (`@neondatabase/serverless` and compatible):
//! `POST /sql` runs queries on pooled backend connections, and a WebSocket upgrade on any path
//! tunnels the Postgres protocol into the same session path as TCP clients.
//!
//! HTTP/1.1 and HTTP/2 (by ALPN), TLS with the Postgres listener's certificates; plaintext only
//! when `listen.allow_plaintext` is set.

pub mod body;
mod query;
mod spill;
mod sql;
mod stateless;
mod websocket;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span};

use crate::capacity::ClientSlot;
use crate::config::HttpConfig;
use crate::front::{Front, Shards, accept_next};
use crate::tls::ServerCertificates;

/// First byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What the HTTP listener shares between its connections.
pub struct HttpState {
    /// The front the Postgres listener uses too (caps, negotiation, the pipeline).
    pub front: Arc<Front>,
    /// Limits of `/sql`.
    pub config: HttpConfig,
    /// The gateway's certificates (served with ALPN `h2` and `http/1.1`), when configured.
    pub tls: Option<Arc<ServerCertificates>>,
    /// Accept connections without TLS.
    pub allow_plaintext: bool,
    /// The room spilled `/sql` responses share on disk (`http.max_spill_total`), and each
    /// tenant's share of it (`http.max_spill_per_tenant`).
    pub spill_budget: Arc<spill::SpillBudget>,
}

impl HttpState {
    /// State for connections through `front` with `config`; TLS from the gateway's
    /// certificates.
    pub fn new(
        front: Arc<Front>,
        tls: Option<Arc<ServerCertificates>>,
        config: HttpConfig,
        allow_plaintext: bool,
    ) -> HttpState {
        HttpState {
            front,
            spill_budget: spill::SpillBudget::new(
                config.max_spill_total.as_u64(),
                config.spill_per_tenant(),
            ),
            config,
            tls,
            allow_plaintext,
        }
    }

    /// Publishes the `/sql` pool's counts as metrics.
    fn record_pool(&self) {
        let stats = self.front.pipeline.connector.pool_stats();
        let m = &self.front.metrics;
        m.http_pool_open.set(stats.open as i64);
        m.http_pool_idle.set(stats.idle as i64);
    }
}

/// A response body: in memory, or read back from a `/sql` result spilled to disk.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// A body that is all in memory.
fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// What one HTTP connection's serving loop learns from its requests: how many are in flight
/// (a connection with none is idle, and closed after `http.header_timeout`), whether one of
/// them logged in (the connection then no longer counts as logging in), and when a response
/// body last went out (one stalled past `http.send_timeout` ends the connection).
pub(crate) struct ConnActivity {
    in_flight: AtomicUsize,
    authenticated: AtomicBool,
    changed: Notify,
    /// Response bodies being sent.
    sending: AtomicUsize,
    /// When a response body last gave the connection a frame to send.
    progress: std::sync::Mutex<tokio::time::Instant>,
}

impl Default for ConnActivity {
    fn default() -> Self {
        ConnActivity {
            in_flight: AtomicUsize::new(0),
            authenticated: AtomicBool::new(false),
            changed: Notify::new(),
            sending: AtomicUsize::new(0),
            progress: std::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }
}

impl ConnActivity {
    /// Counts a request in flight until the guard drops (with the response body, once sent).
    fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        Busy(self.clone())
    }

    /// A request on this connection passed the password check.
    pub(crate) fn logged_in(&self) {
        self.authenticated.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    fn quiet(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    fn progressed(&self) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
    }

    /// When the bodies being sent count as stalled, if any is being sent.
    fn stalled_at(&self, send_timeout: Duration) -> Option<tokio::time::Instant> {
        if self.sending.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(*self.progress.lock().unwrap_or_else(|p| p.into_inner()) + send_timeout)
    }
}

/// A request in flight on its connection.
struct Busy(Arc<ConnActivity>);

impl Busy {
    /// The request's response is going out: its body is being sent until the guard drops.
    fn sending(self) -> Sending {
        self.0.sending.fetch_add(1, Ordering::AcqRel);
        self.0.progressed();
        self.0.changed.notify_one();
        Sending(self)
    }
}

/// A response body being sent (its request still in flight).
struct Sending(Busy);

impl Sending {
    fn progressed(&self) {
        (self.0).0.progressed();
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        (self.0).0.sending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// Accepts HTTP connections until `stop` fires; each runs as a task in `tasks` on one of the
/// session threads, like a Postgres connection, so that its requests, the pooled backend
/// connections they use and the tasks they spawn (HTTP/2 streams, WebSocket sessions) share one
/// event loop. Each counts against the client connection caps like a Postgres connection: as
/// logging in (the oldest such is ended to make room) until one of its requests logs in.
/// Shutdown waits for requests and WebSocket sessions in flight like for TCP sessions.
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    shards: Arc<Shards>,
    tasks: TaskTracker,
    stop: CancellationToken,
) {
    let reaper = {
        let state = state.clone();
        let stop = stop.clone();
        let period = (state.config.pool_idle_timeout / 2).max(Duration::from_millis(100));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {
                        state.front.pipeline.connector.reap_pool();
                        state.record_pool();
                    }
                }
            }
        })
    };
    while let Some((tcp, peer)) = accept_next(&listener, &stop, "http").await {
        let (slot, evicted) = state.front.capacity.open();
        if evicted {
            state.front.metrics.error("login_evicted");
        }
        let state = state.clone();
        let conn_tasks = tasks.clone();
        let stop = stop.clone();
        shards.spawn(&tasks, tcp, move |tcp| {
            connection(tcp, peer, state, conn_tasks, stop, slot)
        });
    }
    reaper.abort();
    info!("http listener stopped accepting");
}

/// Names the connection's client (a trusted load balancer's PROXY header, or the socket), then
/// serves it in a span carrying that address; a connection past the gateway's cap is closed,
/// and one still logging in is ended when it must make room for newer ones.
async fn connection(
    mut tcp: TcpStream,
    socket_peer: SocketAddr,
    state: Arc<HttpState>,
    tasks: TaskTracker,
    stop: CancellationToken,
    mut slot: ClientSlot,
) {
    let front = &state.front;
    if slot.check_gateway().is_err() {
        front.metrics.error("gateway_full");
        return;
    }
    let _ = tcp.set_nodelay(true);
    let evicted = slot.eviction();
    let header_deadline = tokio::time::Instant::now() + front.startup_timeout;
    let interrupted = async {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = evicted.cancelled() => {}
        }
    };
    let named = front.client_address(&mut tcp, socket_peer, header_deadline, interrupted);
    let Some(peer) = named.await else {
        return;
    };
    let span = info_span!("http", %peer, via = tracing::field::Empty);
    if peer != socket_peer {
        span.record("via", tracing::field::display(socket_peer));
    }
    let serve = serve_connection(tcp, peer, state, tasks, stop, &mut slot);
    tokio::select! {
        _ = serve.instrument(span) => {}
        // Never once a request logged in.
        _ = evicted.cancelled() => debug!("http connection ended to make room for newer ones"),
    }
}

/// The connection's transport, like the Postgres listener's: TLS when its first byte starts a
/// handshake, plaintext only when allowed (a plaintext client is told why otherwise); `None`
/// when the connection ends first.
async fn transport(
    tcp: TcpStream,
    state: &HttpState,
) -> Option<(Box<dyn crate::stream::TunnelIo>, bool)> {
    let gw = &state.front;
    let deadline = gw.startup_timeout;
    let mut first = [0u8; 1];
    let is_tls = match tokio::time::timeout(deadline, tcp.peek(&mut first)).await {
        Ok(Ok(1)) => first[0] == TLS_HANDSHAKE_RECORD,
        _ => return None,
    };
    match (&state.tls, is_tls) {
        (Some(certs), true) => {
            // The certificates current now; a reload later does not touch this connection.
            let acceptor = TlsAcceptor::from(certs.current().http_config.clone());
            match tokio::time::timeout(deadline, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => Some((Box::new(s), true)),
                Ok(Err(e)) => {
                    crate::tls::log_failed_handshake(&e);
                    gw.metrics.error("tls_handshake");
                    None
                }
                Err(_) => None,
            }
        }
        (_, false) if state.allow_plaintext => Some((Box::new(tcp), false)),
        _ => {
            // Say why in HTTP, so `curl http://…` shows the fix instead of an empty reply.
            gw.metrics.error("plaintext_refused");
            let refuse = service_fn(|_req: Request<Incoming>| async {
                Ok::<_, Infallible>(plain(
                    StatusCode::BAD_REQUEST,
                    "this listener requires TLS: use https:// or wss:// (or set listen.allow_plaintext)",
                ))
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(tcp), refuse);
            let _ = tokio::time::timeout(deadline, conn).await;
            None
        }
    }
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    state: Arc<HttpState>,
    tasks: TaskTracker,
    stop: CancellationToken,
    slot: &mut ClientSlot,
) {
    let Some((io, tls)) = transport(tcp, &state).await else {
        return;
    };
    let header_timeout = state.config.header_timeout;
    let send_timeout = state.config.send_timeout;
    let metrics = state.front.metrics.clone();
    let activity = Arc::new(ConnActivity::default());
    let requests = activity.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        let tasks = tasks.clone();
        let activity = requests.clone();
        async move {
            let busy = activity.busy();
            let response = route(req, peer, tls, state, tasks, &activity).await;
            // Busy until the body is sent (or the connection drops it).
            let sending = busy.sending();
            let response = response.map(|body| {
                body.map_frame(move |f| {
                    sending.progressed();
                    f
                })
                .boxed_unsync()
            });
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // No timer of hyper's: it would arm one for every request head. A client that trickles its
    // headers or holds a kept-alive connection idle is closed by the loop below, whose one
    // deadline starts when the connection's last request ended.
    builder.http1().header_read_timeout(None);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    loop {
        // Every version and phase has the same deadline: with no request in flight (an HTTP/2
        // connection that sent its preface and SETTINGS, a kept-alive one), the connection is
        // closed `header_timeout` after its last request ended.
        let quiet = activity.quiet();
        let stalled_at = activity.stalled_at(send_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(error = %e, "http connection ended with an error");
                }
                return;
            }
            _ = stop.cancelled() => {
                // Shutdown: finish requests in flight, take no more on this connection.
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
                return;
            }
            _ = activity.changed.notified() => {
                if activity.authenticated.load(Ordering::Acquire) {
                    slot.logged_in();
                }
            }
            // A client that stopped reading holds the response (a spilled one holds a file)
            // and the connection: both end once nothing went out for `send_timeout`.
            _ = tokio::time::sleep_until(stalled_at.unwrap_or_else(tokio::time::Instant::now)),
                if stalled_at.is_some() =>
            {
                let now = tokio::time::Instant::now();
                if activity.stalled_at(send_timeout).is_some_and(|t| t <= now) {
                    debug!(?send_timeout, "the client stopped reading its response; closing");
                    metrics.error("http_send_timeout");
                    return;
                }
            }
            _ = tokio::time::sleep(header_timeout), if quiet => {
                debug!(idle = ?header_timeout, "http connection idle; closing it");
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(header_timeout, conn.as_mut()).await;
                return;
            }
        }
    }
}

async fn route(
    req: Request<Incoming>,
    peer: SocketAddr,
    tls: bool,
    state: Arc<HttpState>,
    tasks: TaskTracker,
    activity: &ConnActivity,
) -> Response<Body> {
    if websocket::is_upgrade(&req) {
        return websocket::upgrade(req, peer, tls, state, tasks);
    }
    let answer = match (req.method(), req.uri().path()) {
        (&Method::POST, "/sql") => return sql::handle(req, peer, &state, activity).await,
        (&Method::OPTIONS, "/sql") => preflight(),
        (_, "/sql") => plain(StatusCode::METHOD_NOT_ALLOWED, "use POST /sql"),
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: use POST /sql or a WebSocket",
        ),
    };
    drain(req.into_body(), state.config.body_timeout).await;
    answer
}

/// Reads and drops what is left of a request body before an early answer, until its end or
/// for `wait` at most. Over HTTP/2 an answer sent while the request is still open is followed
/// by a stream reset, which clients such as curl report instead of the answer. Nothing read
/// is kept, so only time bounds it, whatever size the client declared.
pub(crate) async fn drain(mut body: Incoming, wait: std::time::Duration) {
    use http_body_util::BodyExt;
    let read = async { while let Some(Ok(_)) = body.frame().await {} };
    let _ = tokio::time::timeout(wait, read).await;
}

/// Headers every `/sql` response carries so browsers may call it from any origin.
fn cors(builder: hyper::http::response::Builder) -> hyper::http::response::Builder {
    builder
        .header("access-control-allow-origin", "*")
        .header("access-control-expose-headers", "*")
}

/// The answer to a CORS preflight for `/sql`.
fn preflight() -> Response<Body> {
    cors(Response::builder().status(StatusCode::OK))
        .header("access-control-allow-methods", "POST, OPTIONS")
        .header(
            "access-control-allow-headers",
            "Authorization, Content-Type, Neon-Connection-String, Neon-Raw-Text-Output, \
             Neon-Array-Mode, Neon-Pool-Opt-In, Neon-Batch-Read-Only, Neon-Batch-Isolation-Level, \
             Neon-Batch-Deferrable",
        )
        .header("access-control-max-age", "86400")
        .body(full(Bytes::new()))
        .expect("valid response")
}

/// A short text response.
fn plain(status: StatusCode, text: &str) -> Response<Body> {
    cors(Response::builder().status(status))
        .header("content-type", "text/plain; charset=utf-8")
        .body(full(Bytes::from(format!("{text}\n"))))
        .expect("valid response")
}

/// A JSON response.
fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    cors(Response::builder().status(status))
        .header("content-type", "application/json")
        .body(full(Bytes::from(body)))
        .expect("valid response")
}
