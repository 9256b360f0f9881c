//! Prepared statements: SQL `PREPARE` alone and inside multi-statement strings (after a write,
//! two at once, behind comments and literals holding semicolons), `DEALLOCATE`, protocol
//! statements named and unnamed with parameter types, Describe and Close, and drivers'
//! cached statements.

use super::super::dsl::*;
use super::super::run::Scenario;

const AUDIT_COUNT: &str = "SELECT count(*) FROM audit";

pub fn all() -> Vec<Scenario> {
    vec![
        sc(
            "sql_prepare_execute",
            vec![
                q("PREPARE twice(int) AS SELECT $1 * 2"),
                q("EXECUTE twice(21)"),
                q("EXECUTE twice(4)"),
                statements(),
            ],
        ),
        sc(
            "sql_prepare_after_insert_in_one_query",
            vec![
                q("INSERT INTO audit(note) VALUES ('once'); PREPARE p AS SELECT 1"),
                q(AUDIT_COUNT),
                q(AUDIT_COUNT),
                q(AUDIT_COUNT),
                q("EXECUTE p"),
            ],
        ),
        sc(
            "sql_prepare_before_insert_in_one_query",
            vec![
                q("PREPARE p AS SELECT 2; INSERT INTO audit(note) VALUES ('after')"),
                q(AUDIT_COUNT),
                q("EXECUTE p"),
                q(AUDIT_COUNT),
            ],
        ),
        sc(
            "sql_prepare_inside_explicit_transaction_with_write",
            vec![
                q("BEGIN; INSERT INTO audit(note) VALUES ('tx'); PREPARE p AS SELECT 3; COMMIT"),
                q(AUDIT_COUNT),
                q("EXECUTE p"),
                q(AUDIT_COUNT),
            ],
        ),
        sc(
            "two_sql_prepares_in_one_query",
            vec![
                q("PREPARE a AS SELECT 'a'; PREPARE b AS SELECT 'b'"),
                q("EXECUTE a"),
                q("EXECUTE b"),
                statements(),
            ],
        ),
        sc(
            "sql_prepare_behind_comment_with_semicolon",
            vec![
                q(
                    "/* a comment; with PREPARE x AS SELECT 0; inside */ PREPARE c AS SELECT ';' AS semi",
                ),
                q("EXECUTE c"),
                q("EXECUTE c"),
                statements(),
            ],
        ),
        sc(
            "sql_prepare_behind_line_comment",
            vec![
                q("-- first; PREPARE fake AS SELECT 0;\nPREPARE lc AS SELECT 'line' AS l"),
                q("EXECUTE lc"),
                statements(),
            ],
        ),
        sc(
            "sql_prepare_string_literal_with_semicolons",
            vec![
                q(
                    "PREPARE s AS SELECT 'a;b; INSERT INTO audit(note) VALUES (''no'')' AS lit; \
                   SELECT 1",
                ),
                q("EXECUTE s"),
                q(AUDIT_COUNT),
                q("EXECUTE s"),
            ],
        ),
        sc(
            "sql_prepare_dollar_quoted_body",
            vec![
                q("PREPARE d AS SELECT $x$;; PREPARE y AS SELECT 1;$x$ AS body"),
                q("EXECUTE d"),
                statements(),
            ],
        ),
        sc(
            "sql_prepare_quoted_name",
            vec![
                q("PREPARE \"Mixed Name\" AS SELECT 'mixed'"),
                q("EXECUTE \"Mixed Name\""),
                q("EXECUTE \"Mixed Name\""),
            ],
        ),
        sc(
            "sql_prepare_with_parameter_types",
            vec![
                q("PREPARE typed(text, int8, numeric) AS SELECT $1 || '!', $2 + 1, $3 * 2"),
                q("EXECUTE typed('x', 41, 1.5)"),
                statements(),
                q("EXECUTE typed('y', 1, 0.5)"),
            ],
        ),
        sc(
            "sql_prepare_write_statement",
            vec![
                q("PREPARE ins(text) AS INSERT INTO audit(note) VALUES ($1)"),
                q("EXECUTE ins('one')"),
                q(AUDIT_COUNT),
                q("EXECUTE ins('two')"),
                q(AUDIT_COUNT),
            ],
        ),
        sc(
            "sql_prepare_then_error_in_same_query",
            vec![
                q("PREPARE pe AS SELECT 'kept?'; SELECT 1/0"),
                statements(),
                q("EXECUTE pe"),
            ],
        ),
        sc(
            "sql_prepare_in_rolled_back_transaction",
            vec![
                q("BEGIN; PREPARE rb AS SELECT 'rb'; ROLLBACK"),
                q("EXECUTE rb"),
                statements(),
            ],
        ),
        sc(
            "deallocate",
            vec![
                q("PREPARE p1 AS SELECT 1; PREPARE p2 AS SELECT 2"),
                q("DEALLOCATE p1"),
                q("EXECUTE p1"),
                q("EXECUTE p2"),
                statements(),
            ],
        ),
        sc(
            "deallocate_all",
            vec![
                q("PREPARE p1 AS SELECT 1"),
                prep("proto", "SELECT 2", &[]),
                q("DEALLOCATE ALL"),
                statements(),
                q("EXECUTE p1"),
            ],
        ),
        sc(
            "prepare_same_name_again",
            vec![
                q("PREPARE dup AS SELECT 1"),
                q("PREPARE dup AS SELECT 2"),
                q("EXECUTE dup"),
            ],
        ),
        sc(
            "protocol_named_statement",
            vec![
                prep("plus", "SELECT $1::int4 + 1 AS plus", &[23]),
                exec("plus", &["41"]),
                exec_named("plus", &["1"]),
                describe("plus"),
                exec("plus", &["2"]),
            ],
        ),
        sc(
            "protocol_statement_parameter_types",
            vec![
                prep("typed", "SELECT $1 AS t, $2 AS i, $3 AS b", &[25, 20, 16]),
                describe("typed"),
                exec_named("typed", &["x", "9", "t"]),
                describe("typed"),
            ],
        ),
        sc(
            "protocol_statement_unspecified_types",
            vec![
                prep("guess", "SELECT $1 AS unknown, $2::int AS cast", &[0, 0]),
                describe("guess"),
                exec_named("guess", &["u", "5"]),
            ],
        ),
        sc(
            "protocol_statement_null_parameters",
            vec![
                prep(
                    "nul",
                    "SELECT $1::text IS NULL AS is_null, coalesce($1::text, 'dflt')",
                    &[25],
                ),
                exec("nul", &["\\N"]),
                exec("nul", &["v"]),
            ],
        ),
        sc(
            "protocol_close_then_execute",
            vec![
                prep("gone", "SELECT 1", &[]),
                close("gone"),
                exec_named("gone", &[]),
                describe("gone"),
            ],
        ),
        sc(
            "protocol_describe_missing_statement",
            vec![describe("never"), describe("never")],
        ),
        sc(
            "unnamed_statement_across_sync",
            vec![
                prep("", "SELECT 'unnamed' AS u", &[]),
                exec_named("", &[]),
                exec_named("", &[]),
            ],
        ),
        sc(
            // Pinned, so it never moves, but the gateway reads its state at every pause: that
            // must not cost the unnamed statement.
            "unnamed_statement_survives_the_snapshots_of_a_pinned_session",
            vec![
                q("CREATE TEMP TABLE keep_here (x int)"),
                prep("", "SELECT 'unnamed' AS u", &[]),
                exec_named("", &[]),
                exec_named("", &[]),
            ],
        ),
        sc(
            "unnamed_extended_queries",
            vec![
                ext("SELECT $1::int * 3 AS tripled", &[23], &["3"]),
                ext("SELECT v FROM t WHERE id = $1", &[], &["2"]),
                ext("SELECT v FROM t WHERE id = $1", &[], &["3"]),
            ],
        ),
        sc(
            "protocol_statement_and_sql_prepare_mixed",
            vec![
                prep("pp", "SELECT 'proto' AS kind", &[]),
                q("PREPARE sp AS SELECT 'sql' AS kind"),
                exec("pp", &[]),
                q("EXECUTE sp"),
                statements(),
            ],
        ),
        sc(
            "forty_sql_prepared_statements_in_one_query",
            vec![
                q(&(0..40)
                    .map(|i| format!("PREPARE m{i} AS SELECT {i} AS n"))
                    .collect::<Vec<_>>()
                    .join("; ")),
                prep("proto_last", "SELECT 'last' AS n", &[]),
                q("SELECT count(*) FROM pg_prepared_statements"),
                q("EXECUTE m0"),
                q("EXECUTE m39"),
                exec("proto_last", &[]),
            ],
        ),
        sc(
            "driver_cached_statement_repeated",
            vec![
                drv("SELECT v FROM t WHERE id = $1", &["1"]),
                drv("SELECT v FROM t WHERE id = $1", &["2"]),
                drv("SELECT v FROM t WHERE id = $1", &["3"]),
                drv("SELECT v FROM t WHERE id = $1", &["1"]),
            ],
        ),
        sc(
            "driver_cached_statement_in_transaction",
            vec![
                drv("SELECT v FROM t WHERE id = $1", &["1"]),
                q("BEGIN"),
                drv("SELECT v FROM t WHERE id = $1", &["2"]),
                q("COMMIT"),
                drv("SELECT v FROM t WHERE id = $1", &["3"]),
            ],
        ),
        sc(
            "driver_cached_write_statement",
            vec![
                drv("INSERT INTO audit(note) VALUES ($1)", &["d1"]),
                drv("INSERT INTO audit(note) VALUES ($1)", &["d2"]),
                q(AUDIT_COUNT),
                drv(
                    "INSERT INTO audit(note) VALUES ($1) RETURNING note",
                    &["d3"],
                ),
                q(AUDIT_COUNT),
            ],
        ),
    ]
}
