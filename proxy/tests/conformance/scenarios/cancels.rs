//! Cancel keys belong to the session: a running query is cancelled with the client's own key
//! after moves; a parked session's key never reaches another session's query on the backend
//! it left; a cancel while the session waits for a wake or a free backend slot ends the wait
//! with `57014`.

use super::super::dsl::*;
use super::super::lab::CAP;
use super::super::run::Scenario;
use super::super::step::MoveKind;

pub fn all() -> Vec<Scenario> {
    let mut slot_wait = vec![q("SELECT 'before'"), force(MoveKind::SessionIdle)];
    // Every slot of the tenant's cap busy with other sessions' queries, then the parked main
    // session asks for one, and cancels while it waits.
    for who in 0..CAP {
        slot_wait.push(bg(who, "SELECT pg_sleep(3)"));
    }
    slot_wait.push(cancel("SELECT pg_sleep(1)", 300));
    for who in 0..CAP {
        slot_wait.push(finish(who));
    }
    slot_wait.push(q("SELECT 'after'"));
    // Issue 26 case 3: the parked session's backend connection serves others (at the cap, the
    // kept one is surely taken); its client's cancel must not stop their queries.
    let mut spared = vec![q("SELECT 'parked next'"), force(MoveKind::SessionIdle)];
    for who in 0..CAP {
        spared.push(bg(who, "SELECT pg_sleep(2), 'not cancelled'"));
    }
    spared.push(send_cancel());
    for who in 0..CAP {
        spared.push(finish(who));
    }
    spared.push(q("SELECT 'after'"));
    vec![
        sc(
            "cancel_running_query",
            vec![
                q("SELECT 1"),
                cancel("SELECT pg_sleep(5)", 300),
                q("SELECT 'after'"),
                cancel("SELECT pg_sleep(5)", 300),
            ],
        ),
        sc(
            "cancel_in_transaction",
            vec![
                q("BEGIN"),
                cancel("SELECT pg_sleep(5)", 300),
                q("SELECT 1"),
                q("ROLLBACK"),
            ],
        ),
        sc(
            "cancel_after_settings_and_statements",
            vec![
                q("SET app.x = 'c'"),
                prep("s", "SELECT pg_sleep($1::float8)", &[]),
                cancel("SELECT pg_sleep(5)", 300),
                settings(&["app.x"]),
            ],
        ),
        sc(
            "parked_session_key_spares_other_session",
            vec![
                q("SELECT 'parked next'"),
                force(MoveKind::SessionIdle),
                bg(0, "SELECT pg_sleep(1.5), 'not cancelled'"),
                send_cancel(),
                finish(0),
                q("SELECT 'after'"),
            ],
        ),
        sc(
            "parked_session_key_spares_other_session_after_sleep",
            vec![
                q("SELECT 'asleep next'"),
                force(MoveKind::Sleep),
                bg(0, "SELECT pg_sleep(1.5), 'not cancelled'"),
                send_cancel(),
                finish(0),
                q("SELECT 'after'"),
            ],
        ),
        // The wake takes some 50-150 ms here: the cancel must land inside it, while directly
        // the query has long started.
        sc(
            "cancel_while_waking",
            vec![
                q("SELECT 'asleep next'"),
                force(MoveKind::Sleep),
                cancel("SELECT pg_sleep(1)", 15),
                q("SELECT 'after'"),
            ],
        ),
        sc("cancel_while_waiting_for_a_slot", slot_wait),
        sc("parked_session_key_spares_every_session_at_the_cap", spared),
        sc(
            "cancel_key_of_idle_session_is_harmless",
            vec![
                q("SELECT 1"),
                send_cancel(),
                q("SELECT 2"),
                send_cancel(),
                q("SELECT 3"),
            ],
        ),
    ]
}
