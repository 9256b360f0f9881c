//! Messages the gateway sends a backend on its own (to record and restore a session's state),
//! and readers for the few answers it inspects.

/// Appends one message: tag, length, body.
pub(crate) fn message(out: &mut Vec<u8>, tag: u8, body: impl FnOnce(&mut Vec<u8>)) {
    out.push(tag);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    body(out);
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// Appends a simple Query.
pub fn query(out: &mut Vec<u8>, sql: &str) {
    message(out, b'Q', |b| cstr(b, sql));
}

/// Appends the queries that return a session to its defaults before another client uses it
/// (a rollback when `in_transaction`, then `DISCARD ALL`); returns how many ReadyForQuery
/// replies they produce.
pub fn reset(out: &mut Vec<u8>, in_transaction: bool) -> usize {
    if in_transaction {
        query(out, "ROLLBACK");
    }
    query(out, "DISCARD ALL");
    1 + usize::from(in_transaction)
}

/// Appends a Parse of statement `name` with parameter type OIDs (0: let the server infer).
pub fn parse(out: &mut Vec<u8>, name: &str, sql: &str, param_types: &[u32]) {
    message(out, b'P', |b| {
        cstr(b, name);
        cstr(b, sql);
        b.extend_from_slice(&(param_types.len() as u16).to_be_bytes());
        for t in param_types {
            b.extend_from_slice(&t.to_be_bytes());
        }
    });
}

/// Appends a Bind of the unnamed portal to statement `name` with text parameters and text
/// results.
pub fn bind_text(out: &mut Vec<u8>, name: &str, params: &[&str]) {
    bind(out, name, params.iter().map(|p| Some(p.as_bytes())));
}

/// Appends a Bind of the unnamed portal to statement `name`: parameters in text format
/// (`None` is NULL), results in text format.
pub fn bind<'a>(
    out: &mut Vec<u8>,
    name: &str,
    params: impl ExactSizeIterator<Item = Option<&'a [u8]>>,
) {
    message(out, b'B', |b| {
        cstr(b, "");
        cstr(b, name);
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&(params.len() as u16).to_be_bytes());
        for p in params {
            match p {
                Some(v) => {
                    b.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    b.extend_from_slice(v);
                }
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        b.extend_from_slice(&0u16.to_be_bytes());
    });
}

/// Appends a Describe of the unnamed portal.
pub fn describe_portal(out: &mut Vec<u8>) {
    message(out, b'D', |b| cstr(b, "P"));
}

/// Appends a Describe of prepared statement `name`.
pub fn describe_statement(out: &mut Vec<u8>, name: &str) {
    message(out, b'D', |b| {
        b.push(b'S');
        cstr(b, name);
    });
}

/// What Postgres compares when it decides that a cached statement's result changed (column
/// names, types and type modifiers, in order), as a fingerprint of a RowDescription body; the
/// column's table and position are left out, as Postgres leaves them out. `None` when
/// malformed.
pub fn row_shape(body: &[u8]) -> Option<u64> {
    let n = u16::from_be_bytes(body.get(..2)?.try_into().ok()?);
    let mut rest = &body[2..];
    let mut hash = Fnv::default();
    hash.add(&n.to_be_bytes());
    for _ in 0..n {
        let end = rest.iter().position(|&b| b == 0)?;
        hash.add(&rest[..=end]);
        let fixed = rest.get(end + 1..end + 19)?;
        // table oid (4), column (2), type oid (4), size (2), modifier (4), format (2)
        hash.add(&fixed[6..10]);
        hash.add(&fixed[12..16]);
        rest = &rest[end + 19..];
    }
    Some(hash.0)
}

/// The parameter type OIDs of a ParameterDescription body; `None` when malformed.
pub fn parameter_types(body: &[u8]) -> Option<Vec<u32>> {
    let n = usize::from(u16::from_be_bytes(body.get(..2)?.try_into().ok()?));
    let oids = body.get(2..2 + 4 * n)?;
    Some(
        oids.chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// FNV-1a, enough to tell shapes apart without keeping them.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Appends an Execute of the unnamed portal, all rows.
pub fn execute(out: &mut Vec<u8>) {
    message(out, b'E', |b| {
        cstr(b, "");
        b.extend_from_slice(&0u32.to_be_bytes());
    });
}

/// Appends a Close of prepared statement `name`.
pub fn close_statement(out: &mut Vec<u8>, name: &str) {
    message(out, b'C', |b| {
        b.push(b'S');
        cstr(b, name);
    });
}

/// Appends a Sync.
pub fn sync(out: &mut Vec<u8>) {
    message(out, b'S', |_| {});
}

/// A Terminate message.
pub const TERMINATE: [u8; 5] = [b'X', 0, 0, 0, 4];

/// The columns of a DataRow body; `None` for SQL NULL. `None` overall when malformed.
pub fn data_row(body: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let n = u16::from_be_bytes(body.get(..2)?.try_into().ok()?) as usize;
    let mut rest = &body[2..];
    let mut cols = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
        rest = &rest[4..];
        if len < 0 {
            cols.push(None);
            continue;
        }
        let len = len as usize;
        cols.push(Some(rest.get(..len)?));
        rest = &rest[len..];
    }
    Some(cols)
}

/// The SQLSTATE (`C`), severity (`V` or `S`) and message (`M`) fields of an ErrorResponse or
/// NoticeResponse body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorFields {
    /// SQLSTATE code.
    pub code: String,
    /// Severity, not localized when the server sent `V`.
    pub severity: String,
    /// Primary message.
    pub message: String,
}

/// Reads the fields of an ErrorResponse body (tolerates a cut-off body).
pub fn error_fields(body: &[u8]) -> ErrorFields {
    let mut out = ErrorFields::default();
    for field in body.split(|&b| b == 0) {
        let Some((&kind, value)) = field.split_first() else {
            continue;
        };
        let value = String::from_utf8_lossy(value).into_owned();
        match kind {
            b'C' => out.code = value,
            b'V' => out.severity = value,
            b'S' if out.severity.is_empty() => out.severity = value,
            b'M' => out.message = value,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_their_lengths() {
        let mut out = Vec::new();
        parse(&mut out, "s1", "select $1", &[23]);
        assert_eq!(out[0], b'P');
        assert_eq!(
            u32::from_be_bytes(out[1..5].try_into().unwrap()) as usize,
            out.len() - 1
        );
        let mut out = Vec::new();
        sync(&mut out);
        assert_eq!(out, [b'S', 0, 0, 0, 4]);
        let mut out = Vec::new();
        close_statement(&mut out, "s1");
        assert_eq!(out, [b'C', 0, 0, 0, 8, b'S', b's', b'1', 0]);
    }

    fn row_description(cols: &[(&str, u32, u32, i32)]) -> Vec<u8> {
        let mut b = (cols.len() as u16).to_be_bytes().to_vec();
        for (name, table, ty, typmod) in cols {
            b.extend(name.as_bytes());
            b.push(0);
            b.extend(table.to_be_bytes());
            b.extend(1u16.to_be_bytes());
            b.extend(ty.to_be_bytes());
            b.extend(4u16.to_be_bytes());
            b.extend(typmod.to_be_bytes());
            b.extend(0u16.to_be_bytes());
        }
        b
    }

    #[test]
    fn row_shapes_compare_names_types_and_modifiers_only() {
        let shape = |c: &[(&str, u32, u32, i32)]| row_shape(&row_description(c)).unwrap();
        let ab = shape(&[("a", 1, 23, -1), ("b", 1, 23, -1)]);
        assert_eq!(ab, shape(&[("a", 99, 23, -1), ("b", 99, 23, -1)]));
        assert_ne!(ab, shape(&[("b", 1, 23, -1), ("a", 1, 23, -1)]));
        assert_ne!(ab, shape(&[("a", 1, 20, -1), ("b", 1, 23, -1)]));
        assert_ne!(ab, shape(&[("a", 1, 23, 8), ("b", 1, 23, -1)]));
        assert_ne!(ab, shape(&[("a", 1, 23, -1)]));
        let body = row_description(&[("a", 1, 23, -1)]);
        assert_eq!(row_shape(&body[..body.len() - 1]), None);
    }

    #[test]
    fn reads_rows_and_errors() {
        let mut body = 2u16.to_be_bytes().to_vec();
        body.extend(2i32.to_be_bytes());
        body.extend(b"ab");
        body.extend((-1i32).to_be_bytes());
        assert_eq!(data_row(&body), Some(vec![Some(&b"ab"[..]), None]));
        assert_eq!(data_row(&body[..5]), None);
        let f = error_fields(b"SFATAL\0VFATAL\0C57P01\0Mterminating\0\0");
        assert_eq!(f.code, "57P01");
        assert_eq!(f.severity, "FATAL");
        assert_eq!(f.message, "terminating");
    }
}
