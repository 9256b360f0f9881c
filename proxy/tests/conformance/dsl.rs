//! Short constructors for scenario steps.

use std::time::Duration;

use super::run::Scenario;
use super::step::{MoveKind, Step};

pub fn sc(name: &str, steps: Vec<Step>) -> Scenario {
    sc_setup(name, "", steps)
}

pub fn sc_setup(name: &str, setup: &str, steps: Vec<Step>) -> Scenario {
    Scenario {
        name: name.to_owned(),
        setup: setup.to_owned(),
        steps,
    }
}

fn params(p: &[&str]) -> Vec<Option<String>> {
    p.iter()
        .map(|v| (*v != "\\N").then(|| (*v).to_owned()))
        .collect()
}

/// A simple Query.
pub fn q(sql: &str) -> Step {
    Step::Simple(sql.to_owned())
}

/// A simple Query sent in LATIN1.
pub fn q_latin1(sql: &str) -> Step {
    Step::Latin1(sql.to_owned())
}

/// Unnamed Parse/Bind/Describe/Execute/Sync (`\N` is NULL).
pub fn ext(sql: &str, oids: &[u32], p: &[&str]) -> Step {
    Step::Extended {
        sql: sql.to_owned(),
        oids: oids.to_vec(),
        params: params(p),
    }
}

/// A driver's prepare of a named statement (its description is cached).
pub fn prep(name: &str, sql: &str, oids: &[u32]) -> Step {
    Step::Prepare {
        name: name.to_owned(),
        sql: sql.to_owned(),
        oids: oids.to_vec(),
    }
}

/// A driver's execution decoded with the description cached at prepare time.
pub fn exec(name: &str, p: &[&str]) -> Step {
    Step::ExecCached {
        name: name.to_owned(),
        params: params(p),
    }
}

/// Bind/Describe portal/Execute of a named statement.
pub fn exec_named(name: &str, p: &[&str]) -> Step {
    Step::ExecNamed {
        name: name.to_owned(),
        params: params(p),
    }
}

pub fn describe(name: &str) -> Step {
    Step::DescribeStmt(name.to_owned())
}

pub fn close(name: &str) -> Step {
    Step::CloseStmt(name.to_owned())
}

/// A driver-level cached query (asyncpg-like re-prepare on `0A000`).
pub fn drv(sql: &str, p: &[&str]) -> Step {
    Step::Driver {
        sql: sql.to_owned(),
        params: params(p),
    }
}

pub fn copy_in(sql: &str, data: &str) -> Step {
    Step::CopyIn {
        sql: sql.to_owned(),
        data: data.to_owned(),
    }
}

/// Runs `sql` and sends one cancel with the session's own key after `ms`.
pub fn cancel(sql: &str, ms: u64) -> Step {
    Step::CancelRunning {
        sql: sql.to_owned(),
        after: Duration::from_millis(ms),
    }
}

pub fn send_cancel() -> Step {
    Step::SendCancel
}

/// The other session #0 runs `sql`.
pub fn side(sql: &str) -> Step {
    side_n(0, sql)
}

pub fn side_n(who: usize, sql: &str) -> Step {
    Step::Side {
        who,
        sql: sql.to_owned(),
    }
}

pub fn bg(who: usize, sql: &str) -> Step {
    Step::SideStart {
        who,
        sql: sql.to_owned(),
    }
}

pub fn finish(who: usize) -> Step {
    Step::SideFinish { who }
}

pub fn force(kind: MoveKind) -> Step {
    Step::Force(kind)
}

/// `SELECT current_setting(n, true)` for each name, one column each, named after it.
pub fn settings(names: &[&str]) -> Step {
    let cols: Vec<String> = names
        .iter()
        .map(|n| format!("current_setting('{n}', true) AS \"{n}\""))
        .collect();
    q(&format!("SELECT {}", cols.join(", ")))
}

/// Who the session is.
pub fn whoami() -> Step {
    q(
        "SELECT current_user, session_user, current_setting('role') AS role, \
       current_setting('is_superuser') AS su",
    )
}

/// The session's prepared statements as a client can list them.
pub fn statements() -> Step {
    q("SELECT name, parameter_types::text, from_sql FROM pg_prepared_statements ORDER BY name")
}
