//! The admin listener: Prometheus metrics, liveness and readiness.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use crate::metrics::Metrics;

/// What the admin endpoints report on.
pub struct AdminState {
    /// Metrics to export.
    pub metrics: Arc<Metrics>,
    /// False once shutdown has begun, so load balancers stop sending clients.
    pub ready: AtomicBool,
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

fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.render(),
        ),
        (&Method::GET, "/healthz") => text(StatusCode::OK, PLAIN, "ok\n"),
        (&Method::GET, "/readyz") if state.ready.load(Ordering::Relaxed) => {
            text(StatusCode::OK, PLAIN, "ready\n")
        }
        (&Method::GET, "/readyz") => {
            text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "shutting down\n")
        }
        (_, "/metrics" | "/healthz" | "/readyz") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "method not allowed\n",
        ),
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n"),
    }
}

/// Serves the admin endpoints until the process exits.
pub async fn serve(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let resp = route(&state, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
