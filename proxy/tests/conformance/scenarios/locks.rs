//! Another session holds a lock on what the session's statements name while the session is
//! moved (a migration's `ACCESS EXCLUSIVE`): the statements work once the lock is gone, an
//! unrelated query runs meanwhile, a use during the lock answers what Postgres answers, and a
//! lock longer than a revival may take ends nothing.

use super::super::dsl::*;
use super::super::run::Scenario;
use super::super::step::{MoveKind, Step};

const SETUP: &str = "CREATE TABLE lk (a int); INSERT INTO lk VALUES (1)";

/// Waits until the other session holds its lock on `lk`, so the move comes after it.
const WAIT_FOR_LOCK: &str = "DO $$BEGIN WHILE NOT EXISTS (SELECT FROM pg_locks AS l \
 JOIN pg_class AS c ON c.oid = l.relation WHERE c.relname = 'lk' \
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
 AND l.mode = 'AccessExclusiveLock' AND l.granted) LOOP PERFORM pg_sleep(0.01); END LOOP; END$$";

/// A protocol statement and an SQL one on `lk`, each used once (so a move records them).
fn statements_on_lk() -> Vec<Step> {
    vec![
        prep("s", "SELECT a FROM lk", &[]),
        q("PREPARE p AS SELECT a + 1 FROM lk"),
        exec("s", &[]),
        q("EXECUTE p"),
    ]
}

/// Another session takes `ACCESS EXCLUSIVE` on `lk` for `seconds`, and the session is
/// migrated while it holds it.
fn locked_for(seconds: u32) -> Vec<Step> {
    vec![
        force(MoveKind::Migrate),
        bg(
            0,
            &format!("BEGIN; LOCK lk IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep({seconds}); COMMIT"),
        ),
        side_n(1, WAIT_FOR_LOCK),
    ]
}

/// Once the lock is gone: the statements, a Describe of one, and the statement list.
fn after_the_lock() -> Vec<Step> {
    vec![
        finish(0),
        exec("s", &[]),
        q("EXECUTE p"),
        describe("s"),
        exec("s", &[]),
        statements(),
    ]
}

/// Once the lock is gone, a statement `d` never used since the move: the statement list, `d`,
/// and both again after one more move.
fn d_once_the_lock_is_gone() -> Vec<Step> {
    vec![
        finish(0),
        statements(),
        exec("d", &[]),
        force(MoveKind::Migrate),
        q("SELECT 'moved again'"),
        statements(),
        exec("d", &[]),
    ]
}

pub fn all() -> Vec<Scenario> {
    let mut short = vec![q("SET lock_timeout = '200ms'")];
    short.extend(statements_on_lk());
    short.extend(locked_for(3));
    short.extend([
        q("SELECT 'unrelated'"),
        force(MoveKind::Migrate),
        // During the lock: Postgres gives up after lock_timeout, for both kinds.
        exec("s", &[]),
        force(MoveKind::Migrate),
        q("EXECUTE p"),
        force(MoveKind::Migrate),
        describe("s"),
    ]);
    short.extend(after_the_lock());
    // No lock_timeout: the lock outlasts what a revival may take (the lab's revive_timeout).
    let mut long = statements_on_lk();
    long.extend(locked_for(7));
    long.push(q("SELECT 'unrelated'"));
    long.extend(after_the_lock());
    let mut pipelined = vec![q("SET lock_timeout = '200ms'")];
    pipelined.extend(statements_on_lk());
    pipelined.extend(locked_for(3));
    pipelined.extend([
        // The statement is used in a later batch and in a simple Query with others.
        q("SELECT 'unrelated'; SELECT 2"),
        finish(0),
        q("SELECT 1; EXECUTE p; EXECUTE p"),
        ext("SELECT a FROM lk", &[], &[]),
        exec_named("s", &[]),
        close("s"),
        statements(),
    ]);
    // Never used after the lock: listed again once it is gone, made under the settings it was
    // prepared under although the session changed them during the lock.
    let mut listed = vec![
        q("SET DateStyle = 'ISO, MDY'"),
        prep("d", "SELECT '03/04/2024'::date AS d, a FROM lk", &[]),
        exec("d", &[]),
    ];
    listed.extend(statements_on_lk());
    listed.extend(locked_for(2));
    listed.extend([q("SELECT 'unrelated'"), q("SET DateStyle = 'ISO, DMY'")]);
    listed.extend(d_once_the_lock_is_gone());
    listed.push(q("EXECUTE p"));
    // Prepared under other settings than the session's at the move: made again under those
    // once the lock is gone, never failing for good.
    let mut other_settings = vec![
        prep(
            "d",
            "SELECT '03/04/2024'::date AS d, 'a\\tb' AS e, a FROM lk",
            &[],
        ),
        q("SELECT 'prepared, never used'"),
        q("SET DateStyle = 'ISO, DMY'"),
        q("SET standard_conforming_strings = off"),
    ];
    other_settings.extend(locked_for(2));
    other_settings.push(q("SELECT 'unrelated'"));
    other_settings.extend(d_once_the_lock_is_gone());
    vec![
        sc_setup("lock_during_revival_with_lock_timeout", SETUP, short),
        sc_setup(
            "lock_during_revival_prepared_under_other_settings",
            SETUP,
            other_settings,
        ),
        sc_setup("lock_during_revival_listed_once_gone", SETUP, listed),
        sc_setup(
            "lock_during_revival_longer_than_revive_timeout",
            SETUP,
            long,
        ),
        sc_setup(
            "lock_during_revival_then_used_among_others",
            SETUP,
            pipelined,
        ),
    ]
}
