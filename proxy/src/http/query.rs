//! Running `/sql` statements on a pooled backend connection with the extended protocol (text
//! parameters, text results), and shaping the replies as the serverless driver expects.
//!
//! Everything one request needs is sent in one go: the pending session reset, `BEGIN` for a
//! batch, each statement as Parse/Bind/Describe/Execute/Sync, `COMMIT`. After an error the
//! backend skips to the next Sync, later statements of a batch fail inside the aborted
//! transaction and `COMMIT` rolls back, so one round trip serves any request. Replies are read
//! while the request is still being written: a batch whose early results fill the socket
//! would otherwise leave Postgres waiting for the gateway to read and the gateway waiting for
//! Postgres to read, until the query timeout.

use pgwake_protocol::backend::type_oid as oid;
use pgwake_protocol::frontend;
use serde_json::{Map, Number, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::spill::SpillBuffer;
use crate::upstream::{BackendConn, CacheLimits, Prepared};

pub use super::body::Statement;

/// How results are shaped.
#[derive(Clone, Copy)]
pub struct Shape {
    /// Every value as Postgres's text (`Neon-Raw-Text-Output`); else bool, int2/4, floats and
    /// json become JSON values.
    pub raw_text: bool,
    /// Rows as arrays (`Neon-Array-Mode`) rather than objects keyed by column name.
    pub array_mode: bool,
}

/// Why statements produced no result.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// Postgres refused a statement; the connection is still usable.
    #[error("postgres error {}", .0.get("code").and_then(Value::as_str).unwrap_or("?"))]
    Postgres(Map<String, Value>),
    /// A statement the cache named is gone or changed on the backend (a user's `DEALLOCATE`, a
    /// table whose columns changed): nothing ran, and the request may run again uncached.
    #[error("cached statement unusable: {}", .0.get("code").and_then(Value::as_str).unwrap_or("?"))]
    StaleStatement(Map<String, Value>),
    /// The results grew past the response limit; the connection is mid-reply.
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    /// A statement asked for something `/sql` cannot carry (COPY to or from the client); the
    /// connection is mid-reply.
    #[error("unsupported: {}", .0.get("message").and_then(Value::as_str).unwrap_or("?"))]
    Unsupported(Map<String, Value>),
    /// The backend connection failed.
    #[error("backend I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The response outgrew memory and could not be written to a temporary file.
    #[error("spilling the response to disk: {0}")]
    Spill(std::io::Error),
    /// The backend sent something unexpected.
    #[error("backend protocol: {0}")]
    Protocol(String),
}

/// Bounds on one request's results.
#[derive(Clone, Copy)]
pub struct Limits {
    /// Largest response: rows read from the backend and the JSON body alike.
    pub max_response: usize,
    /// Largest single message from the backend other than a DataRow.
    pub max_message: usize,
    /// The connection's statement cache.
    pub statements: CacheLimits,
}

/// SQLSTATEs that a cached statement can cause where a freshly parsed one would not:
/// `26000` (the statement is gone), `42P05` (a user's PREPARE took the name) and `0A000`
/// ("cached plan must not change result type").
const STALE_STATEMENT_CODES: [&str; 3] = ["26000", "42P05", "0A000"];

/// Whether the first error, met in statement `at` (when in one), came from the cache.
fn stale(fields: &Map<String, Value>, at: Option<usize>, plan: &[Prepared]) -> bool {
    let code = fields
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let cached = at
        .and_then(|i| plan.get(i))
        .is_some_and(|p| *p != Prepared::Unnamed);
    cached && STALE_STATEMENT_CODES.contains(&code)
}

/// Runs `statements` (in one transaction opened by `begin`, when given) and writes the response
/// body to `out`: one result object, or `{"results": [...]}` for a batch. Rows go to `out` as
/// they arrive; on an error whatever `out` holds is to be dropped.
///
/// The replies are read in one loop: what a message means depends on where in the request it
/// falls (a reset, BEGIN or COMMIT, or which statement) and on whether an error came before, which
/// the arms share.
pub async fn run(
    conn: &mut BackendConn,
    statements: &[Statement],
    begin: Option<&str>,
    shape: Shape,
    limits: Limits,
    out: &mut SpillBuffer,
) -> Result<(), QueryError> {
    let (request, resets, plan) = build_request(conn, statements, begin, limits.statements)?;
    let (mut rd, mut wr) = tokio::io::split(&mut conn.stream);
    let write = async {
        wr.write_all(&request).await?;
        wr.flush().await
    };
    let batch = begin.is_some();
    if batch {
        out.buf().extend_from_slice(b"{\"results\":[");
    }
    // Each statement (and each reset, BEGIN, COMMIT) ends with one ReadyForQuery.
    let mut first_error: Option<Map<String, Value>> = None;
    let mut error_at = None;
    let mut rows_read = 0usize;
    let mut replies_left = resets + statements.len() + if batch { 2 } else { 0 };
    let mut reply = 0usize;
    let first_statement = resets + usize::from(batch);
    let mut current = ResultWriter::new(shape);
    // One buffer for every message of the request: a result costs one row at a time here.
    let mut body = Vec::new();
    let (status, needs_reset, cache) = (
        &mut conn.status,
        &mut conn.needs_reset,
        &mut conn.statements,
    );
    let read = async {
        while replies_left > 0 {
            let in_statement =
                reply >= first_statement && reply < first_statement + statements.len();
            let tag = next_reply(&mut rd, &mut body, in_statement, &mut rows_read, &limits).await?;
            match tag {
                b'Z' => {
                    *status = body.first().copied().unwrap_or(b'E');
                    if in_statement && first_error.is_none() {
                        current.finish(out.buf())?;
                    }
                    replies_left -= 1;
                    reply += 1;
                }
                b'E' => {
                    let fields = error_fields(&body);
                    if reply < resets {
                        return Err(QueryError::Protocol("the session reset failed".into()));
                    }
                    if first_error.is_none() {
                        first_error = Some(fields);
                        error_at = in_statement.then(|| reply - first_statement);
                    }
                }
                // A setting the backend reports changed (`SET`, `set_config`, a function's side
                // effect): the next request must not inherit it.
                b'S' if in_statement => *needs_reset = true,
                b'H' | b'G' | b'W' if in_statement => return Err(copy_refused()),
                b'1' if in_statement => {
                    let i = reply - first_statement;
                    if let Prepared::New(name) = &plan[i] {
                        cache.confirm(&statements[i].query, name.clone());
                    }
                }
                _ if !in_statement || first_error.is_some() => {}
                b'T' => current.fields(out.buf(), &body)?,
                b'D' => {
                    current.row(out.buf(), &body)?;
                    if out.len() > limits.max_response as u64 {
                        return Err(QueryError::TooLarge(limits.max_response));
                    }
                    out.settle().await.map_err(QueryError::Spill)?;
                }
                b'C' => current.complete(&body),
                // Parse/Bind complete, NoData, empty query, notices, parameter changes,
                // notifications and the replies to the reset, BEGIN and COMMIT carry nothing the
                // response needs.
                _ => {}
            }
        }
        Ok::<_, QueryError>(())
    };
    while_writing(write, read).await?;
    let failed = first_error.map(|e| (e, error_at));
    finish(out, batch, failed, &plan)
}

/// The end of a response: the first error and the statement it came from (a cached statement
/// gone stale told apart, so the request may run again uncached), or a batch's closing bracket.
fn finish(
    out: &mut SpillBuffer,
    batch: bool,
    failed: Option<(Map<String, Value>, Option<usize>)>,
    plan: &[Prepared],
) -> Result<(), QueryError> {
    if let Some((e, error_at)) = failed {
        let stale = stale(&e, error_at, plan);
        return Err(if stale {
            QueryError::StaleStatement(e)
        } else {
            QueryError::Postgres(e)
        });
    }
    if batch {
        out.buf().extend_from_slice(b"]}");
    }
    Ok(())
}

/// Reads the next reply message into `body` and returns its tag. A statement's row counts
/// against the response limit before it is read, so one huge row is refused without being
/// held; any other message is bounded by the message limit.
async fn next_reply(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    body: &mut Vec<u8>,
    in_statement: bool,
    rows_read: &mut usize,
    limits: &Limits,
) -> Result<u8, QueryError> {
    let mut header = [0u8; 5];
    rd.read_exact(&mut header).await?;
    let tag = header[0];
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let Some(size) = len.checked_sub(4) else {
        return Err(QueryError::Protocol("message length out of range".into()));
    };
    if tag == b'D' && in_statement {
        *rows_read = rows_read.saturating_add(size + 5);
        if *rows_read > limits.max_response {
            return Err(QueryError::TooLarge(limits.max_response));
        }
    } else if size > limits.max_message {
        return Err(QueryError::Protocol("message length out of range".into()));
    }
    body.clear();
    body.resize(size, 0);
    rd.read_exact(body).await?;
    Ok(tag)
}

/// The answer to COPY with the client as one end: its rows would not be in the answer (TO
/// STDOUT), or the backend would wait for rows that never come (FROM STDIN).
fn copy_refused() -> QueryError {
    QueryError::Unsupported(client_error(
        "0A000",
        "COPY to or from the client (STDOUT, STDIN) is not supported over SQL over HTTP: use \
         a Postgres connection, or COPY to a table or query the rows",
    ))
}

/// Reads the replies with `read` while `write` sends the request. Every reply follows the
/// whole request, so reading ends first only with an error (the connection, mid-request, is
/// then not reused).
async fn while_writing(
    write: impl Future<Output = std::io::Result<()>>,
    read: impl Future<Output = Result<(), QueryError>>,
) -> Result<(), QueryError> {
    tokio::pin!(write, read);
    let mut written = false;
    loop {
        tokio::select! {
            w = &mut write, if !written => {
                w?;
                written = true;
            }
            r = &mut read => return r,
        }
    }
}

/// The whole request: the pending reset if any, the Close of statements evicted from the
/// cache, BEGIN, every statement, COMMIT. Also returns how many replies come before the
/// batch's BEGIN or the first statement, and how each statement is sent.
fn build_request(
    conn: &mut BackendConn,
    statements: &[Statement],
    begin: Option<&str>,
    cache: CacheLimits,
) -> Result<(Vec<u8>, usize, Vec<Prepared>), QueryError> {
    // Refused before anything changes: the reset still due and the cache stay as they are.
    for s in statements {
        check(s)?;
    }
    let mut request = Vec::with_capacity(256);
    let mut leading = conn.take_reset(&mut request);
    let mut evict = Vec::new();
    let queries = statements.iter().map(|s| s.query.as_str());
    let plan = conn.statements.plan(queries, cache, &mut evict);
    if !evict.is_empty() {
        for name in &evict {
            frontend::close_statement(&mut request, name);
        }
        frontend::sync(&mut request);
        leading += 1;
    }
    if let Some(begin) = begin {
        frontend::query(&mut request, begin);
    }
    for (s, p) in statements.iter().zip(&plan) {
        extended(&mut request, s, p);
    }
    if begin.is_some() {
        frontend::query(&mut request, "COMMIT");
    }
    Ok((request, leading, plan))
}

/// Refuses a statement the protocol cannot carry.
fn check(s: &Statement) -> Result<(), QueryError> {
    if s.query.contains('\0') {
        return Err(QueryError::Postgres(client_error(
            "22021",
            "the query contains a NUL character",
        )));
    }
    if s.params.len() > i16::MAX as usize {
        return Err(QueryError::Postgres(client_error(
            "08P01",
            "too many parameters (at most 32767)",
        )));
    }
    Ok(())
}

/// Appends Parse (unless the statement is cached), Bind, Describe (portal), Execute and Sync
/// for one statement.
fn extended(out: &mut Vec<u8>, s: &Statement, prepared: &Prepared) {
    // The unnamed portal, parameter types left to the server.
    if !matches!(prepared, Prepared::Cached(_)) {
        frontend::parse(out, prepared.name(), &s.query, &[]);
    }
    frontend::bind(
        out,
        prepared.name(),
        s.params.iter().map(|p| p.as_deref().map(str::as_bytes)),
    );
    frontend::describe_portal(out);
    frontend::execute(out);
    frontend::sync(out);
}

/// An error object for a request the gateway refuses before Postgres sees it.
pub fn client_error(code: &str, message: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("message".into(), message.into());
    m.insert("code".into(), code.into());
    m.insert("severity".into(), "ERROR".into());
    m
}

/// The fields of an ErrorResponse under the driver's names.
pub fn error_fields(body: &[u8]) -> Map<String, Value> {
    let mut m = Map::new();
    for field in body.split(|b| *b == 0) {
        let Some((&code, text)) = field.split_first() else {
            continue;
        };
        let name = match code {
            b'V' => "severity",
            b'S' if !m.contains_key("severity") => "severity",
            b'C' => "code",
            b'M' => "message",
            b'D' => "detail",
            b'H' => "hint",
            b'P' => "position",
            b'p' => "internalPosition",
            b'q' => "internalQuery",
            b'W' => "where",
            b's' => "schema",
            b't' => "table",
            b'c' => "column",
            b'd' => "dataType",
            b'n' => "constraint",
            b'F' => "file",
            b'L' => "line",
            b'R' => "routine",
            _ => continue,
        };
        m.insert(
            name.into(),
            String::from_utf8_lossy(text).into_owned().into(),
        );
    }
    m
}

/// Writes one statement's result object at a time, straight from the backend's messages.
///
/// Its keys are written in the order the facts arrive (`fields`, `rows`, then `command` and
/// `rowCount` from CommandComplete), so no row is held once it is written.
struct ResultWriter {
    shape: Shape,
    /// Each column's key in object mode, escaped and followed by a colon.
    keys: Vec<Vec<u8>>,
    type_oids: Vec<u32>,
    started: bool,
    rows: usize,
    /// Results finished so far, for the commas of a batch.
    finished: usize,
    command: String,
    row_count: Option<u64>,
}

impl ResultWriter {
    fn new(shape: Shape) -> Self {
        ResultWriter {
            shape,
            keys: Vec::new(),
            type_oids: Vec::new(),
            started: false,
            rows: 0,
            finished: 0,
            command: String::new(),
            row_count: None,
        }
    }

    /// Opens the result object; `fields` is the JSON array of its field descriptions.
    fn begin(&mut self, out: &mut Vec<u8>, fields: &[u8]) {
        if self.finished > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"fields\":");
        out.extend_from_slice(fields);
        out.extend_from_slice(b",\"rows\":[");
        self.started = true;
    }

    /// Writes the field descriptions straight from a RowDescription, keys in the order
    /// serde_json's sorted maps gave them before (the body stays byte for byte the same).
    fn fields(&mut self, out: &mut Vec<u8>, body: &[u8]) -> Result<(), QueryError> {
        let bad = || QueryError::Protocol("malformed RowDescription".into());
        let mut r = Reader(body);
        let n = r.i16().ok_or_else(bad)?;
        let mut fields = Vec::with_capacity(24 + 128 * n.max(0) as usize);
        fields.push(b'[');
        let mut number = itoa::Buffer::new();
        for i in 0..n {
            let name = r.cstr().ok_or_else(bad)?;
            let table = r.u32().ok_or_else(bad)?;
            let column = r.i16().ok_or_else(bad)?;
            let type_oid = r.u32().ok_or_else(bad)?;
            let size = r.i16().ok_or_else(bad)?;
            let modifier = r.i32().ok_or_else(bad)?;
            r.i16().ok_or_else(bad)?;
            let mut key = Vec::with_capacity(name.len() + 3);
            write_json(&mut key, &name)?;
            if i > 0 {
                fields.push(b',');
            }
            fields.extend_from_slice(b"{\"columnID\":");
            fields.extend_from_slice(number.format(column).as_bytes());
            fields.extend_from_slice(b",\"dataTypeID\":");
            fields.extend_from_slice(number.format(type_oid).as_bytes());
            fields.extend_from_slice(b",\"dataTypeModifier\":");
            fields.extend_from_slice(number.format(modifier).as_bytes());
            fields.extend_from_slice(b",\"dataTypeSize\":");
            fields.extend_from_slice(number.format(size).as_bytes());
            fields.extend_from_slice(b",\"format\":\"text\",\"name\":");
            fields.extend_from_slice(&key);
            fields.extend_from_slice(b",\"tableID\":");
            fields.extend_from_slice(number.format(table).as_bytes());
            fields.push(b'}');
            key.push(b':');
            self.keys.push(key);
            self.type_oids.push(type_oid);
        }
        fields.push(b']');
        self.begin(out, &fields);
        Ok(())
    }

    fn row(&mut self, out: &mut Vec<u8>, body: &[u8]) -> Result<(), QueryError> {
        let bad = || QueryError::Protocol("malformed DataRow".into());
        if !self.started {
            return Err(QueryError::Protocol("DataRow before RowDescription".into()));
        }
        let mut r = Reader(body);
        let n = r.i16().ok_or_else(bad)? as usize;
        if n != self.type_oids.len() {
            return Err(bad());
        }
        if self.rows > 0 {
            out.push(b',');
        }
        out.push(if self.shape.array_mode { b'[' } else { b'{' });
        for (i, &type_oid) in self.type_oids.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if !self.shape.array_mode {
                out.extend_from_slice(&self.keys[i]);
            }
            let len = r.i32().ok_or_else(bad)?;
            if len < 0 {
                out.extend_from_slice(b"null");
                continue;
            }
            let bytes = r.take(len as usize).ok_or_else(bad)?;
            let text = String::from_utf8_lossy(bytes);
            if self.shape.raw_text {
                write_json(out, text.as_ref())?;
            } else {
                write_typed(out, &text, type_oid)?;
            }
        }
        out.push(if self.shape.array_mode { b']' } else { b'}' });
        self.rows += 1;
        Ok(())
    }

    fn complete(&mut self, body: &[u8]) {
        let tag = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body)).into_owned();
        let mut words = tag.split(' ');
        self.command = words.next().unwrap_or_default().to_owned();
        self.row_count = tag.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok());
    }

    /// Closes the result object and makes ready for the next statement's.
    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), QueryError> {
        if !self.started {
            self.begin(out, b"[]");
        }
        out.extend_from_slice(b"],\"command\":");
        write_json(out, &self.command)?;
        out.extend_from_slice(b",\"rowCount\":");
        write_json(out, &self.row_count)?;
        out.extend_from_slice(b",\"rowAsArray\":");
        write_json(out, &self.shape.array_mode)?;
        out.push(b'}');
        let finished = self.finished + 1;
        *self = ResultWriter::new(self.shape);
        self.finished = finished;
        Ok(())
    }
}

/// Appends `value` as compact JSON.
fn write_json<T: serde::Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
) -> Result<(), QueryError> {
    serde_json::to_writer(out, value)
        .map_err(|e| QueryError::Protocol(format!("cannot encode a value as JSON: {e}")))
}

/// Appends a value's JSON form outside raw-text mode: numbers and booleans and JSON documents as
/// such, everything else (int8 and numeric included, to keep precision) as text.
fn write_typed(out: &mut Vec<u8>, text: &str, type_oid: u32) -> Result<(), QueryError> {
    match type_oid {
        oid::BOOL => out.extend_from_slice(if text == "t" { b"true" } else { b"false" }),
        oid::INT2 | oid::INT4 => match text.parse::<i32>() {
            Ok(v) => write_json(out, &v)?,
            Err(_) => write_json(out, text)?,
        },
        // NaN and infinities have no JSON number: they stay text.
        oid::FLOAT4 | oid::FLOAT8 => match text.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => write_json(out, &n)?,
            None => write_json(out, text)?,
        },
        // Postgres only ever prints valid JSON for these; checking costs no allocation and
        // keeps a malformed value from breaking the whole body.
        oid::JSON | oid::JSONB if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
            out.extend_from_slice(text.as_bytes())
        }
        _ => write_json(out, text)?,
    }
    Ok(())
}

/// Reads big-endian fields from a message body.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn cstr(&mut self) -> Option<String> {
        let end = self.0.iter().position(|b| *b == 0)?;
        let s = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = &self.0[end + 1..];
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn typed(text: &str, type_oid: u32) -> Value {
        let mut out = Vec::new();
        write_typed(&mut out, text, type_oid).expect("encodes");
        serde_json::from_slice(&out).expect("valid JSON")
    }

    fn row_description(columns: &[(&str, u32)]) -> Vec<u8> {
        let mut b = Vec::new();
        b.put_i16(columns.len() as i16);
        for (name, oid) in columns {
            b.put_slice(name.as_bytes());
            b.put_u8(0);
            b.put_u32(0);
            b.put_i16(0);
            b.put_u32(*oid);
            b.put_i16(-1);
            b.put_i32(-1);
            b.put_i16(0);
        }
        b
    }

    fn data_row(values: &[Option<&str>]) -> Vec<u8> {
        let mut b = Vec::new();
        b.put_i16(values.len() as i16);
        for v in values {
            match v {
                Some(v) => {
                    b.put_i32(v.len() as i32);
                    b.put_slice(v.as_bytes());
                }
                None => b.put_i32(-1),
            }
        }
        b
    }

    #[test]
    fn typed_values_follow_the_driver() {
        assert_eq!(typed("t", oid::BOOL), Value::Bool(true));
        assert_eq!(typed("42", oid::INT4), Value::from(42));
        assert_eq!(typed("1.5", oid::FLOAT8), Value::from(1.5));
        assert_eq!(typed("NaN", oid::FLOAT8), Value::from("NaN"));
        assert_eq!(typed("{\"a\": 1}", oid::JSONB), serde_json::json!({"a": 1}));
        assert_eq!(typed("{\"a\": ", oid::JSON), Value::from("{\"a\": "));
        assert_eq!(
            typed("9007199254740993", 20),
            Value::from("9007199254740993")
        );
    }

    #[test]
    fn results_are_written_as_the_driver_reads_them() {
        for array_mode in [false, true] {
            let mut w = ResultWriter::new(Shape {
                raw_text: false,
                array_mode,
            });
            let mut out = b"{\"results\":[".to_vec();
            w.fields(&mut out, &row_description(&[("n", oid::INT4), ("s", 25)]))
                .expect("fields");
            w.row(&mut out, &data_row(&[Some("1"), Some("a\"b\n")]))
                .expect("row");
            w.row(&mut out, &data_row(&[None, Some("")])).expect("row");
            w.complete(b"SELECT 2\0");
            w.finish(&mut out).expect("finish");
            w.complete(b"CREATE TABLE\0");
            w.finish(&mut out).expect("finish");
            out.extend_from_slice(b"]}");
            let v: Value = serde_json::from_slice(&out).expect("valid JSON");
            let rows = if array_mode {
                serde_json::json!([[1, "a\"b\n"], [null, ""]])
            } else {
                serde_json::json!([{"n": 1, "s": "a\"b\n"}, {"n": null, "s": ""}])
            };
            assert_eq!(v["results"][0]["rows"], rows);
            assert_eq!(v["results"][0]["command"], "SELECT");
            assert_eq!(v["results"][0]["rowCount"], 2);
            assert_eq!(v["results"][0]["rowAsArray"], array_mode);
            assert_eq!(v["results"][0]["fields"][1]["name"], "s");
            assert_eq!(v["results"][0]["fields"][1]["dataTypeID"], 25);
            assert_eq!(v["results"][1]["command"], "CREATE");
            assert_eq!(v["results"][1]["rowCount"], Value::Null);
            assert_eq!(v["results"][1]["rows"], serde_json::json!([]));
            assert_eq!(v["results"][1]["fields"], serde_json::json!([]));
        }
    }

    #[test]
    fn a_row_that_does_not_match_its_description_is_refused() {
        let shape = Shape {
            raw_text: true,
            array_mode: true,
        };
        let mut w = ResultWriter::new(shape);
        let mut out = Vec::new();
        assert!(w.row(&mut out, &data_row(&[Some("1")])).is_err());
        w.fields(&mut out, &row_description(&[("n", oid::INT4)]))
            .expect("fields");
        assert!(w.row(&mut out, &data_row(&[Some("1"), None])).is_err());
        assert!(w.row(&mut out, &[0, 1, 0, 0, 0, 9, b'x']).is_err());
    }

    #[test]
    fn error_fields_use_the_driver_names() {
        let body = b"SERROR\0VERROR\0C42601\0Msyntax error at or near \"selec\"\0P1\0\0";
        let m = error_fields(body);
        assert_eq!(m["code"], "42601");
        assert_eq!(m["position"], "1");
        assert_eq!(m["severity"], "ERROR");
    }
}
