//! The two worlds a scenario runs in: a Postgres server the client reaches directly, and a
//! pgwake gateway with local tenants (one per shard, each its own Postgres) that moves the
//! session between steps. Also the other sessions a scenario uses, on either side.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgwake_testkit::{PgOptions, TestPostgres};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use super::step::{Event, MoveKind, Shown};
use super::wire::Login;
use crate::common::{Gateway, LOCAL_PASSWORD};

/// Quiet time before a session's state is recorded.
pub const SNAPSHOT_AFTER: Duration = Duration::from_millis(50);
/// The tenants' idle timeout: every session quiet this long, the tenant sleeps.
pub const IDLE_TIMEOUT: Duration = Duration::from_millis(300);
/// A session quiet this long parks on its own (longer than the idle timeout: a busy neighbour
/// keeps the tenant awake in those gaps).
pub const PARK_AFTER: Duration = Duration::from_millis(700);
/// The cap on each tenant's backend connections.
pub const CAP: usize = 5;

/// What every scenario's database holds at its start (on both sides).
pub const BASE_SCHEMA: &str = "
CREATE TABLE t (id int PRIMARY KEY, v text);
INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three');
CREATE TABLE gt (a int, b int);
INSERT INTO gt VALUES (1, 2);
-- No sequence under audit (rows in insertion order are in ctid order): a session that draws
-- from one is pinned, and the write scenarios are there to move. counted has one.
CREATE TABLE audit (note text);
CREATE TABLE counted (id serial PRIMARY KEY, note text);
CREATE SCHEMA app;
CREATE TABLE app.items (id int, name text);
INSERT INTO app.items VALUES (1, 'app-one');
CREATE TABLE public.items (id int, name text);
INSERT INTO public.items VALUES (1, 'public-one');
CREATE ROLE {db}_r;
CREATE ROLE {db}_s;
GRANT ALL ON ALL TABLES IN SCHEMA public, app TO {db}_r, {db}_s;
GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {db}_r, {db}_s;
GRANT USAGE ON SCHEMA app TO {db}_r, {db}_s;
GRANT {db}_s TO {db}_r;
";

/// The direct Postgres and the gateway.
pub struct Lab {
    pub direct: TestPostgres,
    pub gw: Gateway,
    pub tenants: Vec<String>,
}

impl Lab {
    /// Starts both; `shards` local tenants named `conf0`, `conf1`, ...
    pub fn start(shards: usize) -> Lab {
        let direct = TestPostgres::start(PgOptions {
            password: LOCAL_PASSWORD.into(),
            extra_conf: vec!["jit = off".into(), "max_connections = 100".into()],
            ..PgOptions::default()
        })
        .expect("start the direct postgres");
        let tenants: Vec<String> = (0..shards).map(|i| format!("conf{i}")).collect();
        let mut config = format!(
            "[local]\ndata_dir = \"data\"\npassword = \"{LOCAL_PASSWORD}\"\n[local.settings]\n\n"
        );
        for t in &tenants {
            config.push_str(&format!(
                "[[tenant]]\nid = \"{t}\"\nbackend = {{ kind = \"local\" }}\n\
                 max_backend_connections = {CAP}\n"
            ));
        }
        let ms = |d: Duration| format!("\"{}ms\"", d.as_millis());
        // revive_timeout below the longest lock a scenario holds (locks.rs): a revival that
        // waited for it would end the session.
        let extra = format!(
            "allow_plaintext = true\n[wake]\nidle_timeout = {}\nidle_check_interval = \"50ms\"\n\
             [revival]\nsnapshot_after = {}\npark_session_after = {}\nrevive_timeout = \"5s\"\n\
             [limits]\nbackend_wait_timeout = \"20s\"\n",
            ms(IDLE_TIMEOUT),
            ms(SNAPSHOT_AFTER),
            ms(PARK_AFTER)
        );
        let gw = Gateway::launch(&extra, &config, &[]);
        Lab {
            direct,
            gw,
            tenants,
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.gw.dir.path().join("pgwake.log")
    }
}

/// Where one side's sessions log in.
#[derive(Clone, Debug)]
pub struct Side {
    pub port: u16,
    /// The database name as the client gives it (with the tenant prefix through the gateway).
    pub prefix: String,
    /// The application name every session of a scenario gives at login: part of the gateway's
    /// reuse key, so a scenario's sessions share backend connections with each other and never
    /// with an earlier scenario's (whose leftovers are no move's doing).
    pub app: String,
}

impl Side {
    pub fn login(&self, db: &str) -> Login {
        Login {
            port: self.port,
            user: "pgwake".into(),
            password: LOCAL_PASSWORD.into(),
            database: format!("{}{db}", self.prefix),
            application_name: self.app.clone(),
        }
    }

    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={}{db} \
             application_name={} sslmode=disable connect_timeout=60",
            self.port, self.prefix, self.app
        )
    }

    pub async fn connect(&self, db: &str) -> Result<Client, tokio_postgres::Error> {
        let (client, conn) = tokio_postgres::connect(&self.conninfo(db), NoTls).await?;
        tokio::spawn(conn);
        Ok(client)
    }

    /// Drops database `db` (ending its connections: the gateway keeps some for reuse), so
    /// the clusters stay small over a long run.
    pub async fn drop_db(&self, db: &str) {
        if let Ok(admin) = self.connect("postgres").await {
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                .await;
        }
    }

    /// Creates database `db` with the base schema plus `extra` (run in the new database).
    pub async fn create_db(&self, db: &str, extra: &str) {
        let admin = self.connect("postgres").await.expect("admin login");
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .expect("create database");
        drop(admin);
        let c = self.connect(db).await.expect("login to the new database");
        let schema = format!("{BASE_SCHEMA}{extra}").replace("{db}", db);
        c.batch_execute(&schema).await.expect("base schema");
    }
}

/// The other sessions of a scenario on one side, connected on first use.
pub struct Others {
    side: Side,
    db: String,
    clients: HashMap<usize, Arc<Client>>,
    running: HashMap<usize, JoinHandle<Vec<Event>>>,
}

impl Others {
    pub fn new(side: Side, db: &str) -> Others {
        Others {
            side,
            db: db.to_owned(),
            clients: HashMap::new(),
            running: HashMap::new(),
        }
    }

    async fn client(&mut self, who: usize) -> Result<Arc<Client>, Vec<Event>> {
        if let Some(c) = self.clients.get(&who) {
            return Ok(c.clone());
        }
        match self.side.connect(&self.db).await {
            Ok(c) => {
                let c = Arc::new(c);
                self.clients.insert(who, c.clone());
                Ok(c)
            }
            Err(e) => Err(vec![Event::Ended(format!("login: {e}"))]),
        }
    }

    pub async fn run(&mut self, who: usize, sql: &str) -> Vec<Event> {
        match self.client(who).await {
            Ok(c) => simple(&c, sql).await,
            Err(e) => e,
        }
    }

    pub async fn start(&mut self, who: usize, sql: &str) -> Vec<Event> {
        match self.client(who).await {
            Ok(c) => {
                let sql = sql.to_owned();
                self.running
                    .insert(who, tokio::spawn(async move { simple(&c, &sql).await }));
                // Let it reach the server before the next step.
                tokio::time::sleep(Duration::from_millis(300)).await;
                Vec::new()
            }
            Err(e) => e,
        }
    }

    pub async fn finish(&mut self, who: usize) -> Vec<Event> {
        match self.running.remove(&who) {
            Some(h) => h
                .await
                .unwrap_or_else(|e| vec![Event::Ended(format!("panicked: {e}"))]),
            None => vec![Event::Ended("nothing running".into())],
        }
    }
}

/// Runs `sql` on a tokio-postgres session; rows, counts and errors as events.
pub async fn simple(c: &Client, sql: &str) -> Vec<Event> {
    match c.simple_query(sql).await {
        Ok(msgs) => msgs
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(Event::Row(
                    (0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect(),
                )),
                SimpleQueryMessage::CommandComplete(n) => Some(Event::Complete(n.to_string())),
                _ => None,
            })
            .collect(),
        Err(e) => match e.as_db_error() {
            Some(db) => vec![Event::Error {
                severity: db.parsed_severity().map_or_else(
                    || db.severity().to_owned(),
                    |s| format!("{s:?}").to_uppercase(),
                ),
                code: db.code().code().to_owned(),
                message: Shown(db.message().to_owned()),
            }],
            None => vec![Event::Ended(e.to_string())],
        },
    }
}

/// What the gateway's log says one session did during a gap.
#[derive(Clone, Debug, Default)]
pub struct GapReport {
    pub kind: Option<MoveKind>,
    /// Parked, revived or failed a revival at least once.
    pub moved: bool,
    /// `reason` of each park and revival.
    pub parks: Vec<String>,
    pub revivals: Vec<String>,
    /// Why it stayed, when the log says.
    pub pinned: Option<String>,
    pub failed: Option<String>,
}

/// Reads the gateway's log from where it was last read, keeping one session's lines.
pub struct LogTail {
    path: PathBuf,
    offset: u64,
    partial: String,
    pub lines: Vec<String>,
}

impl LogTail {
    pub fn new(path: PathBuf) -> LogTail {
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        LogTail {
            path,
            offset,
            partial: String::new(),
            lines: Vec::new(),
        }
    }

    /// Forgets what was read: lines from now on.
    pub fn mark(&mut self) {
        self.poll("");
        self.lines.clear();
    }

    /// Reads new lines, keeping those of the connection from `peer`.
    pub fn poll(&mut self, peer: &str) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut text = String::new();
        let Ok(n) = f.read_to_string(&mut text) else {
            return;
        };
        self.offset += n as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let complete: String = self.partial.drain(..=end).collect();
        if peer.is_empty() {
            return;
        }
        let (a, b) = (format!("peer={peer} "), format!("peer={peer}}}"));
        for line in complete.lines() {
            if line.contains(&a) || line.contains(&b) {
                self.lines.push(line.to_owned());
            }
        }
    }

    /// The gap as the kept lines tell it.
    pub fn report(&self, kind: MoveKind) -> GapReport {
        let mut r = GapReport {
            kind: Some(kind),
            ..GapReport::default()
        };
        for l in &self.lines {
            let reason = || field(l, "reason").unwrap_or_default();
            if l.contains("session parked") {
                r.parks.push(reason());
            } else if l.contains("session revived") {
                r.revivals.push(reason());
            } else if l.contains("revival failed") {
                // The error is a sentence; the reason field follows it.
                let error = l
                    .split_once(" error=")
                    .map(|(_, e)| e.split_once(" reason=").map_or(e, |(e, _)| e).to_owned());
                r.failed = Some(error.unwrap_or_else(|| l.clone()));
            } else if l.contains("session pinned") {
                // The pins are the line's last field, words and all.
                let pins = l.split_once(" pins=").map(|(_, p)| p.trim().to_owned());
                r.pinned = Some(pins.unwrap_or_else(|| "pinned".into()));
            } else if l.contains("could not be recorded") {
                r.pinned = Some("state not recorded".into());
            } else if l.contains("session cannot move") && r.pinned.is_none() {
                r.pinned = Some("cannot move".into());
            }
        }
        // A failed revival also left the backend connection: the move was tried, and failed.
        r.moved = !r.parks.is_empty() || !r.revivals.is_empty() || r.failed.is_some();
        r
    }
}

/// `name=value` (quotes removed) from a log line.
fn field(line: &str, name: &str) -> Option<String> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    let rest = &line[at..];
    if let Some(q) = rest.strip_prefix('"') {
        return q.find('"').map(|e| q[..e].to_owned());
    }
    Some(
        rest.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// Forces moves of one shard's main session, through the gateway.
pub struct Mover<'l> {
    pub lab: &'l Lab,
    pub tenant: String,
    pub tail: LogTail,
    /// A session of the same tenant (another database) that keeps it busy while it pings.
    pub pinger: Arc<Client>,
    pinging: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// The application name of the scenario running (the hand-off session gives it too).
    pub app: String,
}

impl<'l> Mover<'l> {
    pub async fn new(lab: &'l Lab, tenant: &str) -> Mover<'l> {
        let side = Side {
            port: lab.gw.port,
            prefix: format!("{tenant}."),
            app: "pinger".into(),
        };
        let pinger = Arc::new(side.connect("postgres").await.expect("pinger login"));
        Mover {
            lab,
            tenant: tenant.to_owned(),
            tail: LogTail::new(lab.log_path()),
            pinger,
            pinging: None,
            app: String::new(),
        }
    }

    /// Keeps the tenant busy (a query every 60 ms on the pinger) until [`Mover::report`], so
    /// it does not sleep in a gap meant for another kind of move.
    fn start_pinging(&mut self) {
        let busy = Arc::new(AtomicBool::new(true));
        let (flag, pinger) = (busy.clone(), self.pinger.clone());
        let task = tokio::spawn(async move {
            while flag.load(Ordering::Relaxed) {
                let _ = pinger.simple_query("SELECT 1").await;
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        });
        self.pinging = Some((busy, task));
    }

    /// Stops the pinger (the end of a gap, or of a scenario that ended inside one).
    pub async fn stop_pinging(&mut self) {
        if let Some((busy, task)) = self.pinging.take() {
            busy.store(false, Ordering::Relaxed);
            let _ = task.await;
        }
    }

    /// Waits until the kept lines satisfy `done` or `limit` passes.
    async fn wait_lines(&mut self, peer: &str, limit: Duration, done: impl Fn(&GapReport) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            self.tail.poll(peer);
            if done(&self.tail.report(MoveKind::Sleep)) || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The first half of a gap, before the other sessions' steps: for the parking kinds, waits
    /// until the session is parked (or the log says it cannot move). `in_tx`: the client is in
    /// a transaction, so the session cannot move and the wait is short.
    pub async fn begin(&mut self, kind: MoveKind, peer: &str, db: &str, in_tx: bool) {
        self.tail.mark();
        let settled = |r: &GapReport| r.moved || r.pinned.is_some() || r.failed.is_some();
        let margin = if in_tx {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(4)
        };
        match kind {
            MoveKind::Stay => {}
            MoveKind::Migrate => self.start_pinging(),
            MoveKind::Sleep => {
                self.wait_lines(peer, IDLE_TIMEOUT + SNAPSHOT_AFTER + margin, settled)
                    .await;
                if self
                    .tail
                    .report(kind)
                    .parks
                    .iter()
                    .any(|p| p == "idle_sleep")
                {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while self.lab.gw.tenant_state(&self.tenant).0 != "asleep"
                        && Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            MoveKind::SessionIdle => {
                self.start_pinging();
                self.wait_lines(peer, PARK_AFTER + margin, settled).await;
                if self.tail.report(kind).moved {
                    // Another session of the same user and database takes the kept connection.
                    let side = Side {
                        port: self.lab.gw.port,
                        prefix: format!("{}.", self.tenant),
                        app: self.app.clone(),
                    };
                    if let Ok(c) = side.connect(db).await {
                        let _ = c.simple_query("SELECT 1").await;
                    }
                    // Its hand-back (pin check and reset) finishes before the next session asks.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The second half of a gap, after the other sessions' steps: asks for the migration and
    /// waits until the session moved or the log says it cannot.
    pub async fn end(&mut self, kind: MoveKind, peer: &str, in_tx: bool) {
        if kind != MoveKind::Migrate {
            return;
        }
        let path = format!("/v1/tenants/{}/migrate", self.tenant);
        let gw = &self.lab.gw;
        let _ = gw.http("POST", &path);
        let limit = if in_tx {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(4)
        };
        self.wait_lines(peer, limit, |r| {
            !r.revivals.is_empty() || r.pinned.is_some() || r.failed.is_some()
        })
        .await;
    }

    /// What the gap did, once the next step has run.
    pub async fn report(&mut self, kind: MoveKind, peer: &str) -> GapReport {
        self.stop_pinging().await;
        // The revival's lines are written as the step's answer goes out: give them a moment.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.tail.poll(peer);
        self.tail.report(kind)
    }
}
