//! The gateway's own look at an idle session (its state check, `revival.snapshot_after`) never
//! waits long on a lock another session holds. While it waited, the session's client was not
//! served; an application whose other connection held the lock (a `DROP` or `LOCK` inside a
//! transaction it keeps open, as psycopg's test suite does between its connections) waited for
//! a result that never came, until the check's deadline (`limits.login_timeout`) ended the
//! session. Real Postgres, real tokio-postgres clients: one through pgwake, one directly.

mod common;

use std::time::Duration;

use common::{Gateway, backend, backend_pid, connect_plain, verified_fixed_tenant};

/// Plaintext clients and a state check 100 ms after a session comes to rest.
const CONFIG: &str = "allow_plaintext = true
[revival]
snapshot_after = \"100ms\"
";

/// A gateway with tenant `alpha` on a fresh Postgres, a client through it and one directly
/// (the gateway, the Postgres server and the folder are kept alive with them).
async fn clients() -> (
    tokio_postgres::Client,
    tokio_postgres::Client,
    (Gateway, pgwake_testkit::TestPostgres, tempfile::TempDir),
) {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tenants = verified_fixed_tenant(dir.path(), &pg);
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(CONFIG, &tenants, &[]))
        .await
        .unwrap();
    let (user, password) = (&pg.options.user, &pg.options.password);
    let through = connect_plain(&format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=postgres \
         options='endpoint=alpha' sslmode=disable",
        gw.port
    ))
    .await;
    let direct = connect_plain(&format!(
        "host=127.0.0.1 port={} user={user} password={password} dbname=postgres sslmode=disable",
        pg.port
    ))
    .await;
    (through, direct, (gw, pg, dir))
}

/// Takes a lock on the direct connection with `lock_sql` (which opens a transaction), waits
/// until the idle session's state check has begun under it, checks that the session's next
/// query is answered, and rolls the lock back.
async fn answers_while_locked(
    through: &tokio_postgres::Client,
    direct: &tokio_postgres::Client,
    lock_sql: &str,
) {
    direct.batch_execute(lock_sql).await.unwrap();
    // Quiet for ten times snapshot_after: the state check has begun while the lock is held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let one: i32 = through
        .query_one("SELECT 1", &[])
        .await
        .expect("the idle session answers while another session holds a lock")
        .get(0);
    assert_eq!(one, 1);
    direct.batch_execute("ROLLBACK").await.unwrap();
}
/// A session that drew from a sequence and read it is checked for sequence state (`lastval`
/// locks the sequence it names). Another connection drops that sequence in a transaction it
/// keeps open; the idle session's next query is answered at once, its backend connection and
/// its sequence state are still there once the other transaction rolls back, and the gateway
/// ended nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_check_does_not_wait_for_another_sessions_lock_on_a_sequence() {
    let (through, direct, (gw, _pg, _dir)) = clients().await;
    direct.batch_execute("CREATE SEQUENCE s").await.unwrap();
    let drawn: i64 = through
        .query_one("SELECT nextval('s')", &[])
        .await
        .unwrap()
        .get(0);
    let read: i64 = through
        .query_one("SELECT currval('s')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(drawn, read);
    let pid = backend_pid(&through).await;
    answers_while_locked(&through, &direct, "BEGIN; DROP SEQUENCE s").await;
    let (now_pid, now_read): (i32, i64) = {
        let row = through
            .query_one("SELECT pg_backend_pid(), currval('s')", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (now_pid, now_read),
        (pid, drawn),
        "the session stays on its backend with its sequence state"
    );
    let log = gw.log();
    assert!(!log.contains("session ended"), "no session ended: {log}");
}

/// The same with a prepared statement: the check describes it again (Postgres locks the table
/// it names to do so) while another connection holds `ACCESS EXCLUSIVE` on that table in a
/// transaction it keeps open. The idle session's next query is answered at once, and its
/// statement works on the same backend once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_check_does_not_wait_for_another_sessions_lock_on_a_table() {
    let (through, direct, (gw, _pg, _dir)) = clients().await;
    direct
        .batch_execute("CREATE TABLE t (a int); INSERT INTO t VALUES (7)")
        .await
        .unwrap();
    let stmt = through.prepare("SELECT a FROM t").await.unwrap();
    assert_eq!(
        through
            .query_one(&stmt, &[])
            .await
            .unwrap()
            .get::<_, i32>(0),
        7
    );
    let pid = backend_pid(&through).await;
    answers_while_locked(&through, &direct, "BEGIN; LOCK t IN ACCESS EXCLUSIVE MODE").await;
    assert_eq!(
        through
            .query_one(&stmt, &[])
            .await
            .unwrap()
            .get::<_, i32>(0),
        7
    );
    assert_eq!(
        backend_pid(&through).await,
        pid,
        "the session stays on its backend"
    );
    let log = gw.log();
    assert!(!log.contains("session ended"), "no session ended: {log}");
}
