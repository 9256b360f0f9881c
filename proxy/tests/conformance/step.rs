//! What a scenario is made of (client steps), what a step's answer looks like once normalized
//! for comparison (events), and how the main session carries a step out on the wire, driver
//! habits included.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::wire::{self, Msg, Reader, WireClient, WireError};

/// How a session is moved between two main-session steps (gateway side only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoveKind {
    /// Every session idle for the tenant's idle timeout: parked, tenant asleep, woken and
    /// revived on the next message.
    Sleep,
    /// Admin `POST /v1/tenants/{id}/migrate`: revived at once on a new backend connection.
    Migrate,
    /// Quiet for `park_session_after` while the tenant is busy: parked, its backend connection
    /// handed to another session, revived on the next message.
    SessionIdle,
    /// No move is forced (the generator's quick gaps; one may still happen on its own).
    Stay,
}

impl MoveKind {
    pub const ALL: [MoveKind; 3] = [MoveKind::Sleep, MoveKind::Migrate, MoveKind::SessionIdle];

    pub fn label(self) -> &'static str {
        match self {
            MoveKind::Sleep => "sleep",
            MoveKind::Migrate => "migrate",
            MoveKind::SessionIdle => "idle-park",
            MoveKind::Stay => "none",
        }
    }
}

/// One client step. `{db}` in any SQL text stands for the scenario's database name (roles are
/// per cluster, so a scenario names its roles after its database).
#[derive(Clone, Debug)]
pub enum Step {
    /// A simple Query (any number of statements).
    Simple(String),
    /// A simple Query whose text is sent in LATIN1 (a LATIN1 client's bytes).
    Latin1(String),
    /// Extended protocol, unnamed statement, as libpq's `PQexecParams`: Parse (with parameter
    /// type OIDs), Bind (text), Describe portal, Execute, Sync.
    Extended {
        sql: String,
        oids: Vec<u32>,
        params: Vec<Option<String>>,
    },
    /// A driver's prepare: Parse named, Describe statement, Sync. The RowDescription the client
    /// is told here is cached under `name` and used to decode that statement's rows later.
    Prepare {
        name: String,
        sql: String,
        oids: Vec<u32>,
    },
    /// A driver's execution of a prepared statement: Bind (text parameters, binary results),
    /// Execute, Sync; rows are decoded with the description cached at prepare time (no
    /// Describe), as asyncpg and pgx do.
    ExecCached {
        name: String,
        params: Vec<Option<String>>,
    },
    /// Bind, Describe portal, Execute, Sync of a named statement (fresh description, text).
    ExecNamed {
        name: String,
        params: Vec<Option<String>>,
    },
    /// Describe statement + Sync.
    DescribeStmt(String),
    /// Close statement + Sync.
    CloseStmt(String),
    /// A driver-level cached statement keyed by its text: prepared on first use under a name of
    /// the driver's, executed with the cached description; on `0A000` outside a transaction
    /// the driver drops it, prepares again and retries once (asyncpg's habit; other errors
    /// reach the application).
    Driver {
        sql: String,
        params: Vec<Option<String>>,
    },
    /// `COPY ... FROM STDIN` with this data.
    CopyIn { sql: String, data: String },
    /// Runs `sql` and sends one CancelRequest with the session's own cancel key after `after`.
    CancelRunning { sql: String, after: Duration },
    /// Sends a CancelRequest with the session's own key while nothing runs on it.
    SendCancel,
    /// Another session (`who`) runs `sql` and waits for its answer.
    Side { who: usize, sql: String },
    /// Another session starts `sql` in the background.
    SideStart { who: usize, sql: String },
    /// Waits for the background query of session `who`.
    SideFinish { who: usize },
    /// The move before the next main step is this one rather than the rotation's.
    Force(MoveKind),
}

impl Step {
    /// A step of the main session (moves happen between two of them).
    pub fn is_main(&self) -> bool {
        !matches!(
            self,
            Step::Side { .. } | Step::SideStart { .. } | Step::SideFinish { .. } | Step::Force(_)
        )
    }

    /// The step with `{db}` replaced.
    pub fn for_db(&self, db: &str) -> Step {
        let f = |s: &String| s.replace("{db}", db);
        let p = |ps: &Vec<Option<String>>| ps.iter().map(|v| v.as_ref().map(f)).collect();
        match self {
            Step::Simple(s) => Step::Simple(f(s)),
            Step::Latin1(s) => Step::Latin1(f(s)),
            Step::Extended { sql, oids, params } => Step::Extended {
                sql: f(sql),
                oids: oids.clone(),
                params: p(params),
            },
            Step::Prepare { name, sql, oids } => Step::Prepare {
                name: name.clone(),
                sql: f(sql),
                oids: oids.clone(),
            },
            Step::ExecCached { name, params } => Step::ExecCached {
                name: name.clone(),
                params: p(params),
            },
            Step::ExecNamed { name, params } => Step::ExecNamed {
                name: name.clone(),
                params: p(params),
            },
            Step::Driver { sql, params } => Step::Driver {
                sql: f(sql),
                params: p(params),
            },
            Step::CopyIn { sql, data } => Step::CopyIn {
                sql: f(sql),
                data: f(data),
            },
            Step::CancelRunning { sql, after } => Step::CancelRunning {
                sql: f(sql),
                after: *after,
            },
            Step::Side { who, sql } => Step::Side {
                who: *who,
                sql: f(sql),
            },
            Step::SideStart { who, sql } => Step::SideStart {
                who: *who,
                sql: f(sql),
            },
            other => other.clone(),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = |s: &str| {
            let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
            if one.len() > 140 {
                let mut cut = 140;
                while !one.is_char_boundary(cut) {
                    cut -= 1;
                }
                format!("{}…", &one[..cut])
            } else {
                one
            }
        };
        match self {
            Step::Simple(s) => write!(f, "Query {:?}", short(s)),
            Step::Latin1(s) => write!(f, "Query in LATIN1 {:?}", short(s)),
            Step::Extended { sql, oids, params } => {
                write!(
                    f,
                    "Parse/Bind/Execute {:?} oids {oids:?} params {params:?}",
                    short(sql)
                )
            }
            Step::Prepare { name, sql, oids } => {
                write!(f, "Prepare {name:?} {:?} oids {oids:?}", short(sql))
            }
            Step::ExecCached { name, params } => {
                write!(f, "Execute cached {name:?} params {params:?}")
            }
            Step::ExecNamed { name, params } => write!(f, "Execute {name:?} params {params:?}"),
            Step::DescribeStmt(n) => write!(f, "Describe statement {n:?}"),
            Step::CloseStmt(n) => write!(f, "Close statement {n:?}"),
            Step::Driver { sql, params } => {
                write!(f, "driver query {:?} params {params:?}", short(sql))
            }
            Step::CopyIn { sql, .. } => write!(f, "COPY IN {:?}", short(sql)),
            Step::CancelRunning { sql, after } => {
                write!(f, "cancel {:?} after {after:?} (own key)", short(sql))
            }
            Step::SendCancel => write!(f, "cancel request with own key, nothing running"),
            Step::Side { who, sql } => write!(f, "session #{who}: {:?}", short(sql)),
            Step::SideStart { who, sql } => {
                write!(f, "session #{who} starts {:?}", short(sql))
            }
            Step::SideFinish { who } => write!(f, "session #{who} finishes"),
            Step::Force(k) => write!(f, "next move: {}", k.label()),
        }
    }
}

/// A column of a RowDescription, normalized: type OIDs of user-made types and table OIDs differ
/// between the two clusters, so they compare as "user type" and "some table".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub from_table: bool,
    pub attnum: i16,
    pub type_oid: TypeOid,
    pub typmod: i32,
    pub format: i16,
}

/// A type OID as compared: built-in ones exactly, user-made ones (OID ≥ 16384) alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeOid {
    Builtin(u32),
    User,
}

impl TypeOid {
    pub fn of(oid: u32) -> TypeOid {
        if oid >= 16_384 {
            TypeOid::User
        } else {
            TypeOid::Builtin(oid)
        }
    }
}

/// Text shown in a difference report but not compared (error messages can hold OIDs and
/// process ids).
#[derive(Clone, Debug)]
pub struct Shown(pub String);

impl PartialEq for Shown {
    fn eq(&self, _: &Shown) -> bool {
        true
    }
}
impl Eq for Shown {}

/// One thing the client saw, normalized for comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    ParseComplete,
    BindComplete,
    CloseComplete,
    NoData,
    EmptyQuery,
    ParamDesc(Vec<TypeOid>),
    RowDesc(Vec<Column>),
    /// A DataRow in text.
    Row(Vec<Option<String>>),
    /// A DataRow decoded with a driver's cached description: (column name, value) pairs, or
    /// the decoding error the driver would raise.
    Decoded(Result<Vec<(String, Option<String>)>, String>),
    Complete(String),
    Error {
        severity: String,
        code: String,
        message: Shown,
    },
    Notice {
        severity: String,
        code: String,
        message: Shown,
    },
    Param(String, String),
    CopyOut,
    CopyIn,
    CopyData(String),
    CopyDone,
    Ready(char),
    /// The driver prepared its statement again after an error.
    Reprepared,
    /// The connection ended (closed by the server, or no answer in time).
    Ended(String),
    /// A message the harness does not expect here.
    Other(char),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Error {
                severity,
                code,
                message,
            } => write!(f, "{severity} {code} {:?}", message.0),
            Event::Notice {
                severity,
                code,
                message,
            } => write!(f, "notice {severity} {code} {:?}", message.0),
            Event::RowDesc(cols) => {
                let c: Vec<String> = cols
                    .iter()
                    .map(|c| {
                        let t = match c.type_oid {
                            TypeOid::Builtin(o) => o.to_string(),
                            TypeOid::User => "user".into(),
                        };
                        format!("{}:{t}#{}", c.name, c.attnum)
                    })
                    .collect();
                write!(f, "columns [{}]", c.join(", "))
            }
            Event::Row(v) => write!(f, "row {v:?}"),
            Event::Decoded(Ok(v)) => {
                let c: Vec<String> = v.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                write!(f, "decoded row {{{}}}", c.join(", "))
            }
            Event::Decoded(Err(e)) => write!(f, "driver decoding error: {e}"),
            Event::Complete(t) => write!(f, "complete {t:?}"),
            Event::Ready(s) => write!(f, "ready {s}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// The session's driver-side memory: descriptions cached at prepare time, and the driver's own
/// statement names for cached queries.
#[derive(Default)]
pub struct DriverCache {
    described: HashMap<String, Vec<(String, u32)>>,
    by_text: HashMap<String, String>,
    next: usize,
}

/// The main session: its wire client, the driver cache, and what was last seen.
pub struct MainSession {
    pub client: WireClient,
    pub cache: DriverCache,
    /// The transaction status of the last ReadyForQuery.
    pub status: char,
    /// Notifications received, in order (compared per scenario: when one arrives is a race).
    pub notifications: Vec<String>,
    /// The connection ended.
    pub dead: bool,
    /// The last RowDescription seen, with raw type OIDs.
    last_description: Option<Vec<(String, u32)>>,
    /// Rows are decoded with this cached description (a driver's execution).
    decoding: Option<Vec<(String, u32)>>,
}

impl MainSession {
    pub fn new(client: WireClient) -> MainSession {
        MainSession {
            client,
            cache: DriverCache::default(),
            status: 'I',
            notifications: Vec::new(),
            dead: false,
            last_description: None,
            decoding: None,
        }
    }

    /// Carries out a main-session step and returns what the client saw.
    pub async fn run(&mut self, step: &Step) -> Vec<Event> {
        let mut out = Vec::new();
        if self.dead {
            out.push(Event::Ended("connection already ended".into()));
            return out;
        }
        let r = self.run_inner(step, &mut out).await;
        if let Err(e) = r {
            self.dead = true;
            out.push(Event::Ended(match e {
                WireError::Closed => "connection closed".into(),
                WireError::Timeout => format!("no answer in {:?}", wire::ANSWER_TIMEOUT),
                WireError::Login(s) => s,
            }));
        }
        out
    }

    async fn run_inner(&mut self, step: &Step, out: &mut Vec<Event>) -> Result<(), WireError> {
        match step {
            Step::Simple(sql) => {
                self.client.send(&wire::query(sql)).await?;
                self.collect(out, None).await
            }
            Step::Latin1(sql) => {
                self.client.send(&wire::query_latin1(sql)).await?;
                self.collect(out, None).await
            }
            Step::Extended { sql, oids, params } => {
                let mut b = wire::parse("", sql, oids);
                b.extend(wire::bind("", params));
                b.extend(wire::describe(b'P', ""));
                b.extend(wire::execute());
                b.extend(wire::sync());
                self.client.send(&b).await?;
                self.collect(out, None).await
            }
            Step::Prepare { name, sql, oids } => self.prepare(name, sql, oids, out).await,
            Step::ExecCached { name, params } => {
                let cached = self.cache.described.get(name).cloned();
                self.exec_cached(name, params, cached, out).await
            }
            Step::ExecNamed { name, params } => {
                let mut b = wire::bind(name, params);
                b.extend(wire::describe(b'P', ""));
                b.extend(wire::execute());
                b.extend(wire::sync());
                self.client.send(&b).await?;
                self.collect(out, None).await
            }
            Step::DescribeStmt(name) => {
                let mut b = wire::describe(b'S', name);
                b.extend(wire::sync());
                self.client.send(&b).await?;
                self.collect(out, None).await
            }
            Step::CloseStmt(name) => {
                let mut b = wire::close(b'S', name);
                b.extend(wire::sync());
                self.client.send(&b).await?;
                self.cache.described.remove(name);
                self.collect(out, None).await
            }
            Step::Driver { sql, params } => self.driver(sql, params, out).await,
            Step::CopyIn { sql, data } => {
                self.client.send(&wire::query(sql)).await?;
                self.collect(out, Some(data.as_bytes())).await
            }
            Step::CancelRunning { sql, after } => {
                self.client.send(&wire::query(sql)).await?;
                let (port, key) = (self.client.port, self.client.key);
                let after = *after;
                // One cancel, as a client sends it: if it is lost (a gateway still waiting for
                // a wake or a slot ignores it), the query runs to its end and the answers differ.
                let canceller = tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    wire::send_cancel(port, key).await;
                });
                let start = out.len();
                let r = self.collect(out, None).await;
                let _ = canceller.await;
                // Postgres sends a query's RowDescription when its execution starts, so whether
                // one comes before the 57014 is timing (a cancel during planning, or while the
                // gateway waits for a wake, gets none): only the outcome is compared.
                let cancelled = out[start..]
                    .iter()
                    .any(|e| matches!(e, Event::Error { code, .. } if code == "57014"));
                if cancelled {
                    out.retain(|e| !matches!(e, Event::RowDesc(_)));
                }
                // A cancel already on its way could still hit the next query.
                tokio::time::sleep(Duration::from_millis(150)).await;
                r
            }
            Step::SendCancel => {
                self.client.send_cancel().await;
                tokio::time::sleep(Duration::from_millis(150)).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn prepare(
        &mut self,
        name: &str,
        sql: &str,
        oids: &[u32],
        out: &mut Vec<Event>,
    ) -> Result<(), WireError> {
        let mut b = wire::parse(name, sql, oids);
        b.extend(wire::describe(b'S', name));
        b.extend(wire::sync());
        self.client.send(&b).await?;
        let start = out.len();
        self.last_description = None;
        self.collect(out, None).await?;
        let described = out[start..].iter().find_map(|e| match e {
            Event::RowDesc(_) => Some(true),
            Event::NoData => Some(false),
            _ => None,
        });
        if described.is_some() {
            self.cache.described.insert(
                name.to_owned(),
                self.last_description.take().unwrap_or_default(),
            );
        }
        Ok(())
    }

    async fn exec_cached(
        &mut self,
        name: &str,
        params: &[Option<String>],
        cached: Option<Vec<(String, u32)>>,
        out: &mut Vec<Event>,
    ) -> Result<(), WireError> {
        let mut b = bind_binary(name, params);
        b.extend(wire::execute());
        b.extend(wire::sync());
        self.client.send(&b).await?;
        self.decoding = Some(cached.unwrap_or_default());
        let r = self.collect(out, None).await;
        self.decoding = None;
        r
    }

    async fn driver(
        &mut self,
        sql: &str,
        params: &[Option<String>],
        out: &mut Vec<Event>,
    ) -> Result<(), WireError> {
        for attempt in 0..2 {
            let name = match self.cache.by_text.get(sql) {
                Some(n) => n.clone(),
                None => {
                    self.cache.next += 1;
                    let n = format!("__drv_{}", self.cache.next);
                    self.prepare(&n, sql, &[], out).await?;
                    if !self.cache.described.contains_key(&n) {
                        return Ok(());
                    }
                    self.cache.by_text.insert(sql.to_owned(), n.clone());
                    n
                }
            };
            let cached = self.cache.described.get(&name).cloned();
            let start = out.len();
            self.exec_cached(&name, params, cached, out).await?;
            // asyncpg retries on this error only (InvalidCachedStatementError); any other,
            // `26000` included, reaches the application.
            let stale = out[start..]
                .iter()
                .any(|e| matches!(e, Event::Error { code, .. } if code == "0A000"));
            if !(stale && attempt == 0 && self.status == 'I') {
                return Ok(());
            }
            // What asyncpg does with an invalid cached statement: forget it, close it on the
            // server, prepare afresh and run the query again.
            out.push(Event::Reprepared);
            self.cache.by_text.remove(sql);
            self.cache.described.remove(&name);
            let mut b = wire::close(b'S', &name);
            b.extend(wire::sync());
            self.client.send(&b).await?;
            self.collect(out, None).await?;
        }
        Ok(())
    }

    /// Reads messages until ReadyForQuery, as events; sends `copy` when the server asks for
    /// COPY data.
    async fn collect(
        &mut self,
        out: &mut Vec<Event>,
        copy: Option<&[u8]>,
    ) -> Result<(), WireError> {
        loop {
            let m = self.client.read().await?;
            if let Some(e) = self.event(&m) {
                let ready = matches!(e, Event::Ready(_));
                let copy_in = matches!(e, Event::CopyIn);
                out.push(e);
                if ready {
                    return Ok(());
                }
                if copy_in {
                    let mut b = Vec::new();
                    if let Some(data) = copy {
                        b.extend(wire::copy_data(data));
                    }
                    b.extend(wire::copy_done());
                    self.client.send(&b).await?;
                }
            }
        }
    }

    fn event(&mut self, m: &Msg) -> Option<Event> {
        let body = &m.body[..];
        Some(match m.tag {
            b'1' => Event::ParseComplete,
            b'2' => Event::BindComplete,
            b'3' => Event::CloseComplete,
            b'n' => Event::NoData,
            b'I' => Event::EmptyQuery,
            b't' => {
                let mut r = Reader::new(body);
                let n = r.i16();
                Event::ParamDesc((0..n).map(|_| TypeOid::of(r.i32() as u32)).collect())
            }
            b'T' => {
                let cols = row_description(body);
                self.last_description =
                    Some(cols.iter().map(|(c, oid)| (c.name.clone(), *oid)).collect());
                Event::RowDesc(cols.into_iter().map(|(c, _)| c).collect())
            }
            b'D' => {
                let values = data_row(body);
                match &self.decoding {
                    Some(desc) => Event::Decoded(decode(desc, &values)),
                    None => Event::Row(
                        values
                            .into_iter()
                            .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                            .collect(),
                    ),
                }
            }
            b'C' => Event::Complete(Reader::new(body).cstr()),
            b'E' | b'N' => {
                let severity = wire::field(body, b'V')
                    .or_else(|| wire::field(body, b'S'))
                    .unwrap_or_default();
                let code = wire::field(body, b'C').unwrap_or_default();
                let message = Shown(wire::field(body, b'M').unwrap_or_default());
                if m.tag == b'E' {
                    Event::Error {
                        severity,
                        code,
                        message,
                    }
                } else {
                    Event::Notice {
                        severity,
                        code,
                        message,
                    }
                }
            }
            b'S' => {
                let mut r = Reader::new(body);
                Event::Param(r.cstr(), r.cstr())
            }
            b'A' => {
                let mut r = Reader::new(body);
                let _pid = r.i32();
                let channel = r.cstr();
                let payload = r.cstr();
                self.notifications.push(format!("{channel}: {payload}"));
                return None;
            }
            b'H' => Event::CopyOut,
            b'G' => Event::CopyIn,
            b'd' => Event::CopyData(String::from_utf8_lossy(body).into_owned()),
            b'c' => Event::CopyDone,
            b'Z' => {
                let s = body.first().copied().unwrap_or(b'?') as char;
                self.status = s;
                Event::Ready(s)
            }
            other => Event::Other(other as char),
        })
    }
}

/// Bind with text parameters and every result column in binary, as asyncpg and pgx ask.
fn bind_binary(stmt: &str, params: &[Option<String>]) -> Vec<u8> {
    let mut b = wire::bind(stmt, params);
    // The text Bind ends with "0 result formats"; ask for one format, binary, for all columns.
    b.truncate(b.len() - 2);
    b.extend_from_slice(&1i16.to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes());
    let len = (b.len() - 1) as u32;
    b[1..5].copy_from_slice(&len.to_be_bytes());
    b
}

/// The columns of a RowDescription, with each raw type OID.
fn row_description(body: &[u8]) -> Vec<(Column, u32)> {
    let mut r = Reader::new(body);
    let n = r.i16();
    (0..n)
        .map(|_| {
            let name = r.cstr();
            let table = r.i32();
            let attnum = r.i16();
            let oid = r.i32() as u32;
            let _len = r.i16();
            let typmod = r.i32();
            let format = r.i16();
            (
                Column {
                    name,
                    from_table: table != 0,
                    attnum,
                    type_oid: TypeOid::of(oid),
                    typmod,
                    format,
                },
                oid,
            )
        })
        .collect()
}

fn data_row(body: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut r = Reader::new(body);
    let n = r.i16();
    (0..n)
        .map(|_| {
            let len = r.i32();
            (len >= 0).then(|| r.bytes(len as usize).to_vec())
        })
        .collect()
}

/// Decodes binary values with a cached description, the way a driver with typed decoders
/// does: a value whose length does not fit its cached type is an error.
fn decode(
    desc: &[(String, u32)],
    values: &[Option<Vec<u8>>],
) -> Result<Vec<(String, Option<String>)>, String> {
    if desc.len() != values.len() {
        return Err(format!(
            "row has {} values, the cached description {} columns",
            values.len(),
            desc.len()
        ));
    }
    desc.iter()
        .zip(values)
        .map(|((name, oid), v)| {
            let Some(v) = v else {
                return Ok((name.clone(), None));
            };
            let fixed = |n: usize, ty: &str| {
                if v.len() == n {
                    Ok(())
                } else {
                    Err(format!("{name}: {ty}: invalid length {}", v.len()))
                }
            };
            let text = match oid {
                16 => fixed(1, "bool").map(|_| (v[0] != 0).to_string())?,
                21 => fixed(2, "int2").map(|_| i16::from_be_bytes([v[0], v[1]]).to_string())?,
                23 => fixed(4, "int4")
                    .map(|_| i32::from_be_bytes(v[..4].try_into().unwrap()).to_string())?,
                20 => fixed(8, "int8")
                    .map(|_| i64::from_be_bytes(v[..8].try_into().unwrap()).to_string())?,
                701 => fixed(8, "float8")
                    .map(|_| f64::from_be_bytes(v[..8].try_into().unwrap()).to_string())?,
                25 | 1043 | 1042 | 19 => String::from_utf8(v.clone())
                    .map_err(|_| format!("{name}: text: invalid UTF-8"))?,
                _ => v.iter().map(|b| format!("{b:02x}")).collect(),
            };
            Ok((name.clone(), Some(text)))
        })
        .collect()
}
