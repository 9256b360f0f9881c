//! Schema changes by another session while the main session sits idle with statements
//! prepared: columns dropped and re-added, types changed, columns added and renamed, tables
//! dropped (and recreated alike), views and functions replaced. Each under a driver's cached
//! statement (asyncpg-like re-prepare), a cached description without retry (pgx-like until its
//! next prepare), and SQL `PREPARE`.

use super::super::dsl::*;
use super::super::run::Scenario;
use super::super::step::Step;

const GT_BY_A: &str = "SELECT * FROM gt WHERE a = $1";
const READD_A: &str =
    "ALTER TABLE gt DROP COLUMN a; ALTER TABLE gt ADD COLUMN a int; UPDATE gt SET a = 1";

/// A driver's cached `SELECT * FROM gt WHERE a = $1`, the change while idle, then the
/// statement again (twice) and a plain query (the session must still work).
fn driver_under(change: &str) -> Vec<Step> {
    vec![
        drv(GT_BY_A, &["1"]),
        side(change),
        drv(GT_BY_A, &["1"]),
        drv(GT_BY_A, &["1"]),
        q("SELECT 'alive'"),
    ]
}

/// The same with a named statement whose description the client cached at prepare time.
fn cached_under(change: &str) -> Vec<Step> {
    vec![
        prep("by_a", GT_BY_A, &[23]),
        exec("by_a", &["1"]),
        side(change),
        exec("by_a", &["1"]),
        exec("by_a", &["1"]),
        q("SELECT 'alive'"),
    ]
}

/// The same with SQL `PREPARE` and `EXECUTE`.
fn sql_under(change: &str) -> Vec<Step> {
    vec![
        q("PREPARE by_a(int) AS SELECT * FROM gt WHERE a = $1"),
        q("EXECUTE by_a(1)"),
        side(change),
        q("EXECUTE by_a(1)"),
        q("SELECT 'alive'"),
    ]
}

pub fn all() -> Vec<Scenario> {
    let changes = [
        ("column_dropped_and_readded", READD_A),
        (
            "column_type_changed_to_bigint",
            "ALTER TABLE gt ALTER COLUMN b TYPE bigint",
        ),
        (
            "column_type_changed_to_text",
            "ALTER TABLE gt ALTER COLUMN b TYPE text",
        ),
        ("column_added", "ALTER TABLE gt ADD COLUMN c int DEFAULT 5"),
        ("column_renamed", "ALTER TABLE gt RENAME COLUMN b TO bb"),
        ("table_dropped", "DROP TABLE gt"),
        (
            "table_recreated_same_shape",
            "DROP TABLE gt; CREATE TABLE gt (a int, b int); INSERT INTO gt VALUES (1, 20)",
        ),
    ];
    let mut out = Vec::new();
    for (name, change) in changes {
        out.push(sc(&format!("driver_cache_{name}"), driver_under(change)));
        out.push(sc(
            &format!("cached_description_{name}"),
            cached_under(change),
        ));
    }
    for (name, change) in [
        ("column_dropped_and_readded", READD_A),
        ("table_dropped", "DROP TABLE gt"),
        (
            "column_type_changed_to_text",
            "ALTER TABLE gt ALTER COLUMN b TYPE text",
        ),
    ] {
        out.push(sc(&format!("sql_prepare_{name}"), sql_under(change)));
    }
    out.extend([
        sc(
            "prepared_statement_table_dropped_other_queries_work",
            vec![
                prep("s", "SELECT * FROM gt", &[]),
                q("PREPARE p AS SELECT a FROM gt"),
                side("DROP TABLE gt"),
                q("SELECT 1"),
                q("SELECT 2"),
                exec("s", &[]),
                q("EXECUTE p"),
                q("SELECT 3"),
            ],
        ),
        sc(
            // Found by the generator: Postgres checks each use against the statement's first
            // shape, so a change undone before the next use leaves it working.
            "table_changed_and_changed_back_under_statement",
            vec![
                prep("s", "SELECT * FROM gt", &[]),
                exec("s", &[]),
                side("ALTER TABLE gt ALTER COLUMN b TYPE bigint"),
                q("SELECT 1"),
                side("ALTER TABLE gt ALTER COLUMN b TYPE int"),
                exec("s", &[]),
            ],
        ),
        sc(
            "parameter_type_changed_under_statement",
            vec![
                prep("by_a", GT_BY_A, &[23]),
                exec("by_a", &["1"]),
                side("ALTER TABLE gt ALTER COLUMN a TYPE text"),
                exec("by_a", &["1"]),
                describe("by_a"),
            ],
        ),
        sc(
            "view_replaced_under_statement",
            vec![
                side("CREATE VIEW gv AS SELECT a, b FROM gt"),
                prep("v", "SELECT * FROM gv", &[]),
                exec("v", &[]),
                side("CREATE OR REPLACE VIEW gv AS SELECT a, b, 'c'::text AS c FROM gt"),
                exec("v", &[]),
                drv("SELECT * FROM gv", &[]),
            ],
        ),
        sc(
            "function_replaced_under_statement",
            vec![
                side("CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 1'"),
                prep("f", "SELECT answer()", &[]),
                exec("f", &[]),
                side("CREATE OR REPLACE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 2'"),
                exec("f", &[]),
                exec("f", &[]),
            ],
        ),
        sc(
            "rows_changed_under_statement",
            vec![
                drv("SELECT v FROM t ORDER BY id", &[]),
                side("UPDATE t SET v = upper(v); INSERT INTO t VALUES (4, 'four')"),
                drv("SELECT v FROM t ORDER BY id", &[]),
            ],
        ),
        sc(
            "table_dropped_while_idle_plain_queries",
            vec![
                q("SELECT count(*) FROM gt"),
                side("DROP TABLE gt"),
                q("SELECT count(*) FROM gt"),
                q("SELECT 'alive'"),
            ],
        ),
        sc(
            "index_added_under_statement",
            vec![
                prep("by_id", "SELECT v FROM t WHERE id = $1", &[23]),
                exec("by_id", &["2"]),
                side("CREATE INDEX t_v ON t (v)"),
                exec("by_id", &["2"]),
            ],
        ),
    ]);
    out
}
