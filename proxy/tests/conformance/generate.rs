//! Random session-state sequences (proptest strategies): settings changed every way a client
//! can, prepared statements of every kind, roles, transactions, pins, schema changes by
//! another session and a lock it holds during a move, settings that decide how a statement is
//! read changed (and `SET ROLE`) between its prepare and its use, non-ASCII names and values
//! sent by a LATIN1 client, with a random move (or none) before each main-session step and a
//! full probe of the session's state at the end.

use proptest::prelude::*;

use super::dsl::*;
use super::run::Scenario;
use super::step::{MoveKind, Step};

/// Run once in each generator database (after the base schema), on both sides.
pub const SETUP: &str = "
CREATE FUNCTION set_k(n text, v text) RETURNS void LANGUAGE plpgsql
  AS $$ BEGIN PERFORM set_config(n, v, false); END $$;
CREATE TABLE trig_t (n text, v text);
CREATE FUNCTION trig_fn() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN PERFORM set_config(NEW.n, NEW.v, false); RETURN NEW; END $$;
CREATE TRIGGER trig_set BEFORE INSERT ON trig_t FOR EACH ROW EXECUTE FUNCTION trig_fn();
GRANT ALL ON trig_t TO {db}_r, {db}_s;
CREATE SCHEMA priv;
CREATE TABLE priv.pt (a int);
INSERT INTO priv.pt VALUES (7);
GRANT SELECT ON priv.pt TO {db}_r, {db}_s;
CREATE SCHEMA \"ßchema\";
CREATE TABLE \"ßchema\".enc_t (v text);
INSERT INTO \"ßchema\".enc_t VALUES ('ß inside');
CREATE TABLE public.enc_t (v text);
INSERT INTO public.enc_t VALUES ('public');
GRANT USAGE ON SCHEMA \"ßchema\" TO {db}_r, {db}_s;
GRANT SELECT ON \"ßchema\".enc_t, public.enc_t TO {db}_r, {db}_s;
";

/// A statement whose meaning hangs on how it was read at its prepare: literals of `date` and
/// `timestamptz`, a backslash in a string, `x = NULL`, and a table in a schema the roles may
/// not look into (so prepared under `SET ROLE` it fails, and prepared before it, it runs).
const CONTEXT_SQL: &str = "SELECT '03/04/2024'::date::text AS d, \
 '2024-01-01 12:00'::timestamptz::text AS ts, 'a\\tb' AS s, \
 (SELECT count(*) FROM (VALUES (1), (NULL)) AS v(x) WHERE x = NULL) AS nulls, \
 (SELECT a FROM priv.pt) AS a";

/// What a LATIN1 client's texts can read back, as UTF-8 hex digits (plain ASCII in any
/// encoding, so a difference in one byte shows).
const ENCODED: &str = "pg_catalog.encode(pg_catalog.convert_to(v, 'UTF8'), 'hex') AS h, \
 pg_catalog.encode(pg_catalog.convert_to(current_setting('app.k0', true), 'UTF8'), 'hex') AS k0, \
 pg_catalog.encode(pg_catalog.convert_to(current_setting('search_path'), 'UTF8'), 'hex') AS sp";

/// Run before each sequence, on both sides: the tables a sequence may change, as they were.
pub const RESET: &str = "
DROP TABLE IF EXISTS gt;
CREATE TABLE gt (a int, b int);
INSERT INTO gt VALUES (1, 2);
GRANT ALL ON gt TO {db}_r, {db}_s;
TRUNCATE audit;
TRUNCATE counted RESTART IDENTITY;
TRUNCATE trig_t;
";

/// Custom setting names a sequence uses.
const KEYS: [&str; 4] = ["app.k0", "app.k1", "app.tenant", "app.k3"];

/// One abstract step; [`GenStep::steps`] makes client steps of it.
#[derive(Clone, Debug)]
pub enum GenStep {
    /// Sets custom setting `key` to value `val` in way `how`.
    SetCustom {
        key: usize,
        val: u8,
        how: u8,
    },
    Reset {
        key: usize,
    },
    ResetAll,
    DiscardAll,
    Builtin {
        which: u8,
        val: u8,
    },
    Role {
        which: u8,
    },
    SqlPrepare {
        n: u8,
        after_insert: bool,
    },
    Deallocate {
        n: u8,
    },
    Execute {
        n: u8,
    },
    ProtoPrepare {
        n: u8,
    },
    ProtoExec {
        n: u8,
    },
    ProtoClose {
        n: u8,
    },
    Driver {
        which: u8,
    },
    Tx {
        which: u8,
    },
    Pin {
        which: u8,
    },
    OtherDdl {
        which: u8,
    },
    Seed,
    /// Inserts a row, into the table with a sequence when `counted`.
    Insert {
        counted: bool,
    },
    /// Reads the session's sequence state.
    SequenceRead,
    /// Another session holds `ACCESS EXCLUSIVE` on `gt` while the session is moved and runs an
    /// unrelated query; its statements on `gt` are used after the lock is gone.
    LockDuringMove,
    /// Prepares [`CONTEXT_SQL`] as protocol statement `cx{n}` and SQL statement `cs{n}`.
    ContextPrepare {
        n: u8,
    },
    /// Changes a setting that decides how a statement is read.
    ContextSet {
        which: u8,
        val: u8,
    },
    /// Uses `cx{n}` and `cs{n}`.
    ContextUse {
        n: u8,
    },
    /// A LATIN1 client's step with non-ASCII names and values.
    Latin1 {
        which: u8,
    },
    Probe,
}

/// Waits (3 s at most: the main session may hold a lock on `gt` in an open transaction, which
/// the other session then waits out with its lock_timeout) until the other session holds its
/// lock on `gt`.
const WAIT_FOR_LOCK: &str = "DO $$BEGIN FOR i IN 1..300 LOOP EXIT WHEN EXISTS (SELECT FROM \
 pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation WHERE c.relname = 'gt' \
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
 AND l.mode = 'AccessExclusiveLock' AND l.granted); PERFORM pg_sleep(0.01); END LOOP; END$$";

fn key(k: usize) -> &'static str {
    KEYS[k % KEYS.len()]
}

impl GenStep {
    fn steps(&self) -> Vec<Step> {
        match *self {
            GenStep::SetCustom { key: k, val, how } => {
                let (k, v) = (key(k), format!("v{val}"));
                vec![match how % 9 {
                    0 => q(&format!("SET {k} = '{v}'")),
                    1 => q(&format!("SET SESSION {k} TO '{v}'")),
                    2 => q(&format!("SELECT set_config('{k}', '{v}', false)")),
                    3 => ext("SELECT set_config($1, $2, false)", &[], &[k, &v]),
                    4 => q(&format!("SELECT set_k('{k}', '{v}')")),
                    5 => q(&format!(
                        "DO $$ BEGIN PERFORM set_config('{k}', '{v}', false); END $$"
                    )),
                    6 => drv("INSERT INTO trig_t VALUES ($1, $2)", &[k, &v]),
                    7 => q(&format!("BEGIN; SET LOCAL {k} = '{v}'; COMMIT")),
                    _ => q(&format!("SELECT 1; SET {k} = '{v}'; SELECT 2")),
                }]
            }
            GenStep::Reset { key: k } => vec![q(&format!("RESET {}", key(k)))],
            GenStep::ResetAll => vec![q("RESET ALL")],
            GenStep::DiscardAll => vec![q("DISCARD ALL")],
            GenStep::Builtin { which, val } => {
                let v = val % 3;
                vec![q(&match which % 5 {
                    0 => format!("SET statement_timeout = '{}s'", 10 + v),
                    1 => format!("SET work_mem = '{}MB'", 4 + v),
                    2 => format!(
                        "SET TimeZone = '{}'",
                        ["UTC", "Asia/Tokyo", "America/Lima"][v as usize]
                    ),
                    3 => format!(
                        "SET search_path = {}",
                        ["app, public", "public", "public, app"][v as usize]
                    ),
                    _ => format!(
                        "SET DateStyle = '{}'",
                        ["ISO, MDY", "SQL, DMY", "German"][v as usize]
                    ),
                })]
            }
            GenStep::Role { which } => vec![q(match which % 5 {
                0 => "SET ROLE {db}_s",
                1 => "RESET ROLE",
                2 => "SET SESSION AUTHORIZATION {db}_r",
                3 => "RESET SESSION AUTHORIZATION",
                _ => "SET log_min_duration_statement = 5000",
            })],
            GenStep::SqlPrepare { n, after_insert } => {
                let p = format!(
                    "PREPARE sp{n}(int) AS SELECT $1 + {n} AS r, current_setting('app.k0', true) AS k0"
                );
                vec![q(&if after_insert {
                    format!("INSERT INTO audit(note) VALUES ('prep{n}'); {p}")
                } else {
                    p
                })]
            }
            GenStep::Deallocate { n } => vec![q(&format!("DEALLOCATE sp{n}"))],
            GenStep::Execute { n } => vec![q(&format!("EXECUTE sp{n}({n})"))],
            GenStep::ProtoPrepare { n } => vec![prep(
                &format!("pp{n}"),
                &format!("SELECT $1::int * {} AS r, * FROM gt", n + 1),
                &[23],
            )],
            GenStep::ProtoExec { n } => vec![exec(&format!("pp{n}"), &["2"])],
            GenStep::ProtoClose { n } => vec![close(&format!("pp{n}"))],
            GenStep::Driver { which } => vec![match which % 3 {
                0 => drv("SELECT * FROM gt WHERE a = $1", &["1"]),
                1 => drv("SELECT name FROM items WHERE id = $1", &["1"]),
                _ => drv("SELECT current_setting($1, true) AS v", &["app.tenant"]),
            }],
            GenStep::Tx { which } => vec![q(match which % 4 {
                0 => "BEGIN",
                1 => "COMMIT",
                2 => "ROLLBACK",
                _ => "SELECT 1/0",
            })],
            GenStep::Pin { which } => vec![q(match which % 6 {
                0 => "SELECT pg_advisory_lock(1)",
                1 => "SELECT pg_advisory_unlock_all()",
                2 => "CREATE TEMP TABLE IF NOT EXISTS tmp (x int)",
                3 => "DROP TABLE IF EXISTS tmp",
                4 => {
                    "CREATE OR REPLACE FUNCTION pg_temp.tf() RETURNS int LANGUAGE sql AS 'SELECT 1'"
                }
                _ => "DROP FUNCTION IF EXISTS pg_temp.tf()",
            })],
            // The main session may hold a lock on gt in an open transaction: the DDL then gives
            // up on both sides alike instead of waiting for a step that never comes.
            GenStep::OtherDdl { which } => vec![side(match which % 4 {
                0 => {
                    "SET lock_timeout = '2s'; ALTER TABLE gt DROP COLUMN IF EXISTS a; \
                     ALTER TABLE gt ADD COLUMN a int; UPDATE gt SET a = 1"
                }
                1 => "SET lock_timeout = '2s'; ALTER TABLE gt ALTER COLUMN b TYPE bigint",
                2 => {
                    "SET lock_timeout = '2s'; DROP TABLE IF EXISTS gt; CREATE TABLE gt (a int, b int); \
                     INSERT INTO gt VALUES (1, 3); GRANT ALL ON gt TO {db}_r, {db}_s"
                }
                _ => {
                    "SET lock_timeout = '2s'; ALTER TABLE gt ADD COLUMN IF NOT EXISTS c text DEFAULT 'c'"
                }
            })],
            GenStep::Seed => vec![q("SELECT setseed(0.3)"), q("SELECT random()")],
            GenStep::Insert { counted: false } => vec![q(
                "INSERT INTO audit(note) VALUES ('w'); SELECT count(*) FROM audit",
            )],
            GenStep::Insert { counted: true } => {
                vec![q("INSERT INTO counted(note) VALUES ('w') RETURNING id")]
            }
            GenStep::SequenceRead => vec![q("SELECT currval('counted_id_seq')")],
            GenStep::LockDuringMove => vec![
                bg(
                    0,
                    "SET lock_timeout = '2s'; BEGIN; LOCK gt IN ACCESS EXCLUSIVE MODE; \
                     SELECT pg_sleep(1); COMMIT",
                ),
                side_n(1, WAIT_FOR_LOCK),
                q("SELECT 'during the lock'"),
                finish(0),
            ],
            GenStep::ContextPrepare { n } => vec![
                prep(&format!("cx{n}"), CONTEXT_SQL, &[]),
                q(&format!("PREPARE cs{n} AS {CONTEXT_SQL}")),
            ],
            GenStep::ContextSet { which, val } => {
                let v = usize::from(val % 3);
                vec![q(&match which % 5 {
                    0 => format!(
                        "SET DateStyle = '{}'",
                        ["ISO, MDY", "ISO, DMY", "SQL, YMD"][v]
                    ),
                    1 => format!(
                        "SELECT set_config('TimeZone', '{}', false)",
                        ["UTC", "Asia/Tokyo", "America/Lima"][v]
                    ),
                    2 => format!(
                        "SET standard_conforming_strings = {}",
                        ["on", "off", "on"][v]
                    ),
                    3 => format!("SET transform_null_equals = {}", ["on", "off", "on"][v]),
                    _ => ["SET ROLE {db}_s", "RESET ROLE", "SET ROLE {db}_r"][v].to_owned(),
                })]
            }
            GenStep::ContextUse { n } => {
                vec![exec(&format!("cx{n}"), &[]), q(&format!("EXECUTE cs{n}"))]
            }
            GenStep::Latin1 { which } => vec![match which % 7 {
                0 => q("SET client_encoding = 'LATIN1'"),
                1 => q_latin1("SET app.k0 = 'naïve café'"),
                2 => q_latin1("SET search_path = \"ßchema\", public"),
                3 => q_latin1(&format!(
                    "PREPARE enc_p AS SELECT 'ü' AS u, v, {ENCODED} FROM enc_t"
                )),
                4 => q_latin1(&format!("SELECT v, 'é' AS e, {ENCODED} FROM enc_t")),
                5 => q("EXECUTE enc_p"),
                _ => q("RESET client_encoding"),
            }],
            GenStep::Probe => vec![probe()],
        }
    }
}

/// Everything a client could notice about the session's state, in one query.
fn probe() -> Step {
    let keys: Vec<String> = KEYS
        .iter()
        .map(|k| format!("current_setting('{k}', true) AS \"{k}\""))
        .collect();
    q(&format!(
        "SELECT {}, current_setting('statement_timeout') AS st, current_setting('work_mem') AS wm, \
         current_setting('TimeZone') AS tz, current_setting('search_path') AS sp, \
         current_setting('DateStyle') AS ds, current_setting('log_min_duration_statement') AS lmd, \
         current_user, session_user, current_setting('role') AS role, \
         (SELECT string_agg(name || ':' || parameter_types::text || ':' || from_sql, ',' ORDER BY name) \
          FROM pg_prepared_statements) AS statements, \
         (SELECT count(*) FROM audit) AS writes, (SELECT count(*) FROM counted) AS counted",
        keys.join(", ")
    ))
}

/// The way of setting a custom setting whose name only the inserted row holds (a trigger that
/// takes it from a bound parameter): a known gap (see the README), left out of the sequences
/// unless `known_gaps` is asked for. A function given the name as a literal (`set_k('app.k',
/// …)`) is not a gap: the gateway asks for every dotted literal argument.
const RUN_TIME_NAMES: [u8; 1] = [6];

fn gen_step(known_gaps: bool) -> impl Strategy<Value = GenStep> {
    let k = 0..KEYS.len();
    let n = 0u8..3;
    let hows: Vec<u8> = (0u8..9)
        .filter(|h| known_gaps || !RUN_TIME_NAMES.contains(h))
        .collect();
    prop_oneof![
        6 => (k.clone(), 0u8..3, prop::sample::select(hows)).prop_map(|(key, val, how)| GenStep::SetCustom { key, val, how }),
        1 => k.prop_map(|key| GenStep::Reset { key }),
        1 => Just(GenStep::ResetAll),
        1 => Just(GenStep::DiscardAll),
        3 => (0u8..5, 0u8..3).prop_map(|(which, val)| GenStep::Builtin { which, val }),
        2 => (0u8..5).prop_map(|which| GenStep::Role { which }),
        2 => (n.clone(), any::<bool>()).prop_map(|(n, after_insert)| GenStep::SqlPrepare { n, after_insert }),
        1 => n.clone().prop_map(|n| GenStep::Deallocate { n }),
        2 => n.clone().prop_map(|n| GenStep::Execute { n }),
        2 => n.clone().prop_map(|n| GenStep::ProtoPrepare { n }),
        2 => n.clone().prop_map(|n| GenStep::ProtoExec { n }),
        1 => n.prop_map(|n| GenStep::ProtoClose { n }),
        2 => (0u8..3).prop_map(|which| GenStep::Driver { which }),
        2 => (0u8..4).prop_map(|which| GenStep::Tx { which }),
        1 => (0u8..6).prop_map(|which| GenStep::Pin { which }),
        2 => (0u8..4).prop_map(|which| GenStep::OtherDdl { which }),
        1 => Just(GenStep::Seed),
        1 => any::<bool>().prop_map(|counted| GenStep::Insert { counted }),
        1 => Just(GenStep::SequenceRead),
        1 => Just(GenStep::LockDuringMove),
        2 => (0u8..2).prop_map(|n| GenStep::ContextPrepare { n }),
        2 => (0u8..5, 0u8..3).prop_map(|(which, val)| GenStep::ContextSet { which, val }),
        2 => (0u8..2).prop_map(|n| GenStep::ContextUse { n }),
        2 => (0u8..7).prop_map(|which| GenStep::Latin1 { which }),
        2 => Just(GenStep::Probe),
    ]
}

/// The move before a main step: none (most often, so sequences stay quick), or one kind.
fn gen_move() -> impl Strategy<Value = MoveKind> {
    prop_oneof![
        3 => Just(MoveKind::Stay),
        3 => Just(MoveKind::Migrate),
        1 => Just(MoveKind::SessionIdle),
        1 => Just(MoveKind::Sleep),
    ]
}

/// A generated sequence: abstract steps, each with the move before it.
pub type Items = Vec<(MoveKind, GenStep)>;

/// A sequence of 2 to 6 abstract steps, each with the move before it; with `known_gaps`, also
/// the steps that meet a gap the README names.
pub fn sequence(known_gaps: bool) -> impl Strategy<Value = Items> {
    prop::collection::vec((gen_move(), gen_step(known_gaps)), 2..=6).prop_map(move |mut items| {
        if !known_gaps {
            leave_out_first_reads_after_draws(&mut items);
        }
        items
    })
}

/// With `sequence_state = "auto"` a session that drew from a sequence while nothing could read
/// it moves, so the first read of its sequence state after a draw answers 55000 through the
/// gateway (a known difference): such a read becomes a probe. Once a text has read the state,
/// the session stays where it is whenever it holds some, so later reads are kept.
fn leave_out_first_reads_after_draws(items: &mut Items) {
    let (mut drawn, mut read) = (false, false);
    for (_, step) in items.iter_mut() {
        match step {
            GenStep::Insert { counted: true } => drawn = true,
            GenStep::SequenceRead if drawn && !read => *step = GenStep::Probe,
            GenStep::SequenceRead => read = true,
            _ => {}
        }
    }
}

/// The scenario of a sequence: its client steps, a migrate and a probe of the whole state.
pub fn scenario(items: &[(MoveKind, GenStep)]) -> Scenario {
    let mut steps = Vec::new();
    for (mv, g) in items {
        for s in g.steps() {
            if s.is_main() {
                steps.push(force(*mv));
            }
            steps.push(s);
        }
    }
    steps.push(force(MoveKind::Migrate));
    steps.push(probe());
    let name: Vec<String> = items.iter().map(|(_, g)| format!("{g:?}")).collect();
    Scenario {
        name: name.join(" → "),
        setup: String::new(),
        steps,
    }
}
