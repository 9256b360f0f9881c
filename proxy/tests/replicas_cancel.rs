//! Cancel forwarding between two gateway replicas against a real kube-apiserver: a query running
//! through replica A is cancelled by a CancelRequest sent to replica B, and forged keys sent to
//! B cancel nothing and are rate-limited.
//!
//! The replicas find each other in their Service's EndpointSlices. No endpoint controller runs in
//! the lab, so the test writes the EndpointSlices the controller would write for the Service
//! (one per replica: both run on this host, on different peer ports); the gateways only watch
//! them, with exactly the RBAC that deploy/ grants. The API server refuses loopback addresses in
//! EndpointSlices, so the peer listeners bind this host's own address instead (the kernel
//! delivers that traffic locally: nothing leaves the machine); clients still use 127.0.0.1.

mod common;

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::{CANCEL_REQUEST_CODE, Gateway, backend, issued_key};
use pgwake_testkit::kube::KubeLab;
use pgwake_testkit::{TestPostgres, free_port};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::NoTls;

const SERVICE: &str = "pgwake";

struct Replicas {
    a: Gateway,
    b: Gateway,
    _dir: tempfile::TempDir,
}

/// This host's own non-loopback address: the one it would send from (a connected UDP socket
/// sends nothing).
fn host_address() -> IpAddr {
    let probe = UdpSocket::bind("0.0.0.0:0").unwrap();
    probe
        .connect("203.0.113.1:9")
        .expect("a route for picking this host's own address");
    let ip = probe.local_addr().unwrap().ip();
    assert!(
        !ip.is_loopback() && !ip.is_unspecified(),
        "no non-loopback address on this host for EndpointSlices: {ip}"
    );
    ip
}

/// Writes the EndpointSlice that lists a replica's peer port for the Service.
fn write_endpoint_slice(lab: &KubeLab, ns: &str, name: &str, host: IpAddr, peer_port: u16) {
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": { "kubernetes.io/service-name": SERVICE },
        },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": [host.to_string()], "conditions": { "ready": true } }],
        "ports": [{ "name": "peer", "port": peer_port, "protocol": "TCP" }],
    });
    lab.create(
        &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
        &slice.to_string(),
    )
    .unwrap()
    .success_json()
    .unwrap();
}

/// Two replicas of one Service in namespace `ns`, both serving tenant `alpha` on `pg`, with
/// `peer_extra` added to each one's `[peer]` section; returns once each has listed both.
fn start_replicas(pg: &TestPostgres, ns: &str, peer_extra: &str) -> Replicas {
    let lab = KubeLab::shared();
    let token = lab.deploy_rbac_token(ns).unwrap();
    let kubeconfig = lab.kubeconfig_for_token(&token).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("peer-token");
    std::fs::write(&token_file, "shared-peer-token-for-tests\n").unwrap();
    let (peer_a, peer_b) = (free_port(), free_port());
    let host = host_address();
    write_endpoint_slice(lab, ns, "pgwake-a", host, peer_a);
    write_endpoint_slice(lab, ns, "pgwake-b", host, peer_b);
    let extra = |peer_port: u16| {
        format!(
            "allow_plaintext = true\npeer = \"{host}:{peer_port}\"\n\
             [kubernetes]\nkubeconfig = \"{}\"\n\
             [peer]\nservice = \"{SERVICE}\"\nnamespace = \"{ns}\"\ntoken_file = \"{}\"\n{peer_extra}\n",
            kubeconfig.display(),
            token_file.display()
        )
    };
    let a = Gateway::start(pg, &extra(peer_a), &[]);
    let b = Gateway::start(pg, &extra(peer_b), &[]);
    for gw in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !gw
            .log()
            .contains("peer replicas listed service=pgwake replicas=2")
        {
            assert!(
                Instant::now() < deadline,
                "replica did not list its peers:\n{}",
                gw.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Replicas { a, b, _dir: dir }
}

fn conninfo(gw: &Gateway, pg: &TestPostgres) -> String {
    format!(
        "host=127.0.0.1 port={} user={} password={} dbname=alpha.postgres sslmode=disable",
        gw.port, pg.options.user, pg.options.password
    )
}

async fn connect(gw: &Gateway, pg: &TestPostgres) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&conninfo(gw, pg), NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

fn peer_cancels(gw: &Gateway, side: &str, outcome: &str) -> f64 {
    gw.labelled_metric(
        "pgwake_peer_cancels_total",
        &[("side", side), ("outcome", outcome)],
    )
}

/// Sends a raw CancelRequest to `port` and waits until the gateway closes the connection.
async fn send_cancel(port: u16, pid: i32, secret: &[u8]) {
    let mut packet = ((12 + secret.len()) as u32).to_be_bytes().to_vec();
    packet.extend_from_slice(&CANCEL_REQUEST_CODE.to_be_bytes());
    packet.extend_from_slice(&pid.to_be_bytes());
    packet.extend_from_slice(secret);
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&packet).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_cancel_sent_to_another_replica_reaches_the_query() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let r = start_replicas(&pg, "replica-cancel", "");
    let client = connect(&r.a, &pg).await;
    let token = client.cancel_token();
    let query = tokio::spawn(async move { client.batch_execute("select pg_sleep(30)").await });
    // Let the query reach the backend before cancelling it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = Instant::now();
    let to_b = TcpStream::connect(("127.0.0.1", r.b.port)).await.unwrap();
    token
        .cancel_query_raw(to_b, NoTls)
        .await
        .expect("cancel request sent to replica B");
    let err = tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .expect("query ended")
        .unwrap()
        .expect_err("query cancelled");
    let took = sent.elapsed();
    println!(
        "cancel through B ended A's query after {took:?}: SQLSTATE {:?}",
        err.code().map(|c| c.code())
    );
    assert_eq!(err.code().map(|c| c.code()), Some("57014"), "{err}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // The backend may end the query before the replicas count the exchange.
    let counted = Instant::now() + Duration::from_secs(5);
    while (
        peer_cancels(&r.b, "forwarded", "cancelled"),
        peer_cancels(&r.a, "served", "cancelled"),
    ) != (1.0, 1.0)
        && Instant::now() < counted
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(peer_cancels(&r.b, "forwarded", "cancelled"), 1.0);
    assert_eq!(peer_cancels(&r.a, "served", "cancelled"), 1.0);
    println!(
        "B forwarded/cancelled={} A served/cancelled={}",
        peer_cancels(&r.b, "forwarded", "cancelled"),
        peer_cancels(&r.a, "served", "cancelled")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_forged_keys_cancel_nothing_and_are_rate_limited() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let r = start_replicas(
        &pg,
        "replica-forged",
        "forward_burst = 3\nforward_rate = 0.5",
    );
    let client = connect(&r.a, &pg).await;
    let (pid, secret) = issued_key(&client.cancel_token()).await;
    let query = tokio::spawn(async move { client.batch_execute("select pg_sleep(3)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The real pid with wrong secrets: first a protocol 3.2-length one (32 bytes), then 4-byte
    // ones, as a client guessing secrets through replica B would send.
    send_cancel(r.b.port, pid, &[7u8; 32]).await;
    for guess in 1..20u8 {
        let mut forged = secret.clone();
        forged[3] ^= guess;
        send_cancel(r.b.port, pid, &forged).await;
    }

    query.await.unwrap().expect("the real query ran to its end");
    let forwarded_unknown = peer_cancels(&r.b, "forwarded", "unknown_key");
    let limited = peer_cancels(&r.b, "forwarded", "rate_limited");
    println!(
        "B forwarded/unknown_key={forwarded_unknown} forwarded/rate_limited={limited} \
         A served/unknown_key={} served/cancelled={}",
        peer_cancels(&r.a, "served", "unknown_key"),
        peer_cancels(&r.a, "served", "cancelled")
    );
    assert!(
        (3.0..=5.0).contains(&forwarded_unknown),
        "the burst (3, plus at most a refill or two) reached A: {forwarded_unknown}"
    );
    assert_eq!(forwarded_unknown + limited, 20.0);
    assert_eq!(peer_cancels(&r.b, "forwarded", "cancelled"), 0.0);
    assert_eq!(peer_cancels(&r.a, "served", "cancelled"), 0.0);
    assert_eq!(
        peer_cancels(&r.a, "served", "unknown_key"),
        forwarded_unknown
    );
    let b_log = r.b.log();
    let limited_lines = b_log.matches("cancel forwarding rate-limited").count();
    println!("B log lines \"cancel forwarding rate-limited\": {limited_lines}");
    assert_eq!(limited_lines as f64, limited);
    // The whole 3.2-length secret reached A.
    assert!(
        r.a.log().contains("secret_len=32"),
        "A saw the long key whole:\n{}",
        r.a.log()
    );
    // A answered from its own keys and forwarded nothing on: requests cannot loop.
    for outcome in ["cancelled", "unknown_key", "unroutable", "rate_limited"] {
        assert_eq!(peer_cancels(&r.a, "forwarded", outcome), 0.0);
    }
}
