//! Catalog objects another session drops or adds while the session is parked, where no
//! gateway can give the session back exactly what it had (each is a known difference the
//! README names): a setting that names a dropped object, an overload that a statement made
//! again resolves to, a collation changed under a statement's column.

use super::super::dsl::*;
use super::super::run::Scenario;

pub fn all() -> Vec<Scenario> {
    vec![
        sc_setup(
            "text_search_config_dropped_while_idle",
            "CREATE TEXT SEARCH CONFIGURATION public.mycfg (COPY = pg_catalog.simple)",
            vec![
                q("SET default_text_search_config = 'public.mycfg'"),
                q("SELECT to_tsvector('The running dogs')::text"),
                side("DROP TEXT SEARCH CONFIGURATION public.mycfg"),
                q("SHOW default_text_search_config"),
                q("SELECT to_tsvector('The running dogs')::text"),
            ],
        ),
        sc_setup(
            "function_overload_created_while_idle",
            "CREATE FUNCTION ov(x numeric) RETURNS text LANGUAGE sql AS $$ SELECT 'numeric' $$",
            vec![
                prep("o", "SELECT ov(1) AS which", &[]),
                q("PREPARE op AS SELECT ov(1) AS which"),
                exec("o", &[]),
                q("EXECUTE op"),
                side("CREATE FUNCTION ov(x int) RETURNS text LANGUAGE sql AS $$ SELECT 'int' $$"),
                exec("o", &[]),
                q("EXECUTE op"),
                q("SELECT ov(1) AS which"),
            ],
        ),
        sc_setup(
            "column_collation_changed_while_idle",
            "CREATE TABLE co (v text COLLATE \"C\"); INSERT INTO co VALUES ('a'), ('B'), ('c')",
            vec![
                prep("c", "SELECT v FROM co ORDER BY v", &[]),
                q("PREPARE cp AS SELECT v FROM co ORDER BY v"),
                exec("c", &[]),
                q("EXECUTE cp"),
                side("ALTER TABLE co ALTER COLUMN v TYPE text COLLATE \"en-x-icu\""),
                exec("c", &[]),
                q("EXECUTE cp"),
            ],
        ),
    ]
}
