//! SQL over HTTP: `POST /sql` with `SELECT 1` on keep-alive connections against a woken
//! `local`-backend tenant, beside tokio-postgres running the same query in a loop directly on
//! the tenant's Postgres, through the gateway's Postgres listener and through its WebSocket
//! endpoint (Postgres over WebSocket, as the serverless driver's `Pool`/`Client` use it), in the
//! same run.
//!
//! Beside them, `POST /sql` with a wrong password for the tenant and for a tenant that does not
//! exist, side by side: what a client probing for tenant names could compare (issue 42, F8).
//!
//! Every client runs requests back to back for a fixed time and records each one's latency;
//! requests/s is the count over the time, p50/p99 come from the recorded latencies. All three
//! ways do one round trip to Postgres per query (tokio-postgres with a prepared statement; the
//! gateway sends Parse/Bind/Execute/Sync in one write).

use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{Poll, ready};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::Sink;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_postgres::NoTls;
use tokio_tungstenite::tungstenite::Message;

use crate::client::Login;
use crate::gateway::{LocalGateway, Spec};
use crate::process::{ProcSample, clock_ticks_per_second, load_average};
use crate::report::{Facts, met, percentile};

/// How long and how wide to measure.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Measured time per (way, clients) pair.
    pub duration: Duration,
    /// Concurrent clients to measure with, one row each.
    pub clients: Vec<usize>,
}

/// The ways of running `SELECT 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// tokio-postgres straight to the tenant's Postgres.
    Direct,
    /// tokio-postgres through the gateway's Postgres listener.
    GatewayTcp,
    /// `POST /sql` on the gateway's HTTP listener, keep-alive.
    GatewayHttp,
    /// tokio-postgres over a WebSocket to the gateway's HTTP listener.
    GatewayWs,
    /// `POST /sql` with a wrong password, for the tenant.
    WrongPassword,
    /// `POST /sql` with a wrong password, for a tenant that does not exist.
    WrongPasswordNoTenant,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Direct => "Postgres direct (tokio-postgres)",
            Way::GatewayTcp => "pgwake Postgres listener (tokio-postgres)",
            Way::GatewayHttp => "pgwake `POST /sql` (HTTP/1.1 keep-alive)",
            Way::GatewayWs => "pgwake WebSocket (tokio-postgres over tokio-tungstenite)",
            Way::WrongPassword => "pgwake `POST /sql`, wrong password, tenant exists",
            Way::WrongPasswordNoTenant => {
                "pgwake `POST /sql`, wrong password, tenant does not exist"
            }
        }
    }

    /// A refused login rather than a query: not compared with Postgres direct.
    fn refused(self) -> bool {
        matches!(self, Way::WrongPassword | Way::WrongPasswordNoTenant)
    }
}

/// One measured row.
#[derive(Clone, Debug)]
pub struct Row {
    /// How.
    pub way: Way,
    /// Concurrent clients.
    pub clients: usize,
    /// Queries completed.
    pub requests: u64,
    /// Queries per second.
    pub rps: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Gateway CPU per query, µs (none for direct).
    pub gateway_cpu_us: Option<f64>,
}

/// Everything measured.
pub struct HttpResults {
    /// Rows in the order run.
    pub rows: Vec<Row>,
    /// Load average before and after.
    pub load: (String, String),
}

const TENANT: &str = "sqlbench";
/// A tenant the gateway does not have, for the wrong-password rows.
const NO_TENANT: &str = "nosuchbench";
/// Unmeasured time per way before its rows: wakes the tenant, fills the pool, warms caches.
const WARMUP: Duration = Duration::from_secs(1);

/// Runs the scenario with the pgwake binary at `binary`.
pub fn run(binary: &std::path::Path, opts: &HttpOptions) -> Result<HttpResults> {
    let load_before = load_average();
    let http_port = pgwake_testkit::free_port();
    let gw = LocalGateway::start_with_listen(
        binary,
        &Spec {
            tenant: TENANT,
            wake: vec!["idle_timeout = \"1h\"".into()],
            limits: vec![],
            settings: vec![],
            revival: vec![],
            // Every wrong password is evaluated, so the rows measure the check, not the
            // throttle's refusals.
            auth: vec![
                "throttle_free_failures = 4000000000".into(),
                "throttle_source_free_failures = 4000000000".into(),
            ],
        },
        &[format!("http = \"127.0.0.1:{http_port}\"")],
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let login = gw.login();
    crate::progress("sql over http: waking the tenant (initdb and first start) ...");
    rt.block_on(crate::client::connect_select1(
        &login,
        &crate::client::Transport::Plain,
        Duration::from_secs(120),
    ))
    .with_context(|| format!("first connection: {}", gw.log_tail(5)))?;
    let direct = gw.direct_login(gw.postgres_port()?);
    let conn_string = |password: &str, database: &str| {
        format!(
            "postgresql://{}:{password}@localhost/{database}",
            login.user
        )
    };
    let clk_tck = clock_ticks_per_second();
    let mut rows = Vec::new();
    let ways = [
        Way::Direct,
        Way::GatewayTcp,
        Way::GatewayHttp,
        Way::GatewayWs,
        Way::WrongPassword,
        Way::WrongPasswordNoTenant,
    ];
    for way in ways {
        let http = |password: &str, database: &str| Target::Http {
            port: http_port,
            conn_string: conn_string(password, database),
            refused: way.refused(),
        };
        let target = match way {
            Way::Direct => Target::Postgres(direct.clone()),
            Way::GatewayTcp => Target::Postgres(login.clone()),
            Way::GatewayHttp => http(&login.password, &login.dbname),
            Way::WrongPassword => http("wrong", &login.dbname),
            Way::WrongPasswordNoTenant => http("wrong", &format!("{NO_TENANT}.postgres")),
            Way::GatewayWs => Target::Ws {
                port: http_port,
                login: login.clone(),
            },
        };
        rt.block_on(measure(&target, 1, WARMUP))
            .with_context(|| format!("{} warm-up: {}", way.label(), gw.log_tail(5)))?;
        for &clients in &opts.clients {
            let before = ProcSample::read(gw.pid())?;
            let (requests, mut latencies, elapsed) = rt
                .block_on(measure(&target, clients, opts.duration))
                .with_context(|| format!("{}: {}", way.label(), gw.log_tail(5)))?;
            let after = ProcSample::read(gw.pid())?;
            if requests == 0 {
                bail!("{}: no query completed", way.label());
            }
            latencies.sort_by(f64::total_cmp);
            let cpu_us = (after.cpu_ticks.saturating_sub(before.cpu_ticks)) as f64 / clk_tck as f64
                * 1e6
                / requests as f64;
            let row = Row {
                way,
                clients,
                requests,
                rps: requests as f64 / elapsed.as_secs_f64(),
                p50_us: percentile(&latencies, 50.0).unwrap_or(0.0),
                p99_us: percentile(&latencies, 99.0).unwrap_or(0.0),
                gateway_cpu_us: (way != Way::Direct).then_some(cpu_us),
            };
            crate::progress(format_args!(
                "sql over http: {} x{clients}: {:.0} q/s, p50 {:.0} µs, p99 {:.0} µs",
                way.label(),
                row.rps,
                row.p50_us,
                row.p99_us
            ));
            rows.push(row);
        }
    }
    drop(gw);
    Ok(HttpResults {
        rows,
        load: (load_before, load_average()),
    })
}

#[derive(Clone)]
enum Target {
    Postgres(Login),
    /// `refused`: the password is wrong, so the answer must be a 400 with SQLSTATE 28P01.
    Http {
        port: u16,
        conn_string: String,
        refused: bool,
    },
    Ws {
        port: u16,
        login: Login,
    },
}

/// Runs `clients` loops for `duration`; returns the queries done, their latencies in µs and
/// the time taken.
async fn measure(
    target: &Target,
    clients: usize,
    duration: Duration,
) -> Result<(u64, Vec<f64>, Duration)> {
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let target = target.clone();
            tokio::spawn(async move {
                match target {
                    Target::Postgres(login) => postgres_loop(&login, deadline).await,
                    Target::Http {
                        port,
                        conn_string,
                        refused,
                    } => http_loop(port, (&conn_string, refused), deadline).await,
                    Target::Ws { port, login } => ws_loop(port, &login, deadline).await,
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    Ok((latencies.len() as u64, latencies, started.elapsed()))
}

async fn postgres_loop(login: &Login, deadline: Instant) -> Result<Vec<f64>> {
    let (client, conn) = login
        .plain_config()
        .connect(NoTls)
        .await
        .context("connect")?;
    let driver = tokio::spawn(conn);
    select_loop(client, driver, deadline).await
}

/// Runs a prepared `SELECT 1` on `client` until `deadline`; returns the latencies in µs.
async fn select_loop(
    client: tokio_postgres::Client,
    driver: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    deadline: Instant,
) -> Result<Vec<f64>> {
    let statement = client.prepare("SELECT 1").await?;
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        let rows = client.query(&statement, &[]).await?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
        if rows.len() != 1 {
            bail!("SELECT 1 returned {} rows", rows.len());
        }
    }
    drop(client);
    let _ = driver.await;
    Ok(latencies)
}

/// tokio-postgres over a WebSocket to the gateway's HTTP listener, as the serverless driver
/// tunnels the protocol (binary frames; the gateway asks for the password in the clear).
async fn ws_loop(port: u16, login: &Login, deadline: Instant) -> Result<Vec<f64>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let (ws, _) = tokio_tungstenite::client_async(format!("ws://localhost:{port}/v2"), tcp)
        .await
        .context("websocket handshake")?;
    let (client, conn) = login
        .plain_config()
        .connect_raw(WsBytes::new(ws), NoTls)
        .await
        .context("log in over the websocket")?;
    let driver = tokio::spawn(conn);
    select_loop(client, driver, deadline).await
}

/// A client WebSocket as a byte stream: writes go out as binary frames, binary frames are read
/// back as bytes.
struct WsBytes {
    ws: tokio_tungstenite::WebSocketStream<TcpStream>,
    pending: bytes::Bytes,
}

impl WsBytes {
    fn new(ws: tokio_tungstenite::WebSocketStream<TcpStream>) -> Self {
        WsBytes {
            ws,
            pending: bytes::Bytes::new(),
        }
    }
}

impl tokio::io::AsyncRead for WsBytes {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        use futures_util::Stream as _;
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending.split_to(n));
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.pending = data,
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(std::io::Error::other(e))),
            }
        }
    }
}

impl tokio::io::AsyncWrite for WsBytes {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(std::io::Error::other)?;
        Pin::new(&mut this.ws)
            .start_send(Message::Binary(bytes::Bytes::copy_from_slice(buf)))
            .map_err(std::io::Error::other)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_flush(cx)
            .map_err(std::io::Error::other)
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_close(cx)
            .map_err(std::io::Error::other)
    }
}

/// `POST /sql` of `SELECT 1` until `deadline` on one kept-alive connection, with `conn_string`;
/// every answer must be the query's result, or when `refused`, a wrong password's 400.
async fn http_loop(
    port: u16,
    (conn_string, refused): (&str, bool),
    deadline: Instant,
) -> Result<Vec<f64>> {
    let body = br#"{"query":"SELECT 1","params":[]}"#;
    let request = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Neon-Connection-String: {conn_string}\r\nNeon-Raw-Text-Output: true\r\n\
         Neon-Array-Mode: true\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut request = request.into_bytes();
    request.extend_from_slice(body);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let mut conn = BufReader::new(tcp);
    let mut latencies = Vec::new();
    let mut line = String::new();
    let mut response = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        conn.get_mut().write_all(&request).await?;
        line.clear();
        conn.read_line(&mut line).await?;
        let status = if refused {
            "HTTP/1.1 400"
        } else {
            "HTTP/1.1 200"
        };
        if !line.starts_with(status) {
            bail!("answer {:?}", line.trim_end());
        }
        read_body(&mut conn, &mut line, &mut response).await?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
        let expected: &[u8] = match refused {
            true => br#""code":"28P01""#,
            false => br#""command":"SELECT""#,
        };
        if !response.windows(expected.len()).any(|w| w == expected) {
            bail!("unexpected body {:?}", String::from_utf8_lossy(&response));
        }
    }
    Ok(latencies)
}

/// Reads an answer's headers and then its body into `response`: `Content-Length` bytes, or
/// the chunks of a chunked body (how the gateway sends its error answers).
async fn read_body(
    conn: &mut BufReader<TcpStream>,
    line: &mut String,
    response: &mut Vec<u8>,
) -> Result<()> {
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        conn.read_line(line).await?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.trim().eq_ignore_ascii_case("chunked");
        }
    }
    response.clear();
    if !chunked {
        let length = length.ok_or_else(|| anyhow!("no Content-Length in the answer"))?;
        response.resize(length, 0);
        conn.read_exact(response).await?;
        return Ok(());
    }
    loop {
        line.clear();
        conn.read_line(line).await?;
        let size = usize::from_str_radix(line.trim_end(), 16)
            .with_context(|| format!("chunk size {:?}", line.trim_end()))?;
        let start = response.len();
        // The chunk and the line end after it; the last (empty) chunk has only the line end.
        response.resize(start + size + 2, 0);
        conn.read_exact(&mut response[start..]).await?;
        response.truncate(start + size);
        if size == 0 {
            return Ok(());
        }
    }
}

/// The report section.
pub fn render(facts: &Facts, opts: &HttpOptions, outcome: &Result<HttpResults, String>) -> String {
    let mut out = String::new();
    let Some(r) = facts.open_section(
        &mut out,
        "SQL over HTTP (`POST /sql`, `SELECT 1`)",
        outcome,
        |r| &r.load,
    ) else {
        return out;
    };
    let _ = writeln!(
        out,
        "\nEach row: that many clients run `SELECT 1` back to back for {:.0} s against a woken \
         `local` tenant (plaintext, loopback, client and servers on the same CPUs). The HTTP \
         client keeps its connection alive and asks for raw text and array mode, as the \
         serverless driver does; tokio-postgres uses a prepared statement, over TCP or tunnelled \
         through a WebSocket to the HTTP listener (binary frames, as the driver's `Pool` sends). Ratio: requests/s \
         relative to Postgres direct with the same number of clients. Gateway CPU: user + \
         system time of the pgwake process per query. The two wrong-password rows send \
         `POST /sql` with a wrong password for the tenant and for a tenant that does not \
         exist (the throttle's free failures raised so that every attempt is evaluated): \
         each answer is the 400 with SQLSTATE 28P01, and a gap between them would tell a \
         client probing names which tenants exist.\n",
        opts.duration.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| way | clients | queries | queries/s | ratio | p50 µs | p99 µs | gateway CPU µs/query |\n|---|---|---|---|---|---|---|---|"
    );
    for row in &r.rows {
        let direct = r
            .rows
            .iter()
            .find(|d| d.way == Way::Direct && d.clients == row.clients)
            .map(|d| d.rps);
        let ratio = match (direct, row.way.refused()) {
            (Some(d), false) => format!("{:.2}", row.rps / d),
            _ => "–".into(),
        };
        let cpu = row.gateway_cpu_us.map_or("–".into(), |c| format!("{c:.0}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {ratio} | {:.0} | {:.0} | {cpu} |",
            row.way.label(),
            row.clients,
            row.requests,
            row.rps,
            row.p50_us,
            row.p99_us
        );
    }
    out.push_str(&probing(&r.rows));
    out.push_str(&goals(&r.rows));
    out
}

/// The wrong-password rows compared: a tenant that does not exist over one that does.
fn probing(rows: &[Row]) -> String {
    let mut out = String::from(
        "\nWrong password, tenant that does not exist ÷ tenant that exists (issue 42, F8):\n\n\
         | clients | p50 | p99 | gateway CPU per request |\n|---|---:|---:|---:|\n",
    );
    let find =
        |way: Way, clients: usize| rows.iter().find(|r| r.way == way && r.clients == clients);
    let mut any = false;
    for known in rows.iter().filter(|r| r.way == Way::WrongPassword) {
        let Some(unknown) = find(Way::WrongPasswordNoTenant, known.clients) else {
            continue;
        };
        any = true;
        let cpu = unknown
            .gateway_cpu_us
            .zip(known.gateway_cpu_us)
            .map_or("–".into(), |(u, k)| format!("{:.2}×", u / k));
        let _ = writeln!(
            out,
            "| {} | {:.2}× | {:.2}× | {cpu} |",
            known.clients,
            unknown.p50_us / known.p50_us,
            unknown.p99_us / known.p99_us,
        );
    }
    if any { out } else { String::new() }
}

/// Issue 29's `/sql` goals: with one client, at least this share of the gateway's own Postgres
/// listener's rate.
const ONE_CLIENT_MIN_RATE: f64 = 0.95;
/// With eight clients, at most this multiple of the Postgres listener's gateway CPU per query.
const EIGHT_CLIENTS_MAX_CPU: f64 = 1.25;

/// The goals' lines, judged on the rows (a row that was not measured leaves its goal open).
fn goals(rows: &[Row]) -> String {
    let find =
        |way: Way, clients: usize| rows.iter().find(|r| r.way == way && r.clients == clients);
    let mut out = String::from(
        "\nIssue 29's goals, from the rows above:\n\n| goal | figure | met |\n|---|---:|---|\n",
    );
    let verdict = |v: Option<f64>, ok: &dyn Fn(f64) -> bool| match v {
        Some(v) => (format!("{v:.2}×"), met(ok(v))),
        None => ("–".to_string(), "not measured"),
    };
    let rate = find(Way::GatewayHttp, 1)
        .zip(find(Way::GatewayTcp, 1))
        .map(|(h, t)| h.rps / t.rps);
    let (figure, met) = verdict(rate, &|v| v >= ONE_CLIENT_MIN_RATE);
    let _ = writeln!(
        out,
        "| one client: `POST /sql` queries/s ≥ {ONE_CLIENT_MIN_RATE}× the Postgres listener's | {figure} | {met} |"
    );
    let cpu = find(Way::GatewayHttp, 8)
        .and_then(|h| h.gateway_cpu_us)
        .zip(find(Way::GatewayTcp, 8).and_then(|t| t.gateway_cpu_us))
        .map(|(h, t)| h / t);
    let (figure, met) = verdict(cpu, &|v| v <= EIGHT_CLIENTS_MAX_CPU);
    let _ = writeln!(
        out,
        "| eight clients: `POST /sql` gateway CPU per query ≤ {EIGHT_CLIENTS_MAX_CPU}× the Postgres listener's | {figure} | {met} |"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(way: Way, clients: usize, rps: f64, cpu: Option<f64>) -> Row {
        Row {
            way,
            clients,
            requests: 0,
            rps,
            p50_us: 0.0,
            p99_us: 0.0,
            gateway_cpu_us: cpu,
        }
    }

    #[test]
    fn goals_compare_sql_over_http_with_the_postgres_listener() {
        let rows = [
            row(Way::Direct, 1, 12000.0, None),
            row(Way::GatewayTcp, 1, 10000.0, Some(40.0)),
            row(Way::GatewayHttp, 1, 9600.0, Some(45.0)),
            row(Way::GatewayTcp, 8, 20000.0, Some(20.0)),
            row(Way::GatewayHttp, 8, 12000.0, Some(30.0)),
        ];
        let text = goals(&rows);
        assert!(
            text.contains("the Postgres listener's | 0.96× | yes |"),
            "{text}"
        );
        assert!(
            text.contains("the Postgres listener's | 1.50× | **no** |"),
            "{text}"
        );
        let text = goals(&rows[..3]);
        assert!(text.contains("| – | not measured |"), "{text}");
    }

    #[test]
    fn probing_compares_the_wrong_password_rows_per_client_count() {
        let mut known = row(Way::WrongPassword, 1, 500.0, Some(2000.0));
        let mut unknown = row(Way::WrongPasswordNoTenant, 1, 480.0, Some(2100.0));
        (known.p50_us, known.p99_us) = (2000.0, 4000.0);
        (unknown.p50_us, unknown.p99_us) = (2200.0, 4000.0);
        let text = probing(&[known.clone(), unknown]);
        assert!(text.contains("| 1 | 1.10× | 1.00× | 1.05× |"), "{text}");
        assert_eq!(probing(&[known]), "", "no pair, no table");
    }
}
