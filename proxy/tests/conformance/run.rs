//! Runs a scenario in lockstep against direct Postgres and through pgwake, moving the gateway's
//! session between every two main-session steps, and compares what the client saw.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::lab::{GapReport, Lab, Mover, Others, Side};
use super::step::{Event, MainSession, MoveKind, Step};
use super::wire::WireClient;

/// A named list of client steps.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// SQL run in the scenario's fresh database after the base schema, on both sides.
    pub setup: String,
    pub steps: Vec<Step>,
}

/// One step where the two sides differ.
#[derive(Debug)]
pub struct Difference {
    pub step: usize,
    pub what: String,
    pub direct: Vec<Event>,
    pub gateway: Vec<Event>,
    pub gap: Option<GapReport>,
}

/// How a scenario went.
#[derive(Debug, Default)]
pub struct Outcome {
    pub name: String,
    pub main_steps: usize,
    pub gaps: Vec<GapReport>,
    pub differences: Vec<Difference>,
}

impl Outcome {
    pub fn moved(&self) -> usize {
        self.gaps.iter().filter(|g| g.moved).count()
    }

    /// Moved / tried, for one kind.
    pub fn moved_of(&self, kind: MoveKind) -> (usize, usize) {
        let of: Vec<_> = self.gaps.iter().filter(|g| g.kind == Some(kind)).collect();
        (of.iter().filter(|g| g.moved).count(), of.len())
    }

    /// Pin reasons the log gave for gaps that did not move.
    pub fn pins(&self) -> Vec<String> {
        let mut p: Vec<String> = self
            .gaps
            .iter()
            .filter(|g| !g.moved)
            .filter_map(|g| g.pinned.clone())
            .collect();
        p.sort();
        p.dedup();
        p
    }

    /// The scenario's block of output: its name, moves, and each difference in full.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mark = if self.differences.is_empty() {
            "ok  "
        } else {
            "DIFF"
        };
        let kinds: Vec<String> = MoveKind::ALL
            .iter()
            .map(|k| {
                let (m, n) = self.moved_of(*k);
                format!("{} {m}/{n}", k.label())
            })
            .collect();
        let _ = write!(
            s,
            "{mark} {}: moved {}/{} gaps ({})",
            self.name,
            self.moved(),
            self.gaps.len(),
            kinds.join(", ")
        );
        let pins = self.pins();
        if !pins.is_empty() {
            let _ = write!(s, "; stayed: {}", pins.join("; "));
        }
        s.push('\n');
        for d in &self.differences {
            let _ = writeln!(s, "     step {}: {}", d.step, d.what);
            if let Some(g) = &d.gap {
                let _ = writeln!(
                    s,
                    "       move before it: {} moved={} parks={:?} revivals={:?}{}",
                    g.kind.map_or("none", |k| k.label()),
                    g.moved,
                    g.parks,
                    g.revivals,
                    g.pinned
                        .as_ref()
                        .map(|p| format!(" pinned={p}"))
                        .or_else(|| g.failed.as_ref().map(|f| format!(" revival failed: {f}")))
                        .unwrap_or_default()
                );
            }
            let first = d
                .direct
                .iter()
                .zip(&d.gateway)
                .position(|(a, b)| a != b)
                .unwrap_or(d.direct.len().min(d.gateway.len()));
            for (label, events) in [("direct ", &d.direct), ("pgwake ", &d.gateway)] {
                let _ = writeln!(s, "       {label}:");
                for (i, e) in events.iter().enumerate() {
                    let arrow = if i == first { ">" } else { " " };
                    let _ = writeln!(s, "        {arrow} {e}");
                }
            }
        }
        s
    }
}

/// One side of a scenario: its main session and its other sessions.
struct World {
    main: MainSession,
    others: Others,
}

impl World {
    async fn open(side: &Side, db: &str) -> Result<World, String> {
        let client = WireClient::connect(&side.login(db))
            .await
            .map_err(|e| format!("login: {e:?}"))?;
        Ok(World {
            main: MainSession::new(client),
            others: Others::new(side.clone(), db),
        })
    }

    async fn side_step(&mut self, step: &Step) -> Vec<Event> {
        match step {
            Step::Side { who, sql } => self.others.run(*who, sql).await,
            Step::SideStart { who, sql } => self.others.start(*who, sql).await,
            Step::SideFinish { who } => self.others.finish(*who).await,
            _ => Vec::new(),
        }
    }
}

/// Where scenarios run.
#[derive(Clone, Debug)]
pub enum Databases {
    /// A fresh database for each scenario, named with this prefix and the scenario's number.
    Fresh(String),
    /// One database per shard (`<prefix><shard>`), made with the base schema and `setup` once,
    /// and `reset` run in it before each scenario.
    PerShard {
        prefix: String,
        setup: String,
        reset: String,
    },
}

/// The direct side, and the gateway side through `tenant`, for sessions named `app`.
fn sides(lab: &Lab, tenant: &str, app: &str) -> (Side, Side) {
    (
        Side {
            port: lab.direct.port,
            prefix: String::new(),
            app: app.to_owned(),
        },
        Side {
            port: lab.gw.port,
            prefix: format!("{tenant}."),
            app: app.to_owned(),
        },
    )
}

/// Runs `sql` in `db` on both sides (a database's reset between generated sequences).
async fn on_both(lab: &Lab, tenant: &str, db: &str, sql: &str) {
    let sql = sql.replace("{db}", db);
    for side in <[Side; 2]>::from(sides(lab, tenant, "reset")) {
        let c = side.connect(db).await.expect("login for a reset");
        c.batch_execute(&sql).await.expect("reset");
    }
}

/// Runs one scenario in database `db` on both sides (made fresh when `fresh`); its `number`
/// picks the first move kind and names its sessions (no two scenarios share a number).
pub async fn run_scenario(
    lab: &Lab,
    mover: &mut Mover<'_>,
    sc: &Scenario,
    (db, fresh): (&str, bool),
    number: usize,
) -> Outcome {
    let app = format!("conformance{number}");
    let (direct, gateway) = sides(lab, &mover.tenant, &app);
    mover.app = app;
    let mut out = Outcome {
        name: sc.name.clone(),
        ..Outcome::default()
    };
    if fresh {
        direct.create_db(db, &sc.setup).await;
        gateway.create_db(db, &sc.setup).await;
    }
    let (mut d, mut g) = match (
        World::open(&direct, db).await,
        World::open(&gateway, db).await,
    ) {
        (Ok(d), Ok(g)) => (d, g),
        (d, g) => {
            out.differences.push(Difference {
                step: 0,
                what: format!("login: direct {:?}, pgwake {:?}", d.err(), g.err()),
                direct: Vec::new(),
                gateway: Vec::new(),
                gap: None,
            });
            return out;
        }
    };
    let peer = g.main.client.local.clone();
    let mut forced: Option<MoveKind> = None;
    // The gap in progress: its kind, once the first step after a main step began it.
    let mut gap: Option<MoveKind> = None;
    let mut after_main = false;
    let mut gaps = 0usize;
    for (i, step) in sc.steps.iter().enumerate() {
        let step = step.for_db(db);
        if let Step::Force(k) = step {
            forced = Some(k);
            continue;
        }
        if after_main && gap.is_none() && !g.main.dead {
            let kind = forced
                .take()
                .unwrap_or(MoveKind::ALL[(number + gaps) % MoveKind::ALL.len()]);
            gaps += 1;
            mover.begin(kind, &peer, db, g.main.status != 'I').await;
            gap = Some(kind);
        }
        if !step.is_main() {
            let de = d.side_step(&step).await;
            let ge = g.side_step(&step).await;
            if de != ge {
                out.differences.push(Difference {
                    step: i + 1,
                    what: format!("{step}: answers differ"),
                    direct: de,
                    gateway: ge,
                    gap: None,
                });
            }
            continue;
        }
        if let Some(kind) = gap {
            mover.end(kind, &peer, g.main.status != 'I').await;
        }
        out.main_steps += 1;
        let de = d.main.run(&step).await;
        let ge = g.main.run(&step).await;
        let report = match gap.take() {
            Some(kind) => {
                let r = mover.report(kind, &peer).await;
                out.gaps.push(r.clone());
                Some(r)
            }
            None => None,
        };
        after_main = true;
        if de != ge {
            out.differences.push(Difference {
                step: i + 1,
                what: format!("{step}: answers differ"),
                direct: de,
                gateway: ge,
                gap: report,
            });
        }
        if d.main.dead || g.main.dead {
            // A connection that ended on one side is already a difference (its answer says
            // so); the rest of the scenario cannot be compared.
            break;
        }
    }
    mover.stop_pinging().await;
    if d.main.notifications != g.main.notifications {
        out.differences.push(Difference {
            step: sc.steps.len(),
            what: format!(
                "notifications differ: direct {:?}, pgwake {:?}",
                d.main.notifications, g.main.notifications
            ),
            direct: Vec::new(),
            gateway: Vec::new(),
            gap: None,
        });
    }
    for w in [d, g] {
        if !w.main.dead {
            w.main.client.terminate().await;
        }
    }
    out
}

/// Runs scenario number `i` on `shard` (its tenant's name beside it) in the database `dbs`
/// gives it.
pub async fn run_on_shard(
    lab: &Lab,
    mover: &mut Mover<'_>,
    (shard, tenant): (usize, &str),
    dbs: &Databases,
    (i, sc): (usize, &Scenario),
) -> Outcome {
    match dbs {
        Databases::Fresh(prefix) => {
            let db = format!("{prefix}{i}");
            let o = run_scenario(lab, mover, sc, (&db, true), i).await;
            let (direct, gateway) = sides(lab, tenant, "admin");
            direct.drop_db(&db).await;
            gateway.drop_db(&db).await;
            o
        }
        Databases::PerShard { prefix, reset, .. } => {
            let db = format!("{prefix}{shard}");
            on_both(lab, tenant, &db, reset).await;
            run_scenario(lab, mover, sc, (&db, false), i).await
        }
    }
}

/// Runs scenarios on every shard of the lab at once (each shard takes the next one waiting),
/// printing each scenario's block as it ends (only differing ones when `quiet`, with a progress
/// line every 100); returns the outcomes in scenario order.
pub async fn run_all(
    lab: Arc<Lab>,
    scenarios: Arc<Vec<Scenario>>,
    dbs: Databases,
    quiet: bool,
) -> Vec<Outcome> {
    let next = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let mut shards = Vec::new();
    for (shard, tenant) in lab.tenants.clone().into_iter().enumerate() {
        let (lab, scenarios, next) = (lab.clone(), scenarios.clone(), next.clone());
        let (dbs, finished) = (dbs.clone(), finished.clone());
        shards.push(tokio::spawn(async move {
            let mut mover = Mover::new(&lab, &tenant).await;
            if let Databases::PerShard { prefix, setup, .. } = &dbs {
                let db = format!("{prefix}{shard}");
                let (direct, gateway) = sides(&lab, &tenant, "admin");
                direct.create_db(&db, setup).await;
                gateway.create_db(&db, setup).await;
            }
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(sc) = scenarios.get(i) else {
                    break;
                };
                let o = run_on_shard(&lab, &mut mover, (shard, &tenant), &dbs, (i, sc)).await;
                if !quiet || !o.differences.is_empty() {
                    print!("{}", o.render());
                }
                let n = finished.fetch_add(1, Ordering::SeqCst) + 1;
                if quiet && n % 100 == 0 {
                    println!("… {n} of {} done", scenarios.len());
                }
                done.push((i, o));
            }
            done
        }));
    }
    let mut all = Vec::new();
    for s in shards {
        all.extend(s.await.expect("a shard panicked"));
    }
    all.sort_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, o)| o).collect()
}

/// The summary table: one line per scenario, then the totals.
pub fn summary(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    let width = outcomes
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let _ = writeln!(
        s,
        "{:<width$}  steps  moved/gaps  sleep  migrate  idle-park  diffs  stayed because",
        "scenario"
    );
    for o in outcomes {
        let k = |kind| {
            let (m, n) = o.moved_of(kind);
            format!("{m}/{n}")
        };
        let _ = writeln!(
            s,
            "{:<width$}  {:>5}  {:>10}  {:>5}  {:>7}  {:>9}  {:>5}  {}",
            o.name,
            o.main_steps,
            format!("{}/{}", o.moved(), o.gaps.len()),
            k(MoveKind::Sleep),
            k(MoveKind::Migrate),
            k(MoveKind::SessionIdle),
            o.differences.len(),
            o.pins().join("; ")
        );
    }
    s.push_str(&totals(outcomes));
    s
}

/// One line of totals: scenarios, gaps moved by kind, differences.
pub fn totals(outcomes: &[Outcome]) -> String {
    let gaps: usize = outcomes.iter().map(|o| o.gaps.len()).sum();
    let moved: usize = outcomes.iter().map(Outcome::moved).sum();
    let kinds: Vec<String> = MoveKind::ALL
        .iter()
        .chain([&MoveKind::Stay])
        .map(|k| {
            let (m, n) = outcomes.iter().fold((0, 0), |(m, n), o| {
                let (a, b) = o.moved_of(*k);
                (m + a, n + b)
            });
            format!("{} {m}/{n}", k.label())
        })
        .collect();
    let never = outcomes.iter().filter(|o| o.moved() == 0).count();
    let differences: usize = outcomes.iter().map(|o| o.differences.len()).sum();
    let differing = outcomes
        .iter()
        .filter(|o| !o.differences.is_empty())
        .count();
    format!(
        "{} scenarios; {moved} of {gaps} gaps moved ({}); {never} scenarios never moved; \
         {differences} differences in {differing} scenarios\n",
        outcomes.len(),
        kinds.join(", ")
    )
}
