//! Hostile clients at the edge: logins that stall mid-SCRAM are ended by `limits.auth_timeout`
//! and cannot crowd out real clients, even with the file limit far below their number; the
//! connection caps answer FATAL 53300.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, read_message, sqlstate, startup_packet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A plaintext StartupMessage for `user` on `database`.
fn startup(user: &str, database: &str) -> Vec<u8> {
    startup_packet(&[("user", user), ("database", database)], 196_608)
}

/// A gateway with plaintext tenant `edge` and a plaintext HTTP listener, plus `more` TOML under
/// its `[listen]` section and `env`; returns it with the HTTP port.
async fn with_http(more: &str, env: &'static [(&'static str, &'static str)]) -> (Gateway, u16) {
    let http = pgwake_testkit::free_port();
    let extra = format!("allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n{more}");
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], &extra, "", env))
        .await
        .unwrap();
    (gw, http)
}

/// A client that sends its startup message, reads the gateway's AuthenticationSASL and then
/// says nothing more; `None` when the gateway closed it before that.
async fn stall_mid_scram(port: u16, tenant: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(&startup("pgwake", &format!("{tenant}.postgres")))
        .await
        .ok()?;
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.ok()?;
    // 'R', length, then 10: AuthenticationSASL.
    (head[0] == b'R' && head[5..9] == 10u32.to_be_bytes()).then_some(s)
}

/// Reads until the gateway closes the connection; returns when that was.
async fn closed(mut s: TcpStream) -> Instant {
    let mut buf = [0u8; 512];
    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    Instant::now()
}

/// psql logs in and runs `select 1`; returns how long it took.
fn psql_login(gw: &Gateway, tenant: &str) -> Duration {
    let started = Instant::now();
    let out = Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-w", "-c", "select 1"])
        .arg(format!(
            "host=127.0.0.1 port={} user=pgwake dbname={tenant}.postgres sslmode=disable \
             connect_timeout=10",
            gw.port
        ))
        .env("PGPASSWORD", LOCAL_PASSWORD)
        .output()
        .expect("run psql");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "1",
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed()
}

/// Runs psql logins one after another for `period`; returns the slowest.
async fn logins_during(gw: &std::sync::Arc<Gateway>, period: Duration) -> Duration {
    let gw = gw.clone();
    tokio::task::spawn_blocking(move || {
        let until = Instant::now() + period;
        let mut slowest = Duration::ZERO;
        while Instant::now() < until {
            slowest = slowest.max(psql_login(&gw, "edge"));
            std::thread::sleep(Duration::from_millis(100));
        }
        slowest
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_logins_end_at_the_auth_timeout_while_psql_logs_in() {
    let extra = "allow_plaintext = true\n[limits]\nauth_timeout = \"3s\"\n";
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], extra, "", &[]))
        .await
        .unwrap();
    let gw = std::sync::Arc::new(gw);
    // Wake the tenant first: what follows measures logins, not the wake.
    psql_login(&gw, "edge");

    let port = gw.port;
    let stalls: Vec<_> = (0..500)
        .map(|_| tokio::spawn(async move { stall_mid_scram(port, "edge").await }))
        .collect();
    let mut stalled = Vec::new();
    for s in stalls {
        stalled.push(
            s.await
                .unwrap()
                .expect("every stalled client got AuthenticationSASL"),
        );
    }
    let stalled_at = Instant::now();
    let waits: Vec<_> = stalled
        .into_iter()
        .map(|s| tokio::spawn(closed(s)))
        .collect();

    let slowest = logins_during(&gw, Duration::from_secs(3)).await;
    eprintln!("slowest psql login during the stall: {slowest:?}");
    assert!(slowest < Duration::from_secs(2), "psql took {slowest:?}");

    let mut last = stalled_at;
    for w in waits {
        last = last.max(w.await.unwrap());
    }
    let held = last - stalled_at;
    eprintln!("all 500 stalled logins closed {held:?} after the last one stalled");
    assert!(
        held <= Duration::from_secs(3) + Duration::from_secs(2),
        "{held:?}"
    );
    assert!(
        gw.labelled_metric("pgwake_errors_total", &[("kind", "auth_timeout")]) >= 500.0,
        "{}",
        gw.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_stalled_logins_under_a_low_file_limit_crowd_out_nobody() {
    let extra = "allow_plaintext = true\n[limits]\nauth_timeout = \"5s\"\n";
    let tenants = Gateway::local_tenants(&["edge"], "");
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::launch_under(&["prlimit", "--nofile=256"], extra, &tenants, &[])
    })
    .await
    .unwrap();
    let gw = std::sync::Arc::new(gw);
    psql_login(&gw, "edge");
    let lines_before = gw.log().lines().count();

    let port = gw.port;
    let attack: Vec<_> = (0..1000)
        .map(|_| tokio::spawn(async move { stall_mid_scram(port, "edge").await }))
        .collect();
    // Every one of them has connected and stalled, or been ended to make room, before psql
    // comes: they are there, holding what the gateway let them hold.
    let mut stalled = Vec::new();
    for a in attack {
        if let Some(s) = a.await.unwrap() {
            stalled.push(s);
        }
    }
    let slowest = logins_during(&gw, Duration::from_secs(3)).await;
    let health = {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || {
            (
                gw.http_get("/healthz").map(|(s, _)| s),
                gw.http_get("/readyz").map(|(s, _)| s),
            )
        })
        .await
        .unwrap()
    };
    eprintln!(
        "{} of 1000 stalled logins got as far as AuthenticationSASL; slowest psql login {slowest:?}",
        stalled.len()
    );
    drop(stalled);
    assert!(slowest < Duration::from_secs(3), "psql took {slowest:?}");
    assert_eq!(health, (Some(200), Some(200)));
    let log = gw.log();
    let lines = log.lines().count() - lines_before;
    let accept_warnings = log.matches("accept failed").count();
    eprintln!("{lines} log lines for 1000 connections, {accept_warnings} accept failures logged");
    assert!(
        accept_warnings <= 2,
        "{accept_warnings} accept failure lines"
    );
    assert!(lines < 10_000, "{lines} log lines");
    assert!(
        log.contains("caps lowered"),
        "the gateway says it fitted its caps to the file limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_caps_answer_53300() {
    let extra = "allow_plaintext = true\n[limits]\nmax_client_connections = 3\n";
    let tenants = format!(
        "{}max_client_connections = 1\n",
        Gateway::local_tenants(&["edge"], "")
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(extra, &tenants, &[]))
        .await
        .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=edge.postgres \
         sslmode=disable connect_timeout=30",
        gw.port
    );
    let (first, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    first.simple_query("select 1").await.unwrap();
    // The tenant's cap of one is taken.
    let err = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .err()
        .expect("refused");
    assert_eq!(
        err.as_db_error().map(|e| e.code().code()),
        Some("53300"),
        "{err}"
    );
    // The gateway's cap of three: two more sockets held open, the next login is refused.
    let _a = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let _b = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .err()
        .expect("refused");
    let db = err.as_db_error().expect("an ErrorResponse");
    assert_eq!(db.code().code(), "53300");
    assert_eq!(db.message(), "sorry, too many clients already");
    assert!(gw.labelled_metric("pgwake_errors_total", &[("kind", "gateway_full")]) >= 1.0);
    assert!(gw.labelled_metric("pgwake_errors_total", &[("kind", "tenant_full")]) >= 1.0);
}

/// A SCRAM login stopped after the server-first message, ready to send a proof.
struct AwaitingProof {
    stream: TcpStream,
    challenge: pgwake_protocol::scram::ScramChallenge,
}

/// Logs in up to the server-first message, or returns the SQLSTATE of an early refusal.
async fn up_to_server_first(port: u16, tenant: &str, user: &str) -> Result<AwaitingProof, String> {
    use pgwake_protocol::scram::{Nonce, ScramClient};
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&startup(user, &format!("{tenant}.postgres")))
        .await
        .unwrap();
    match read_message(&mut s)
        .await
        .expect("an answer to the startup")
    {
        (b'R', _) => {}
        (b'E', body) => return Err(sqlstate(&body)),
        (tag, _) => panic!("unexpected message {:?}", tag as char),
    }
    let client = ScramClient::new(Nonce::from_random(rand::random()));
    s.write_all(&pgwake_protocol::auth::sasl_initial_response(
        "SCRAM-SHA-256",
        &client.client_first(),
    ))
    .await
    .unwrap();
    let (tag, body) = read_message(&mut s).await.expect("SASLContinue");
    assert_eq!((tag, &body[..4]), (b'R', &11u32.to_be_bytes()[..]));
    let challenge = client.handle_server_first(&body[4..]).unwrap();
    Ok(AwaitingProof {
        stream: s,
        challenge,
    })
}

/// A whole SCRAM login: "" on success, else the SQLSTATE of the refusal.
async fn attempt(port: u16, tenant: &str, user: &str, password: &str) -> String {
    match up_to_server_first(port, tenant, user).await {
        Ok(w) => w.prove(password).await,
        Err(code) => code,
    }
}

impl AwaitingProof {
    /// Sends the proof of `password`; returns the SQLSTATE of the refusal, or "" on success.
    async fn prove(mut self, password: &str) -> String {
        use pgwake_protocol::scram::ScramKeys;
        let keys =
            ScramKeys::from_password(password, self.challenge.salt(), self.challenge.iterations());
        let (_, client_final) = self.challenge.client_final(&keys).unwrap();
        self.stream
            .write_all(&pgwake_protocol::auth::sasl_response(&client_final))
            .await
            .unwrap();
        match read_message(&mut self.stream).await {
            Some((b'E', body)) => sqlstate(&body),
            Some(_) => String::new(),
            None => "closed".into(),
        }
    }
}

/// Plaintext local tenant `edge`, a throttle that allows three failures and then waits long.
const THROTTLED: &str =
    "allow_plaintext = true\n[auth]\nthrottle_free_failures = 3\nthrottle_base = \"30s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofs_sent_together_get_only_the_free_failures_evaluated() {
    let gw = tokio::task::spawn_blocking(|| Gateway::start_local(&["edge"], THROTTLED, "", &[]))
        .await
        .unwrap();
    let mut waiting = Vec::new();
    for _ in 0..60 {
        waiting.push(
            up_to_server_first(gw.port, "edge", "victim")
                .await
                .expect("not throttled before any proof"),
        );
    }
    let answers: Vec<_> = waiting
        .into_iter()
        .map(|w| tokio::spawn(w.prove("wrong")))
        .collect();
    let mut codes = Vec::new();
    for a in answers {
        codes.push(a.await.unwrap());
    }
    let evaluated = codes.iter().filter(|c| *c == "28P01").count();
    let throttled = codes.iter().filter(|c| *c == "28000").count();
    eprintln!("60 proofs at once: {evaluated} evaluated, {throttled} throttled");
    assert_eq!(evaluated, 3, "{codes:?}");
    assert_eq!(throttled, 57, "{codes:?}");
    assert_eq!(
        gw.labelled_metric("pgwake_auth_attempts_total", &[("outcome", "failed")]),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_logins_as_another_user_do_not_dilute_the_count() {
    let gw = tokio::task::spawn_blocking(|| Gateway::start_local(&["edge"], THROTTLED, "", &[]))
        .await
        .unwrap();
    let (mut evaluated, mut throttled) = (0, 0);
    let mut good = Vec::new();
    for _round in 0..4 {
        for _ in 0..3 {
            match attempt(gw.port, "edge", "victim", "guess").await.as_str() {
                "28P01" => evaluated += 1,
                "28000" => throttled += 1,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        good.push(attempt(gw.port, "edge", "pgwake", LOCAL_PASSWORD).await);
    }
    eprintln!("12 guesses: {evaluated} evaluated, {throttled} throttled; good logins: {good:?}");
    assert_eq!((evaluated, throttled), (3, 9));
    // The address is throttled for the tenant: the good logins after the guesses wait too.
    assert!(good.iter().all(|c| c == "28000"), "{good:?}");
}

/// psql's error output for a login to `tenant` with `password`.
fn psql_refusal(gw: &Gateway, tenant: &str, password: &str) -> String {
    let out = Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-w", "-c", "select 1"])
        .arg(format!(
            "host=127.0.0.1 port={} user=pgwake dbname={tenant}.postgres sslmode=disable",
            gw.port
        ))
        .env("PGPASSWORD", password)
        .output()
        .expect("run psql");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `POST /sql` of `select 1` as `user` on `tenant`: (status, body).
async fn post_sql(http: u16, user: &str, tenant: &str, password: &str) -> (u16, String) {
    post_query(http, user, tenant, password, "select 1").await
}

/// `POST /sql` of `sql` as `user` on `tenant`: (status, body).
async fn post_query(
    http: u16,
    user: &str,
    tenant: &str,
    password: &str,
    sql: &str,
) -> (u16, String) {
    let body = serde_json::to_vec(&serde_json::json!({ "query": sql, "params": [] })).unwrap();
    common::post_sql_body(http, (user, password, tenant), &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tenant_is_answered_as_a_wrong_password() {
    let (gw, http) = with_http("", &[]).await;
    let gw = std::sync::Arc::new(gw);
    let (wrong, unknown) = {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || {
            (
                psql_refusal(&gw, "edge", "wrong"),
                psql_refusal(&gw, "nosuch", "wrong"),
            )
        })
        .await
        .unwrap()
    };
    eprintln!("over TCP, both: {wrong}");
    assert!(wrong.contains("28P01") || wrong.contains("password authentication failed"));
    assert_eq!(
        wrong.replace("edge", "nosuch"),
        unknown,
        "TCP answers differ"
    );

    let wrong = post_sql(http, "pgwake", "edge", "wrong").await;
    let unknown = post_sql(http, "pgwake", "nosuch", "wrong").await;
    eprintln!("over HTTP, both: {wrong:?}");
    assert_eq!(wrong.0, 400);
    assert!(wrong.1.contains("28P01"), "{}", wrong.1);
    assert_eq!(wrong, unknown, "HTTP answers differ");
    // The sleeping tenant was never woken by either.
    assert_eq!(gw.tenant_state("edge").0, "asleep");
}

/// Client keys per (salt, iterations): a user's salt never changes, so the client's own key
/// derivation is done once and the timings show only the gateway's work.
type KeyCache = std::collections::HashMap<(Vec<u8>, u32), pgwake_protocol::scram::ScramKeys>;

/// One SCRAM login with a wrong password over TCP; returns its duration.
async fn timed_scram(port: u16, user: &str, keys: &mut KeyCache) -> Duration {
    let started = Instant::now();
    let w = up_to_server_first(port, "edge", user)
        .await
        .expect("not throttled");
    let salt = (w.challenge.salt().to_vec(), w.challenge.iterations());
    let mut pause = Duration::ZERO;
    if !keys.contains_key(&salt) {
        let t = Instant::now();
        let k = pgwake_protocol::scram::ScramKeys::from_password("wrong", &salt.0, salt.1);
        keys.insert(salt.clone(), k);
        pause = t.elapsed();
    }
    let AwaitingProof {
        mut stream,
        challenge,
    } = w;
    let (_, client_final) = challenge.client_final(&keys[&salt]).unwrap();
    stream
        .write_all(&pgwake_protocol::auth::sasl_response(&client_final))
        .await
        .unwrap();
    let (tag, body) = read_message(&mut stream).await.expect("an answer");
    assert_eq!((tag, sqlstate(&body).as_str()), (b'E', "28P01"));
    started.elapsed() - pause
}

/// A WebSocket login with a wrong cleartext password; returns its duration.
async fn timed_websocket(http: u16, user: &str) -> Duration {
    use futures_util::SinkExt;
    let started = Instant::now();
    let path = format!("/?address=edge.{}:5432", common::SNI_SUFFIX);
    let mut ws = common::open_ws(http, &path).await;
    let login = common::pipelined_login(user, "wrong", "select 1");
    ws.send(tokio_tungstenite::tungstenite::Message::Binary(
        login.into(),
    ))
    .await
    .unwrap();
    let got = common::read_until(&mut ws, |m| m.iter().any(|(t, _)| *t == b'E')).await;
    let (_, body) = got.iter().find(|(t, _)| *t == b'E').expect("an error");
    assert_eq!(sqlstate(body), "28P01");
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_and_unknown_users_take_the_same_time() {
    // Timing is the subject here, not the throttle (per source and tenant, or across tenants).
    let (gw, http) = with_http(
        "[auth]\nthrottle_free_failures = 1000000\nthrottle_source_free_failures = 1000000\n",
        &[],
    )
    .await;
    const TRIES: usize = 200;
    let mut keys = KeyCache::new();
    let mut report = Vec::new();
    for path in ["tcp", "http", "websocket"] {
        let (mut known, mut unknown) = (Vec::new(), Vec::new());
        // Interleaved, so that load on the machine falls on both alike; in the order known,
        // unknown, unknown, known, so that each kind lands on every session thread alike
        // (connections are dealt to the threads in turn).
        for i in 0..TRIES * 2 {
            let (user, into) = if i % 4 == 0 || i % 4 == 3 {
                ("pgwake", &mut known)
            } else {
                ("nobody", &mut unknown)
            };
            let took = match path {
                "tcp" => timed_scram(gw.port, user, &mut keys).await,
                "http" => {
                    let t = Instant::now();
                    let (_, body) = post_sql(http, user, "edge", "wrong").await;
                    assert!(body.contains("28P01"), "{body}");
                    t.elapsed()
                }
                _ => timed_websocket(http, user).await,
            };
            into.push(took);
        }
        let (k, u) = (median(known), median(unknown));
        let gap = (k.as_secs_f64() - u.as_secs_f64()).abs() / k.max(u).as_secs_f64();
        report.push(format!(
            "{path}: known {k:?}, unknown {u:?} (medians of {TRIES}), gap {:.1} %",
            gap * 100.0
        ));
        assert!(gap <= 0.20, "{}", report.join("\n"));
    }
    eprintln!("{}", report.join("\n"));
    // Nothing of this woke the tenant.
    assert_eq!(gw.tenant_state("edge").0, "asleep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_passwords_never_reach_the_log_even_at_trace() {
    let (gw, http) = with_http("", &[("PGWAKE_LOG", "trace")]).await;
    let path = format!("/?address=edge.{}:5432", common::SNI_SUFFIX);
    for (password, answer) in [("wrong-4711-secret", b'E'), (LOCAL_PASSWORD, b'Z')] {
        use futures_util::SinkExt;
        let mut ws = common::open_ws(http, &path).await;
        let login = common::pipelined_login("pgwake", password, "select 1");
        ws.send(tokio_tungstenite::tungstenite::Message::Binary(
            login.into(),
        ))
        .await
        .unwrap();
        let got = common::read_until(&mut ws, |m| m.iter().any(|(t, _)| *t == answer)).await;
        assert!(got.iter().any(|(t, _)| *t == answer), "{got:?}");
    }
    // The gateway logs the session's start right after the client has its ReadyForQuery.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gw.log().contains("DEBUG") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = gw.log();
    assert!(log.contains("DEBUG"), "verbose logging is on:\n{log}");
    for secret in ["wrong-4711-secret", LOCAL_PASSWORD] {
        assert!(!log.contains(secret), "a password in the log");
    }
}

/// A plaintext session logged in as pgwake on tenant `edge`, ready for queries.
async fn logged_in(port: u16) -> TcpStream {
    let w = up_to_server_first(port, "edge", "pgwake")
        .await
        .expect("not throttled");
    let keys = pgwake_protocol::scram::ScramKeys::from_password(
        LOCAL_PASSWORD,
        w.challenge.salt(),
        w.challenge.iterations(),
    );
    let AwaitingProof {
        mut stream,
        challenge,
    } = w;
    let (_, client_final) = challenge.client_final(&keys).unwrap();
    stream
        .write_all(&pgwake_protocol::auth::sasl_response(&client_final))
        .await
        .unwrap();
    loop {
        match read_message(&mut stream).await.expect("login answers") {
            (b'Z', _) => return stream,
            (b'E', body) => panic!("login refused: {}", String::from_utf8_lossy(&body)),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_after_login_get_08p01() {
    let gw = tokio::task::spawn_blocking(|| {
        Gateway::start_local(&["edge"], "allow_plaintext = true\n", "", &[])
    })
    .await
    .unwrap();
    for len in [0x7fff_ffffu32, 2] {
        let mut s = logged_in(gw.port).await;
        let mut bad = vec![b'Q'];
        bad.extend_from_slice(&len.to_be_bytes());
        s.write_all(&bad).await.unwrap();
        let (tag, body) = read_message(&mut s).await.expect("an ErrorResponse");
        assert_eq!(
            (tag, sqlstate(&body).as_str()),
            (b'E', "08P01"),
            "length {len}"
        );
        eprintln!("length {len:#x}: {}", String::from_utf8_lossy(&body));
        assert!(
            read_message(&mut s).await.is_none(),
            "then the connection closes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_text_frame_gets_a_close_frame_saying_why() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let (_gw, http) = with_http("", &[]).await;
    let path = format!("/?address=edge.{}:5432", common::SNI_SUFFIX);
    let mut ws = common::open_ws(http, &path).await;
    ws.send(Message::Text("select 1".into())).await.unwrap();
    let frame = loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame,
            Ok(Some(Ok(_))) => {}
            other => panic!("no close frame: {other:?}"),
        }
    };
    let frame = frame.expect("a close code");
    assert_eq!(frame.code, CloseCode::Unsupported);
    assert!(frame.reason.contains("binary frames"), "{}", frame.reason);
}

#[test]
fn psycopg_cancel_safe_over_tls_reports_success() {
    let gw = Gateway::start_local(&["edge"], "", "", &[]);
    let script = r#"
import sys, threading, time
import psycopg
assert psycopg.pq.version() >= 170000, f"libpq {psycopg.pq.version()} has no PQcancelBlocking"
conn = psycopg.connect(sys.argv[1])
def cancel_soon():
    time.sleep(1)
    conn.cancel_safe()
    print("cancel_safe returned", flush=True)
t = threading.Thread(target=cancel_soon)
t.start()
try:
    conn.execute("select pg_sleep(30)")
    print("not cancelled", flush=True)
except psycopg.errors.QueryCanceled:
    print("query cancelled", flush=True)
t.join()
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(format!(
            "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=edge.postgres \
             sslmode=require connect_timeout=30",
            gw.port
        ))
        .output()
        .expect("python3 with psycopg");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("cancel_safe returned"), "{stdout}{stderr}");
    assert!(stdout.contains("query cancelled"), "{stdout}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_answers_are_flushed_and_close_frames_answered() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (_gw, http) = with_http("", &[]).await;
    let path = format!("/v2?address=edge.{}:5432", common::SNI_SUFFIX);
    // An SSLRequest inside the tunnel is answered N at once, with nothing sent after it.
    let mut ws = common::open_ws(http, &path).await;
    let ssl_request = [0, 0, 0, 8, 4, 210, 22, 47];
    ws.send(Message::Binary(ssl_request.to_vec().into()))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(2), ws.next())
        .await
        .expect("the N arrives without more client bytes");
    match answer {
        Some(Ok(Message::Binary(b))) => assert_eq!(&b[..], b"N"),
        other => panic!("expected N, got {other:?}"),
    }
    // Then the session goes on, and the client's close frame gets a close frame back.
    let login = common::pipelined_login("pgwake", LOCAL_PASSWORD, "select 1");
    ws.send(Message::Binary(login.into())).await.unwrap();
    let got = common::read_until(&mut ws, |m| {
        m.iter().filter(|(t, _)| *t == b'Z').count() >= 2
    })
    .await;
    assert!(got.iter().any(|(t, _)| *t == b'D'), "{got:?}");
    ws.close(None).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("an answer to the close frame");
    assert!(
        matches!(reply, Some(Ok(Message::Close(_)))),
        "a close frame back, not a dropped connection: {reply:?}"
    );
}

/// A raw request to the admin listener: the status code.
fn admin_status(gw: &Gateway, head: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.admin)).unwrap();
    write!(s, "{head}Host: localhost\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The tenant `edge`'s state, read with an extra header line (the token).
fn tenant_state_with(gw: &Gateway, header: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.admin)).unwrap();
    write!(
        s,
        "GET /v1/tenants HTTP/1.0\r\nHost: localhost\r\n{header}\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let all: serde_json::Value = serde_json::from_str(body).unwrap();
    all[0]["state"].as_str().unwrap().to_owned()
}

#[test]
fn the_admin_api_refuses_web_pages_and_wants_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "s3cret-admin-token\n").unwrap();
    let extra = format!(
        "allow_plaintext = true\n[admin]\ntoken_file = \"{}\"\n",
        token.display()
    );
    let gw = Gateway::start_local(&["edge"], &extra, "", &[]);
    let auth = "Authorization: Bearer s3cret-admin-token\r\n";
    let json = "Content-Type: application/json\r\n";
    let post = "POST /v1/tenants/edge/wake HTTP/1.0\r\n";
    // A form or a fetch() from a web page: refused.
    assert_eq!(admin_status(&gw, &format!("{post}{auth}")), 415);
    assert_eq!(
        admin_status(&gw, &format!("{post}{auth}Content-Type: text/plain\r\n")),
        415
    );
    assert_eq!(
        admin_status(
            &gw,
            &format!("{post}{auth}{json}Origin: http://evil.example\r\n")
        ),
        403
    );
    // Without the token, or a wrong one.
    assert_eq!(admin_status(&gw, &format!("{post}{json}")), 401);
    assert_eq!(
        admin_status(&gw, &format!("{post}{json}Authorization: Bearer guess\r\n")),
        401
    );
    assert_eq!(admin_status(&gw, "GET /v1/tenants HTTP/1.0\r\n"), 401);
    assert_eq!(tenant_state_with(&gw, auth), "asleep", "nothing was woken");
    // The token and JSON: done. Probes and metrics need no token.
    assert_eq!(admin_status(&gw, &format!("{post}{json}{auth}")), 200);
    assert_eq!(tenant_state_with(&gw, auth), "awake");
    assert_eq!(admin_status(&gw, "GET /healthz HTTP/1.0\r\n"), 200);
    assert_eq!(admin_status(&gw, "GET /readyz HTTP/1.0\r\n"), 200);
    assert_eq!(admin_status(&gw, "GET /metrics HTTP/1.0\r\n"), 200);
}

#[test]
fn curl_over_http2_gets_early_answers_whole() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[http]\nmax_request_size = \"1MiB\"\n"
    );
    let gw = Gateway::start_local(&["edge"], &extra, "", &[]);
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b'a'; 3 << 20]).unwrap();
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
            ])
            .args([
                "--http2-prior-knowledge",
                "-H",
                "Content-Type: application/json",
            ])
            .args(args)
            .stdin(std::fs::File::open(&big).unwrap())
            .output()
            .expect("curl");
        let got = String::from_utf8_lossy(&out.stdout).into_owned();
        (got, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let sql = format!("http://127.0.0.1:{http}/sql");
    let upload = format!("@{}", big.display());
    // Declared length over the limit, then the same read from a pipe (no length declared).
    let (got, err) = curl(&["--data-binary", &upload, &sql]);
    assert_eq!(got, "413 2", "{err}");
    let (got, err) = curl(&["--data-binary", "@-", &sql]);
    assert_eq!(got, "413 2", "{err}");
    let (got, err) = curl(&["-d", "{}", &format!("http://127.0.0.1:{http}/elsewhere")]);
    assert_eq!(got, "404 2", "{err}");
    // The listener still serves.
    assert_eq!(gw.tenant_state("edge").0, "asleep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_wait_through_crash_recovery() {
    let gw = tokio::task::spawn_blocking(|| {
        Gateway::start_local(&["edge"], "allow_plaintext = true\n", "", &[])
    })
    .await
    .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=edge.postgres \
         sslmode=disable connect_timeout=30",
        gw.port
    );
    let (victim, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let pid: i32 = victim
        .query_one("select pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // New clients keep coming while a backend crashes and Postgres recovers.
    let until = Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let conninfo = conninfo.clone();
            tokio::spawn(async move {
                let mut logins = 0;
                while Instant::now() < until {
                    let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
                        .await
                        .map_err(|e| format!("login failed: {e:?}"))?;
                    tokio::spawn(conn);
                    logins += 1;
                    // A session open when the backend crashed ends, as it would without the
                    // gateway: Postgres says 57P02, or its process is gone before it can and the
                    // gateway says 08006. Only logins must not fail.
                    if let Err(e) = c.simple_query("select 1").await {
                        let code = e.code().map(|c| c.code().to_owned());
                        let crashed = matches!(code.as_deref(), Some("57P02" | "08006"));
                        if !crashed && !e.is_closed() {
                            return Err(format!("query failed: {e:?}"));
                        }
                    }
                }
                Ok::<_, String>(logins)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A backend killed: the postmaster ends every session and runs crash recovery.
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let mut logins = 0;
    for c in clients {
        logins += c.await.unwrap().expect("no client sees the recovery");
    }
    let held = gw
        .log()
        .matches("backend not ready; holding the client")
        .count();
    eprintln!("{logins} logins during the crash; {held} held while Postgres recovered");
    assert!(held > 0, "the crash recovery was not reached: {}", gw.log());
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib * 1024
}

/// The most of `pid`'s resident memory seen while `work` runs, sampled every 5 ms.
async fn peak_rss_during<T>(pid: u32, work: impl std::future::Future<Output = T>) -> (T, u64) {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = tokio::spawn({
        let done = done.clone();
        async move {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss(pid));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            peak.max(rss(pid))
        }
    });
    let out = work.await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (out, sampler.await.unwrap())
}

const MIB: u64 = 1024 * 1024;

/// Twenty `POST /sql` of `sql` on tenant `edge` at once: their (status, body).
async fn twenty_at_once(http: u16, sql: &'static str) -> Vec<(u16, String)> {
    let requests: Vec<_> = (0..20)
        .map(|_| tokio::spawn(post_query(http, "pgwake", "edge", LOCAL_PASSWORD, sql)))
        .collect();
    let mut answers = Vec::new();
    for r in requests {
        answers.push(r.await.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_sql_results_keep_the_gateway_within_a_fixed_memory_bound() {
    let (gw, http) = with_http("", &[]).await;
    let pid = gw.pid();
    let (status, _) = post_sql(http, "pgwake", "edge", LOCAL_PASSWORD).await;
    assert_eq!(status, 200);
    let baseline = rss(pid);

    // Twenty results of about 100 MB each, all over http.max_response_size (10 MiB).
    let huge = "select g, repeat('y', 90) from generate_series(1, 1000000) g";
    let (answers, peak) = peak_rss_during(pid, twenty_at_once(http, huge)).await;
    for (status, body) in &answers {
        assert_eq!(*status, 507, "{body}");
        assert!(body.contains("http.max_response_size"), "{body}");
    }
    println!(
        "20 oversized results: baseline {} MiB, peak {} MiB",
        baseline / MIB,
        peak / MIB
    );
    assert!(peak < 100 * MIB, "peak RSS {peak} bytes");

    // Twenty results of about 6.5 MB each, under the limit: spilled, then sent whole.
    let large = "select g, repeat('y', 90) from generate_series(1, 60000) g";
    let (answers, peak) = peak_rss_during(pid, twenty_at_once(http, large)).await;
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{}", &body[..body.len().min(300)]);
        let v: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert_eq!(v["rowCount"], 60000);
        let rows = v["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 60000);
        assert_eq!(rows[59999]["g"], 60000);
        assert_eq!(rows[0]["repeat"].as_str().map(str::len), Some(90));
    }
    println!("20 results of 6.5 MB: peak {} MiB", peak / MIB);
    assert!(peak < 100 * MIB, "peak RSS {peak} bytes");

    // What the requests took is given back.
    let settle = Instant::now() + Duration::from_secs(10);
    let mut now = rss(pid);
    while now > baseline + 16 * MIB && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = rss(pid);
    }
    println!("after: {} MiB", now / MIB);
    assert!(
        now <= baseline + 16 * MIB,
        "RSS {now} bytes after the requests, {baseline} before"
    );
}
