//! A move never changes what a session does: the cases a careful user of session state found
//! (issue 26), each driven through a real gateway, real local Postgres and tokio-postgres, with
//! the session parked and revived between steps (`revival.park_session_after`). Either the
//! session moves and behaves as it did, or it stays pinned to its backend connection.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, LOCAL_PASSWORD, PARK_ON_OWN};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

async fn gateway(cap: Option<u32>) -> Gateway {
    gateway_with(cap, "").await
}

/// A gateway with `revival` lines added to [`PARK_ON_OWN`]'s `[revival]` section.
async fn gateway_with(cap: Option<u32>, revival: &str) -> Gateway {
    let mut tenants = Gateway::local_tenants(&["m"], "");
    if let Some(cap) = cap {
        tenants.push_str(&format!("max_backend_connections = {cap}\n"));
    }
    let extra = format!("{PARK_ON_OWN}{revival}");
    tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap()
}

async fn connect(gw: &Gateway) -> Client {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=m.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// A second session for another user's statements (DDL, functions, roles): it holds a
/// temporary table, so it never parks and every park counted is the session under test's.
async fn connect_other(gw: &Gateway) -> Client {
    let other = connect(gw).await;
    other
        .batch_execute("create temp table stay_here()")
        .await
        .unwrap();
    other
}

fn parks(gw: &Gateway) -> f64 {
    gw.labelled_metric("pgwake_parks_total", &[("reason", "session_idle")])
}

/// Waits for the session that just ran something to park (true), or gives up after 2 s, by
/// which time a movable session has parked many times over (false: it is pinned).
async fn parked_since(gw: &Gateway, before: f64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if parks(gw) > before {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Runs `sql`, then lets the session park; returns whether it did.
async fn run_then_park(gw: &Gateway, c: &Client, sql: &str) -> bool {
    let before = parks(gw);
    c.batch_execute(sql).await.unwrap();
    parked_since(gw, before).await
}

async fn text(c: &Client, sql: &str) -> Option<String> {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_after_a_write_never_runs_the_write_again() {
    let gw = gateway(None).await;
    let c = connect(&gw).await;
    c.batch_execute("create table audit(note text)")
        .await
        .unwrap();
    let moved = run_then_park(
        &gw,
        &c,
        "insert into audit(note) values ('once'); prepare p as select 1",
    )
    .await;
    assert!(moved, "the session parks");
    for _ in 0..3 {
        let before = parks(&gw);
        let n: i64 = c
            .query_one("select count(*) from audit", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "the insert ran once");
        assert!(parked_since(&gw, before).await);
    }
    let one: i32 = c.query_one("execute p", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    // Two PREPAREs and a semicolon in a literal in one text: each is made again on its own.
    let moved = run_then_park(
        &gw,
        &c,
        "prepare a as select 'x;y'::text; /* ; */ prepare b(int) as select $1 + 1",
    )
    .await;
    assert!(moved);
    assert_eq!(text(&c, "execute a").await.as_deref(), Some("x;y"));
    let two: i32 = c.query_one("execute b(1)", &[]).await.unwrap().get(0);
    assert_eq!(two, 2);
    let n: i64 = c
        .query_one("select count(*) from audit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_made_by_bound_parameters_functions_and_long_texts_survive() {
    let gw = gateway(None).await;
    let other = connect_other(&gw).await;
    other
        .batch_execute(
            "create function set_tenant(t text) returns void language plpgsql as \
             $$ begin perform set_config('app.tenant', t, false); end $$",
        )
        .await
        .unwrap();
    let c = connect(&gw).await;
    let before = parks(&gw);
    c.query("select set_config($1, $2, false)", &[&"app.bound", &"b1"])
        .await
        .unwrap();
    c.query("select set_tenant($1)", &[&"acme"]).await.unwrap();
    let long = format!("select '{}'; set app.late = 'l1'", "x".repeat(2000));
    c.batch_execute(&long).await.unwrap();
    c.batch_execute("do $$ begin perform set_config('app.in_do', 'd1', false); end $$")
        .await
        .unwrap();
    assert!(parked_since(&gw, before).await, "the session parks");
    for (name, want) in [
        ("app.bound", "b1"),
        ("app.tenant", "acme"),
        ("app.late", "l1"),
        ("app.in_do", "d1"),
    ] {
        let got = text(&c, &format!("select current_setting('{name}', true)")).await;
        assert_eq!(got.as_deref(), Some(want), "{name} after the move");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporary_functions_and_setseed_pin_the_session() {
    let gw = gateway(None).await;
    let c = connect(&gw).await;
    let moved = run_then_park(
        &gw,
        &c,
        "create function pg_temp.tf() returns int language sql as 'select 7'",
    )
    .await;
    assert!(!moved, "a temporary function pins the session");
    let pins = |reason| gw.labelled_metric("pgwake_session_pins_total", &[("reason", reason)]);
    assert!(pins("temp_objects") >= 1.0);
    let seven: i32 = c
        .query_one("select pg_temp.tf()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seven, 7);

    let c = connect(&gw).await;
    let moved = run_then_park(&gw, &c, "select setseed(0.5)").await;
    assert!(!moved, "setseed pins the session");
    assert!(pins("random_seed") >= 1.0);
    let got: Vec<f64> = c
        .query("select random() from generate_series(1, 3)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The same steps on a session that has no time to move in between.
    let reference = connect(&gw).await;
    reference
        .batch_execute("select setseed(0.5)")
        .await
        .unwrap();
    let want: Vec<f64> = reference
        .query("select random() from generate_series(1, 3)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, want, "the seeded sequence goes on as it began");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_state_pins_only_where_it_could_be_read_by_default() {
    let pins = |gw: &Gateway| {
        gw.labelled_metric("pgwake_session_pins_total", &[("reason", "sequence_state")])
    };
    let fresh_table = async |gw: &Gateway| {
        connect_other(gw)
            .await
            .batch_execute(
                "drop table if exists seq_rows; create table seq_rows (id serial, v int)",
            )
            .await
            .unwrap();
    };

    // By default (auto) a session that draws moves while nothing could read the state…
    let auto = gateway(None).await;
    fresh_table(&auto).await;
    let c = connect(&auto).await;
    assert!(
        run_then_park(
            &auto,
            &c,
            "insert into seq_rows (v) values (1) returning id"
        )
        .await
    );
    assert_eq!(pins(&auto), 0.0);
    // …and stays once the database holds code that reads it, which answers as it did.
    connect_other(&auto)
        .await
        .batch_execute(
            "create function last_seq_row() returns bigint language sql \
             as 'select currval(''seq_rows_id_seq'')'",
        )
        .await
        .unwrap();
    let c = connect(&auto).await;
    let moved = run_then_park(&auto, &c, "insert into seq_rows (v) values (2)").await;
    assert!(
        !moved,
        "a function that reads currval pins a session that drew"
    );
    assert!(pins(&auto) >= 1.0);
    let read = text(&c, "select last_seq_row()::text").await;
    let max = text(&c, "select max(id)::text from seq_rows").await;
    assert_eq!(read, max);
    // A session that never drew moves all the same.
    let c = connect(&auto).await;
    assert!(run_then_park(&auto, &c, "select count(*) from seq_rows").await);

    // With "pin" drawing alone pins, and currval answers as it did.
    let strict = gateway_with(None, "sequence_state = \"pin\"\n").await;
    fresh_table(&strict).await;
    let c = connect(&strict).await;
    let moved = run_then_park(&strict, &c, "insert into seq_rows (v) values (3)").await;
    assert!(!moved, "drawing from a sequence pins with \"pin\"");
    assert!(pins(&strict) >= 1.0);
    let drawn = text(&c, "select currval('seq_rows_id_seq')::text").await;
    let max = text(&c, "select max(id)::text from seq_rows").await;
    assert_eq!(drawn, max);
    // DISCARD SEQUENCES forgets the state: the session moves again.
    assert!(run_then_park(&strict, &c, "discard sequences").await);
    // A session that never drew moves.
    let c = connect(&strict).await;
    assert!(run_then_park(&strict, &c, "select 1").await);

    // revival.sequence_state = "pin_if_read": a session that inserts rows and never reads
    // currval keeps moving (its tenant can sleep).
    let gw = gateway_with(None, "sequence_state = \"pin_if_read\"\n").await;
    fresh_table(&gw).await;
    let c = connect(&gw).await;
    assert!(run_then_park(&gw, &c, "insert into seq_rows (v) values (1)").await);
    assert_eq!(pins(&gw), 0.0);

    // Once it has read currval it stays, and currval and lastval answer as they did.
    let c = connect(&gw).await;
    let moved = run_then_park(
        &gw,
        &c,
        "insert into seq_rows (v) values (2); select currval('seq_rows_id_seq')",
    )
    .await;
    assert!(!moved, "a session that reads currval after drawing stays");
    assert!(pins(&gw) >= 1.0);
    let drawn = text(&c, "select currval('seq_rows_id_seq')::text").await;
    let last = text(&c, "select lastval()::text").await;
    assert_eq!(drawn, last);
    let max = text(&c, "select max(id)::text from seq_rows").await;
    assert_eq!(drawn, max);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_restored_fails_at_its_use_not_at_the_revival() {
    let gw = gateway(None).await;
    let other = connect_other(&gw).await;
    other
        .batch_execute("create table t7(a int); insert into t7 values (1); create role r0")
        .await
        .unwrap();
    let c = connect(&gw).await;
    let before = parks(&gw);
    let stmt = c.prepare("select a from t7").await.unwrap();
    // Recorded at rest before the identity changes, so the statement's context is known.
    assert!(parked_since(&gw, before).await, "the session parks");
    let before = parks(&gw);
    c.batch_execute("set log_min_duration_statement = 100; set session authorization r0")
        .await
        .unwrap();
    assert!(parked_since(&gw, before).await, "the session parks");
    other.batch_execute("drop table t7").await.unwrap();
    // Any other query works; the session is still r0 with the superuser-only setting.
    assert_eq!(
        text(&c, "select current_user::text").await.as_deref(),
        Some("r0")
    );
    assert_eq!(
        text(&c, "select current_setting('log_min_duration_statement')")
            .await
            .as_deref(),
        Some("100ms")
    );
    let err = c.query(&stmt, &[]).await.unwrap_err();
    assert!(err.as_db_error().is_some(), "{err}");
    assert_ne!(err.as_db_error().map(|e| e.severity()), Some("FATAL"));
    assert_eq!(text(&c, "select 'alive'").await.as_deref(), Some("alive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_sessions_cancel_never_reaches_another_session() {
    let gw = gateway(Some(1)).await;
    let a = connect(&gw).await;
    let before = parks(&gw);
    a.batch_execute("select 1").await.unwrap();
    assert!(
        parked_since(&gw, before).await,
        "a parks and frees the only slot"
    );
    let b = connect(&gw).await;
    let sleeping = tokio::spawn(async move {
        let r = b.batch_execute("select pg_sleep(2)").await;
        (b, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.cancel_token().cancel_query(NoTls).await.unwrap();
    // a's next query waits for the slot b holds; its cancel ends that wait.
    let token = a.cancel_token();
    let waiting = tokio::spawn(async move { a.batch_execute("select 1").await.map(|_| a) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    token.cancel_query(NoTls).await.unwrap();
    let err = match waiting.await.unwrap() {
        Ok(_) => panic!("the waiting query was not cancelled"),
        Err(e) => e,
    };
    assert_eq!(err.code(), Some(&SqlState::QUERY_CANCELED), "{err}");
    let (b, r) = sleeping.await.unwrap();
    r.expect("b's query ran to its end, untouched by a's cancels");
    assert_eq!(text(&b, "select 'b'").await.as_deref(), Some("b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_statement_whose_rows_changed_while_parked_fails_with_0a000() {
    let gw = gateway(None).await;
    let other = connect_other(&gw).await;
    other
        .batch_execute("create table gt(a int, b int); insert into gt values (1, 2)")
        .await
        .unwrap();
    let c = connect(&gw).await;
    let stmt = c.prepare("select * from gt where b = $1").await.unwrap();
    let unchanged = c.prepare("select b from gt").await.unwrap();
    let before = parks(&gw);
    c.query(&stmt, &[&2i32]).await.unwrap();
    assert!(parked_since(&gw, before).await, "the session parks");
    other
        .batch_execute(
            "alter table gt drop column a; alter table gt add column a int; update gt set a = 1",
        )
        .await
        .unwrap();
    // Postgres answers this for a cached statement whose result changed; drivers prepare
    // again when they see it.
    for _ in 0..2 {
        let err = c.query(&stmt, &[&2i32]).await.unwrap_err();
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code(), &SqlState::FEATURE_NOT_SUPPORTED, "{err}");
        assert_eq!(db.message(), "cached plan must not change result type");
        assert_eq!(db.routine(), Some("RevalidateCachedQuery"));
    }
    // A statement whose rows did not change works, and so does the stale one prepared again.
    let row = c.query_one(&unchanged, &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    let again = c.prepare("select * from gt where b = $1").await.unwrap();
    let row = c.query_one(&again, &[&2i32]).await.unwrap();
    let names: Vec<&str> = row.columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["b", "a"]);
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (2, 1));
    // Stale still after another move, until the client closes it.
    let before = parks(&gw);
    c.batch_execute("select 1").await.unwrap();
    assert!(parked_since(&gw, before).await);
    let err = c.query(&stmt, &[&2i32]).await.unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{err}");
}

/// asyncpg with its statement cache: one query, a line on stdin, the same query again.
const ASYNCPG_CACHED: &str = r#"
import asyncio, sys, asyncpg
async def main():
    c = await asyncpg.connect(sys.argv[1])
    async def run():
        try:
            r = await c.fetchrow(sys.argv[2])
            return " ".join(f"{k}={v}" for k, v in r.items())
        except Exception as e:
            return f"error {type(e).__name__} {e}"
    print(await run(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(await run(), flush=True)
asyncio.run(main())
"#;

/// How to start one run of a driver program.
type Launcher = Box<dyn Fn() -> std::process::Command>;

/// The drivers that cache statements with their row descriptions, as programs that take the
/// URL and query; `None` when the runtime is missing here.
fn caching_drivers() -> Vec<(&'static str, Option<Launcher>)> {
    use std::process::Command;
    let python = Command::new("python3")
        .args(["-c", "import asyncpg"])
        .status()
        .is_ok_and(|s| s.success());
    let asyncpg = python.then(|| -> Launcher {
        Box::new(|| {
            let mut c = Command::new("python3");
            c.args(["-c", ASYNCPG_CACHED]);
            c
        })
    });
    let go = std::env::var("PGWAKE_GO")
        .ok()
        .into_iter()
        .chain(["go".to_owned(), "/usr/local/go/bin/go".to_owned()])
        .find(|go| Command::new(go).arg("version").output().is_ok());
    let pgx = go.map(|go| -> Launcher {
        let bin = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("pgx-cached");
        let built = Command::new(go)
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pgx-cached"))
            .status()
            .unwrap();
        assert!(built.success(), "go build of tests/pgx-cached");
        Box::new(move || Command::new(&bin))
    });
    vec![("asyncpg", asyncpg), ("pgx", pgx)]
}

/// Runs a caching driver's two queries against `url`, with the table reshaped in between by
/// `other`; through the gateway (`gw`), the session parks first. Returns the two lines printed.
async fn reshaped_under(
    mut command: std::process::Command,
    url: &str,
    table: &str,
    other: &Client,
    gw: Option<&Gateway>,
) -> (String, String) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    other
        .batch_execute(&format!(
            "create table {table}(a int, b int); insert into {table} values (1, 2)"
        ))
        .await
        .unwrap();
    let before = gw.map(parks);
    let mut child = command
        .arg(url)
        .arg(format!("select * from {table} where b = 2"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    if let (Some(gw), Some(before)) = (gw, before) {
        assert!(parked_since(gw, before).await, "the session parks: {first}");
    }
    other
        .batch_execute(&format!(
            "alter table {table} drop column a; alter table {table} add column a int; \
             update {table} set a = 1"
        ))
        .await
        .unwrap();
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let mut second = String::new();
    out.read_line(&mut second).unwrap();
    assert!(child.wait().unwrap().success());
    (first.trim().to_owned(), second.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncpg_and_pgx_meet_reshaped_tables_after_a_move_as_they_do_directly() {
    let gw = gateway(None).await;
    let through = connect(&gw).await;
    let pg = tokio::task::spawn_blocking(common::backend).await.unwrap();
    let (direct, conn) = tokio_postgres::connect(&pg.conn_str("postgres"), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let gateway_url = format!(
        "postgres://pgwake:{LOCAL_PASSWORD}@127.0.0.1:{}/m.postgres?sslmode=disable",
        gw.port
    );
    let o = &pg.options;
    let direct_url = format!(
        "postgres://{}:{}@127.0.0.1:{}/postgres?sslmode=disable",
        o.user, o.password, pg.port
    );
    for (driver, launcher) in caching_drivers() {
        let Some(launch) = launcher else {
            println!("{driver}: runtime missing here, skipped");
            continue;
        };
        let table = format!("gt_{driver}");
        let want = reshaped_under(launch(), &direct_url, &table, &direct, None).await;
        let got = reshaped_under(launch(), &gateway_url, &table, &through, Some(&gw)).await;
        println!("{driver}: directly {want:?}, through pgwake {got:?}");
        assert_eq!(got, want, "{driver}");
    }
}

/// A session's own `idle_session_timeout` ends it as Postgres would (FATAL `57P05`), also while
/// it is parked and its backend, whose timer it was, is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_timeout_ends_a_parked_session() {
    let gw = gateway(None).await;
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname=m.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    );
    let (c, conn) = tokio_postgres::connect(&conninfo, NoTls).await.unwrap();
    let ended = tokio::spawn(conn);
    let before = parks(&gw);
    c.batch_execute("set idle_session_timeout = '1500ms'")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(parked_since(&gw, before).await, "the session parks");
    let end = tokio::time::timeout(Duration::from_secs(10), ended).await;
    let end = end
        .unwrap_or_else(|_| panic!("the idle session is ended: {}", gw.log()))
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1400));
    let err = end.expect_err("ended with an error");
    assert_eq!(err.code(), Some(&SqlState::IDLE_SESSION_TIMEOUT), "{err}");
    // A session that keeps talking within its timeout is not ended.
    let c = connect(&gw).await;
    c.batch_execute("set idle_session_timeout = '1500ms'")
        .await
        .unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.batch_execute("select 1").await.unwrap();
    }
}
