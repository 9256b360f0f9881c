//! Cancel, bad input, backend failure and graceful shutdown through the gateway.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Gateway, backend, startup_packet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::NoTls;

const PLAINTEXT: &str = "allow_plaintext = true";

fn conninfo(gw: &Gateway, pg: &pgwake_testkit::TestPostgres) -> String {
    format!(
        "host=127.0.0.1 port={} user={} password={} dbname=alpha.postgres sslmode=disable",
        gw.port, pg.options.user, pg.options.password
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_running_query() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let gw = Gateway::start(&pg, PLAINTEXT, &[]);
    let (client, conn) = tokio_postgres::connect(&conninfo(&gw, &pg), NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let token = client.cancel_token();
    let started = Instant::now();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        token.cancel_query(NoTls).await
    });
    let err = client
        .simple_query("select pg_sleep(30)")
        .await
        .expect_err("cancelled");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1300),
        "took {:?}",
        started.elapsed()
    );
    canceller.await.unwrap().expect("cancel sent");
    // The session is still usable afterwards.
    let row = client.query_one("select 1::int4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);

    // The same over TLS: the cancel request arrives inside a direct TLS connection.
    let token = client.cancel_token();
    let connector = gw.tls_connector();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = connector.connect(name, tcp).await.unwrap();
        token.cancel_query_raw(tls, NoTls).await.map(|()| gw)
    });
    let started = Instant::now();
    let err = client
        .simple_query("select pg_sleep(30)")
        .await
        .expect_err("cancelled over TLS");
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1300),
        "took {:?}",
        started.elapsed()
    );
    let gw = canceller.await.unwrap().expect("TLS cancel sent");
    drop(client);
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

/// Reads until EOF (or error) within a time limit; returns what arrived.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            // A read with a timeout is not restarted after a signal (another test's child
            // process ending sends this process SIGCHLD): read on, within the same limit.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted && left > Duration::ZERO => {}
            Err(e) => panic!("connection not closed after {:?}: {e}", started.elapsed()),
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn bad_input_is_refused_cleanly() {
    let pg = backend();
    let gw = Gateway::start(&pg, PLAINTEXT, &[("PGWAKE_LIMITS__STARTUP_TIMEOUT", "1s")]);
    let connect = || TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let limit = Duration::from_secs(5);

    // Random bytes.
    let mut s = connect();
    let noise: Vec<u8> = (0..200u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    s.write_all(&noise).unwrap();
    let got = read_to_close(&mut s, limit);
    assert!(text(&got).contains("08P01"), "{:?}", text(&got));

    // A startup length of 1 MiB.
    let mut s = connect();
    s.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
    s.write_all(&196_608u32.to_be_bytes()).unwrap();
    let got = text(&read_to_close(&mut s, limit));
    assert!(
        got.contains("08P01") && got.contains("over the limit"),
        "{got}"
    );

    // A startup that never finishes: closed after startup_timeout.
    let mut s = connect();
    s.write_all(&100u32.to_be_bytes()).unwrap();
    let started = Instant::now();
    let got = text(&read_to_close(&mut s, limit));
    assert!(got.contains("timeout"), "{got}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // Garbage after SSLRequest: the TLS handshake fails and the connection closes.
    let mut s = connect();
    s.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"S");
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    read_to_close(&mut s, limit);

    // A cancel with a random key: dropped silently.
    let mut s = connect();
    s.write_all(&[0, 0, 0, 16, 4, 210, 22, 46, 0, 1, 2, 3, 9, 9, 9, 9])
        .unwrap();
    assert!(read_to_close(&mut s, limit).is_empty());

    // Plaintext startup naming no tenant: a clear FATAL with a hint.
    let mut s = connect();
    s.write_all(&startup_packet(
        &[("user", "x"), ("database", "postgres")],
        196_608,
    ))
    .unwrap();
    let got = text(&read_to_close(&mut s, limit));
    assert!(
        got.contains("08004") && got.contains("unknown or forbidden tenant"),
        "{got}"
    );

    // An unsupported protocol version.
    let mut s = connect();
    s.write_all(&startup_packet(&[("user", "x")], 2 << 16))
        .unwrap();
    let got = text(&read_to_close(&mut s, limit));
    assert!(
        got.contains("0A000") && got.contains("unsupported frontend protocol"),
        "{got}"
    );

    // A newer minor version is answered with NegotiateProtocolVersion, then the login goes on.
    let mut s = connect();
    let p = startup_packet(
        &[
            ("user", &pg.options.user),
            ("database", "alpha.postgres"),
            ("_pq_.x", "1"),
        ],
        196_610,
    );
    s.write_all(&p).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut head = [0u8; 1];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], b'v');
    drop(s);

    gw.wait_idle();
    assert!(!gw.log().contains("panicked"), "{}", gw.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_hello_without_sni_then_no_tenant() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let gw = Gateway::start(&pg, "", &[]);
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    tcp.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await.unwrap();
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"S");
    // rustls sends no SNI for an IP address.
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(std::sync::Arc::new(AcceptAny))
    .with_no_client_auth();
    config.enable_sni = false;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    tls.write_all(&startup_packet(
        &[("user", "x"), ("database", "postgres")],
        196_608,
    ))
    .await
    .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut got))
        .await
        .expect("closed in time")
        .ok();
    let got = text(&got);
    assert!(
        got.contains("08004") && got.contains("unknown or forbidden tenant"),
        "{got}"
    );
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

/// Test-only verifier: the point of that test is SNI, not trust.
#[derive(Debug)]
struct AcceptAny;

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_death_reaches_the_client_at_once() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let gw = Gateway::start(&pg, PLAINTEXT, &[]);
    let (client, conn) = tokio_postgres::connect(&conninfo(&gw, &pg), NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let pid: i32 = client
        .query_one("select pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let started = Instant::now();
    let query = tokio::spawn(async move { client.simple_query("select pg_sleep(20)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SIGKILL the backend process: no goodbye message, the socket just closes.
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .expect("client not left hanging")
        .unwrap();
    assert!(result.is_err());
    assert!(started.elapsed() < Duration::from_secs(5));
    let _ = conn.await;
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_ends_sessions_with_57p01() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let mut gw = Gateway::start(&pg, PLAINTEXT, &[("PGWAKE_LIMITS__SHUTDOWN_GRACE", "1s")]);
    let (client, conn) = tokio_postgres::connect(&conninfo(&gw, &pg), NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    client.simple_query("select 1").await.unwrap();
    gw.signal("-TERM");
    // Readiness flips at once; the session lives on through the grace period.
    let deadline = Instant::now() + Duration::from_secs(3);
    while gw.http_get("/readyz").map(|(s, _)| s) != Some(503) {
        assert!(Instant::now() < deadline, "readyz did not turn 503");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        TcpStream::connect(("127.0.0.1", gw.port)).is_err(),
        "still accepting"
    );
    client
        .simple_query("select 2")
        .await
        .expect("alive in the grace period");
    let err = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("session ended after the grace period")
        .unwrap()
        .expect_err("ended with an error");
    assert_eq!(err.code().map(|c| c.code()), Some("57P01"), "{err}");
    let exited = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(exited, "pgwake did not exit");
}

/// A session's connection task ended by the gateway: waits (well within `limit`) and returns
/// the SQLSTATE it ended with.
async fn ended_with(
    conn: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    limit: Duration,
    what: &str,
) -> Option<String> {
    let err = tokio::time::timeout(limit, conn)
        .await
        .unwrap_or_else(|_| panic!("{what}: still open after {limit:?}"))
        .unwrap()
        .expect_err("ended with an error");
    err.code().map(|c| c.code().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_ends_idle_sessions_at_once_and_a_second_signal_ends_the_rest() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    // A grace far beyond the waits below: whatever ends in them did not wait it out.
    let mut gw = Gateway::start(&pg, PLAINTEXT, &[("PGWAKE_LIMITS__SHUTDOWN_GRACE", "300s")]);
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(&conninfo(&gw, &pg), NoTls)
            .await
            .expect("connect");
        (client, tokio::spawn(conn))
    };
    let (idle, idle_conn) = connect().await;
    idle.simple_query("select 1").await.unwrap();
    let (committing, committing_conn) = connect().await;
    committing.simple_query("begin").await.unwrap();
    let (open, open_conn) = connect().await;
    open.simple_query("begin").await.unwrap();

    gw.signal("-INT");
    // The idle session ends without waiting for the grace period.
    let limit = Duration::from_secs(60);
    assert_eq!(
        ended_with(idle_conn, limit, "the idle session")
            .await
            .as_deref(),
        Some("57P01"),
        "{}",
        gw.log()
    );
    // Open transactions go on; one that commits ends right after its answer.
    committing
        .simple_query("select 2")
        .await
        .expect("a transaction lives on after SIGINT");
    committing
        .simple_query("commit")
        .await
        .expect("its commit is answered");
    assert_eq!(
        ended_with(committing_conn, limit, "the committed session")
            .await
            .as_deref(),
        Some("57P01")
    );
    open.simple_query("select 3")
        .await
        .expect("the other transaction is still open");

    // A second Ctrl-C ends the rest now, and the gateway exits.
    gw.signal("-INT");
    assert_eq!(
        ended_with(open_conn, limit, "the session in a transaction")
            .await
            .as_deref(),
        Some("57P01")
    );
    let (exited, gw) = tokio::task::spawn_blocking(move || (gw.wait_exit(limit), gw))
        .await
        .unwrap();
    assert!(exited, "pgwake did not exit: {}", gw.log());
    assert!(
        gw.log().contains("asked again: terminating sessions"),
        "{}",
        gw.log()
    );
}
