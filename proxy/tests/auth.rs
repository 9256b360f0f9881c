//! Authentication at the gateway: SCRAM (with channel binding over TLS) against static,
//! auth_query and local credential sources; wrong passwords never wake a tenant; throttling;
//! CIDR deny lists.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, backend, connections_seen};
use pgwake_testkit::TestPostgres;
use tokio_postgres::NoTls;

const PLAINTEXT: &str = "allow_plaintext = true";

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_owned()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// The server's message of a database error (tokio-postgres displays only "db error").
fn message(err: &tokio_postgres::Error) -> String {
    err.as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| format!("{err:?}"))
}

async fn try_login(
    gw: &Gateway,
    db: &str,
    user: &str,
    password: &str,
) -> Result<(), tokio_postgres::Error> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname={db} sslmode=disable",
        gw.port
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls).await?;
    tokio::spawn(conn);
    let row = client.query_one("select current_user::text", &[]).await?;
    assert_eq!(row.get::<_, String>(0), user);
    Ok(())
}

/// A static credentials file for `pg`'s superuser (its real verifier) and role `app` (password).
fn static_users(gw_dir: &std::path::Path, pg: &TestPostgres) -> String {
    let verifier = pg
        .psql(&format!(
            "select rolpassword from pg_authid where rolname = '{}'",
            pg.options.user
        ))
        .unwrap();
    pg.psql("create role app login password 'app-password'")
        .unwrap();
    let path = gw_dir.join("users.txt");
    std::fs::write(
        &path,
        format!(
            "\"{}\" \"{verifier}\"\n\"app\" \"app-password\"\n",
            pg.options.user
        ),
    )
    .unwrap();
    format!(
        "[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n\
         credentials = {{ kind = \"static\", file = \"{}\" }}\n",
        pg.port,
        path.display()
    )
}

#[test]
fn scram_at_the_gateway_with_psql_and_channel_binding() {
    let pg = backend();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::launch("", &static_users(dir.path(), &pg), &[]);
    let user = &pg.options.user;
    let base = "host=alpha.db.localtest hostaddr=127.0.0.1 sslmode=require dbname=postgres";
    for conninfo in [
        format!("{base} user={user}"),
        format!("{base} user={user} channel_binding=require"),
        format!("{base} user=app password=app-password channel_binding=require"),
    ] {
        let out = gw.psql(&pg, &conninfo, "select current_user");
        assert!(
            out.status.success(),
            "{conninfo}: {}\n{}",
            stderr(&out),
            gw.log()
        );
    }
    let wrong = gw.psql(
        &pg,
        &format!("{base} user={user} password=wrong"),
        "select 1",
    );
    let ghost = gw.psql(
        &pg,
        &format!("{base} user=ghost password=wrong"),
        "select 1",
    );
    let (wrong, ghost) = (stderr(&wrong), stderr(&ghost));
    assert!(
        wrong.contains(&format!(
            "password authentication failed for user \"{user}\""
        )),
        "{wrong}"
    );
    // An unknown user gets the very same answer, but for the name.
    let as_ghost = |s: &str| s.replace(&format!("user \"{user}\""), "user \"ghost\"");
    assert_eq!(as_ghost(&wrong), ghost);
    gw.wait_idle();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_logs_in_through_gateway_auth() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::launch(PLAINTEXT, &static_users(dir.path(), &pg), &[]);
    try_login(
        &gw,
        "alpha.postgres",
        &pg.options.user,
        &pg.options.password,
    )
    .await
    .expect("superuser via its own verifier");
    try_login(&gw, "alpha.postgres", "app", "app-password")
        .await
        .expect("app via the password");
    let err = try_login(&gw, "alpha.postgres", "app", "nope")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("28P01"), "{err:?}");
    assert_eq!(
        message(&err),
        "password authentication failed for user \"app\""
    );
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_never_wakes_the_tenant() {
    let gw = tokio::task::spawn_blocking(|| {
        Gateway::start_local(&["sleepy"], PLAINTEXT, "log_min_messages = 'log'", &[])
    })
    .await
    .unwrap();
    for user in ["pgwake", "nobody"] {
        let err = try_login(&gw, "sleepy.postgres", user, "wrong")
            .await
            .unwrap_err();
        assert_eq!(err.code().map(|c| c.code()), Some("28P01"), "{err:?}");
        assert_eq!(
            message(&err),
            format!("password authentication failed for user \"{user}\"")
        );
    }
    assert_eq!(gw.tenant_state("sleepy").0, "asleep");
    assert_eq!(
        gw.local_starts("sleepy"),
        0,
        "a wrong password started postgres"
    );
    assert_eq!(
        gw.metric("pgwake_auth_attempts_total{outcome=\"failed\"}"),
        2.0
    );
    try_login(&gw, "sleepy.postgres", "pgwake", LOCAL_PASSWORD)
        .await
        .expect("the right password wakes it");
    assert_eq!(gw.local_starts("sleepy"), 1);
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_throttled_and_success_clears_them() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "{PLAINTEXT}\n[auth]\nthrottle_free_failures = 2\nthrottle_base = \"1s\"\nthrottle_max = \"1s\"\n\
         [limits]\nauth_timeout = \"500ms\""
    );
    let gw = Gateway::launch(&extra, &static_users(dir.path(), &pg), &[]);
    // Exactly the free failures are evaluated.
    for _ in 0..2 {
        let err = try_login(&gw, "alpha.postgres", "app", "wrong")
            .await
            .unwrap_err();
        assert_eq!(err.code().map(|c| c.code()), Some("28P01"), "{err:?}");
    }
    // Throttled for longer than the login's deadline (a shorter wait would be sat out):
    // refused before any password exchange, even with the right password.
    let err = try_login(&gw, "alpha.postgres", "app", "app-password")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("28000"), "{err:?}");
    assert!(
        message(&err).contains("too many failed authentication attempts, retry in"),
        "{err:?}"
    );
    assert_eq!(
        gw.metric("pgwake_auth_attempts_total{outcome=\"throttled\"}"),
        1.0
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    try_login(&gw, "alpha.postgres", "app", "app-password")
        .await
        .expect("allowed after the delay");
    // The success cleared the history: the next failure is not throttled.
    let err = try_login(&gw, "alpha.postgres", "app", "wrong")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("28P01"));
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_query_reads_verifiers_caches_and_refreshes() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    // The lookup function PgBouncer documents: owned by a superuser, SECURITY DEFINER, callable
    // only by the lookup role.
    for sql in [
        "create role pgwake_auth login password 'lookup-password'",
        "create role app login password 'first-password'",
        "create schema pgwake",
        "create function pgwake.user_lookup(i_username text, out usename text, out passwd text) \
         returns record language sql security definer as \
         $$ select usename::text, passwd::text from pg_catalog.pg_shadow where usename = i_username $$",
        "revoke all on function pgwake.user_lookup(text) from public",
        "grant usage on schema pgwake to pgwake_auth",
        "grant execute on function pgwake.user_lookup(text) to pgwake_auth",
    ] {
        pg.psql(sql).unwrap();
    }
    let tenants = format!(
        "[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n\
         credentials = {{ kind = \"auth_query\", user = \"pgwake_auth\", password = \"lookup-password\" }}\n",
        pg.port
    );
    let gw = Gateway::launch(PLAINTEXT, &tenants, &[]);
    let lookups = |pg: &TestPostgres| {
        pg.log()
            .matches("connection authorized: user=pgwake_auth")
            .count()
    };
    try_login(&gw, "alpha.postgres", "app", "first-password")
        .await
        .unwrap();
    try_login(&gw, "alpha.postgres", "app", "first-password")
        .await
        .unwrap();
    assert_eq!(lookups(&pg), 1, "the verifier was not cached");
    let err = try_login(&gw, "alpha.postgres", "ghost", "x")
        .await
        .unwrap_err();
    assert_eq!(
        message(&err),
        "password authentication failed for user \"ghost\""
    );

    pg.psql("alter role app password 'second-password'")
        .unwrap();
    // The cached verifier is stale: the first attempt fails and drops it, the next reads the
    // new one.
    let started = Instant::now();
    let mut attempts = 0;
    while try_login(&gw, "alpha.postgres", "app", "second-password")
        .await
        .is_err()
    {
        attempts += 1;
        assert!(
            attempts < 2 && started.elapsed() < Duration::from_secs(10),
            "never refreshed"
        );
    }
    let err = try_login(&gw, "alpha.postgres", "app", "first-password")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("28P01"));
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[test]
fn denied_network_gets_the_unknown_tenant_answer() {
    let pg = backend();
    let dir = tempfile::tempdir().unwrap();
    let tenants = static_users(dir.path(), &pg) + "deny = [\"127.0.0.0/8\"]\n";
    let gw = Gateway::launch("", &tenants, &[]);
    let seen = connections_seen(&pg);
    let user = &pg.options.user;
    let denied = gw.psql(
        &pg,
        &format!(
            "host=alpha.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} dbname=postgres"
        ),
        "select 1",
    );
    let unknown = gw.psql(
        &pg,
        &format!("host=nosuch.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} dbname=postgres"),
        "select 1",
    );
    assert!(stdout(&denied).is_empty());
    // By default both are answered as a wrong password (routing.unknown_tenant).
    assert!(
        stderr(&denied).contains(&format!(
            "password authentication failed for user \"{user}\""
        )),
        "{}",
        stderr(&denied)
    );
    assert_eq!(stderr(&denied), stderr(&unknown));
    assert_eq!(connections_seen(&pg), seen);
    gw.wait_idle();
}

#[test]
fn a_mistyped_tenant_reads_as_a_wrong_password_to_the_client_only() {
    let pg = backend();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::launch("", &static_users(dir.path(), &pg), &[]);
    let user = &pg.options.user;
    let login = |host: &str, password: &str| {
        gw.psql(
            &pg,
            &format!(
                "host={host}.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} \
                 password={password} dbname=postgres"
            ),
            "select 1",
        )
    };
    let typo = login("alpah", &pg.options.password);
    let wrong = login("alpha", "not-the-password");
    // The client cannot tell a tenant that does not exist from a wrong password.
    assert!(
        stderr(&wrong).contains(&format!(
            "password authentication failed for user \"{user}\""
        )),
        "{}",
        stderr(&wrong)
    );
    assert_eq!(stderr(&typo), stderr(&wrong));

    // The operator can.
    let log = gw.log();
    assert!(log.contains("unknown tenant \"alpah\""), "{log}");
    let errors = |kind: &str| gw.labelled_metric("pgwake_errors_total", &[("kind", kind)]);
    assert_eq!(
        (errors("unknown_tenant"), errors("auth_failed")),
        (1.0, 1.0)
    );
    let attempts =
        |outcome: &str| gw.labelled_metric("pgwake_auth_attempts_total", &[("outcome", outcome)]);
    assert_eq!((attempts("unknown_tenant"), attempts("failed")), (1.0, 1.0));
    gw.wait_idle();
}
