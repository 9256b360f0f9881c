//! Every way a session's settings change: SET in its forms, `set_config` with literal and bound
//! arguments, from functions, DO blocks and triggers others created, settings the gateway
//! cannot see by reading query text (past its first bytes, many names), resets, transaction
//! scoped settings, search_path, time zone, roles and session authorization, superuser-only
//! settings, and database defaults changed while the session sits idle.

use super::super::dsl::*;
use super::super::run::Scenario;

const SET_TENANT_PLPGSQL: &str = "CREATE FUNCTION set_tenant(t text) RETURNS void \
     LANGUAGE plpgsql AS $$ BEGIN PERFORM set_config('app.tenant', t, false); END $$";

pub fn all() -> Vec<Scenario> {
    vec![
        sc(
            "set_custom",
            vec![
                q("SET app.x = 'a'"),
                settings(&["app.x"]),
                q("SHOW app.x"),
                settings(&["app.x"]),
            ],
        ),
        sc(
            "set_session_keyword",
            vec![
                q("SET SESSION app.x TO 'b'"),
                settings(&["app.x"]),
                q("SET SESSION statement_timeout = '7s'"),
                q("SHOW statement_timeout"),
                settings(&["app.x", "statement_timeout"]),
            ],
        ),
        sc(
            "set_builtins",
            vec![
                q("SET work_mem = '7MB'; SET lock_timeout = '3s'; SET extra_float_digits = 1"),
                settings(&["work_mem", "lock_timeout", "extra_float_digits"]),
                q("SELECT 0.1::float8"),
                q("SET bytea_output = 'escape'; SELECT 'ab'::bytea"),
                q("SELECT 'ab'::bytea"),
            ],
        ),
        sc(
            "set_reported_parameters",
            vec![
                q("SET application_name = 'conformance'"),
                q("SET DateStyle = 'SQL, DMY'"),
                q("SELECT '2020-03-04'::date::text"),
                q("SET IntervalStyle = 'iso_8601'"),
                q("SELECT '1 day 2 hours'::interval::text"),
                settings(&["application_name", "DateStyle", "IntervalStyle"]),
            ],
        ),
        sc(
            "set_config_literal",
            vec![
                q("SELECT set_config('app.tenant', 't1', false)"),
                settings(&["app.tenant"]),
                settings(&["app.tenant"]),
                settings(&["app.tenant"]),
            ],
        ),
        sc(
            "set_config_literal_is_local_outside_tx",
            vec![
                q("SELECT set_config('app.local', 'gone', true)"),
                settings(&["app.local"]),
                settings(&["app.local"]),
            ],
        ),
        sc(
            "set_config_bound_parameters",
            vec![
                ext("SELECT set_config($1, $2, false)", &[], &["app.tenant", "t2"]),
                settings(&["app.tenant"]),
                settings(&["app.tenant"]),
                settings(&["app.tenant"]),
            ],
        ),
        sc(
            "set_config_bound_typed_parameters",
            vec![
                ext("SELECT set_config($1, $2, $3)", &[25, 25, 16], &["app.typed", "yes", "f"]),
                settings(&["app.typed"]),
                settings(&["app.typed"]),
            ],
        ),
        sc(
            "set_config_bound_named_statement",
            vec![
                prep("setter", "SELECT set_config($1, $2, false)", &[25, 25]),
                exec_named("setter", &["app.tenant", "named"]),
                settings(&["app.tenant"]),
                exec("setter", &["app.other", "cached"]),
                settings(&["app.tenant", "app.other"]),
            ],
        ),
        sc(
            "set_config_bound_driver",
            vec![
                drv("SELECT set_config($1, $2, false)", &["app.tenant", "drv"]),
                settings(&["app.tenant"]),
                drv("SELECT set_config($1, $2, false)", &["app.tenant", "drv2"]),
                settings(&["app.tenant"]),
            ],
        ),
        sc(
            "set_config_name_from_table",
            vec![
                q("SELECT set_config('app.from_' || id, v, false) FROM t ORDER BY id"),
                settings(&["app.from_1", "app.from_2", "app.from_3"]),
                settings(&["app.from_1", "app.from_2", "app.from_3"]),
            ],
        ),
        sc(
            "set_config_in_plpgsql_function_made_by_other",
            vec![
                q("SELECT 1"),
                side(SET_TENANT_PLPGSQL),
                q("SELECT set_tenant('acme')"),
                settings(&["app.tenant"]),
                settings(&["app.tenant"]),
                q("SELECT current_setting('app.tenant', true) IS NULL AS is_null"),
            ],
        ),
        sc_setup(
            "set_config_in_function_bound_call",
            SET_TENANT_PLPGSQL,
            vec![
                ext("SELECT set_tenant($1)", &[25], &["bound-acme"]),
                settings(&["app.tenant"]),
                settings(&["app.tenant"]),
            ],
        ),
        sc_setup(
            "set_config_in_sql_function",
            "CREATE FUNCTION set_app(v text) RETURNS text LANGUAGE sql \
             AS $$ SELECT set_config('app.sqlfn', v, false) $$",
            vec![
                q("SELECT set_app('from-sql-fn')"),
                settings(&["app.sqlfn"]),
                settings(&["app.sqlfn"]),
            ],
        ),
        sc_setup(
            "set_in_function_with_execute",
            "CREATE FUNCTION dyn_set(n text, v text) RETURNS void LANGUAGE plpgsql \
             AS $$ BEGIN EXECUTE format('SET %s = %L', n, v); END $$",
            vec![
                q("SELECT dyn_set('app.dyn', 'dynamic')"),
                q("SELECT dyn_set('statement_timeout', '11s')"),
                settings(&["app.dyn", "statement_timeout"]),
                settings(&["app.dyn", "statement_timeout"]),
            ],
        ),
        sc(
            "set_in_do_block",
            vec![
                q("DO $$ BEGIN PERFORM set_config('app.do', 'yes', false); END $$"),
                settings(&["app.do"]),
                settings(&["app.do"]),
            ],
        ),
        sc(
            "set_in_do_block_execute",
            vec![
                q("DO $$ BEGIN EXECUTE 'SET app.doexec = ''v1'''; \
                   EXECUTE 'SET search_path = app, public'; END $$"),
                settings(&["app.doexec", "search_path"]),
                q("SELECT name FROM items"),
                settings(&["app.doexec", "search_path"]),
            ],
        ),
        sc_setup(
            "set_in_trigger",
            "CREATE TABLE trig_t (v text);
             CREATE FUNCTION trig_fn() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM set_config('app.trig', NEW.v, false); RETURN NEW; END $$;
             CREATE TRIGGER trig_set BEFORE INSERT ON trig_t FOR EACH ROW EXECUTE FUNCTION trig_fn();",
            vec![
                q("INSERT INTO trig_t VALUES ('fired')"),
                settings(&["app.trig"]),
                settings(&["app.trig"]),
                q("SELECT count(*) FROM trig_t"),
            ],
        ),
        sc_setup(
            "set_in_trigger_via_bound_insert",
            "CREATE TABLE trig_t (v text);
             CREATE FUNCTION trig_fn() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM set_config('app.trig', NEW.v, false); RETURN NEW; END $$;
             CREATE TRIGGER trig_set AFTER INSERT ON trig_t FOR EACH ROW EXECUTE FUNCTION trig_fn();",
            vec![
                drv("INSERT INTO trig_t VALUES ($1)", &["bound-fired"]),
                settings(&["app.trig"]),
                settings(&["app.trig"]),
            ],
        ),
        sc(
            "set_past_byte_1024",
            vec![
                q(&format!(
                    "SELECT 1 /* {} */; SET app.late = 'late'; SET statement_timeout = '13s'",
                    "x".repeat(1100)
                )),
                settings(&["app.late", "statement_timeout"]),
                settings(&["app.late", "statement_timeout"]),
            ],
        ),
        sc(
            "set_seventy_custom_settings",
            vec![
                q(&(1..=70)
                    .map(|i| format!("SET app.s{i} = 'v{i}'"))
                    .collect::<Vec<_>>()
                    .join("; ")),
                q("SELECT count(*) FROM generate_series(1, 70) i \
                   WHERE current_setting('app.s' || i, true) = 'v' || i"),
                q("SELECT count(*) FROM generate_series(1, 70) i \
                   WHERE current_setting('app.s' || i, true) = 'v' || i"),
                settings(&["app.s1", "app.s64", "app.s65", "app.s70"]),
            ],
        ),
        sc(
            "set_seventy_custom_settings_over_queries",
            {
                // Seven queries of ten names each: the names add up past 64 over time.
                let mut steps: Vec<_> = (0..7)
                    .map(|k| {
                        q(&(1..=10)
                            .map(|j| format!("SET app.n{} = 'n{}'", k * 10 + j, k * 10 + j))
                            .collect::<Vec<_>>()
                            .join("; "))
                    })
                    .collect();
                steps.push(q("SELECT count(*) FROM generate_series(1, 70) i \
                              WHERE current_setting('app.n' || i, true) = 'n' || i"));
                steps
            },
        ),
        sc(
            "reset_one",
            vec![
                q("SET app.x = 'a'; SET statement_timeout = '5s'"),
                q("RESET app.x; RESET statement_timeout"),
                settings(&["app.x", "statement_timeout"]),
                settings(&["app.x", "statement_timeout"]),
            ],
        ),
        sc(
            "reset_all",
            vec![
                q("SET app.x = 'a'; SET work_mem = '9MB'; SET search_path = app"),
                q("RESET ALL"),
                settings(&["app.x", "work_mem", "search_path"]),
                settings(&["app.x", "work_mem", "search_path"]),
            ],
        ),
        sc(
            "set_to_default",
            vec![
                q("SET statement_timeout = '5s'; SET app.x = 'a'"),
                q("SET statement_timeout TO DEFAULT; SET app.x TO DEFAULT"),
                settings(&["statement_timeout", "app.x"]),
                settings(&["statement_timeout", "app.x"]),
            ],
        ),
        sc(
            "set_local_in_transaction",
            vec![
                q("BEGIN; SET LOCAL app.l = 'local'; SET LOCAL work_mem = '8MB'; COMMIT"),
                settings(&["app.l", "work_mem"]),
                settings(&["app.l", "work_mem"]),
            ],
        ),
        sc(
            "set_local_over_session_value",
            vec![
                q("SET app.y = 'session'"),
                q("BEGIN; SET LOCAL app.y = 'local'; SELECT current_setting('app.y'); COMMIT"),
                settings(&["app.y"]),
                settings(&["app.y"]),
            ],
        ),
        sc(
            "set_in_rolled_back_transaction",
            vec![
                q("BEGIN; SET app.r = 'rolled'; SET work_mem = '6MB'; ROLLBACK"),
                settings(&["app.r", "work_mem"]),
                settings(&["app.r", "work_mem"]),
            ],
        ),
        sc(
            "set_then_error_in_same_query",
            vec![
                q("SET app.e = 'before-error'; SELECT 1/0"),
                settings(&["app.e"]),
                settings(&["app.e"]),
            ],
        ),
        sc(
            "set_in_committed_transaction_steps",
            vec![
                q("BEGIN"),
                q("SET app.c = 'committed'"),
                q("COMMIT"),
                settings(&["app.c"]),
            ],
        ),
        sc(
            "discard_all",
            vec![
                q("SET app.x = 'a'; SET work_mem = '5MB'; PREPARE p AS SELECT 1"),
                prep("s", "SELECT 2", &[]),
                q("DISCARD ALL"),
                settings(&["app.x", "work_mem"]),
                statements(),
            ],
        ),
        sc(
            "search_path_set",
            vec![
                q("SET search_path = app, public"),
                q("SELECT name FROM items"),
                settings(&["search_path"]),
                q("SELECT name FROM items"),
            ],
        ),
        sc(
            "search_path_set_config_bound",
            vec![
                ext("SELECT set_config('search_path', $1, false)", &[25], &["app"]),
                q("SELECT name FROM items"),
                q("SELECT name FROM items"),
            ],
        ),
        sc(
            "search_path_under_prepared_statement",
            vec![
                q("SET search_path = app"),
                prep("by_id", "SELECT name FROM items WHERE id = $1", &[23]),
                exec("by_id", &["1"]),
                exec("by_id", &["1"]),
                exec_named("by_id", &["1"]),
            ],
        ),
        sc(
            "search_path_schema_dropped_while_idle",
            vec![
                q("SET search_path = app, public"),
                q("SELECT name FROM items"),
                side("DROP SCHEMA app CASCADE"),
                q("SELECT name FROM items"),
                settings(&["search_path"]),
            ],
        ),
        sc(
            "time_zone",
            vec![
                q("SET TimeZone = 'Asia/Tokyo'"),
                q("SELECT '2020-01-01 00:00+00'::timestamptz::text"),
                q("SET TIME ZONE 'America/New_York'"),
                q("SELECT '2020-01-01 00:00+00'::timestamptz::text"),
                settings(&["TimeZone"]),
            ],
        ),
        sc(
            "time_zone_set_config",
            vec![
                q("SELECT set_config('timezone', 'Europe/Paris', false)"),
                q("SELECT '2020-06-01 00:00+00'::timestamptz::text"),
                q("SELECT '2020-06-01 00:00+00'::timestamptz::text"),
            ],
        ),
        sc(
            "client_encoding",
            vec![
                q("SET client_encoding = 'LATIN1'"),
                q("SELECT 'abc' AS plain"),
                settings(&["client_encoding"]),
                q("RESET client_encoding"),
            ],
        ),
        sc(
            "standard_conforming_strings_off",
            vec![
                q("SET standard_conforming_strings = off"),
                q("SELECT 'a\\\\b' AS escaped"),
                q("SELECT 'a\\\\b' AS escaped"),
            ],
        ),
        sc(
            "default_transaction_settings",
            vec![
                q("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
                q("BEGIN; SHOW transaction_isolation; COMMIT"),
                q("SET default_transaction_read_only = on"),
                q("INSERT INTO audit(note) VALUES ('ro')"),
                q("BEGIN; SHOW transaction_isolation; COMMIT"),
            ],
        ),
        sc(
            "quoted_custom_setting_name",
            vec![
                q("SET \"app.MixedCase\" = 'mixed'"),
                q("SELECT current_setting('app.MixedCase', true), current_setting('app.mixedcase', true)"),
                q("SELECT current_setting('app.MixedCase', true)"),
            ],
        ),
        sc(
            "custom_value_with_quotes_and_spaces",
            vec![
                q("SET app.q = 'it''s a \"value\"; with semicolon'"),
                settings(&["app.q"]),
                settings(&["app.q"]),
            ],
        ),
        sc(
            "set_role",
            vec![
                q("SET ROLE {db}_r"),
                whoami(),
                q("SELECT count(*) FROM t"),
                whoami(),
            ],
        ),
        sc(
            "set_role_then_reset",
            vec![
                q("SET ROLE {db}_s"),
                whoami(),
                q("RESET ROLE"),
                whoami(),
            ],
        ),
        sc(
            "set_role_none",
            vec![
                q("SET ROLE {db}_s"),
                q("SET ROLE NONE"),
                whoami(),
            ],
        ),
        sc(
            "set_role_via_set_config",
            vec![
                q("SELECT set_config('role', '{db}_s', false)"),
                whoami(),
                whoami(),
            ],
        ),
        sc(
            "session_authorization",
            vec![
                q("SET SESSION AUTHORIZATION {db}_r"),
                whoami(),
                q("INSERT INTO audit(note) VALUES ('as r') RETURNING note"),
                whoami(),
            ],
        ),
        sc(
            "session_authorization_then_role",
            vec![
                q("SET SESSION AUTHORIZATION {db}_r"),
                q("SET ROLE {db}_s"),
                whoami(),
                q("RESET ROLE"),
                whoami(),
            ],
        ),
        sc(
            "session_authorization_reset",
            vec![
                q("SET SESSION AUTHORIZATION {db}_r"),
                whoami(),
                q("RESET SESSION AUTHORIZATION"),
                whoami(),
            ],
        ),
        sc(
            "superuser_setting_then_session_authorization",
            vec![
                q("SET log_min_duration_statement = 0"),
                q("SET SESSION AUTHORIZATION {db}_r"),
                q("SHOW log_min_duration_statement"),
                whoami(),
                q("SHOW log_min_duration_statement"),
            ],
        ),
        sc(
            "superuser_settings_then_role",
            vec![
                q("SET lc_messages = 'C'; SET session_replication_role = replica"),
                q("SET ROLE {db}_r"),
                settings(&["lc_messages", "session_replication_role"]),
                whoami(),
            ],
        ),
        sc(
            "superuser_setting_after_authorization_refused",
            vec![
                q("SET SESSION AUTHORIZATION {db}_r"),
                q("SET log_statement = 'all'"),
                settings(&["log_statement"]),
                q("RESET SESSION AUTHORIZATION"),
                q("SET log_statement = 'all'"),
                settings(&["log_statement"]),
            ],
        ),
        sc(
            "role_dropped_while_idle_under_set_role",
            vec![
                q("SET ROLE {db}_s"),
                side("REASSIGN OWNED BY {db}_s TO pgwake; DROP OWNED BY {db}_s; DROP ROLE {db}_s"),
                whoami(),
                q("SELECT 1"),
                q("RESET ROLE"),
            ],
        ),
        sc(
            "role_dropped_while_idle_under_session_authorization",
            vec![
                q("SET SESSION AUTHORIZATION {db}_s"),
                side("REASSIGN OWNED BY {db}_s TO pgwake; DROP OWNED BY {db}_s; DROP ROLE {db}_s"),
                q("SELECT 1"),
                q("SELECT current_user"),
                q("RESET SESSION AUTHORIZATION"),
                whoami(),
            ],
        ),
        sc(
            "privilege_revoked_while_idle",
            vec![
                q("SET ROLE {db}_s"),
                q("SELECT count(*) FROM t"),
                side("REVOKE ALL ON t FROM {db}_s"),
                q("SELECT count(*) FROM t"),
            ],
        ),
        // Outside ASCII under a client encoding that is not UTF-8: the session's state is
        // carried as the server holds it, not as the client's bytes read as UTF-8.
        sc(
            "latin1_client_keeps_non_ascii_state",
            vec![
                q("CREATE SCHEMA \"ßchema\"; CREATE TABLE \"ßchema\".enc_t (v text); \
                   INSERT INTO \"ßchema\".enc_t VALUES ('ß inside'); \
                   CREATE TABLE public.enc_t (v text); INSERT INTO public.enc_t VALUES ('public')"),
                q("SET search_path = \"ßchema\", public"),
                q("SET app.note = 'naïve café'"),
                prep("enc_s", "SELECT v, 'é' AS e FROM enc_t", &[]),
                q("PREPARE enc_p AS SELECT 'ü'::text AS u, count(*) FROM enc_t"),
                q("SET client_encoding = 'LATIN1'"),
                q("SELECT v FROM enc_t"),
                q("SHOW search_path"),
                q("SELECT current_setting('app.note')"),
                exec("enc_s", &[]),
                q("EXECUTE enc_p"),
                q("SHOW client_encoding"),
                q("RESET client_encoding"),
                exec("enc_s", &[]),
            ],
        ),
        // The same state made by a LATIN1 client's own bytes.
        sc(
            "latin1_client_sends_non_ascii_names_and_values",
            vec![
                q("SET client_encoding = 'LATIN1'"),
                q_latin1(
                    "CREATE SCHEMA \"ßchema\"; CREATE TABLE \"ßchema\".enc_t (v text); \
                     INSERT INTO \"ßchema\".enc_t VALUES ('ß é'); \
                     CREATE TABLE public.enc_t (v text); INSERT INTO public.enc_t VALUES ('public')",
                ),
                q_latin1("SET search_path = \"ßchema\", public"),
                q_latin1("SET app.note = 'naïve café'"),
                q_latin1(
                    "PREPARE enc_p AS SELECT 'ü' AS u, v, \
                     encode(convert_to(v, 'UTF8'), 'hex') AS h FROM enc_t",
                ),
                q_latin1(
                    "SELECT v, encode(convert_to(current_setting('app.note'), 'UTF8'), 'hex') AS n, \
                     encode(convert_to(current_setting('search_path'), 'UTF8'), 'hex') AS sp FROM enc_t",
                ),
                q("EXECUTE enc_p"),
                q("RESET client_encoding"),
                q("EXECUTE enc_p"),
                q("SHOW search_path"),
            ],
        ),
        sc(
            "database_default_changed_while_idle",
            vec![
                settings(&["app.dbdef", "statement_timeout"]),
                side("ALTER DATABASE {db} SET app.dbdef = 'new'; \
                      ALTER DATABASE {db} SET statement_timeout = '9s'"),
                settings(&["app.dbdef", "statement_timeout"]),
                settings(&["app.dbdef", "statement_timeout"]),
            ],
        ),
        sc(
            "role_default_changed_while_idle",
            vec![
                q("SET SESSION AUTHORIZATION {db}_r"),
                side("ALTER ROLE {db}_r SET work_mem = '3MB'"),
                settings(&["work_mem"]),
                settings(&["work_mem"]),
            ],
        ),
        sc(
            "setseed_then_random",
            vec![
                q("SELECT setseed(0.5)"),
                q("SELECT random()"),
                q("SELECT random()"),
                q("SELECT random()"),
            ],
        ),
        sc(
            "setseed_and_random_in_one_query",
            vec![
                q("SELECT setseed(0.25); SELECT random()"),
                q("SELECT random()"),
                q("SELECT random()"),
            ],
        ),
        sc(
            "settings_from_every_source_together",
            vec![
                q("SET app.a = '1'"),
                ext("SELECT set_config($1, $2, false)", &[], &["app.b", "2"]),
                q("DO $$ BEGIN PERFORM set_config('app.c', '3', false); END $$"),
                q("BEGIN; SET LOCAL app.d = '4'; COMMIT"),
                settings(&["app.a", "app.b", "app.c", "app.d"]),
                settings(&["app.a", "app.b", "app.c", "app.d"]),
            ],
        ),
        sc(
            "session_sourced_settings_listed",
            vec![
                q("SET work_mem = '4MB'; SET app.x = 'listed'"),
                q("SELECT name, setting FROM pg_settings WHERE source = 'session' ORDER BY name"),
                q("SELECT name, setting FROM pg_settings WHERE source = 'session' ORDER BY name"),
            ],
        ),
        sc(
            "set_config_null_value",
            vec![
                q("SELECT set_config('app.n', 'x', false)"),
                q("SELECT set_config('app.n', NULL, false)"),
                settings(&["app.n"]),
                settings(&["app.n"]),
            ],
        ),
    ]
}
