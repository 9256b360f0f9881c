//! A statement is read under the settings in force when it was prepared: a `DateStyle`, a
//! `TimeZone`, `transform_null_equals` or `standard_conforming_strings` changed after the
//! prepare leaves its literals as they were read, and a `SET ROLE` after it leaves the names
//! it resolved (in a schema the new role may not use) as they were. A move between the change
//! and the use must not read the statement again under today's settings; where the gateway
//! cannot know the settings of the prepare (the change came in the same text), the session
//! stays.

use super::super::dsl::*;
use super::super::run::Scenario;
use super::super::step::Step;

/// A protocol statement and an SQL one made of `sql`, each used once.
fn prepared(sql: &str) -> Vec<Step> {
    vec![
        prep("s", sql, &[]),
        q(&format!("PREPARE p AS {sql}")),
        exec("s", &[]),
        q("EXECUTE p"),
    ]
}

/// Both statements used, with a Describe between, and the list.
fn used() -> Vec<Step> {
    vec![
        exec("s", &[]),
        q("EXECUTE p"),
        describe("s"),
        exec("s", &[]),
        statements(),
    ]
}

/// The statements of `sql` made under `before`, used after `after` and after it is undone.
fn changed_after_prepare(before: &str, sql: &str, after: &str, undo: &str) -> Vec<Step> {
    let mut steps = vec![q(before)];
    steps.extend(prepared(sql));
    steps.push(q(after));
    steps.extend(used());
    // A statement made under the new settings, and both used once they are undone.
    steps.push(prep("t", sql, &[]));
    steps.push(exec("t", &[]));
    steps.push(q(undo));
    steps.extend(used());
    steps.push(exec("t", &[]));
    steps
}

pub fn all() -> Vec<Scenario> {
    let date = "SELECT '03/04/2024'::date::text AS d";
    let stamp = "SELECT '2024-01-01 12:00'::timestamptz::text AS ts, \
                 extract(epoch FROM '2024-01-01 12:00'::timestamptz) AS epoch";
    let nulls = "SELECT count(*) AS n FROM nt WHERE x = null";
    let strings = "SELECT 'a\\tb' AS s, length('a\\tb') AS n";
    vec![
        sc(
            "prepare_context_datestyle_changed_after_prepare",
            changed_after_prepare(
                "SET datestyle = 'ISO, MDY'",
                date,
                "SET datestyle = 'ISO, DMY'",
                "RESET datestyle",
            ),
        ),
        sc(
            "prepare_context_timezone_changed_after_prepare",
            changed_after_prepare(
                "SET TimeZone = 'UTC'",
                stamp,
                "SET TIME ZONE 'Asia/Tokyo'",
                "SET TimeZone = 'America/New_York'",
            ),
        ),
        sc_setup(
            "prepare_context_transform_null_equals_changed_after_prepare",
            "CREATE TABLE nt (x int); INSERT INTO nt VALUES (1), (NULL), (NULL)",
            changed_after_prepare(
                "SET transform_null_equals = on",
                nulls,
                "SELECT set_config('transform_null_equals', 'off', false)",
                "RESET transform_null_equals",
            ),
        ),
        sc(
            "prepare_context_standard_conforming_strings_changed_after_prepare",
            changed_after_prepare(
                "SET standard_conforming_strings = off",
                strings,
                "SET standard_conforming_strings = on",
                "SET standard_conforming_strings = off",
            ),
        ),
        sc_setup(
            "prepare_context_set_role_between_prepare_and_use",
            "CREATE SCHEMA priv; CREATE TABLE priv.pt (a int); INSERT INTO priv.pt VALUES (7); \
             CREATE ROLE {db}_n",
            {
                let mut steps = prepared("SELECT a FROM priv.pt");
                steps.extend([
                    q("SET ROLE {db}_n"),
                    whoami(),
                    // Directly: the table's privilege is checked when it runs.
                    exec("s", &[]),
                    q("EXECUTE p"),
                    q("RESET ROLE"),
                ]);
                steps.extend(used());
                steps.extend([
                    q("SET ROLE {db}_n"),
                    q("SELECT 1"),
                    q("RESET ROLE"),
                    exec("s", &[]),
                    q("EXECUTE p"),
                ]);
                steps
            },
        ),
        sc("prepare_context_datestyle_set_by_a_bound_name", {
            // The name travels as a parameter: only the Bind shows it.
            let mut steps = prepared(date);
            steps.push(ext(
                "SELECT set_config($1, $2, false)",
                &[],
                &["DateStyle", "ISO, DMY"],
            ));
            steps.extend(used());
            steps.push(ext(
                "SELECT set_config($1, $2, false)",
                &[],
                &["app.tenant", "t1"],
            ));
            steps.extend(used());
            steps
        }),
        sc(
            "prepare_context_changed_in_the_prepare_text_stays",
            vec![
                q(&format!("PREPARE p AS {date}; SET datestyle = 'ISO, DMY'")),
                q("EXECUTE p"),
                q("SELECT '03/04/2024'::date::text"),
                q("RESET datestyle"),
                q("EXECUTE p"),
                statements(),
            ],
        ),
    ]
}
