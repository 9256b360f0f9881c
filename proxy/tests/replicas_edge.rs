//! The fleet's edge (issue 16): behind a load balancer that speaks the PROXY protocol, the
//! client address its header names is the one the tenant's deny list and the login throttle
//! see, on the Postgres and the HTTP listener; a header from an untrusted address is refused.
//! Rotated certificates (rewritten files, or SIGHUP) are served to the next handshake while
//! sessions opened before go on.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Gateway, SNI_SUFFIX, backend};
use pgwake_protocol::proxy_header::{encode_v1, encode_v2};
use pgwake_testkit::{TestCert, TestPostgres};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_postgres::NoTls;

/// The address the load balancer says it accepted each client on.
const BALANCER_FRONT: &str = "10.0.0.1:5432";
/// Client networks: the tenant denies the first.
const DENIED: &str = "203.0.113.7:40001";
const ALLOWED: &str = "198.51.100.9:40002";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Tenant `alpha` on `pg`, checked at the gateway against a static file (role `app`,
/// password `app-password`) and denying 203.0.113.0/24.
fn alpha(dir: &std::path::Path, pg: &TestPostgres) -> String {
    pg.psql("create role app login password 'app-password'")
        .unwrap();
    let users = dir.join("users.txt");
    std::fs::write(&users, "\"app\" \"app-password\"\n").unwrap();
    format!(
        "[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n\
         credentials = {{ kind = \"static\", file = \"{}\" }}\ndeny = [\"203.0.113.0/24\"]\n",
        pg.port,
        users.display()
    )
}

/// A TCP connection to `port` from the loopback address `from`, opened with `header`.
async fn connect_from(from: &str, port: u16, header: &[u8]) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    let mut s = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    s.write_all(header).await.unwrap();
    s
}

/// Logs in as `user` over `stream` (database `alpha.postgres`) and runs `select 1`.
async fn login_over<S>(stream: S, user: &str, password: &str) -> Result<i32, tokio_postgres::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut config = tokio_postgres::Config::new();
    config
        .user(user)
        .password(password)
        .dbname("alpha.postgres");
    let (client, conn) = config.connect_raw(stream, NoTls).await?;
    tokio::spawn(conn);
    let row = client.query_one("select 1::int4", &[]).await?;
    Ok(row.get(0))
}

/// Logs in as `app` through a connection from 127.0.0.1 opened with `header`.
async fn login(gw: &Gateway, header: &[u8], password: &str) -> Result<i32, tokio_postgres::Error> {
    login_as(gw, header, "app", password).await
}

async fn login_as(
    gw: &Gateway,
    header: &[u8],
    user: &str,
    password: &str,
) -> Result<i32, tokio_postgres::Error> {
    login_over(
        connect_from("127.0.0.1", gw.port, header).await,
        user,
        password,
    )
    .await
}

fn code(r: &Result<i32, tokio_postgres::Error>) -> Option<String> {
    r.as_ref()
        .err()
        .and_then(|e| e.code())
        .map(|c| c.code().to_owned())
}

/// Reads until the gateway closes `s`; what it sent first.
async fn read_to_close(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the gateway did not close the connection");
    out
}

async fn wait_log(gw: &Gateway, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.log().contains(needle) {
        assert!(Instant::now() < deadline, "no {needle:?} in\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_proxy_header_names_the_client_for_deny_list_and_throttle() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extra = "allow_plaintext = true\nproxy_protocol_from = [\"127.0.0.1/32\"]\n\
                 [auth]\nthrottle_free_failures = 3\nthrottle_base = \"30s\"\nthrottle_max = \"30s\"";
    let tenants = alpha(dir.path(), &pg);
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(extra, &tenants, &[]))
        .await
        .unwrap();
    let front = addr(BALANCER_FRONT);

    // v2: the deny list sees the proxied address, not the balancer's 127.0.0.1.
    let denied = login(&gw, &encode_v2(addr(DENIED), front), "app-password").await;
    assert_eq!(code(&denied).as_deref(), Some("28P01"), "{denied:?}");
    let allowed = login(&gw, &encode_v2(addr(ALLOWED), front), "app-password").await;
    assert_eq!(allowed.unwrap(), 1);
    // Logs name the client, and the balancer it came through.
    wait_log(&gw, "peer=198.51.100.9:40002").await;
    wait_log(&gw, "via=127.0.0.1:").await;

    // v1 alike.
    let denied = login(
        &gw,
        &encode_v1(addr("203.0.113.8:40003"), front),
        "app-password",
    )
    .await;
    assert_eq!(code(&denied).as_deref(), Some("28P01"), "{denied:?}");
    let allowed = login(
        &gw,
        &encode_v1(addr("198.51.100.10:40004"), front),
        "app-password",
    )
    .await;
    assert_eq!(allowed.unwrap(), 1);

    // The throttle counts failures per proxied address (and per account, so the guesses go to
    // another user): a client guessing is blocked for every user, its neighbour behind the same
    // balancer is not. The refused logins above took two of the three free failures of `app`.
    let guesser = addr("198.51.100.20:40005");
    for _ in 0..3 {
        let r = login_as(&gw, &encode_v2(guesser, front), "ghost", "guess").await;
        assert_eq!(code(&r).as_deref(), Some("28P01"), "{r:?}");
    }
    let blocked = login(&gw, &encode_v2(guesser, front), "app-password").await;
    assert_eq!(code(&blocked).as_deref(), Some("28000"), "{blocked:?}");
    let neighbour = login(
        &gw,
        &encode_v2(addr("198.51.100.21:40006"), front),
        "app-password",
    )
    .await;
    assert_eq!(neighbour.unwrap(), 1);

    // A trusted balancer must send the header.
    let bare = connect_from("127.0.0.1", gw.port, &[]).await;
    let mut bare = bare;
    bare.write_all(&common::startup_packet(&[("user", "app")], 196_608))
        .await
        .unwrap();
    assert!(read_to_close(bare).await.is_empty());
    wait_log(
        &gw,
        "no PROXY protocol header from an address in listen.proxy_protocol_from",
    )
    .await;

    // From an untrusted address (127.0.0.2) a header is refused, v2 and v1, with nothing
    // written back; without one the client is served as before.
    for header in [
        encode_v2(addr(ALLOWED), front),
        encode_v1(addr(ALLOWED), front),
    ] {
        let s = connect_from("127.0.0.2", gw.port, &header).await;
        assert!(read_to_close(s).await.is_empty());
    }
    wait_log(&gw, "PROXY protocol header from an untrusted address").await;
    let plain = login_over(
        connect_from("127.0.0.2", gw.port, &[]).await,
        "app",
        "app-password",
    )
    .await;
    assert_eq!(plain.unwrap(), 1);
    assert_eq!(
        gw.labelled_metric("pgwake_errors_total", &[("kind", "proxy_header")]),
        3.0
    );
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

/// One `POST /sql` as `app` over a connection from `from` opened with `header`: the status.
async fn post_sql(from: &str, port: u16, header: &[u8]) -> u16 {
    let mut s = connect_from(from, port, header).await;
    let body = br#"{"query":"select 1 as one","params":[]}"#;
    let head = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n\
         Neon-Connection-String: postgresql://app:app-password@alpha.{SNI_SUFFIX}:5432/postgres\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    // A gateway that refuses the connection may close it (and reset it) before all is written.
    let sent = async {
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await
    };
    if sent.await.is_err() {
        return 0;
    }
    let reply = String::from_utf8_lossy(&read_to_close(s).await).into_owned();
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_proxy_header_on_the_http_listener() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let http = pgwake_testkit::free_port();
    let extra = format!(
        "allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\nproxy_protocol_from = [\"127.0.0.1/32\"]"
    );
    let tenants = alpha(dir.path(), &pg);
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    let front = addr(BALANCER_FRONT);
    let denied = post_sql("127.0.0.1", http, &encode_v2(addr(DENIED), front)).await;
    let allowed = post_sql("127.0.0.1", http, &encode_v2(addr(ALLOWED), front)).await;
    let allowed_v1 = post_sql("127.0.0.1", http, &encode_v1(addr(ALLOWED), front)).await;
    eprintln!(
        "POST /sql through the balancer: denied client {denied}, allowed {allowed} (v2), {allowed_v1} (v1)"
    );
    assert!(denied >= 400, "denied client got {denied}");
    assert_eq!((allowed, allowed_v1), (200, 200));
    // Untrusted: closed without an answer; without a header: served.
    assert_eq!(
        post_sql("127.0.0.2", http, &encode_v2(addr(ALLOWED), front)).await,
        0
    );
    assert_eq!(post_sql("127.0.0.2", http, &[]).await, 200);
    wait_log(&gw, "PROXY protocol header from an untrusted address").await;
}

/// The leaf certificate a TLS client is served by the gateway now.
async fn served_certificate(gw: &Gateway, trusted: &[&TestCert]) -> Vec<u8> {
    let s = tls_session(gw, trusted).await;
    s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Direct TLS (ALPN postgresql, SNI alpha.<suffix>) trusting each of `trusted`.
async fn tls_session(
    gw: &Gateway,
    trusted: &[&TestCert],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let pems: Vec<&str> = trusted.iter().map(|c| c.cert_pem.as_str()).collect();
    let tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let name = ServerName::try_from(format!("alpha.{SNI_SUFFIX}")).unwrap();
    common::tls_connector_trusting(&pems)
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Replaces the gateway's certificate and key the way the kubelet updates a mounted Secret:
/// each file appears whole (written aside, then renamed).
fn rotate(gw: &Gateway, cert: &TestCert) {
    let aside = tempfile::tempdir_in(gw.dir.path()).unwrap();
    let (c, k) = cert.write_to(aside.path()).unwrap();
    std::fs::rename(c, gw.dir.path().join("cert.pem")).unwrap();
    std::fs::rename(k, gw.dir.path().join("key.pem")).unwrap();
}

fn der(c: &TestCert) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(c.cert_pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// A session opened over TLS (SCRAM at the gateway) and kept for later queries.
async fn open_session(gw: &Gateway, trusted: &[&TestCert]) -> tokio_postgres::Client {
    let stream = tls_session(gw, trusted).await;
    let mut config = tokio_postgres::Config::new();
    config
        .user("app")
        .password("app-password")
        .dbname("postgres");
    let (client, conn) = config.connect_raw(stream, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

async fn ask(client: &tokio_postgres::Client, n: i32) {
    let row = client.query_one("select $1::int4", &[&n]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), n);
}

/// psql logs in with SCRAM-SHA-256-PLUS required (channel binding to the certificate served).
fn psql_with_channel_binding(gw: &Gateway) {
    let out = std::process::Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
        .args(["-X", "-A", "-t", "-w", "-c", "select 42"])
        .arg(format!(
            "host=alpha.{SNI_SUFFIX} hostaddr=127.0.0.1 port={} sslmode=require \
             channel_binding=require user=app dbname=postgres connect_timeout=10",
            gw.port
        ))
        .env("PGPASSWORD", "app-password")
        .output()
        .expect("run psql");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "42",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until new handshakes are served `want`.
async fn wait_served(gw: &Gateway, trusted: &[&TestCert], want: &TestCert) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while served_certificate(gw, trusted).await != der(want) {
        assert!(
            Instant::now() < deadline,
            "the new certificate is not served:\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_rotated_certificate_files_serve_the_next_handshake() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tenants = alpha(dir.path(), &pg);
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::launch("", &tenants, &[("PGWAKE_TLS__WATCH_INTERVAL", "200ms")])
    })
    .await
    .unwrap();
    let old = gw.cert.clone();
    let new = TestCert::new(&["*.db.localtest", "localhost"]);
    let both = [&old, &new];
    assert_eq!(served_certificate(&gw, &both).await, der(&old));
    let before = open_session(&gw, &[&old]).await;
    ask(&before, 1).await;

    // cert-manager rewrites the files: the next handshake gets the new certificate.
    rotate(&gw, &new);
    let rotated = Instant::now();
    wait_served(&gw, &both, &new).await;
    eprintln!(
        "new certificate served {:?} after the files were rewritten",
        rotated.elapsed()
    );
    wait_log(&gw, "reason=\"files_changed\"").await;
    ask(&before, 2).await;
    let after = open_session(&gw, &[&new]).await;
    ask(&after, 3).await;
    tokio::task::block_in_place(|| psql_with_channel_binding(&gw));

    // A bad file keeps the certificate in use, and says why.
    std::fs::write(gw.dir.path().join("cert.pem"), "not a certificate\n").unwrap();
    wait_log(
        &gw,
        "TLS certificates not reloaded: keeping the previous ones",
    )
    .await;
    assert_eq!(served_certificate(&gw, &both).await, der(&new));
    ask(&before, 4).await;
    ask(&after, 5).await;
    assert!(gw.labelled_metric("pgwake_errors_total", &[("kind", "tls_reload")]) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sighup_reloads_the_certificate() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tenants = alpha(dir.path(), &pg);
    // Files are looked at only hourly: the reload below is SIGHUP's.
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::launch("", &tenants, &[("PGWAKE_TLS__WATCH_INTERVAL", "1h")])
    })
    .await
    .unwrap();
    let old = gw.cert.clone();
    let new = TestCert::new(&["*.db.localtest", "localhost"]);
    let both = [&old, &new];
    let before = open_session(&gw, &[&old]).await;
    ask(&before, 1).await;
    rotate(&gw, &new);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(served_certificate(&gw, &both).await, der(&old));
    gw.signal("-HUP");
    let hup = Instant::now();
    wait_served(&gw, &both, &new).await;
    eprintln!("new certificate served {:?} after SIGHUP", hup.elapsed());
    wait_log(&gw, "reason=\"sighup\"").await;
    ask(&before, 2).await;
    tokio::task::block_in_place(|| psql_with_channel_binding(&gw));
}
