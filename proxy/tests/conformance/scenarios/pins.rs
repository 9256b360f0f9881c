//! State the gateway cannot carry to a new backend connection, which must keep the session
//! where it is (advisory locks, LISTEN, held cursors, open and failed transactions, sequence
//! state), and the ordinary traffic around moves: COPY both ways, notices, empty queries,
//! several results in one query, errors.

use super::super::dsl::*;
use super::super::run::Scenario;

pub fn all() -> Vec<Scenario> {
    vec![
        sc(
            "advisory_lock_session",
            vec![
                q("SELECT pg_advisory_lock(42)"),
                side("SELECT pg_try_advisory_lock(42)"),
                q(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
                ),
                side("SELECT pg_try_advisory_lock(42)"),
                q("SELECT pg_advisory_unlock(42)"),
                side("SELECT pg_try_advisory_lock(42)"),
            ],
        ),
        sc_setup(
            "advisory_lock_under_a_shadowing_search_path",
            "CREATE SCHEMA shadow; \
             CREATE VIEW shadow.pg_locks AS SELECT * FROM pg_catalog.pg_locks WHERE false; \
             CREATE VIEW shadow.pg_settings AS SELECT * FROM pg_catalog.pg_settings WHERE false",
            vec![
                q("SET search_path = shadow, pg_catalog"),
                q("SELECT pg_advisory_lock(77)"),
                side("SELECT pg_try_advisory_lock(77)"),
                q("SHOW search_path"),
                side("SELECT pg_try_advisory_lock(77)"),
                q("SELECT pg_advisory_unlock(77)"),
            ],
        ),
        sc(
            "advisory_lock_shared",
            vec![
                q("SELECT pg_advisory_lock_shared(7)"),
                side("SELECT pg_try_advisory_lock(7)"),
                q("SELECT pg_advisory_unlock_shared(7)"),
                side("SELECT pg_try_advisory_lock(7)"),
            ],
        ),
        sc(
            "advisory_lock_taken_twice",
            vec![
                q("SELECT pg_advisory_lock(9); SELECT pg_advisory_lock(9)"),
                q("SELECT pg_advisory_unlock(9)"),
                side("SELECT pg_try_advisory_lock(9)"),
                q("SELECT pg_advisory_unlock(9)"),
                side("SELECT pg_try_advisory_lock(9)"),
            ],
        ),
        sc(
            "advisory_xact_lock_released_at_commit",
            vec![
                q("BEGIN; SELECT pg_advisory_xact_lock(5); COMMIT"),
                side("SELECT pg_try_advisory_lock(5)"),
                q("SELECT 1"),
            ],
        ),
        sc(
            "listen_notify",
            vec![
                q("LISTEN news"),
                side("NOTIFY news, 'first'"),
                q("SELECT 1"),
                side("NOTIFY news, 'second'"),
                q("SELECT 2"),
                q("UNLISTEN news"),
            ],
        ),
        sc(
            "listen_then_unlisten",
            vec![
                q("LISTEN gone"),
                q("UNLISTEN gone"),
                side("NOTIFY gone, 'nobody'"),
                q("SELECT 1"),
            ],
        ),
        sc(
            "notify_to_self",
            vec![
                q("LISTEN self; NOTIFY self, 'me'"),
                q("SELECT 1"),
                q("SELECT 2"),
            ],
        ),
        sc(
            "cursor_with_hold",
            vec![
                q("DECLARE c CURSOR WITH HOLD FOR SELECT id, v FROM t ORDER BY id"),
                q("FETCH 1 FROM c"),
                q("FETCH 1 FROM c"),
                q("FETCH ALL FROM c"),
                q("CLOSE c"),
            ],
        ),
        sc(
            "cursor_in_transaction",
            vec![
                q("BEGIN"),
                q("DECLARE c CURSOR FOR SELECT id FROM t ORDER BY id"),
                q("FETCH 2 FROM c"),
                q("FETCH 2 FROM c"),
                q("COMMIT"),
            ],
        ),
        sc(
            "open_transaction",
            vec![
                q("BEGIN"),
                q("INSERT INTO audit(note) VALUES ('in tx')"),
                side("SELECT count(*) FROM audit"),
                q("SELECT count(*) FROM audit"),
                q("COMMIT"),
                side("SELECT count(*) FROM audit"),
            ],
        ),
        sc(
            "open_transaction_rolled_back",
            vec![
                q("BEGIN; INSERT INTO audit(note) VALUES ('undone')"),
                q("SELECT count(*) FROM audit"),
                q("ROLLBACK"),
                q("SELECT count(*) FROM audit"),
            ],
        ),
        sc(
            "failed_transaction",
            vec![
                q("BEGIN"),
                q("SELECT 1/0"),
                q("SELECT 1"),
                q("ROLLBACK"),
                q("SELECT 2"),
            ],
        ),
        sc(
            "savepoints",
            vec![
                q("BEGIN; INSERT INTO audit(note) VALUES ('kept')"),
                q("SAVEPOINT s1; INSERT INTO audit(note) VALUES ('undone')"),
                q("ROLLBACK TO SAVEPOINT s1"),
                q("COMMIT"),
                q("SELECT note FROM audit ORDER BY ctid"),
            ],
        ),
        sc(
            "extended_protocol_transaction",
            vec![
                ext("BEGIN", &[], &[]),
                ext("INSERT INTO audit(note) VALUES ($1)", &[25], &["ext"]),
                ext("SELECT count(*) FROM audit", &[], &[]),
                ext("COMMIT", &[], &[]),
            ],
        ),
        sc(
            "serializable_snapshot_in_transaction",
            vec![
                q("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM t"),
                side("INSERT INTO t VALUES (10, 'ten')"),
                q("SELECT count(*) FROM t"),
                q("COMMIT"),
                q("SELECT count(*) FROM t"),
            ],
        ),
        sc(
            "sequence_currval_and_lastval",
            vec![
                q("CREATE SEQUENCE s"),
                q("SELECT nextval('s')"),
                q("SELECT currval('s')"),
                q("SELECT lastval()"),
            ],
        ),
        sc(
            "currval_read_then_kept_across_moves",
            vec![
                q("CREATE SEQUENCE s2"),
                q("SELECT nextval('s2'), currval('s2')"),
                q("SELECT currval('s2')"),
                q("SELECT nextval('s2'), lastval()"),
                q("DISCARD SEQUENCES"),
                q("SELECT 1"),
            ],
        ),
        sc(
            "serial_insert_then_lastval",
            vec![
                q("INSERT INTO counted(note) VALUES ('x')"),
                q("SELECT lastval()"),
                q("SELECT currval('counted_id_seq')"),
            ],
        ),
        // `sequence_state = "auto"`: a session that drew stays where it is only while
        // something could read what it drew.
        sc(
            "serial_insert_returning_moves",
            vec![
                q("INSERT INTO counted(note) VALUES ('a') RETURNING id"),
                q("INSERT INTO counted(note) VALUES ('b') RETURNING id"),
                q("SELECT id, note FROM counted ORDER BY id"),
                q("SELECT nextval('counted_id_seq')"),
                q("SELECT count(*) FROM counted"),
            ],
        ),
        sc(
            "sequence_read_in_the_same_text_as_the_draw",
            vec![
                q("INSERT INTO counted(note) VALUES ('x'); SELECT currval('counted_id_seq')"),
                q("SELECT lastval()"),
                q("INSERT INTO counted(note) VALUES ('y')"),
                q("SELECT currval('counted_id_seq')"),
            ],
        ),
        sc_setup(
            "sequence_read_by_a_function",
            "CREATE FUNCTION last_counted() RETURNS bigint LANGUAGE plpgsql \
             AS $$BEGIN RETURN currval('counted_id_seq'); END$$",
            vec![
                q("INSERT INTO counted(note) VALUES ('x')"),
                q("SELECT last_counted()"),
                q("SELECT last_counted()"),
            ],
        ),
        sc_setup(
            "sequence_read_by_an_atomic_sql_function",
            "CREATE FUNCTION last_any() RETURNS bigint LANGUAGE sql BEGIN ATOMIC \
             SELECT pg_catalog.\"lastval\"(); END",
            vec![
                q("INSERT INTO counted(note) VALUES ('x')"),
                q("SELECT last_any()"),
            ],
        ),
        sc_setup(
            "sequence_read_by_a_column_default",
            "CREATE TABLE counted_child (id int GENERATED ALWAYS AS IDENTITY, \
             parent int DEFAULT currval('counted_id_seq'), note text)",
            vec![
                q("INSERT INTO counted(note) VALUES ('x')"),
                q("INSERT INTO counted_child(note) VALUES ('child')"),
                q("SELECT parent, note FROM counted_child"),
            ],
        ),
        sc_setup(
            "sequence_read_by_a_view",
            "CREATE VIEW counted_last AS SELECT currval('counted_id_seq') AS id",
            vec![
                q("INSERT INTO counted(note) VALUES ('x')"),
                q("SELECT id FROM counted_last"),
            ],
        ),
        sc_setup(
            "sequence_drawn_then_set_role_without_rights",
            "CREATE FUNCTION last_counted() RETURNS bigint LANGUAGE sql \
             AS 'SELECT currval(''counted_id_seq'')'; \
             CREATE ROLE {db}_n; GRANT EXECUTE ON FUNCTION last_counted() TO {db}_n",
            vec![
                q("INSERT INTO counted(note) VALUES ('x')"),
                q("SET ROLE {db}_n"),
                q("SELECT 1"),
                q("RESET ROLE"),
                q("SELECT last_counted()"),
            ],
        ),
        sc_setup(
            "sequence_drawn_then_the_last_one_dropped",
            "CREATE SEQUENCE sa; CREATE SEQUENCE sb; \
             CREATE FUNCTION read_sa() RETURNS bigint LANGUAGE sql AS 'SELECT currval(''sa'')'",
            vec![
                q("SELECT nextval('sa') > 0"),
                q("SELECT nextval('sb') > 0"),
                q("DROP SEQUENCE sb"),
                q("SELECT 1"),
                q("SELECT read_sa()"),
            ],
        ),
        sc(
            "sequence_first_read_after_a_move",
            vec![
                q("INSERT INTO counted(note) VALUES ('x') RETURNING id"),
                q("SELECT currval('counted_id_seq')"),
            ],
        ),
        sc(
            "copy_out",
            vec![
                q("COPY t TO STDOUT"),
                q("COPY (SELECT id * 2 FROM t ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER)"),
                q("COPY t TO STDOUT"),
            ],
        ),
        sc(
            "copy_in",
            vec![
                copy_in("COPY audit(note) FROM STDIN", "a\nb\nc\n"),
                q("SELECT count(*) FROM audit"),
                copy_in("COPY audit(note) FROM STDIN", "d\n"),
                q("SELECT note FROM audit ORDER BY ctid"),
            ],
        ),
        sc(
            "copy_in_bad_data",
            vec![
                copy_in("COPY t FROM STDIN", "x\ty\n"),
                q("SELECT count(*) FROM t"),
            ],
        ),
        sc(
            "notices_and_client_min_messages",
            vec![
                q("DO $$ BEGIN RAISE NOTICE 'hello'; END $$"),
                q("SET client_min_messages = warning"),
                q("DO $$ BEGIN RAISE NOTICE 'hidden'; RAISE WARNING 'shown'; END $$"),
                q("DROP TABLE IF EXISTS nothing_here"),
            ],
        ),
        sc(
            "several_results_in_one_query",
            vec![
                q("SELECT 1 AS a; SELECT 'two' AS b, 3 AS c; SELECT * FROM t WHERE false"),
                q(";;"),
                q(""),
                q("SELECT 1; SELECT 1/0; SELECT 2"),
            ],
        ),
        sc(
            "errors_keep_the_session",
            vec![
                q("SELECT * FROM no_such_table"),
                q("SELEC 1"),
                ext("SELECT $1::int", &[], &["not a number"]),
                q("SELECT 'fine'"),
            ],
        ),
        sc(
            "large_result",
            vec![
                q("SELECT g, repeat('r', 200) FROM generate_series(1, 2000) g"),
                q("SELECT count(*) FROM generate_series(1, 100000)"),
            ],
        ),
        sc(
            "insert_returning_and_tags",
            vec![
                q("INSERT INTO audit(note) VALUES ('r1'), ('r2') RETURNING note"),
                q("UPDATE audit SET note = note || '!'"),
                q("DELETE FROM audit WHERE note = 'r1!'"),
                q("SELECT note FROM audit"),
            ],
        ),
        sc(
            "write_counted_once_across_moves",
            vec![
                q("INSERT INTO audit(note) VALUES ('w')"),
                q("SELECT count(*) FROM audit"),
                q("SELECT count(*) FROM audit"),
                q("SELECT count(*) FROM audit"),
                q("SELECT count(*) FROM audit"),
            ],
        ),
    ]
}
