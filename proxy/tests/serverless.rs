//! SQL over HTTP and Postgres over WebSocket: the real `@neondatabase/serverless` driver under
//! Node against the gateway and a local tenant it wakes, and the HTTP limits (413, 507).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{Gateway, LOCAL_PASSWORD, SNI_SUFFIX, open_ws, pipelined_login, read_until};
use pgwake_testkit::free_port;

/// The `[listen]` additions and `[http]` section for a plaintext HTTP listener on `port`.
fn http_listener(port: u16, http_section: &str) -> String {
    format!("allow_plaintext = true\nhttp = \"127.0.0.1:{port}\"\n[http]\n{http_section}\n")
}

fn url(tenant: &str, password: &str) -> String {
    format!("postgresql://pgwake:{password}@{tenant}.{SNI_SUFFIX}:5432/postgres")
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
fn post_sql(port: u16, conn: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nNeon-Connection-String: {conn}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // The gateway may answer 413 before reading a large body; the write may then fail.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn query_body(sql: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "query": sql, "params": [] })).unwrap()
}

#[test]
fn serverless_driver_over_http_and_websocket() {
    let dir = common::node_project("serverless", "@neondatabase/serverless");
    let http = free_port();
    let gw = Gateway::start_local(&["alpha"], &http_listener(http, ""), "", &[]);
    assert_eq!(gw.tenant_state("alpha").0, "asleep");

    let out = Command::new("node")
        .arg("driver.mjs")
        .current_dir(dir)
        .env("PGWAKE_HTTP", format!("127.0.0.1:{http}"))
        .env("PGWAKE_URL", url("alpha", LOCAL_PASSWORD))
        .env("PGWAKE_BAD_URL", url("alpha", "not-the-password"))
        .env("PGWAKE_HTTPS", format!("localhost:{http}"))
        .env("NODE_EXTRA_CA_CERTS", gw.dir.path().join("cert.pem"))
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "driver checks failed:\n{stdout}\n{}\n--- gateway log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.log()
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    assert_eq!(gw.tenant_state("alpha").0, "awake");
    // Each WebSocket was a session like a TCP one, and each one ended.
    gw.wait_idle();
    assert!(gw.metric("pgwake_connections_accepted_total") >= 5.0);

    // Asleep again, the pooled connections are dead: the next request wakes the tenant and
    // opens a fresh one.
    assert_eq!(
        gw.http("POST", "/v1/tenants/alpha/sleep").map(|r| r.0),
        Some(200)
    );
    assert_eq!(gw.tenant_state("alpha").0, "asleep");
    let (status, body) = post_sql(
        http,
        &url("alpha", LOCAL_PASSWORD),
        &query_body("select 7 as n"),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["rows"][0]["n"], 7, "{body}");
    assert_eq!(gw.tenant_state("alpha").0, "awake");

    // HTTP/2 over TLS, as in the README's curl example.
    let out = Command::new("curl")
        .args(["-sS", "--http2", "-w", "\n%{http_version}", "--cacert"])
        .arg(gw.dir.path().join("cert.pem"))
        .arg(format!("https://localhost:{http}/sql"))
        .args([
            "-H",
            &format!("Neon-Connection-String: {}", url("alpha", LOCAL_PASSWORD)),
        ])
        .args([
            "-d",
            r#"{"query": "select $1::int + 1 as n", "params": [1]}"#,
        ])
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.ends_with("\n2"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(r#""rows":[{"n":2}]"#), "{text}");
}

#[test]
fn oversize_request_and_response_leave_the_pool_healthy() {
    let http = free_port();
    let gw = Gateway::start_local(
        &["beta"],
        &http_listener(
            http,
            "max_request_size = \"4KiB\"\nmax_response_size = \"64KiB\"\npool_max_per_key = 2",
        ),
        "",
        &[],
    );
    let conn = url("beta", LOCAL_PASSWORD);
    let (status, body) = post_sql(http, &conn, &query_body("select 1 as one"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(gw.metric("pgwake_http_pool_connections"), 1.0);
    assert_eq!(gw.metric("pgwake_http_pool_idle_connections"), 1.0);

    let big = query_body(&format!("select '{}' as padding", "x".repeat(8192)));
    let (status, body) = post_sql(http, &conn, &big);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("max_request_size"), "{body}");

    let (status, body) = post_sql(
        http,
        &conn,
        &query_body("select repeat('y', 1000) from generate_series(1, 1000)"),
    );
    assert_eq!(status, 507, "{body}");
    assert!(body.contains("max_response_size"), "{body}");

    // Raw text and array mode, the shape the driver asks for.
    for _ in 0..3 {
        let (status, body) = post_sql(http, &conn, &query_body("select 1 as one, null as nothing"));
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["rows"][0]["one"], 1, "{body}");
        assert_eq!(v["command"], "SELECT");
        assert_eq!(v["rowCount"], 1);
    }
    // The connection that overflowed was closed; one healthy connection serves on.
    assert_eq!(gw.metric("pgwake_http_pool_connections"), 1.0);
    assert_eq!(gw.metric("pgwake_http_pool_idle_connections"), 1.0);
    // Session state does not leak from one request to the next.
    let (status, _) = post_sql(http, &conn, &query_body("set search_path = nowhere"));
    assert_eq!(status, 200);
    let (_, body) = post_sql(http, &conn, &query_body("show search_path"));
    assert!(
        body.contains("\\\"$user\\\", public") || body.contains("\"$user\", public"),
        "{body}"
    );
    // Also when the change hides in a query (no SET, no parameter report): the statement is
    // not provably stateless, so the connection is reset before the next request.
    let (status, body) = post_sql(
        http,
        &conn,
        &query_body("select set_config('search_path', 'elsewhere', false) as v"),
    );
    assert_eq!(status, 200, "{body}");
    let (_, body) = post_sql(http, &conn, &query_body("show search_path"));
    assert!(!body.contains("elsewhere"), "{body}");
    // Plain queries skip the reset; types and NULLs come out as before.
    for _ in 0..2 {
        let (status, body) = post_sql(
            http,
            &conn,
            &query_body(
                "select 1::int2 as a, 2.5::float8 as b, true as c, null::text as d,                  '{\"k\": [1]}'::jsonb as e, 12345678901234::int8 as f, 'x\"y' as g",
            ),
        );
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["rows"][0],
            serde_json::json!({"a": 1, "b": 2.5, "c": true, "d": null, "e": {"k": [1]},
                "f": "12345678901234", "g": "x\"y"}),
            "{body}"
        );
        assert_eq!(v["fields"][0]["dataTypeID"], 21, "{body}");
        assert_eq!(v["fields"][0]["name"], "a", "{body}");
        assert_eq!(v["fields"][0]["format"], "text", "{body}");
    }
    assert_eq!(gw.metric("pgwake_http_pool_connections"), 1.0);

    // The backend's own login refusal reaches the client: an unknown database.
    let (status, body) = post_sql(
        http,
        &format!("postgresql://pgwake:{LOCAL_PASSWORD}@beta.{SNI_SUFFIX}/nosuchdb"),
        &query_body("select 1"),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains(r#""code":"3D000""#), "{body}");

    // CORS preflight.
    let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
    s.write_all(b"OPTIONS /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("access-control-allow-headers"),
        "{text}"
    );
}

#[test]
fn websocket_tunnel_with_split_frames_text_refusal_and_close() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let http = free_port();
    let gw = Gateway::start_local(&["gamma"], &http_listener(http, ""), "", &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Startup, password and query pipelined, cut into 3-byte frames; the tenant comes from
        // the address parameter on an arbitrary path.
        let mut ws = open_ws(http, &format!("/any/path?address=gamma.{SNI_SUFFIX}:5432")).await;
        let bytes = pipelined_login("pgwake", LOCAL_PASSWORD, "select 40 + 2");
        for chunk in bytes.chunks(3) {
            ws.send(Message::Binary(chunk.to_vec().into()))
                .await
                .unwrap();
        }
        let got = read_until(&mut ws, |m| {
            m.iter().filter(|(t, _)| *t == b'Z').count() >= 2
        })
        .await;
        assert_eq!(
            got[0],
            (b'R', 3i32.to_be_bytes().to_vec()),
            "cleartext password asked"
        );
        assert!(
            got.iter().any(|(t, _)| *t == b'K'),
            "a cancel key is issued"
        );
        let row = got.iter().find(|(t, _)| *t == b'D').expect("a data row");
        assert!(row.1.ends_with(b"42"), "{row:?}");
        // A close frame ends the session cleanly.
        ws.close(None).await.unwrap();
        let rest = read_until(&mut ws, |_| false).await;
        assert!(rest.is_empty(), "{rest:?}");

        // Text frames are refused: the session ends.
        let mut ws = open_ws(http, "/").await;
        ws.send(Message::Text("select 1".into())).await.unwrap();
        let got = read_until(&mut ws, |_| false).await;
        assert!(got.iter().all(|(t, _)| *t != b'Z'), "{got:?}");

        // A wrong password gets 28P01 and never a ReadyForQuery; the Host header names the
        // tenant here.
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", http))
            .await
            .unwrap();
        let request = tokio_tungstenite::tungstenite::http::Request::builder()
            .uri(format!("ws://127.0.0.1:{http}/v2"))
            .header("Host", format!("gamma.{SNI_SUFFIX}:{http}"))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header(
                "Sec-WebSocket-Key",
                tokio_tungstenite::tungstenite::handshake::client::generate_key(),
            )
            .body(())
            .unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        let bytes = pipelined_login("pgwake", "wrong", "select 1");
        ws.send(Message::Binary(bytes.into())).await.unwrap();
        let got = read_until(&mut ws, |_| false).await;
        let error = got.iter().find(|(t, _)| *t == b'E').expect("an error");
        assert!(
            String::from_utf8_lossy(&error.1).contains("28P01"),
            "{got:?}"
        );
        assert!(got.iter().all(|(t, _)| *t != b'Z'));
    });
    gw.wait_idle();
    assert_eq!(gw.metric("pgwake_connections_accepted_total"), 3.0);
}

#[test]
fn plaintext_http_is_refused_with_a_reason_unless_allowed() {
    let http = free_port();
    let gw = Gateway::launch(&format!("http = \"127.0.0.1:{http}\""), "", &[]);
    let (status, body) = post_sql(http, &url("alpha", "x"), &query_body("select 1"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("requires TLS"), "{body}");
    assert_eq!(
        gw.metric("pgwake_errors_total{kind=\"plaintext_refused\"}"),
        1.0
    );
}

#[test]
fn http_requests_keep_a_tenant_awake_and_pooled_connections_do_not() {
    let http = free_port();
    let section = "\n[wake]\nidle_timeout = \"1s\"\nidle_check_interval = \"50ms\"";
    let gw = Gateway::start_local(&["delta"], &http_listener(http, section), "", &[]);
    let conn = url("delta", LOCAL_PASSWORD);
    // Requests closer together than the idle timeout, for twice as long: it stays awake.
    for _ in 0..8 {
        let (status, body) = post_sql(http, &conn, &query_body("select 1"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(gw.tenant_state("delta").0, "awake");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The idle pooled connection holds no claim on the tenant: it goes to sleep.
    assert_eq!(gw.metric("pgwake_http_pool_idle_connections"), 1.0);
    gw.wait_state("delta", "asleep", Duration::from_secs(10));
}

/// A keep-alive HTTP/1.1 connection sending `POST /sql` requests one after another.
struct KeepAlive {
    stream: std::io::BufReader<TcpStream>,
}

impl KeepAlive {
    fn open(port: u16) -> KeepAlive {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        KeepAlive {
            stream: std::io::BufReader::new(s),
        }
    }

    /// Sends one request and reads its answer (by Content-Length): (status, body).
    fn post(&mut self, conn: &str, body: &[u8]) -> (u16, String) {
        use std::io::BufRead;
        let head = format!(
            "POST /sql HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Neon-Connection-String: {conn}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let s = self.stream.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut status_line = String::new();
        self.stream.read_line(&mut status_line).unwrap();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP response: {status_line:?}"));
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).unwrap();
        (status, String::from_utf8(body).unwrap())
    }
}

/// `select $1::int as n` with `n`, alone or (`with_pid`) with the backend's pid, which also
/// makes the statement one that gets a reset before the next request.
fn numbered(n: usize, with_pid: bool) -> Vec<u8> {
    let sql = if with_pid {
        "select $1::int as n, pg_backend_pid() as pid"
    } else {
        "select $1::int as n"
    };
    serde_json::to_vec(&serde_json::json!({ "query": sql, "params": [n] })).unwrap()
}

/// Checks an answer to [`numbered`]; returns the pid when asked for.
fn check_numbered(n: usize, (status, body): (u16, String)) -> Option<i64> {
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["rows"][0]["n"], n, "{body}");
    v["rows"][0]["pid"].as_i64()
}

#[test]
fn one_pooled_connection_serves_http_connections_on_every_session_thread() {
    let http = free_port();
    // Two session threads and a single backend connection: HTTP connections are dealt to the
    // threads in turn, and every request runs on that one connection, whichever thread opened
    // it or used it last.
    let listen = format!(
        "session_threads = 2\n{}",
        http_listener(http, "pool_max_per_key = 1\npool_acquire_timeout = \"30s\"")
    );
    let gw = Gateway::start_local(&["eps"], &listen, "", &[]);
    let conn = url("eps", LOCAL_PASSWORD);

    // Sequential requests, each on a new HTTP connection.
    let mut pids = std::collections::BTreeSet::new();
    for n in 0..20 {
        let answer = post_sql(http, &conn, &numbered(n, n % 2 == 0));
        pids.extend(check_numbered(n, answer));
    }
    assert_eq!(pids.len(), 1, "one backend connection served all: {pids:?}");

    // Concurrent: keep-alive connections and one-request connections at once, all queueing
    // for the same backend connection.
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let conn = conn.clone();
            std::thread::spawn(move || {
                let mut seen = std::collections::BTreeSet::new();
                let mut kept = (c % 2 == 0).then(|| KeepAlive::open(http));
                for i in 0..25 {
                    let n = c * 1000 + i;
                    let body = numbered(n, i % 3 == 0);
                    let answer = match kept.as_mut() {
                        Some(k) => k.post(&conn, &body),
                        None => post_sql(http, &conn, &body),
                    };
                    seen.extend(check_numbered(n, answer));
                }
                seen
            })
        })
        .collect();
    for c in clients {
        pids.extend(c.join().expect("client"));
    }
    assert_eq!(pids.len(), 1, "still one backend connection: {pids:?}");
    assert_eq!(gw.metric("pgwake_http_pool_connections"), 1.0);
    assert_eq!(gw.metric("pgwake_http_pool_idle_connections"), 1.0);
    assert_eq!(
        gw.metric("pgwake_http_requests_total{status=\"200\"}"),
        220.0
    );
}

#[test]
fn a_throttled_user_is_refused_over_http_even_with_a_recently_verified_password() {
    let http = free_port();
    // A throttled attempt waits out the wait when it fits in the login's deadline (issue 42,
    // F7); here the 1 s wait outlasts the 500 ms deadline, so the attempt is refused.
    let section = "\n[auth]\nthrottle_free_failures = 2\nthrottle_base = \"1s\"\n\
                   throttle_max = \"1s\"\n[limits]\nauth_timeout = \"500ms\"";
    let gw = Gateway::start_local(&["zeta"], &http_listener(http, section), "", &[]);
    let good = url("zeta", LOCAL_PASSWORD);
    // Verified once, then again from memory.
    for _ in 0..2 {
        let (status, body) = post_sql(http, &good, &query_body("select 1 as one"));
        assert_eq!(status, 200, "{body}");
    }
    let two_wrong_passwords = || {
        for _ in 0..2 {
            let (status, body) = post_sql(http, &url("zeta", "wrong"), &query_body("select 1"));
            assert_eq!(status, 400, "{body}");
            assert!(body.contains("28P01"), "{body}");
        }
    };
    two_wrong_passwords();
    // Blocked: the remembered password gets no way around it.
    let (status, body) = post_sql(http, &good, &query_body("select 1 as one"));
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("too many failed authentication attempts"),
        "{body}"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let (status, body) = post_sql(http, &good, &query_body("select 1 as one"));
    assert_eq!(status, 200, "{body}");
    // That success took the failures back: the free failures are there again.
    two_wrong_passwords();
    assert_eq!(
        gw.metric("pgwake_auth_attempts_total{outcome=\"throttled\"}"),
        1.0
    );
}

/// The rows of a `/sql` answer that must have succeeded.
fn rows_of((status, body): (u16, String)) -> serde_json::Value {
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()
}

#[test]
fn repeated_sql_runs_prepared_and_survives_deallocate_and_changed_tables() {
    let http = free_port();
    // One pooled connection, so every request meets the same cache; room for two statements.
    let section = "pool_max_per_key = 1\nstatement_cache = 2";
    let gw = Gateway::start_local(&["theta"], &http_listener(http, section), "", &[]);
    let conn = url("theta", LOCAL_PASSWORD);
    let mut http_conn = KeepAlive::open(http);
    let mut post = |sql: &str| rows_of(http_conn.post(&conn, &query_body(sql)));
    post("create table t (a int)");
    post("insert into t values (1)");
    for _ in 0..2 {
        assert_eq!(post("select * from t")["rows"][0]["a"], 1);
    }
    let prepared =
        post("select statement from pg_prepared_statements where name like 'pgwake_sql_%'");
    let texts: Vec<&str> = prepared["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["statement"].as_str())
        .collect();
    assert!(texts.contains(&"select * from t"), "{prepared}");

    // Another session changes the table: the cached plan's result type no longer holds, and the
    // request runs again parsed afresh instead of failing.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = common::local_session(&gw, "theta").await;
        client
            .batch_execute("alter table t add column b int default 7")
            .await
            .expect("alter");
    });
    post("select * from t");
    let changed = post("select * from t");
    assert_eq!(changed["rows"][0]["b"], 7, "{changed}");

    // A batch that deallocates everything before a cached statement still succeeds.
    let changed = post("select * from t");
    assert_eq!(changed["rows"][0]["b"], 7, "{changed}");
    let batch = serde_json::to_vec(&serde_json::json!({ "queries": [
        { "query": "deallocate all", "params": [] },
        { "query": "select * from t", "params": [] },
    ]}))
    .unwrap();
    let answer = rows_of(http_conn.post(&conn, &batch));
    assert_eq!(answer["results"][1]["rows"][0]["a"], 1, "{answer}");

    // More distinct queries than room: the least recently used are closed on the backend.
    let mut post = |sql: &str| rows_of(http_conn.post(&conn, &query_body(sql)));
    for round in 0..2 {
        for n in 1..=3 {
            let r = post(&format!("select {n} as x"));
            assert_eq!(r["rows"][0]["x"], n, "round {round}: {r}");
        }
    }
    let count = post(
        "select count(*)::int as n from pg_prepared_statements where name like 'pgwake_sql_%'",
    );
    assert_eq!(count["rows"][0]["n"], 2, "{count}");
    assert!(
        gw.log().lines().all(|l| !l.contains("ERROR")),
        "{}",
        gw.log()
    );
}
