//! `POST /sql`: one query or a batch in one transaction, as sent by `neon()` of the serverless
//! driver. The request names its database with `Neon-Connection-String`; the password in it is
//! checked by the gateway (same throttle as TCP), then the tenant wakes and the statements run
//! on a pooled backend connection.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::{Map, Value};
use tracing::{Instrument, debug, info};

use super::query::{self, Limits, QueryError, Shape, client_error};
use super::spill::SpillBuffer;
use super::{Body, ConnActivity, HttpState, json, plain};
use crate::auth::LoginMaterial;
use crate::cancel::CancelOnDrop;
use crate::config::BackendTls;
use crate::error::SessionError;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::upstream::{BackendConn, CacheLimits, OpenError, PoolError, PoolKey, Pooled};
use pgwake_routing::{Endpoint, TenantId};

/// SQLSTATE `query_canceled`, for requests over `http.query_timeout`.
const QUERY_CANCELED: &str = "57014";

/// What went wrong with a request, and how it is answered.
enum Refusal {
    /// 400 with an error object (the driver turns it into `NeonDbError`).
    Error(Map<String, Value>),
    /// Another status with a text body.
    Status(StatusCode, String),
    /// Refused on the way to the database (route, authenticate, admit, wake) as a TCP login
    /// would be: answered like [`Refusal::Error`], and counted in `pgwake_errors_total` by kind.
    Session(SessionError),
}

impl From<SessionError> for Refusal {
    fn from(e: SessionError) -> Self {
        Refusal::Session(e)
    }
}

/// The error object telling a client why its request was refused on the way to the database.
fn session_error_fields(e: &SessionError) -> Map<String, Value> {
    match e.client_message() {
        Some(m) => {
            let mut fields = client_error(m.code, &m.message);
            if let Some(d) = m.detail {
                fields.insert("detail".into(), d.into());
            }
            if let Some(h) = m.hint {
                fields.insert("hint".into(), h.into());
            }
            fields
        }
        // Client I/O and TLS failures cannot happen here; keep a generic answer anyway.
        None => client_error(
            pgwake_protocol::sqlstate::CONNECTION_FAILURE,
            "the connection to the tenant's database failed",
        ),
    }
}

fn bad_request(message: impl Into<String>) -> Refusal {
    Refusal::Error(client_error("08P01", &message.into()))
}

/// The parts of a `postgres://` URL the gateway needs.
struct ConnectionString {
    user: String,
    password: String,
    host: String,
    database: String,
    options: Option<String>,
}

fn parse_connection_string(s: &str) -> Result<ConnectionString, Refusal> {
    let bad = || {
        bad_request("Neon-Connection-String is not a postgres:// URL with user, password and host")
    };
    let rest = s
        .strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
        .ok_or_else(bad)?;
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (userinfo, hostport) = authority.rsplit_once('@').ok_or_else(bad)?;
    let (user, password) = userinfo.split_once(':').ok_or_else(bad)?;
    let decode = |v: &str| percent_decode_str(v).decode_utf8().map(|c| c.into_owned());
    let user = decode(user).map_err(|_| bad())?;
    let password = decode(password).map_err(|_| bad())?;
    let host = match hostport.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default().to_owned(),
        None => hostport.split(':').next().unwrap_or_default().to_owned(),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let database = decode(path.trim_start_matches('/')).map_err(|_| bad())?;
    let options = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "options")
        .map(|(_, v)| v.into_owned());
    if user.is_empty() || host.is_empty() {
        return Err(bad());
    }
    Ok(ConnectionString {
        database: if database.is_empty() {
            user.clone()
        } else {
            database
        },
        user,
        password,
        host,
        options,
    })
}

fn flag(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The `BEGIN` of a batch, from the batch headers.
fn begin_statement(headers: &HeaderMap) -> Result<String, Refusal> {
    let mut begin = String::from("BEGIN");
    if let Some(level) = headers.get("neon-batch-isolation-level") {
        let level = match level.to_str().unwrap_or_default() {
            "Serializable" => "SERIALIZABLE",
            "RepeatableRead" => "REPEATABLE READ",
            "ReadCommitted" => "READ COMMITTED",
            "ReadUncommitted" => "READ UNCOMMITTED",
            other => {
                return Err(bad_request(format!(
                    "Neon-Batch-Isolation-Level {other:?} is not one of Serializable, \
                     RepeatableRead, ReadCommitted, ReadUncommitted"
                )));
            }
        };
        begin.push_str(" ISOLATION LEVEL ");
        begin.push_str(level);
    }
    if headers.contains_key("neon-batch-read-only") {
        begin.push_str(if flag(headers, "neon-batch-read-only") {
            " READ ONLY"
        } else {
            " READ WRITE"
        });
    }
    if headers.contains_key("neon-batch-deferrable") {
        begin.push_str(if flag(headers, "neon-batch-deferrable") {
            " DEFERRABLE"
        } else {
            " NOT DEFERRABLE"
        });
    }
    Ok(begin)
}

/// Answers one `POST /sql`.
pub async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    state: &Arc<HttpState>,
    conn: &ConnActivity,
) -> Response<Body> {
    let span = tracing::info_span!("sql", tenant = tracing::field::Empty);
    let result = execute(req, peer, state, conn).instrument(span).await;
    state.record_pool();
    let response = match result {
        Ok((body, len)) => super::cors(Response::builder().status(StatusCode::OK))
            .header("content-type", "application/json")
            .header("content-length", len)
            .body(body)
            .expect("valid response"),
        Err(Refusal::Error(fields)) => json(StatusCode::BAD_REQUEST, &Value::Object(fields)),
        Err(Refusal::Status(status, text)) => plain(status, &text),
        Err(Refusal::Session(e)) => {
            state.front.metrics.error(e.kind());
            json(
                StatusCode::BAD_REQUEST,
                &Value::Object(session_error_fields(&e)),
            )
        }
    };
    state.front.metrics.http_request(response.status().as_u16());
    response
}

async fn execute(
    req: Request<Incoming>,
    peer: SocketAddr,
    state: &Arc<HttpState>,
    conn: &ConnActivity,
) -> Result<(Body, u64), Refusal> {
    let gw = &state.front.pipeline;
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    // Nothing of the body is kept before the password is checked: a refusal drops what the
    // client sent (up to a bound, so that an HTTP/2 client sees the answer).
    let login = match admit_headers(gw, peer, &headers, state).await {
        Ok(login) => login,
        Err(refusal) => {
            drop_body(body, state).await;
            return Err(refusal);
        }
    };
    conn.logged_in();
    let body = read_body(body, state).await?;
    let shape = Shape {
        raw_text: flag(&headers, "neon-raw-text-output"),
        array_mode: flag(&headers, "neon-array-mode"),
    };
    let (statements, batch) = super::body::parse(&body).map_err(|e| {
        bad_request(format!(
            "the body must be {{\"query\", \"params\"}} or {{\"queries\": [...]}}: {e}"
        ))
    })?;
    let begin = if batch {
        Some(begin_statement(&headers)?)
    } else {
        None
    };
    let admission = gw
        .coordinator
        .ensure_awake(&login.tenant)
        .await
        .map_err(|e| SessionError::Wake(login.tenant.clone(), e))?;
    // The claim marks the tenant active until the response is built.
    let _claim = admission.claim;
    let mut conn = pooled_connection(gw, &login, &admission.endpoint).await?;
    let limits = Limits {
        max_response: state.config.max_response_size.as_u64() as usize,
        max_message: gw.connector.max_message(),
        statements: CacheLimits {
            capacity: state.config.statement_cache,
            max_query: state.config.statement_cache_max_query.as_u64() as usize,
        },
    };
    // Armed until the answer is complete: a client that goes away, or the query timeout, drops
    // it and so cancels the query on the backend.
    let guard = CancelOnDrop::new(
        conn.cancel.as_ref().and_then(|r| r.target()),
        gw.connector.connect_timeout(),
    );
    let memory = state.config.response_memory.as_u64() as usize;
    let budget = state.spill_budget.clone();
    let mut out = SpillBuffer::new(memory, budget, login.tenant.clone());
    let run = run_statements(
        &mut conn,
        &statements,
        begin.as_deref(),
        shape,
        limits,
        &mut out,
    );
    let Ok(outcome) = tokio::time::timeout(state.config.query_timeout, run).await else {
        // The connection is mid-reply; dropping it closes it.
        return Err(Refusal::Error(client_error(
            QUERY_CANCELED,
            &format!(
                "the request took longer than {} s (http.query_timeout)",
                state.config.query_timeout.as_secs_f64()
            ),
        )));
    };
    // A complete answer leaves nothing running; anything else (too large, a broken link) may.
    if matches!(outcome, Ok(_) | Err(QueryError::Postgres(_))) {
        guard.disarm();
    }
    let stateless = statements
        .iter()
        .all(|s| super::stateless::leaves_no_state(&s.query));
    answer(&gw.metrics, conn, outcome, out, statements.len(), stateless).await
}

/// Runs the statements on `conn`; when a statement the cache named turns out gone or changed,
/// forgets the cache and runs them once more, parsed afresh, into a new `out`.
async fn run_statements(
    conn: &mut BackendConn,
    statements: &[query::Statement],
    begin: Option<&str>,
    shape: Shape,
    limits: Limits,
    out: &mut SpillBuffer,
) -> Result<(), QueryError> {
    let first = query::run(conn, statements, begin, shape, limits, out).await;
    let Err(QueryError::StaleStatement(_)) = first else {
        return first;
    };
    // Nothing ran. The reset in front of the retry drops whatever the backend still holds, and
    // empties the cache with it.
    conn.needs_reset = true;
    *out = out.empty_like();
    let uncached = Limits {
        statements: CacheLimits {
            capacity: 0,
            ..limits.statements
        },
        ..limits
    };
    query::run(conn, statements, begin, shape, uncached, out).await
}

/// The body length a request's headers declare.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// Reads and drops a refused request's body within `http.body_timeout`, so that the answer
/// reaches an HTTP/2 client before its stream closes.
async fn drop_body(body: Incoming, state: &HttpState) {
    super::drain(body, state.config.body_timeout).await;
}

/// The 413 for a body over `http.max_request_size`.
fn too_large(max_request: usize) -> Refusal {
    Refusal::Status(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body larger than {max_request} bytes (http.max_request_size)"),
    )
}

/// What the headers alone decide, before any of the body is kept: a declared body over
/// `http.max_request_size` (413), the connection string, and the password it holds.
async fn admit_headers(
    gw: &Pipeline,
    peer: SocketAddr,
    headers: &HeaderMap,
    state: &HttpState,
) -> Result<CheckedLogin, Refusal> {
    let max_request = state.config.max_request_size.as_u64() as usize;
    if declared_length(headers).is_some_and(|n| n > max_request as u64) {
        return Err(too_large(max_request));
    }
    let conn_string = headers
        .get("neon-connection-string")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| bad_request("missing header Neon-Connection-String"))?;
    let target = parse_connection_string(conn_string)?;
    admit(gw, peer, &target).await
}

/// Reads a logged-in request's whole body, within `http.max_request_size` and
/// `http.body_timeout`.
async fn read_body(mut body: Incoming, state: &HttpState) -> Result<Bytes, Refusal> {
    let max_request = state.config.max_request_size.as_u64() as usize;
    let read = tokio::time::timeout(state.config.body_timeout, async {
        let mut kept = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| bad_request("the request body could not be read"))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            if kept.len() + data.len() > max_request {
                // Still read (and dropped) so that the 413 reaches an HTTP/2 client.
                drop_body(body, state).await;
                return Err(too_large(max_request));
            }
            kept.extend_from_slice(data);
        }
        Ok(Bytes::from(kept))
    });
    let body = read.await.map_err(|_| {
        Refusal::Status(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s (http.body_timeout)",
                state.config.body_timeout.as_secs_f64()
            ),
        )
    })??;
    Ok(body)
}

/// Who a request logs in as, once the gateway has checked its password.
struct CheckedLogin {
    tenant: TenantId,
    tls: BackendTls,
    user: String,
    database: String,
    material: LoginMaterial,
}

/// Routes, admits and authenticates a request as the TCP path does: the host stands in for the
/// TLS server name, and an unknown tenant gets by default the answer and the work of a wrong
/// password.
async fn admit(
    gw: &Pipeline,
    peer: SocketAddr,
    target: &ConnectionString,
) -> Result<CheckedLogin, Refusal> {
    let mut params = vec![
        ("user".to_owned(), target.user.clone()),
        ("database".to_owned(), target.database.clone()),
    ];
    if let Some(o) = &target.options {
        params.push(("options".to_owned(), o.clone()));
    }
    let resolved = gw
        .router
        .resolver
        .resolve(Some(&target.host), &mut params)
        .map_err(SessionError::from)?;
    tracing::Span::current().record("tenant", resolved.tenant.as_str());
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let user = get("user").unwrap_or_default();
    let Some((tenant, profile)) = gw.router.admit(&resolved.tenant, peer) else {
        let refusal = gw.router.refusal(&resolved.tenant);
        let password = &target.password;
        let refused = gw
            .auth
            .refuse_unknown_password(&refusal, peer, &resolved.tenant, &user, password)
            .await;
        return Err(refused.into());
    };
    let Some(source) = profile.gateway_credentials() else {
        return Err(Refusal::Error(client_error(
            pgwake_protocol::sqlstate::FEATURE_NOT_SUPPORTED,
            "SQL over HTTP needs authentication at the gateway; this tenant uses passthrough",
        )));
    };
    let database = get("database").unwrap_or_else(|| user.clone());
    let material = gw
        .auth
        .check_password(peer, &tenant.id, source.as_ref(), &user, &target.password)
        .await?;
    Ok(CheckedLogin {
        tenant: tenant.id.clone(),
        tls: profile.tls,
        user,
        database,
        material,
    })
}

/// A pooled backend connection for `login` at `endpoint`, opened when none is free.
async fn pooled_connection(
    gw: &Pipeline,
    login: &CheckedLogin,
    endpoint: &Endpoint,
) -> Result<Pooled<PoolKey, BackendConn>, Refusal> {
    let key = PoolKey {
        tenant: login.tenant.clone(),
        user: login.user.clone(),
        database: login.database.clone(),
    };
    let at = (endpoint, login.tls);
    let pooled = gw.connector.pooled(&key, at, &login.material).await;
    pooled.map_err(|e| match e {
        PoolError::Exhausted(_) => Refusal::Error(client_error(
            pgwake_protocol::sqlstate::TOO_MANY_CONNECTIONS,
            "too many concurrent SQL-over-HTTP requests for this database; retry shortly",
        )),
        PoolError::Open(OpenError::Session(e)) => e.into(),
        // The backend's own answer, e.g. 3D000 for a database that does not exist.
        PoolError::Open(OpenError::Refused(body)) => Refusal::Error(query::error_fields(&body)),
    })
}

/// The response to a request whose statements ran with `outcome`; the connection goes back to
/// the pool when it is at rest, to be reset before its next use unless the statements were
/// `stateless` (provably left no session state) and succeeded.
async fn answer(
    metrics: &Metrics,
    mut conn: Pooled<PoolKey, BackendConn>,
    outcome: Result<(), QueryError>,
    out: SpillBuffer,
    statements: usize,
    stateless: bool,
) -> Result<(Body, u64), Refusal> {
    match outcome {
        Ok(()) => {
            // A reported parameter change already asked for a reset; an open transaction
            // (status not idle) always gets one.
            conn.needs_reset |= !stateless;
            conn.release();
            debug!(
                statements,
                bytes = out.len(),
                spilled = !out.in_memory(),
                "sql over http done"
            );
            let len = out.len();
            let body = out.into_body().await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::StorageFull {
                    return no_room(metrics, &e);
                }
                info!(error = %e, "sql over http: the spilled response could not be read back");
                Refusal::Status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the response could not be assembled".into(),
                )
            })?;
            Ok((body, len))
        }
        Err(QueryError::Postgres(fields) | QueryError::StaleStatement(fields)) => {
            conn.needs_reset = true;
            conn.release();
            Err(Refusal::Error(fields))
        }
        Err(QueryError::Spill(e)) => Err(no_room(metrics, &e)),
        // The connection is mid-reply: dropped, not pooled (its statement is cancelled).
        Err(QueryError::Unsupported(fields)) => Err(Refusal::Error(fields)),
        Err(QueryError::TooLarge(limit)) => {
            metrics.error("http_response_too_large");
            Err(Refusal::Status(
                StatusCode::INSUFFICIENT_STORAGE,
                format!("response larger than {limit} bytes (http.max_response_size)"),
            ))
        }
        Err(e) => {
            info!(error = %e, "sql over http: backend connection failed");
            metrics.error("backend_io");
            Err(Refusal::Error(client_error(
                pgwake_protocol::sqlstate::CONNECTION_FAILURE,
                "the connection to the tenant's database was lost",
            )))
        }
    }
}

/// The 507 for a response that found no room on disk: the temporary folder is full, or spilled
/// responses hold `http.max_spill_total` already, or this tenant's `http.max_spill_per_tenant`.
fn no_room(metrics: &Metrics, e: &std::io::Error) -> Refusal {
    info!(error = %e, "sql over http: no room for a large response");
    metrics.error("http_response_spill");
    let why = match e.kind() {
        std::io::ErrorKind::StorageFull => e.to_string(),
        _ => "no room in the temporary folder".to_owned(),
    };
    Refusal::Status(
        StatusCode::INSUFFICIENT_STORAGE,
        format!("the response could not be stored: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_are_read_like_the_driver_writes_them() {
        let c = parse_connection_string(
            "postgresql://app%40x:p%3Ass@alpha.db.example:5432/shop?options=endpoint%3Dalpha&application_name=a",
        )
        .ok()
        .expect("valid");
        assert_eq!(c.user, "app@x");
        assert_eq!(c.password, "p:ss");
        assert_eq!(c.host, "alpha.db.example");
        assert_eq!(c.database, "shop");
        assert_eq!(c.options.as_deref(), Some("endpoint=alpha"));
        assert!(parse_connection_string("mysql://a:b@c/d").is_err());
    }

    #[test]
    fn batch_headers_make_the_begin() {
        let mut h = HeaderMap::new();
        h.insert(
            "neon-batch-isolation-level",
            "Serializable".parse().unwrap(),
        );
        h.insert("neon-batch-read-only", "true".parse().unwrap());
        h.insert("neon-batch-deferrable", "true".parse().unwrap());
        assert_eq!(
            begin_statement(&h).ok().unwrap(),
            "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE"
        );
    }
}
