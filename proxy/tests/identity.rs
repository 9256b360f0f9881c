//! The process id a client is given is its backend's (issue 46): what `pg_backend_pid()` says,
//! what `pg_terminate_backend` and `pg_cancel_backend` act on, and what the session's own
//! notifications carry, also after the session moved; and a parked session's id never names a
//! backend serving another session. Real gateway, real local Postgres, tokio-postgres.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, PARK_ON_OWN, backend_pid, issued_key};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

async fn gateway(extra: &'static str) -> Gateway {
    let tenants = Gateway::local_tenants(&["who"], "");
    tokio::task::spawn_blocking(move || Gateway::launch(extra, &tenants, &[]))
        .await
        .unwrap()
}

/// A session through the gateway, with the notifications it receives.
async fn connect(gw: &Gateway) -> (Client, mpsc::UnboundedReceiver<Notification>) {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=who.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    );
    let (client, mut conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send(n);
            }
        }
    });
    (client, rx)
}

fn parks(gw: &Gateway) -> f64 {
    gw.labelled_metric("pgwake_parks_total", &[("reason", "session_idle")])
}

async fn wait_parked(gw: &Gateway, before: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while parks(gw) <= before {
        assert!(Instant::now() < deadline, "the session parks");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_given_its_backends_pid_and_can_end_its_own_backend() {
    let gw = gateway("allow_plaintext = true\n").await;
    let (a, _) = connect(&gw).await;
    let (given, _) = issued_key(&a.cancel_token()).await;
    let real = backend_pid(&a).await;
    println!("given pid {given}, pg_backend_pid() {real}");
    assert_eq!(given, real, "the client's pid is its backend's");

    let (b, _) = connect(&gw).await;
    let running = tokio::spawn(async move {
        let r = a.batch_execute("select pg_sleep(30)").await;
        (a, r)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled: bool = b
        .query_one("select pg_cancel_backend($1)", &[&given])
        .await
        .unwrap()
        .get(0);
    assert!(cancelled, "pg_cancel_backend finds the client's pid");
    let (a, r) = running.await.unwrap();
    let e = r.expect_err("the sleep was cancelled");
    assert_eq!(e.code(), Some(&SqlState::QUERY_CANCELED), "{e}");

    let ended: bool = b
        .query_one("select pg_terminate_backend($1)", &[&given])
        .await
        .unwrap()
        .get(0);
    assert!(ended, "pg_terminate_backend finds the client's pid");
    let e = a
        .batch_execute("select 1")
        .await
        .expect_err("a session whose backend was terminated ends, as directly");
    println!("after pg_terminate_backend: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_sessions_pid_names_no_other_sessions_backend() {
    let gw = gateway(PARK_ON_OWN).await;
    let (a, _) = connect(&gw).await;
    let (given, _) = issued_key(&a.cancel_token()).await;
    let before = parks(&gw);
    assert_eq!(given, backend_pid(&a).await);
    wait_parked(&gw, before).await;

    // A's backend was not handed on while A lives: a new session gets another process.
    let (b, _) = connect(&gw).await;
    let b_pid = backend_pid(&b).await;
    let (b_given, _) = issued_key(&b.cancel_token()).await;
    assert_eq!(b_given, b_pid);
    assert_ne!(
        b_pid, given,
        "a parked session's backend serves no other session"
    );
    let holders: i64 = b
        .query_one(
            "select count(*) from pg_stat_activity where pid = $1",
            &[&given],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holders, 0, "no backend holds the parked session's pid");

    // Revived, A runs on another process; its key still cancels its queries.
    let now = backend_pid(&a).await;
    println!("A given {given}, revived on {now}; B on {b_pid}");
    assert_ne!(now, given);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_notifications_carry_the_clients_pid_after_a_move() {
    let gw = gateway(PARK_ON_OWN).await;
    let (a, mut notes) = connect(&gw).await;
    let (given, _) = issued_key(&a.cancel_token()).await;
    let before = parks(&gw);
    a.batch_execute("select 1").await.unwrap();
    wait_parked(&gw, before).await;
    // Revived on another backend, then pinned by LISTEN.
    a.batch_execute("listen news").await.unwrap();
    let moved_to = backend_pid(&a).await;
    assert_ne!(moved_to, given, "the session moved");

    let (other, _) = connect(&gw).await;
    let other_pid = backend_pid(&other).await;
    other.batch_execute("notify news, 'theirs'").await.unwrap();
    a.batch_execute("notify news, 'mine'").await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let n = tokio::time::timeout(Duration::from_secs(10), notes.recv())
            .await
            .expect("both notifications arrive")
            .unwrap();
        seen.push((n.payload().to_string(), n.process_id()));
    }
    println!("given {given}, backend {moved_to}, other {other_pid}: {seen:?}");
    assert!(seen.contains(&("mine".to_string(), given)), "{seen:?}");
    assert!(
        seen.contains(&("theirs".to_string(), other_pid)),
        "{seen:?}"
    );
}
