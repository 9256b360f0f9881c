//! Running `/sql` statements on a pooled backend connection with the extended protocol (text
//! parameters, text results), and shaping the replies as the serverless driver expects.
//!
//! Everything one request needs is written at once: the pending session reset, `BEGIN` for a
//! batch, each statement as Parse/Bind/Describe/Execute/Sync, `COMMIT`. After an error the
//! backend skips to the next Sync, later statements of a batch fail inside the aborted
//! transaction and `COMMIT` rolls back, so one round trip serves any request.

use bytes::BufMut;
use serde_json::{Map, Number, Value};
use tokio::io::AsyncWriteExt;

use crate::connect::read_message;
use crate::pool::BackendConn;

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
    /// The results grew past the response limit; the connection is mid-reply.
    #[error("response larger than {0} bytes")]
    TooLarge(usize),
    /// The backend connection failed.
    #[error("backend I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The backend sent something unexpected.
    #[error("backend protocol: {0}")]
    Protocol(String),
}

/// Type OIDs with a JSON form in non-raw mode.
mod oid {
    pub const BOOL: u32 = 16;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const JSON: u32 = 114;
    pub const JSONB: u32 = 3802;
}

/// Runs `statements` (in one transaction opened by `begin`, when given) and returns one result
/// object per statement, or the first error.
pub async fn run(
    conn: &mut BackendConn,
    statements: &[Statement],
    begin: Option<&str>,
    shape: Shape,
    max_response: usize,
    max_message: usize,
) -> Result<Vec<Value>, QueryError> {
    let mut out = Vec::with_capacity(256);
    let resets = conn.take_reset(&mut out);
    if let Some(begin) = begin {
        simple(&mut out, begin);
    }
    for s in statements {
        extended(&mut out, s)?;
    }
    if begin.is_some() {
        simple(&mut out, "COMMIT");
    }
    conn.stream.write_all(&out).await?;
    conn.stream.flush().await?;

    // Each statement (and each reset, BEGIN, COMMIT) ends with one ReadyForQuery.
    let mut results = Vec::with_capacity(statements.len());
    let mut first_error: Option<Map<String, Value>> = None;
    let mut size = 0usize;
    let mut replies_left = resets + statements.len() + if begin.is_some() { 2 } else { 0 };
    let mut reply = 0usize;
    let first_statement = resets + usize::from(begin.is_some());
    let mut current = ResultBuilder::new(shape);
    while replies_left > 0 {
        let msg = read_message(&mut conn.stream, max_message)
            .await?
            .ok_or_else(|| QueryError::Protocol("message length out of range".into()))?;
        let body = msg.body();
        let in_statement = reply >= first_statement && reply < first_statement + statements.len();
        match msg.tag() {
            b'Z' => {
                conn.status = body.first().copied().unwrap_or(b'E');
                if in_statement && first_error.is_none() {
                    results
                        .push(std::mem::replace(&mut current, ResultBuilder::new(shape)).finish());
                }
                replies_left -= 1;
                reply += 1;
            }
            b'E' => {
                let fields = error_fields(body);
                if reply < resets {
                    return Err(QueryError::Protocol("the session reset failed".into()));
                }
                if first_error.is_none() {
                    first_error = Some(fields);
                }
            }
            b'T' if in_statement => current.fields(body)?,
            b'D' if in_statement => {
                size += body.len() + 8;
                if size > max_response {
                    return Err(QueryError::TooLarge(max_response));
                }
                current.row(body)?;
            }
            b'C' if in_statement => current.complete(body),
            // Parse/Bind complete, NoData, empty query, notices, parameter changes,
            // notifications and the replies to the reset, BEGIN and COMMIT carry nothing the
            // response needs.
            _ => {}
        }
    }
    match first_error {
        Some(e) => Err(QueryError::Postgres(e)),
        None => Ok(results),
    }
}

fn simple(out: &mut Vec<u8>, sql: &str) {
    out.put_u8(b'Q');
    out.put_u32((4 + sql.len() + 1) as u32);
    out.put_slice(sql.as_bytes());
    out.put_u8(0);
}

/// Appends Parse, Bind, Describe (portal), Execute and Sync for one statement.
fn extended(out: &mut Vec<u8>, s: &Statement) -> Result<(), QueryError> {
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
    // Parse: unnamed statement, parameter types left to the server.
    message(out, b'P', |b| {
        b.put_u8(0);
        b.put_slice(s.query.as_bytes());
        b.put_u8(0);
        b.put_i16(0);
    });
    // Bind: unnamed portal, all parameters and results in text format.
    message(out, b'B', |b| {
        b.put_u8(0);
        b.put_u8(0);
        b.put_i16(0);
        b.put_i16(s.params.len() as i16);
        for p in &s.params {
            match p {
                Some(v) => {
                    b.put_i32(v.len() as i32);
                    b.put_slice(v.as_bytes());
                }
                None => b.put_i32(-1),
            }
        }
        b.put_i16(0);
    });
    message(out, b'D', |b| {
        b.put_u8(b'P');
        b.put_u8(0);
    });
    message(out, b'E', |b| {
        b.put_u8(0);
        b.put_i32(0);
    });
    message(out, b'S', |_| {});
    Ok(())
}

/// Appends one tagged message whose body `fill` writes.
fn message(out: &mut Vec<u8>, tag: u8, fill: impl FnOnce(&mut Vec<u8>)) {
    out.put_u8(tag);
    let at = out.len();
    out.put_u32(0);
    fill(out);
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
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

struct Column {
    name: String,
    type_oid: u32,
}

/// One statement's result as it arrives.
struct ResultBuilder {
    shape: Shape,
    columns: Vec<Column>,
    fields: Vec<Value>,
    rows: Vec<Value>,
    command: String,
    row_count: Value,
}

impl ResultBuilder {
    fn new(shape: Shape) -> Self {
        ResultBuilder {
            shape,
            columns: Vec::new(),
            fields: Vec::new(),
            rows: Vec::new(),
            command: String::new(),
            row_count: Value::Null,
        }
    }

    fn fields(&mut self, body: &[u8]) -> Result<(), QueryError> {
        let bad = || QueryError::Protocol("malformed RowDescription".into());
        let mut r = Reader(body);
        let n = r.i16().ok_or_else(bad)?;
        for _ in 0..n {
            let name = r.cstr().ok_or_else(bad)?;
            let table = r.u32().ok_or_else(bad)?;
            let column = r.i16().ok_or_else(bad)?;
            let type_oid = r.u32().ok_or_else(bad)?;
            let size = r.i16().ok_or_else(bad)?;
            let modifier = r.i32().ok_or_else(bad)?;
            r.i16().ok_or_else(bad)?;
            self.fields.push(serde_json::json!({
                "name": name,
                "dataTypeID": type_oid,
                "tableID": table,
                "columnID": column,
                "dataTypeSize": size,
                "dataTypeModifier": modifier,
                "format": "text",
            }));
            self.columns.push(Column { name, type_oid });
        }
        Ok(())
    }

    fn row(&mut self, body: &[u8]) -> Result<(), QueryError> {
        let bad = || QueryError::Protocol("malformed DataRow".into());
        let mut r = Reader(body);
        let n = r.i16().ok_or_else(bad)? as usize;
        if n != self.columns.len() {
            return Err(bad());
        }
        let mut values = Vec::with_capacity(n);
        for c in &self.columns {
            let len = r.i32().ok_or_else(bad)?;
            let v = if len < 0 {
                Value::Null
            } else {
                let bytes = r.take(len as usize).ok_or_else(bad)?;
                let text = String::from_utf8_lossy(bytes);
                if self.shape.raw_text {
                    Value::String(text.into_owned())
                } else {
                    typed(&text, c.type_oid)
                }
            };
            values.push(v);
        }
        let row = if self.shape.array_mode {
            Value::Array(values)
        } else {
            let mut obj = Map::with_capacity(n);
            for (c, v) in self.columns.iter().zip(values) {
                obj.insert(c.name.clone(), v);
            }
            Value::Object(obj)
        };
        self.rows.push(row);
        Ok(())
    }

    fn complete(&mut self, body: &[u8]) {
        let tag = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body)).into_owned();
        let mut words = tag.split(' ');
        self.command = words.next().unwrap_or_default().to_owned();
        self.row_count = tag
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null);
    }

    fn finish(self) -> Value {
        serde_json::json!({
            "command": self.command,
            "fields": self.fields,
            "rowCount": self.row_count,
            "rows": self.rows,
            "rowAsArray": self.shape.array_mode,
        })
    }
}

/// A value's JSON form outside raw-text mode: numbers and booleans and JSON documents as such,
/// everything else (int8 and numeric included, to keep precision) as text.
fn typed(text: &str, type_oid: u32) -> Value {
    match type_oid {
        oid::BOOL => Value::Bool(text == "t"),
        oid::INT2 | oid::INT4 => text
            .parse::<i32>()
            .map(Value::from)
            .unwrap_or_else(|_| text.into()),
        // NaN and infinities have no JSON number: they stay text.
        oid::FLOAT4 | oid::FLOAT8 => text
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .unwrap_or_else(|| text.into()),
        oid::JSON | oid::JSONB => serde_json::from_str(text).unwrap_or_else(|_| text.into()),
        _ => text.into(),
    }
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

    #[test]
    fn typed_values_follow_the_driver() {
        assert_eq!(typed("t", oid::BOOL), Value::Bool(true));
        assert_eq!(typed("42", oid::INT4), Value::from(42));
        assert_eq!(typed("1.5", oid::FLOAT8), Value::from(1.5));
        assert_eq!(typed("NaN", oid::FLOAT8), Value::from("NaN"));
        assert_eq!(typed("{\"a\":1}", oid::JSONB), serde_json::json!({"a": 1}));
        assert_eq!(
            typed("9007199254740993", 20),
            Value::from("9007199254740993")
        );
    }

    #[test]
    fn command_tags_give_command_and_count() {
        let mut b = ResultBuilder::new(Shape {
            raw_text: true,
            array_mode: true,
        });
        b.complete(b"INSERT 0 5\0");
        assert_eq!(
            (b.command.as_str(), b.row_count.clone()),
            ("INSERT", Value::from(5))
        );
        b.complete(b"CREATE TABLE\0");
        assert_eq!(
            (b.command.as_str(), b.row_count.clone()),
            ("CREATE", Value::Null)
        );
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
