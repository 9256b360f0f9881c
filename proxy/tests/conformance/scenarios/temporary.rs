//! Every kind of temporary object: the session must stay where they live (or a move must keep
//! them), and one dropped again frees the session.

use super::super::dsl::*;
use super::super::run::Scenario;

pub fn all() -> Vec<Scenario> {
    vec![
        sc(
            "temp_table",
            vec![
                q("CREATE TEMP TABLE scratch (x int); INSERT INTO scratch VALUES (1)"),
                q("SELECT x FROM scratch"),
                q("INSERT INTO scratch VALUES (2)"),
                q("SELECT count(*) FROM scratch"),
            ],
        ),
        sc(
            "temp_table_as_select",
            vec![
                q("CREATE TEMP TABLE copy_t AS SELECT * FROM t"),
                q("SELECT count(*) FROM copy_t"),
                q("SELECT v FROM copy_t ORDER BY id"),
            ],
        ),
        sc(
            "temp_table_select_into",
            vec![
                q("SELECT * INTO TEMP TABLE into_t FROM t WHERE id < 3"),
                q("SELECT count(*) FROM into_t"),
                q("SELECT count(*) FROM into_t"),
            ],
        ),
        sc(
            "temp_table_on_commit_drop",
            vec![
                q(
                    "BEGIN; CREATE TEMP TABLE gone (x int) ON COMMIT DROP; INSERT INTO gone VALUES (1); COMMIT",
                ),
                q("SELECT to_regclass('gone') IS NULL AS dropped"),
                q("SELECT 1"),
            ],
        ),
        sc(
            "temp_table_on_commit_delete_rows",
            vec![
                q("CREATE TEMP TABLE kept (x int) ON COMMIT DELETE ROWS"),
                q("BEGIN; INSERT INTO kept VALUES (1); SELECT count(*) FROM kept; COMMIT"),
                q("SELECT count(*) FROM kept"),
            ],
        ),
        sc(
            "temp_table_created_and_dropped",
            vec![
                q("CREATE TEMP TABLE brief (x int)"),
                q("DROP TABLE brief"),
                q("SELECT to_regclass('brief') IS NULL AS gone"),
                q("SELECT 1"),
            ],
        ),
        sc(
            "temp_schema_seen_after_drop",
            vec![
                q("CREATE TEMP TABLE brief (x int); DROP TABLE brief"),
                q("SELECT pg_my_temp_schema() <> 0 AS has_temp_schema"),
                q("SELECT pg_my_temp_schema() <> 0 AS has_temp_schema"),
            ],
        ),
        sc(
            "temp_sequence",
            vec![
                q("CREATE TEMP SEQUENCE tseq"),
                q("SELECT nextval('tseq')"),
                q("SELECT nextval('tseq')"),
                q("SELECT currval('tseq')"),
            ],
        ),
        sc(
            "temp_view",
            vec![
                q("CREATE TEMP VIEW tview AS SELECT id * 10 AS ten FROM t"),
                q("SELECT ten FROM tview ORDER BY ten"),
                q("SELECT count(*) FROM tview"),
            ],
        ),
        sc(
            "view_over_temp_table_becomes_temporary",
            vec![
                q("CREATE TEMP TABLE tt (x int)"),
                q("CREATE VIEW uses_temp AS SELECT x FROM tt"),
                q("SELECT count(*) FROM uses_temp"),
                q("SELECT count(*) FROM uses_temp"),
            ],
        ),
        sc(
            "temp_function",
            vec![
                q("CREATE FUNCTION pg_temp.tf() RETURNS int LANGUAGE sql AS 'SELECT 7'"),
                q("SELECT pg_temp.tf()"),
                q("SELECT pg_temp.tf()"),
                q("SELECT pg_temp.tf() + 1"),
            ],
        ),
        sc(
            "temp_function_plpgsql",
            vec![
                q(
                    "CREATE FUNCTION pg_temp.double(x int) RETURNS int LANGUAGE plpgsql \
                   AS $$ BEGIN RETURN x * 2; END $$",
                ),
                q("SELECT pg_temp.double(21)"),
                q("SELECT pg_temp.double(4)"),
            ],
        ),
        sc(
            "temp_function_made_in_do_block",
            vec![
                q(
                    "DO $$ BEGIN EXECUTE 'CREATE FUNCTION pg_temp.hidden() RETURNS text \
                   LANGUAGE sql AS ''SELECT ''''hidden'''''''; END $$",
                ),
                q("SELECT pg_temp.hidden()"),
                q("SELECT pg_temp.hidden()"),
            ],
        ),
        sc(
            "temp_type_enum",
            vec![
                q("CREATE TYPE pg_temp.mood AS ENUM ('sad', 'ok', 'happy')"),
                q("SELECT 'ok'::pg_temp.mood::text"),
                q("SELECT 'happy'::pg_temp.mood > 'sad'::pg_temp.mood"),
            ],
        ),
        sc(
            "temp_type_composite",
            vec![
                q("CREATE TYPE pg_temp.pair AS (a int, b text)"),
                q("SELECT (ROW(1, 'x')::pg_temp.pair).b"),
                q("SELECT (ROW(2, 'y')::pg_temp.pair).a"),
            ],
        ),
        sc(
            "temp_domain",
            vec![
                q("CREATE DOMAIN pg_temp.posint AS int CHECK (VALUE > 0)"),
                q("SELECT 5::pg_temp.posint"),
                q("SELECT (-1)::pg_temp.posint"),
                q("SELECT 6::pg_temp.posint"),
            ],
        ),
        sc(
            "temp_table_with_index_and_toast",
            vec![
                q("CREATE TEMP TABLE big (id int PRIMARY KEY, body text)"),
                q("INSERT INTO big SELECT g, repeat('z', 5000) FROM generate_series(1, 3) g"),
                q("SELECT id, length(body) FROM big ORDER BY id"),
            ],
        ),
        sc(
            "temp_object_made_by_function",
            vec![
                q("SELECT 1"),
                side(
                    "CREATE FUNCTION make_scratch() RETURNS void LANGUAGE plpgsql AS \
                      $$ BEGIN CREATE TEMP TABLE IF NOT EXISTS fn_scratch (x int); END $$",
                ),
                q("SELECT make_scratch()"),
                q("INSERT INTO fn_scratch VALUES (3); SELECT count(*) FROM fn_scratch"),
                q("SELECT count(*) FROM fn_scratch"),
            ],
        ),
    ]
}
