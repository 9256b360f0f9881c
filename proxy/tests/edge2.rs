//! Hostile clients at the edge, round two: what one client's failures, idle connections or
//! slow reads must never cost others. Every attack here is bounded in count and time and talks
//! to loopback only; clients that must look like different hosts bind their own loopback
//! addresses (127.0.0.0/8 all reach the gateway's 127.0.0.1).

mod common;

use std::time::Duration;

use common::{
    Gateway, LOCAL_PASSWORD, connect_from, read_message, scram_login, sqlstate, startup_packet,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `POST /sql` of `select 1` as `user` on `tenant` from `source`: (status, body).
async fn post_sql_from(
    source: &str,
    http: u16,
    tenant: &str,
    user: &str,
    password: &str,
) -> (u16, String) {
    let body = br#"{"query":"select 1","params":[]}"#;
    let mut s = connect_from(source, http).await;
    let head = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n\
         Neon-Connection-String: postgresql://{user}:{password}@{tenant}.{}:5432/postgres\r\n\
         Content-Length: {}\r\n\r\n",
        common::SNI_SUFFIX,
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}

/// Plaintext local tenant `edge` reachable from 127.0.0.8/29 only, an HTTP listener, and a
/// throttle that allows three failures and then waits long (so nothing here outlives a block).
async fn throttled_gateway() -> (Gateway, u16) {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n\
         [auth]\nthrottle_free_failures = 3\nthrottle_base = \"30s\"\n"
    );
    let mut tenants = Gateway::local_tenants(&["edge"], "");
    tenants.push_str("allow = [\"127.0.0.8/29\"]\n");
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    (gw, http)
}

/// Item 2: three wrong guesses from one source, over TCP or `/sql`, or from a source the
/// tenant's allow list refuses, used to lock the user out from every source. Now the guesser
/// alone waits, and the right password from anywhere that did not fail gets in every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_from_one_source_never_lock_the_user_out_of_another() {
    let (gw, http) = throttled_gateway().await;
    let port = gw.port;

    // Over TCP: 127.0.0.9 guesses until it is throttled; 127.0.0.10 logs in ten times, and
    // the guesser stays throttled in between.
    for _ in 0..3 {
        assert_eq!(
            scram_login("127.0.0.9", port, "edge", "pgwake", "wrong").await,
            "28P01"
        );
    }
    let mut good = Vec::new();
    for _ in 0..10 {
        good.push(scram_login("127.0.0.10", port, "edge", "pgwake", LOCAL_PASSWORD).await);
        let guess = scram_login("127.0.0.9", port, "edge", "pgwake", LOCAL_PASSWORD).await;
        assert_eq!(guess, "28000", "the guesser waits, right password or not");
    }
    eprintln!("TCP logins from a source that did not fail: {good:?}");
    assert!(good.iter().all(String::is_empty), "{good:?}");

    // Over /sql, with the account now under attack: a new guessing source (127.0.0.11) has
    // its first guess evaluated and is then throttled at once, while 127.0.0.12, which did
    // not fail, queries with the right password every time.
    let (status, body) = post_sql_from("127.0.0.11", http, "edge", "pgwake", "wrong").await;
    assert!(status == 400 && body.contains("28P01"), "{status} {body}");
    let (status, body) = post_sql_from("127.0.0.11", http, "edge", "pgwake", "wrong").await;
    assert!(
        body.contains("28000"),
        "the /sql guesser waits: {status} {body}"
    );
    for _ in 0..5 {
        let (status, body) =
            post_sql_from("127.0.0.12", http, "edge", "pgwake", LOCAL_PASSWORD).await;
        assert_eq!(status, 200, "{body}");
    }

    // A source the allow list refuses is answered as a wrong password; its failures count
    // against itself only.
    for _ in 0..4 {
        scram_login("127.0.0.30", port, "edge", "pgwake", "wrong").await;
        post_sql_from("127.0.0.30", http, "edge", "pgwake", "wrong").await;
    }
    for _ in 0..5 {
        assert_eq!(
            scram_login("127.0.0.13", port, "edge", "pgwake", LOCAL_PASSWORD).await,
            ""
        );
        let (status, body) =
            post_sql_from("127.0.0.14", http, "edge", "pgwake", LOCAL_PASSWORD).await;
        assert_eq!(status, 200, "{body}");
    }
}

/// Item 3: sessions parked while their tenant sleeps used to keep their places under the
/// tenant's `max_backend_connections`, so with two parked the next client waited
/// `backend_wait_timeout` for a slot no one would give up (FATAL 53300), and a parked session
/// could not come back. A closed backend connection gives up its place at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_parked_by_sleep_hold_no_backend_slots() {
    let config = "allow_plaintext = true
[wake]
idle_timeout = \"1s\"
idle_check_interval = \"100ms\"
[revival]
snapshot_after = \"200ms\"
[limits]
backend_wait_timeout = \"2s\"
";
    let tenants = format!(
        "{}max_backend_connections = 2\n",
        Gateway::local_tenants(&["capped"], "")
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(config, &tenants, &[]))
        .await
        .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=capped.postgres \
         sslmode=disable connect_timeout=30",
        gw.port
    );
    let a = common::connect_plain(&conninfo).await;
    let b = common::connect_plain(&conninfo).await;
    for c in [&a, &b] {
        c.batch_execute("set application_name = 'parked'")
            .await
            .unwrap();
    }
    let gw = tokio::task::spawn_blocking(move || {
        gw.wait_state("capped", "asleep", Duration::from_secs(20));
        gw
    })
    .await
    .unwrap();
    let t = gw.tenant("capped");
    assert_eq!((&t["connections"], &t["parked"]), (&0.into(), &2.into()));

    // A new client gets a slot (and wakes the tenant), then leaves.
    let newcomer = gw.select_one("capped", "pgwake", LOCAL_PASSWORD).await;
    let newcomer = newcomer.map_err(|e| match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    });
    assert_eq!(newcomer, Ok(1));
    // Both parked sessions come back, each within the cap.
    for c in [&a, &b] {
        let row = c.query_one("show application_name", &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), "parked");
    }
}

/// The HTTP/2 connection preface and an empty SETTINGS frame: all an idle HTTP/2 client sends.
const H2_PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// An HTTP/2 client that opens, sends its preface and SETTINGS and then says nothing; `None`
/// when the gateway did not take the connection.
async fn idle_h2(http: u16) -> Option<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", http)).await.ok()?;
    s.write_all(H2_PREFACE_AND_SETTINGS).await.ok()?;
    Some(s)
}

/// Reads until the gateway closes the connection.
async fn until_closed(mut s: TcpStream) {
    let mut buf = [0u8; 512];
    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// psql logs in and runs `select 1`; its error output otherwise.
fn psql_select_one(gw: &Gateway, tenant: &str) -> Result<(), String> {
    let out = std::process::Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-w", "-c", "select 1"])
        .arg(format!(
            "host=127.0.0.1 port={} user=pgwake dbname={tenant}.postgres sslmode=disable \
             connect_timeout=10",
            gw.port
        ))
        .env("PGPASSWORD", LOCAL_PASSWORD)
        .output()
        .expect("run psql");
    match out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "1" {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// Item 1: HTTP connections counted against no cap and an HTTP/2 connection that sent its
/// preface had no idle deadline, so 300 of them took every descriptor of a gateway limited
/// to 256 (psql logins and /healthz failed, and they stayed open). Now they count as
/// connections logging in (the oldest is ended to make room) and an idle one is closed after
/// `http.header_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_exhaust_nothing_and_are_closed() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[http]\nheader_timeout = \"3s\"\n"
    );
    let tenants = Gateway::local_tenants(&["edge"], "");
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::launch_under(&["prlimit", "--nofile=256"], &extra, &tenants, &[])
    })
    .await
    .unwrap();
    let gw = std::sync::Arc::new(gw);
    // Wake the tenant first: what follows is about descriptors, not the wake.
    let first = {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || psql_select_one(&gw, "edge"))
            .await
            .unwrap()
    };
    first.expect("psql before the attack");

    let mut idle = Vec::new();
    for _ in 0..300 {
        if let Some(s) = idle_h2(http).await {
            idle.push(s);
        }
    }
    let during = {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || {
            let logins: Vec<_> = (0..3).map(|_| psql_select_one(&gw, "edge")).collect();
            let health = gw.http_get("/healthz").map(|(s, _)| s);
            (logins, health)
        })
        .await
        .unwrap()
    };
    let sql = post_sql_from("127.0.0.1", http, "edge", "pgwake", LOCAL_PASSWORD);
    let sql = tokio::time::timeout(Duration::from_secs(15), sql)
        .await
        .unwrap_or((0, "no answer within 15 s".into()));
    eprintln!(
        "with 300 idle HTTP/2 connections: psql {:?}, /healthz {:?}, /sql {}",
        during.0, during.1, sql.0
    );
    assert!(during.0.iter().all(Result::is_ok), "{:?}", during.0);
    assert_eq!(during.1, Some(200));
    assert_eq!(sql.0, 200, "{}", sql.1);

    // Every idle connection is closed: made room for newer ones, or idle past its deadline.
    let closing = futures_util::future::join_all(idle.into_iter().map(until_closed));
    tokio::time::timeout(Duration::from_secs(30), closing)
        .await
        .expect("idle HTTP/2 connections were left open");
}

/// A client that trickles an HTTP/1 request head, a byte every 200 ms, holds its connection no
/// longer than one that sends nothing: it is closed once `http.header_timeout` has passed with
/// no request (and the grace the closing gives a request under way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_http1_request_head_is_closed_after_the_header_timeout() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[http]\nheader_timeout = \"2s\"\n"
    );
    let tenants = Gateway::local_tenants(&["edge"], "");
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", http)).await.unwrap();
    let started = std::time::Instant::now();
    let head = b"POST /sql HTTP/1.1\r\nHost: edge\r\nX-Filler: ";
    let filler = std::iter::repeat(&b'a');
    let mut closed_after = None;
    for byte in head.iter().chain(filler) {
        if s.write_all(std::slice::from_ref(byte)).await.is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        let mut buf = [0u8; 512];
        let read = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            closed_after = Some(started.elapsed());
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    let closed_after = closed_after.expect("a trickling client was still connected after 30 s");
    eprintln!("trickled request head closed after {closed_after:?}");
    assert!(
        closed_after >= Duration::from_millis(1500) && closed_after <= Duration::from_secs(10),
        "closed after {closed_after:?} with header_timeout = 2s"
    );
    drop(gw);
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

/// A `POST /sql` as pgwake on tenant `edge` with `password` whose head declares a body of
/// `declared` bytes, of which `sent` are sent (a JSON object with a long `params` string);
/// the status and body of the answer.
async fn post_body(http: u16, password: &str, declared: usize, sent: usize) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", http)).await.unwrap();
    let head = common::sql_request_head(("pgwake", password, "edge"), declared);
    let mut body = br#"{"query":"select $1","params":[""#.to_vec();
    body.resize(declared - 3, b'x');
    body.extend_from_slice(br#""]}"#);
    s.write_all(head.as_bytes()).await.unwrap();
    // The body goes in the background: the answer may come before all of it is sent.
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&body[..sent]).await;
        wr
    });
    let mut raw = Vec::new();
    let _ = rd.read_to_end(&mut raw).await;
    drop(writer.await);
    let (status, body) = common::http_answer(&raw);
    (status.unwrap_or(0), body)
}

/// Item 6: `/sql` read a request's whole body before checking its password, so twenty
/// wrong-password requests with 10 MB bodies took a gigabyte. The password is now checked
/// from the headers first and a refused body is read only to be dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_bodies_are_not_held_before_the_password_is_checked() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n\
         [http]\nbody_timeout = \"2s\"\n[auth]\nthrottle_free_failures = 1000000\n"
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], &extra, "", &[]))
        .await
        .unwrap();
    // A body that never arrives whole: the answer is the password's, not the body's 408.
    let (status, body) = post_body(http, "wrong", 10_000_000, 1000).await;
    assert!(status == 400 && body.contains("28P01"), "{status} {body}");

    let pid = gw.pid();
    let baseline = rss(pid);
    let requests: Vec<_> = (0..20)
        .map(|_| tokio::spawn(post_body(http, "wrong", 10_000_000, 10_000_000)))
        .collect();
    let mut peak = baseline;
    let mut answers = Vec::new();
    for r in requests {
        while !r.is_finished() {
            peak = peak.max(rss(pid));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        answers.push(r.await.unwrap());
    }
    eprintln!(
        "20 wrong-password requests of 10 MB: baseline {} MiB, peak {} MiB",
        baseline / MIB,
        peak / MIB
    );
    for (status, body) in &answers {
        assert!(*status == 400 && body.contains("28P01"), "{status} {body}");
    }
    assert!(peak < baseline + 64 * MIB, "peak RSS {peak} bytes");
}

/// `POST /sql` of `body` (JSON) as pgwake on tenant `edge`: (status, body).
async fn post_json(http: u16, body: &[u8]) -> (u16, String) {
    common::post_sql_body(http, ("pgwake", LOCAL_PASSWORD, "edge"), body).await
}

/// Item 4: a `/sql` batch was written whole before any reply was read, so a batch of
/// statements with 100 kB results each, larger than the sockets hold, filled both and
/// deadlocked until `http.query_timeout`, holding the pooled connection. Replies are now read
/// while the batch is written: the results pass `http.max_response_size` and the answer is a
/// prompt 507.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_sql_batch_is_answered_507_not_deadlocked() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n\
         [http]\nquery_timeout = \"20s\"\npool_max_per_key = 1\nmax_request_size = \"64MiB\"\n"
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], &extra, "", &[]))
        .await
        .unwrap();
    // Each statement distinct (none comes from the statement cache) and carrying a kilobyte
    // parameter: the batch (about 22 MB) is far more than the sockets between gateway and
    // Postgres hold, so it cannot be written whole before Postgres's answers are read.
    let padding = "p".repeat(1000);
    let queries: Vec<_> = (0..20_000)
        .map(|i| {
            serde_json::json!({
                "query": format!("select repeat('x', 100000) as c{i}, length($1)"),
                "params": [padding],
            })
        })
        .collect();
    let batch = serde_json::json!({ "queries": queries });
    let (status, body) = post_json(http, &serde_json::to_vec(&batch).unwrap()).await;
    assert_eq!(status, 507, "{}", &body[..body.len().min(300)]);
    assert!(body.contains("http.max_response_size"), "{body}");
    // The only pooled connection was not kept busy: the next request runs.
    let (status, body) = post_json(http, br#"{"query":"select 1","params":[]}"#).await;
    assert_eq!(status, 200, "{body}");
    drop(gw);
}

/// Open files of process `pid` that are deleted temporary files (spilled responses).
fn spilled_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().ends_with("(deleted)"))
                .count()
        })
        .unwrap_or(0)
}

/// Item 7: spilled `/sql` responses had no total bound and no send deadline, so clients that
/// stopped reading held a temporary file (and descriptors) each for as long as they liked.
/// Now spilled responses share `http.max_spill_total` (past it: 507) and a response nothing
/// of which went out for `http.send_timeout` ends its connection, freeing its file. One tenant
/// here, whose share (`http.max_spill_per_tenant`) is the whole total, so the total is what
/// bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_results_have_a_total_bound_and_a_send_deadline() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n\
         [http]\nresponse_memory = \"64KiB\"\nmax_spill_total = \"12MiB\"\n\
         max_spill_per_tenant = \"12MiB\"\nsend_timeout = \"2s\"\n"
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], &extra, "", &[]))
        .await
        .unwrap();
    let pid = gw.pid();
    // About 8.5 MB of JSON: spilled, and more than the sockets hold.
    let large = "select g, repeat('y', 90) from generate_series(1, 80000) g";
    let (held, head) = common::sql_then_stop_reading(http, "edge", large).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        spilled_files(pid),
        1,
        "the first response is spilled and held"
    );

    // A second one finds no room left.
    let (_second, head) = common::sql_then_stop_reading(http, "edge", large).await;
    assert!(head.starts_with("HTTP/1.1 507"), "{head}");
    assert!(head.contains("http.max_spill_total"), "{head}");

    // The first client never reads again: its connection ends and the file goes.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while spilled_files(pid) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a client that stopped reading still holds its spilled response"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(held);
    // Room again for the next.
    let (_third, head) = common::sql_then_stop_reading(http, "edge", large).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// The SCRAM salt the gateway offers `user` on `<tenant>.postgres`.
async fn offered_salt(port: u16, tenant: &str, user: &str) -> Vec<u8> {
    use pgwake_protocol::scram::{Nonce, ScramClient};
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let database = format!("{tenant}.postgres");
    let startup = startup_packet(&[("user", user), ("database", &database)], 196_608);
    s.write_all(&startup).await.unwrap();
    let (tag, _) = read_message(&mut s).await.expect("AuthenticationSASL");
    assert_eq!(tag, b'R');
    let client = ScramClient::new(Nonce::from_random(rand::random()));
    let first =
        pgwake_protocol::auth::sasl_initial_response("SCRAM-SHA-256", &client.client_first());
    s.write_all(&first).await.unwrap();
    let (tag, body) = read_message(&mut s).await.expect("SASLContinue");
    assert_eq!(tag, b'R');
    let challenge = client.handle_server_first(&body[4..]).unwrap();
    challenge.salt().to_vec()
}

/// Item 8: the stand-in salt for a user the gateway does not know depended on the user name
/// alone, so every tenant that does not exist offered `pgwake` the same salt and a real one
/// another: probing with a common user name told which tenants exist. Every tenant now offers
/// its own stable salt, real or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scram_salt_does_not_tell_which_tenants_exist() {
    let gw = tokio::task::spawn_blocking(|| {
        Gateway::start_local(&["edge"], "allow_plaintext = true\n", "", &[])
    })
    .await
    .unwrap();
    let real = offered_salt(gw.port, "edge", "pgwake").await;
    let nosuch1 = offered_salt(gw.port, "nosuch1", "pgwake").await;
    let nosuch2 = offered_salt(gw.port, "nosuch2", "pgwake").await;
    eprintln!("salts for pgwake: edge {real:02x?}, nosuch1 {nosuch1:02x?}, nosuch2 {nosuch2:02x?}");
    assert_ne!(nosuch1, nosuch2, "tenants that do not exist share a salt");
    assert_ne!(nosuch1, real);
    assert_ne!(nosuch2, real);
    // Stable, as a real user's salt is.
    assert_eq!(offered_salt(gw.port, "nosuch1", "pgwake").await, nosuch1);
    assert_eq!(offered_salt(gw.port, "edge", "pgwake").await, real);
    // An unknown user of a real tenant looks like any other tenant's unknown user.
    let nobody = offered_salt(gw.port, "edge", "nobody").await;
    assert_ne!(nobody, offered_salt(gw.port, "nosuch1", "nobody").await);
    assert_eq!(nobody.len(), real.len());
}

/// CPU time (user and system) process `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').unwrap().1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Item 5: a connection whose first bytes were `\r\n` (as a PROXY header begins) was looked at
/// every 5 ms until the startup timeout, with or without PROXY configured: a thousand of them
/// kept half a core busy. They now cost nothing while they stay silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_that_sent_crlf_cost_no_cpu() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[limits]\nstartup_timeout = \"20s\"\n"
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], &extra, "", &[]))
        .await
        .unwrap();
    let pid = gw.pid();
    let mut idle = Vec::new();
    for i in 0..1000 {
        let port = if i % 2 == 0 { gw.port } else { http };
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
        idle.push(s);
    }
    // Let the gateway take them all in, then measure a quiet stretch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = cpu_ticks(pid) - before;
    // Ticks are 10 ms: polling 1,000 connections every 5 ms costs well over a second in 3 s.
    eprintln!("1,000 silent connections: {used} ticks of CPU in 3 s");
    assert!(used < 30, "{used} ticks (10 ms each) of CPU in 3 s");
    drop(idle);
}

/// A GET of `path` on the admin listener naming `host`: the status.
async fn admin_get(admin: u16, path: &str, host: &str) -> u16 {
    let request_line = format!("GET {path} HTTP/1.1");
    common::admin_status(admin, &request_line, &format!("Host: {host}\r\n")).await
}

/// Item 9, DNS rebinding: a page whose name was rebound to the admin listener's address sends
/// same-origin requests (no `Origin`) naming its own host; the admin API answered them.
/// Now only IP addresses, `localhost` and the names in `admin.hosts` are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_only_its_own_host_names() {
    let extra = "allow_plaintext = true\n[admin]\nhosts = [\"pgwake.monitoring.svc\"]\n";
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], extra, "", &[]))
        .await
        .unwrap();
    let admin = gw.admin;
    for path in ["/v1/tenants", "/v1/summary", "/metrics", "/"] {
        assert_eq!(
            admin_get(admin, path, "attacker.example:8080").await,
            421,
            "{path}"
        );
    }
    for host in [
        "localhost",
        &format!("127.0.0.1:{admin}"),
        "[::1]:9090",
        "pgwake.monitoring.svc:9090",
    ] {
        assert_eq!(admin_get(admin, "/v1/tenants", host).await, 200, "{host}");
    }
    // Probes tell nothing and may come with any name.
    assert_eq!(admin_get(admin, "/healthz", "attacker.example").await, 200);
}

/// Item 9, COPY over `/sql`: `copy ... to stdout` answered 200 with its rows silently dropped
/// (and `from stdin` would wait for rows until the query timeout). Both now get a clear error,
/// and the pooled connection is not kept mid-copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_with_the_client_over_sql_is_an_error() {
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n[http]\nquery_timeout = \"20s\"\n"
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], &extra, "", &[]))
        .await
        .unwrap();
    for sql in [
        "copy (select g from generate_series(1, 3) g) to stdout",
        "copy pg_class from stdin",
    ] {
        let body = serde_json::to_vec(&serde_json::json!({ "query": sql, "params": [] })).unwrap();
        let (status, body) = post_json(http, &body).await;
        assert_eq!(status, 400, "{sql}: {body}");
        assert!(
            body.contains("0A000") && body.contains("COPY"),
            "{sql}: {body}"
        );
    }
    let (status, body) = post_json(http, br#"{"query":"select 1","params":[]}"#).await;
    assert_eq!(status, 200, "{body}");
    drop(gw);
}

/// Item 9, idle transactions: a session left idle inside an open transaction held its
/// backend connection, and a capped tenant's only slot, forever. With
/// `limits.idle_in_transaction_timeout` Postgres ends it with FATAL 25P03 and the slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transaction_does_not_hold_a_capped_slot_forever() {
    let config = "allow_plaintext = true\n[limits]\nidle_in_transaction_timeout = \"1s\"\n\
                  backend_wait_timeout = \"20s\"\n";
    let tenants = format!(
        "{}max_backend_connections = 1\n",
        Gateway::local_tenants(&["capped"], "")
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(config, &tenants, &[]))
        .await
        .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=capped.postgres \
         sslmode=disable connect_timeout=30",
        gw.port
    );
    let (idle, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    idle.batch_execute("begin; select 1").await.unwrap();
    // The only slot is held by the open transaction until Postgres ends it.
    let other = gw.select_one("capped", "pgwake", LOCAL_PASSWORD).await;
    assert_eq!(other.map_err(|e| e.to_string()), Ok(1));
    let ended = conn
        .await
        .unwrap()
        .expect_err("the idle transaction's session ended");
    assert_eq!(ended.code().map(|c| c.code()), Some("25P03"), "{ended:?}");
}

/// Item 9, large bodies over HTTP/2: a 50 MiB body (five times `http.max_request_size`) was
/// answered without being read, and curl saw the stream reset that follows instead of the
/// 413. Refused bodies are now read and dropped within `http.body_timeout`, whatever their size.
#[test]
fn a_50_mib_body_over_http2_gets_its_413() {
    let http = pgwake_testkit::free_port();
    let extra = format!("allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n");
    let gw = Gateway::start_local(&["edge"], &extra, "", &[]);
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b'a'; 50 << 20]).unwrap();
    let out = std::process::Command::new("curl")
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
        .args(["--max-time", "60", "--data-binary"])
        .arg(format!("@{}", big.display()))
        .arg(format!("http://127.0.0.1:{http}/sql"))
        .output()
        .expect("curl");
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(got, "413 2", "{}", String::from_utf8_lossy(&out.stderr));
    drop(gw);
}

/// A plaintext SCRAM login from 127.0.0.1 stopped with its proof unsent (a client still
/// deriving its keys): the stream and the challenge to answer.
async fn scram_until_proof(
    port: u16,
    tenant: &str,
    user: &str,
) -> (TcpStream, pgwake_protocol::scram::ScramChallenge) {
    use pgwake_protocol::scram::{Nonce, ScramClient};
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let database = format!("{tenant}.postgres");
    let startup = startup_packet(&[("user", user), ("database", &database)], 196_608);
    s.write_all(&startup).await.unwrap();
    let (tag, _) = read_message(&mut s).await.expect("AuthenticationSASL");
    assert_eq!(tag, b'R');
    let client = ScramClient::new(Nonce::from_random(rand::random()));
    let first =
        pgwake_protocol::auth::sasl_initial_response("SCRAM-SHA-256", &client.client_first());
    s.write_all(&first).await.unwrap();
    let (tag, body) = read_message(&mut s).await.expect("SASLContinue");
    assert_eq!(tag, b'R');
    (s, client.handle_server_first(&body[4..]).unwrap())
}

/// Item 9, a stream of stalled logins: when connections still logging in filled their cap,
/// the oldest was ended to make room whatever it was doing, so stalled logins arriving faster
/// than the cap turns over ended real logins in the middle of their password exchange (40 of
/// 42 psql logins failed at 4-5 k/s against the cap a file limit of 256 leaves). Now those that
/// got least far go first. Without depending on rates: a real login waits with its proof
/// unsent while more stalled logins arrive than the cap holds, then finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_logins_end_each_other_before_a_real_login() {
    let extra = "allow_plaintext = true\n[limits]\nmax_unauthenticated_connections = 6\n";
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["edge"], extra, "", &[]))
        .await
        .unwrap();
    let (mut honest, challenge) = scram_until_proof(gw.port, "edge", "pgwake").await;
    // Twice as many stalled logins as the cap holds, each in before the next comes.
    let startup = startup_packet(
        &[("user", "pgwake"), ("database", "edge.postgres")],
        196_608,
    );
    let mut stalled = Vec::new();
    for _ in 0..12 {
        let mut s = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        s.write_all(&startup).await.unwrap();
        // AuthenticationSASL (or the end, for one ended to make room already).
        let _ = read_message(&mut s).await;
        stalled.push(s);
    }
    let keys = pgwake_protocol::scram::ScramKeys::from_password(
        LOCAL_PASSWORD,
        challenge.salt(),
        challenge.iterations(),
    );
    let (_, client_final) = challenge.client_final(&keys).unwrap();
    let sent = honest
        .write_all(&pgwake_protocol::auth::sasl_response(&client_final))
        .await;
    let answer = match sent {
        Ok(()) => read_message(&mut honest).await,
        Err(_) => None,
    };
    assert!(
        matches!(&answer, Some((b'R', body)) if body[..4] == 12u32.to_be_bytes()),
        "the real login was ended: {:?}",
        answer.map(|(tag, body)| (tag as char, sqlstate(&body)))
    );
    assert!(gw.labelled_metric("pgwake_errors_total", &[("kind", "login_evicted")]) >= 6.0);
}
