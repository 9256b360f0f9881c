//! Hostile clients at the edge, round three: what a tenant's own database user can make the
//! gateway do outside its database (privilege boundaries), and what clients of the WebSocket
//! and admin listeners can make it hold.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::{
    Gateway, admin_status, connect_from, local_session, read_message, scram_login, startup_packet,
};
use pgwake_testkit::postgres_account;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A local tenant's clients log in as the `[local]` superuser, who can run programs as the
/// server account (`COPY … TO PROGRAM`). Links that account plants where the root gateway
/// writes (its run history and lock in `data_dir`, the server log in the tenant's folder) must
/// never make the gateway write a file only root may write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_superuser_cannot_steer_the_gateways_writes_with_links() {
    let Some((uid, _)) = postgres_account() else {
        eprintln!("skipped: the boundary exists only when the gateway runs as root");
        return;
    };
    let gw = tokio::task::spawn_blocking(|| {
        Gateway::start_local(&["f1"], "allow_plaintext = true\n", "", &[])
    })
    .await
    .unwrap();
    let victim = gw.dir.path().join("root-only");
    std::fs::write(&victim, "root only\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let data_dir = gw.dir.path().join("data");

    let client = local_session(&gw, "f1").await;
    // The account reaches its tenants' folders but may not write beside them.
    let meta = std::fs::metadata(&data_dir).unwrap();
    assert_ne!(meta.uid(), uid, "data_dir is the gateway's own");
    assert_eq!(meta.mode() & 0o022, 0, "nobody else may write in data_dir");
    let plants = [
        data_dir.join("pgwake-runs.json.tmp"),
        data_dir.join("pgwake-runs.json"),
        gw.local_dir("f1").join("postgres.log"),
    ];
    let mut planted = Vec::new();
    for link in &plants {
        let command = format!(
            "COPY (SELECT 1) TO PROGRAM 'ln -sfn {} {}'",
            victim.display(),
            link.display()
        );
        let done = client.batch_execute(&command).await;
        if let Err(e) = &done {
            eprintln!("{}: {e:?}", link.display());
        }
        planted.push(done.is_ok());
    }
    // Only the tenant's own folder is the account's to change.
    assert_eq!(
        planted,
        [false, false, true],
        "links the account could plant"
    );
    drop(client);
    gw.wait_idle();

    // A sleep and a new run: the gateway reopens the server log and rewrites the run history.
    let (status, body) = gw.http("POST", "/v1/tenants/f1/sleep").unwrap();
    assert_eq!(status, 200, "{body}");
    gw.wait_state("f1", "asleep", Duration::from_secs(30));
    let client = local_session(&gw, "f1").await;
    client.simple_query("select 1").await.unwrap();
    // The history is written within an idle check (1 s) of the run: the second run's start.
    let history = data_dir.join("pgwake-runs.json");
    let runs = || -> usize {
        let text = std::fs::read_to_string(&history).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&text)
            .map_or(0, |v| v["tenants"]["f1"].as_array().map_or(0, Vec::len))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runs() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no run history written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root only\n");
    let log = std::fs::symlink_metadata(gw.local_dir("f1").join("postgres.log")).unwrap();
    assert!(
        log.file_type().is_file(),
        "the planted log link was replaced"
    );
    assert!(gw.log().contains("replacing a link or foreign file"));
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

const MIB: u64 = 1024 * 1024;

/// Pings (masked, as a client sends them) with a 125-byte payload, `n` of them in a row.
fn pings(n: usize) -> Vec<u8> {
    let mask = [0x5a, 0xa5, 0x3c, 0xc3];
    let mut one = vec![0x89, 0x80 | 125];
    one.extend_from_slice(&mask);
    one.extend((0..125).map(|i| b'p' ^ mask[i % 4]));
    one.repeat(n)
}

/// A WebSocket on the HTTP listener `http` from a client that reads only the upgrade's answer,
/// with a small receive buffer so that what the gateway sends waits on the gateway's side.
async fn ws_that_never_reads(http: u16) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(([127, 0, 0, 1], http).into()).await.unwrap();
    let head = "GET / HTTP/1.1\r\nHost: edge\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "upgrade answered");
        answer.push(byte[0]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 101"), "{answer:?}");
    s
}

/// F2: tungstenite queued a pong for every ping of a client that never read them, without
/// bound: one logged-in client took the gateway to 1.8 GB in 40 s, and one that never logged
/// in piled up until its startup timeout. Now what waits for the client stays within
/// `http.websocket_write_buffer`, and a client that keeps pinging while it takes nothing for
/// `http.send_timeout` is closed (the startup timeout is far off here, so only that closes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_websocket_pongs_are_bounded_and_end_the_connection() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[limits]\nstartup_timeout = \"60s\"\n\
         [http]\nsend_timeout = \"1s\"\nwebsocket_write_buffer = \"64KiB\"\n"
    );
    let tenants = Gateway::local_tenants(&["edge"], "");
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    let before = rss(gw.pid());
    let mut s = ws_that_never_reads(http).await;
    // 40 MB of pings at once: unbounded, their pongs would take as much.
    let burst = pings(2_000);
    let mut most = before;
    let mut closed = false;
    for _ in 0..150 {
        let sent = tokio::time::timeout(Duration::from_secs(5), s.write_all(&burst)).await;
        most = most.max(rss(gw.pid()));
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                closed = true;
                break;
            }
            Err(_) => panic!("the gateway stopped reading pings without closing"),
        }
    }
    // Then a ping now and then, for as long as it stays open.
    let started = std::time::Instant::now();
    while !closed && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(rss(gw.pid()));
        closed = s.write_all(&pings(1)).await.is_err();
    }
    let grew = most.saturating_sub(before);
    eprintln!(
        "unread pongs: gateway grew {} KiB; closed: {closed} ({:?} after the burst)",
        grew / 1024,
        started.elapsed()
    );
    assert!(grew < 16 * MIB, "the gateway grew {} MiB", grew / MIB);
    assert!(
        closed,
        "a client pinging without reading was still connected"
    );
}

/// The admin Host check (informational finding of issue 42): `[::1]evil.example` passed as an
/// IPv6 literal, only the first of two Host headers was read, and an absolute URI's host was
/// never looked at. Now the request names one host, exactly one the listener answers to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_checks_every_host_a_request_names() {
    let extra = "allow_plaintext = true\n";
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], extra, "", &[]))
        .await
        .unwrap();
    let admin = gw.admin;
    let get = "GET /v1/tenants HTTP/1.1";
    for (line, headers) in [
        (get, "Host: [::1]evil.example\r\n"),
        (get, "Host: [::1]:9090evil.example\r\n"),
        (get, "Host: localhost:evil\r\n"),
        (get, "Host: localhost\r\nHost: evil.example\r\n"),
        (
            "GET http://evil.example/v1/tenants HTTP/1.1",
            "Host: localhost\r\n",
        ),
    ] {
        assert_eq!(
            admin_status(admin, line, headers).await,
            421,
            "{line} {headers:?}"
        );
    }
    for (line, headers) in [
        (get, "Host: [::1]\r\n"),
        (get, "Host: [::1]:9090\r\n"),
        (get, "Host: localhost:9090\r\n"),
        (
            "GET http://localhost/v1/tenants HTTP/1.1",
            "Host: localhost\r\n",
        ),
    ] {
        assert_eq!(
            admin_status(admin, line, headers).await,
            200,
            "{line} {headers:?}"
        );
    }
}

/// Reads until the gateway closes the connection (or resets it).
async fn until_closed(mut s: TcpStream) {
    let mut buf = [0u8; 512];
    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Whether the Postgres listener answers a startup message within 10 s (the password
/// request the gateway sends for any tenant, known or not).
async fn postgres_answers(port: u16) -> bool {
    let answer = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let startup = startup_packet(&[("user", "x"), ("database", "nobody.postgres")], 196_608);
        s.write_all(&startup).await.ok()?;
        read_message(&mut s).await
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), answer).await;
    matches!(answer, Ok(Some(_)))
}

/// F3: the admin listener had no connection cap and no deadlines: under a file limit of
/// 1,024, 1,100 idle admin connections failed every Postgres login, and slowloris connections
/// stayed open. Now it holds at most `admin.max_connections` (counted beside the client caps
/// when they are fitted to the file limit; the one waiting longest makes room), a request head
/// must be complete within `admin.header_timeout`, and a connection waits at most
/// `admin.idle_timeout` between requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_connections_are_capped_and_have_deadlines() {
    let extra = "allow_plaintext = true\n[admin]\nmax_connections = 16\n\
                 header_timeout = \"1s\"\nidle_timeout = \"2s\"\n";
    let tenants = Gateway::local_tenants(&["edge"], "");
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::launch_under(&["prlimit", "--nofile=256"], extra, &tenants, &[])
    })
    .await
    .unwrap();
    let (admin, port) = (gw.admin, gw.port);

    // More idle connections than the gateway has descriptors.
    let mut idle = Vec::new();
    for _ in 0..300 {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", admin)).await {
            idle.push(s);
        }
    }
    let gw = std::sync::Arc::new(gw);
    let health = {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || gw.http_get("/healthz").map(|(s, _)| s))
            .await
            .unwrap()
    };
    let postgres = postgres_answers(port).await;
    eprintln!("with 300 idle admin connections: /healthz {health:?}, postgres answers: {postgres}");
    assert_eq!(health, Some(200));
    assert!(postgres, "the Postgres listener did not answer");
    let closing = futures_util::future::join_all(idle.into_iter().map(until_closed));
    tokio::time::timeout(Duration::from_secs(10), closing)
        .await
        .expect("idle admin connections were left open");

    // A request head trickled a byte every 100 ms is closed by its deadline.
    let trickle = async {
        let mut s = TcpStream::connect(("127.0.0.1", admin)).await.unwrap();
        let head = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Filler: ";
        for byte in head.iter().chain(std::iter::repeat(&b'a')) {
            if s.write_all(std::slice::from_ref(byte)).await.is_err() {
                return;
            }
            let mut buf = [0u8; 512];
            let read = tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                return;
            }
        }
    };
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), trickle)
        .await
        .expect("a trickled admin request head was still open after 10 s");
    let trickled = started.elapsed();

    // A kept-alive connection is closed once idle past its deadline, not before.
    let mut kept = TcpStream::connect(("127.0.0.1", admin)).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 512];
    assert!(kept.read(&mut answer).await.unwrap() > 0, "an answer");
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), until_closed(kept))
        .await
        .expect("an idle kept-alive admin connection was still open after 10 s");
    let idled = started.elapsed();
    eprintln!("trickled head closed after {trickled:?}, idle connection after {idled:?}");
    assert!(trickled < Duration::from_secs(3), "{trickled:?}");
    assert!(
        idled >= Duration::from_millis(1500) && idled < Duration::from_secs(4),
        "{idled:?}"
    );
}

/// F4: `limits.idle_in_transaction_timeout` is the gateway's promise to a capped tenant, so a
/// client that switches off Postgres's own timeout for its session (`SET`, `SET LOCAL`,
/// `set_config`) is still ended, with the FATAL `25P03` Postgres would send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_lift_the_idle_in_transaction_limit() {
    let pg = tokio::task::spawn_blocking(common::backend).await.unwrap();
    let extra = "allow_plaintext = true\n[limits]\nidle_in_transaction_timeout = \"1s\"\n";
    let gw = Gateway::start(&pg, extra, &[]);
    let conninfo = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=alpha.postgres sslmode=disable",
        gw.port, pg.options.user, pg.options.password
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    let ended = tokio::spawn(conn);
    client
        .batch_execute(
            "SET idle_in_transaction_session_timeout = 0; BEGIN; \
             SELECT set_config('idle_in_transaction_session_timeout', '0', true)",
        )
        .await
        .unwrap();
    // Busy inside the transaction for longer than the limit: not idle, not ended.
    client.batch_execute("SELECT pg_sleep(1.5)").await.unwrap();
    let started = std::time::Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), ended)
        .await
        .expect("the gateway ends the session idle in its transaction")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    let err = end.expect_err("ended with an error");
    assert_eq!(err.code().map(|c| c.code()), Some("25P03"), "{err}");
    assert!(client.is_closed());
    // The same without a transaction open: an idle session is left alone.
    let (client, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    let ended = tokio::spawn(conn);
    client.batch_execute("SELECT 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!ended.is_finished());
    client.batch_execute("SELECT 1").await.unwrap();
}

/// F6: spilled `/sql` responses shared `http.max_spill_total` first come, first served, so one
/// tenant's clients that stopped reading held all of it and every other tenant's large answer
/// got 507. Now each tenant may hold `http.max_spill_per_tenant` of it: past that share its
/// own responses get 507, and another tenant still has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_take_all_the_spill_room() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n\
         [http]\nresponse_memory = \"64KiB\"\nmax_spill_total = \"24MiB\"\n\
         max_spill_per_tenant = \"12MiB\"\n"
    );
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::start_local(&["edge", "other"], &extra, "", &[])
    })
    .await
    .unwrap();
    // About 8.5 MB of JSON each: spilled, and more than the sockets hold.
    let large = "select g, repeat('y', 90) from generate_series(1, 80000) g";
    let mut held = Vec::new();
    let (s, head) = common::sql_then_stop_reading(http, "edge", large).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    held.push(s);
    // The total would have room for a second, and did before; the tenant's share does not.
    for _ in 0..2 {
        let (s, head) = common::sql_then_stop_reading(http, "edge", large).await;
        assert!(head.starts_with("HTTP/1.1 507"), "{head}");
        assert!(head.contains("http.max_spill_per_tenant"), "{head}");
        held.push(s);
    }
    // Another tenant keeps its room while the first one's readers stall.
    let (s, head) = common::sql_then_stop_reading(http, "other", large).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    held.push(s);
    drop(held);
    drop(gw);
}

/// The whole answer (status line, headers, body) to a wrong `/sql` password for `pgwake` on
/// `tenant` from `source`.
async fn wrong_sql_answer(source: &str, http: u16, tenant: &str) -> String {
    let body = br#"{"query":"select 1","params":[]}"#;
    let mut s = connect_from(source, http).await;
    let head = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n\
         Neon-Connection-String: postgresql://pgwake:wrong@{tenant}.{}:5432/postgres\r\n\
         Content-Length: {}\r\n\r\n",
        common::SNI_SUFFIX,
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

/// The SQLSTATE a wrong `/sql` password for `pgwake` on `tenant` from `source` is answered with.
async fn wrong_sql_password(source: &str, http: u16, tenant: &str) -> String {
    let text = wrong_sql_answer(source, http, tenant).await;
    ["28P01", "28000"]
        .into_iter()
        .find(|code| text.contains(code))
        .unwrap_or("other")
        .to_owned()
}

/// Plaintext local tenant `edge`, an HTTP listener, and `[auth]` settings `auth`.
async fn throttle_gateway(auth: &str) -> (Gateway, u16) {
    let http = pgwake_testkit::free_port();
    let extra = format!("allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[auth]\n{auth}\n");
    let tenants = Gateway::local_tenants(&["edge"], "");
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    (gw, http)
}

/// F7: a client with a stale password used to lock every login from its address out (the
/// right password refused with 28000 while the wait lasted). Now attempts from the throttled
/// address wait their turn, one per wait, within the login's deadline: the stale client's
/// guesses are still evaluated only one per doubling wait, and the right password gets in late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_password_on_the_address_delays_the_right_one_but_never_refuses_it() {
    let (gw, _) = throttle_gateway(
        "throttle_free_failures = 3\nthrottle_base = \"1s\"\nthrottle_max = \"8s\"",
    )
    .await;
    let (port, me) = (gw.port, "127.0.0.41");
    for _ in 0..3 {
        assert_eq!(
            scram_login(me, port, "edge", "pgwake", "wrong").await,
            "28P01"
        );
    }
    let started = std::time::Instant::now();
    let (stale, honest, again) = tokio::join!(
        scram_login(me, port, "edge", "pgwake", "wrong"),
        scram_login(me, port, "edge", "pgwake", common::LOCAL_PASSWORD),
        scram_login(me, port, "edge", "pgwake", common::LOCAL_PASSWORD),
    );
    let took = started.elapsed();
    eprintln!("stale {stale:?}, right {honest:?} and {again:?} after {took:?}");
    assert_eq!(
        (honest.as_str(), again.as_str()),
        ("", ""),
        "the right password gets in"
    );
    assert_eq!(stale, "28P01", "the stale password is evaluated, late");
    // None went before the wait the three failures set.
    assert!(took >= Duration::from_millis(900), "{took:?}");
}

/// F5: every made-up tenant name used to start a fresh (address, tenant) count, so wrong
/// `/sql` passwords across names were all hashed. The source's failures across tenants are
/// counted too: past `throttle_source_free_failures` its guesses wait like any others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_tenant_names_do_not_buy_fresh_guesses() {
    let (gw, http) = throttle_gateway(
        "throttle_free_failures = 3\nthrottle_base = \"30s\"\nthrottle_source_free_failures = 5",
    )
    .await;
    let mut answers = Vec::new();
    for i in 0..12 {
        answers.push(wrong_sql_password("127.0.0.42", http, &format!("nosuch{i}")).await);
    }
    eprintln!("{answers:?}");
    assert_eq!(
        answers[..5],
        ["28P01"; 5],
        "the free failures are evaluated"
    );
    assert_eq!(
        answers[5..],
        ["28000"; 7],
        "then the source waits, on any tenant"
    );
    drop(gw);
}

/// F9: with a small `throttle_capacity`, made-up tenant names used to flush an attacker's
/// blocked (address, tenant) record out of the cache and so reset its backoff. The source's
/// own count is keyed by the source alone: names sprayed from it cannot evict it, and once it
/// blocks, the spray adds no entries to evict the others with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_tenant_names_cannot_flush_a_backoff() {
    let (gw, http) = throttle_gateway(
        "throttle_free_failures = 3\nthrottle_base = \"30s\"\nthrottle_capacity = 20",
    )
    .await;
    let (port, me) = (gw.port, "127.0.0.43");
    for _ in 0..3 {
        assert_eq!(
            scram_login(me, port, "edge", "pgwake", "wrong").await,
            "28P01"
        );
    }
    assert_eq!(
        scram_login(me, port, "edge", "pgwake", "wrong").await,
        "28000"
    );
    for i in 0..300 {
        wrong_sql_password(me, http, &format!("flush{i}")).await;
    }
    assert_eq!(
        scram_login(me, port, "edge", "pgwake", "wrong").await,
        "28000",
        "the backoff survived the spray"
    );
}

/// The answer to a WebSocket login (startup, wrong cleartext password and a query pipelined,
/// as the serverless driver sends them) as `pgwake` on `tenant` from `source`: its
/// ErrorResponse.
async fn wrong_websocket_password(source: &str, http: u16, tenant: &str) -> Vec<u8> {
    use futures_util::SinkExt;
    let tcp = connect_from(source, http).await;
    let url = format!(
        "ws://localhost:{http}/v2?address={tenant}.{}:5432",
        common::SNI_SUFFIX
    );
    let (mut ws, _) = tokio_tungstenite::client_async(url, tcp)
        .await
        .expect("websocket handshake");
    let login = common::pipelined_login("pgwake", "wrong", "select 1");
    let login = tokio_tungstenite::tungstenite::Message::Binary(login.into());
    ws.send(login).await.unwrap();
    let got = common::read_until(&mut ws, |m| m.iter().any(|(t, _)| *t == b'E')).await;
    let (_, body) = got.into_iter().find(|(t, _)| *t == b'E').expect("an error");
    body
}

/// One wrong password for `pgwake` on `tenant` from `source` over `listener`: the answer as
/// the client reads it, without what differs from one second to the next (the `date` header,
/// the seconds of "retry in N s").
async fn wrong_password(
    gw: &Gateway,
    http: u16,
    listener: &str,
    (tenant, source): (&str, &str),
) -> String {
    let answer = match listener {
        "sql" => wrong_sql_answer(source, http, tenant).await,
        "websocket" => {
            let body = wrong_websocket_password(source, http, tenant).await;
            String::from_utf8_lossy(&body).into_owned()
        }
        _ => scram_login(source, gw.port, tenant, "pgwake", "wrong").await,
    };
    let answer = answer
        .split("\r\n")
        .filter(|line| !line.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\r\n");
    match answer.split_once("retry in ") {
        Some((head, tail)) => {
            let seconds = tail.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{head}retry in N{seconds}")
        }
        None => answer,
    }
}

/// F8: `/sql` was found to answer a wrong password later when the tenant does not exist, so
/// probing could tell which tenants exist. On every listener a tenant that does not exist gets
/// what an existing one gets for the same wrong password: the same answers, throttled at the
/// same attempt, and the same work: one key derivation per evaluated cleartext password
/// (`/sql`, WebSocket; checked against a stand-in verifier when there is no tenant), none for
/// an attempt refused by the throttle, none for SCRAM (its proof check is the same arithmetic
/// against a stand-in). The work is counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_tenant_costs_and_answers_what_a_known_one_does() {
    let (gw, http) = throttle_gateway("throttle_free_failures = 3\nthrottle_base = \"30s\"").await;
    let listeners = [
        ("sql", ["127.0.0.81", "127.0.0.82"]),
        ("websocket", ["127.0.0.83", "127.0.0.84"]),
        ("tcp", ["127.0.0.85", "127.0.0.86"]),
    ];
    let mut report = Vec::new();
    for (listener, sources) in listeners {
        let mut seen = Vec::new();
        for who in ["edge", "nosuch"].into_iter().zip(sources) {
            let before = gw.metric("pgwake_password_hashes_total");
            let mut answers = Vec::new();
            for _ in 0..5 {
                answers.push(wrong_password(&gw, http, listener, who).await);
            }
            let work = gw.metric("pgwake_password_hashes_total") - before;
            let evaluated = answers.iter().filter(|a| a.contains("28P01")).count();
            report.push(format!(
                "{listener}, tenant {}: {evaluated} of 5 evaluated, {work} key derivations",
                who.0
            ));
            seen.push((answers, evaluated, work));
        }
        let said = report.join("\n");
        assert_eq!(
            seen[0], seen[1],
            "{listener}: known and unknown differ\n{said}"
        );
        let (answers, evaluated, work) = &seen[0];
        assert!(*evaluated >= 1 && *evaluated < 5, "{answers:?}\n{said}");
        let cleartext = listener != "tcp";
        let expected = if cleartext { *evaluated as f64 } else { 0.0 };
        assert_eq!(*work, expected, "{said}");
    }
    eprintln!("{}", report.join("\n"));
    assert_eq!(gw.tenant_state("edge").0, "asleep", "no answer woke it");
}

/// A run history of `unconfigured` made-up tenants plus one old run of `h`, written to `path`.
fn history_file(path: &std::path::Path, unconfigured: usize) {
    let mut tenants = serde_json::Map::new();
    for i in 0..unconfigured {
        tenants.insert(
            format!("u{i}"),
            serde_json::json!([1795800000u64, 1795803600u64]),
        );
    }
    tenants.insert("h".into(), serde_json::json!([1795800000u64]));
    let text = serde_json::json!({ "tenants": tenants }).to_string();
    std::fs::write(path, text).unwrap();
}

/// The tenants and runs a history file holds once it holds a run of `h` newer than the seeded
/// one (the gateway writes it within a second of a run's start).
async fn rewritten(path: &std::path::Path) -> (Vec<String>, usize, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let h = v["tenants"]["h"].as_array().cloned().unwrap_or_default();
        if h.iter().any(|t| t.as_u64() > Some(1795803600)) {
            let names = v["tenants"].as_object().unwrap().keys().cloned().collect();
            return (names, h.len(), text.len() as u64);
        }
        assert!(std::time::Instant::now() < deadline, "no new run written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn history_gateway(path: &std::path::Path) -> Gateway {
    let extra = format!(
        "allow_plaintext = true\n[wake]\npredict_history_file = \"{}\"\n",
        path.display()
    );
    tokio::task::spawn_blocking(move || Gateway::start_local(&["h"], &extra, "", &[]))
        .await
        .unwrap()
}

/// F10: the history file holds configured tenants only and stays under
/// `wake.predict_history_max_size`, however large the file the gateway finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_history_keeps_configured_tenants_only_and_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    // Under the size cap: the made-up tenants are not loaded, so not written back; h's run is.
    let small = dir.path().join("small.json");
    history_file(&small, 5_000);
    let gw = history_gateway(&small).await;
    let client = local_session(&gw, "h").await;
    let (names, runs, size) = rewritten(&small).await;
    println!("small file rewritten: {names:?}, {runs} runs of h, {size} bytes");
    assert_eq!(names, ["h"]);
    assert_eq!(runs, 2, "the old run was loaded and kept");
    drop((client, gw));

    // Over the cap (about 8 MB): not loaded at all, and what is written is h's new run alone.
    let big = dir.path().join("big.json");
    history_file(&big, 200_000);
    let gw = history_gateway(&big).await;
    let client = local_session(&gw, "h").await;
    let (names, runs, size) = rewritten(&big).await;
    println!("big file rewritten: {names:?}, {runs} runs of h, {size} bytes");
    assert_eq!(names, ["h"]);
    assert_eq!(runs, 1, "nothing of the oversized file was loaded");
    assert!(size < 1024);
    assert!(
        gw.log().contains("predict_history_max_size"),
        "the refusal names its setting"
    );
    drop(client);
}

/// F10: a history file that cannot be written is warned about once, not every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_run_history_is_warned_about_once() {
    let dir = tempfile::tempdir().unwrap();
    // A folder where the file should be: every write fails, whoever the gateway runs as.
    let path = dir.path().join("runs.json");
    std::fs::create_dir(&path).unwrap();
    let gw = history_gateway(&path).await;
    for _ in 0..3 {
        let client = local_session(&gw, "h").await;
        client.simple_query("select 1").await.unwrap();
        drop(client);
        gw.wait_idle();
        let (status, body) = gw.http("POST", "/v1/tenants/h/sleep").unwrap();
        assert_eq!(status, 200, "{body}");
        gw.wait_state("h", "asleep", Duration::from_secs(30));
    }
    // Every run start leaves the history to write; the writer retries each second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let warned = gw.log().matches("cannot write the run histories").count();
    println!("warnings about the history file: {warned}");
    assert_eq!(warned, 1);
}
