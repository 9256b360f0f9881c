//! Statements whose rows changed while their session was away from its backend connection.
//!
//! Postgres answers the use of a cached statement whose result changed (a column dropped and
//! added again, a type changed) with ERROR `0A000` "cached plan must not change result type", and
//! drivers that cache row descriptions (asyncpg, pgx, pgjdbc) prepare the statement again when
//! they see it. A statement made again on a new backend connection has the new shape, so the
//! gateway must give that answer itself: it renames such a statement in the client's Bind or
//! Describe to a name that exists nowhere (same length, so the message is edited in place), the
//! backend fails the message and skips the rest of the batch to Sync exactly as it would have,
//! and its "does not exist" error is replaced by the `0A000` one on the way back.
//!
//! Sans-io: the relay hands each direction's unwritten bytes to [`StaleStatements::client`] or
//! [`StaleStatements::backend`], which edit them and say how many are final ([`Advance`]).

use std::collections::{BTreeMap, VecDeque};

use crate::frontend::{error_fields, message};
use crate::sql_text::executed_statements;

/// Bytes of a Bind or Describe read before its statement name must have ended.
const NAME_WINDOW: usize = 1024;
/// Largest backend ErrorResponse held back to be replaced, and largest Query text held back to
/// be read whole: a held message must fit in the relay's smallest buffer (1 KiB) with its
/// header and whatever the relay could not write yet.
const ERROR_WINDOW: usize = 1000;
/// See [`ERROR_WINDOW`]. A longer text that executes a stale statement runs it as it is.
const TEXT_WINDOW: usize = 1000;
/// What the name of a stale statement in a Query's `EXECUTE` becomes: a quoted identifier of
/// the mark, a name no statement has.
const QUOTED_MARK: &[u8] = &[b'"', MARK, b'"'];
/// What a stale statement's name becomes in a client message.
const MARK: u8 = 0x7f;
/// SQLSTATE of a statement that does not exist.
const UNDEFINED_STATEMENT: &str = "26000";

/// How much of a direction's unwritten bytes may be written, and an edit to make on the way.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Advance {
    /// Bytes at the start that are final; the rest waits for more input.
    pub ready: usize,
    /// Write `with` instead of the `len` bytes at `at` (all within `ready`).
    pub splice: Option<Splice>,
}

/// A replacement of bytes in the stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Splice {
    /// Where the replaced bytes start.
    pub at: usize,
    /// How many bytes are replaced.
    pub len: usize,
    /// What is written instead.
    pub with: Vec<u8>,
}

/// What the use of a stale statement answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StaleAnswer {
    /// Its rows changed: ERROR `0A000`, as Postgres answers a cached plan whose result changed.
    ResultChanged,
    /// It could not be made again (its table was dropped, a type under it changed): the whole
    /// ErrorResponse its Parse met, which is what Postgres answers when it revalidates such a
    /// statement.
    Failed(Box<[u8]>),
}

impl StaleAnswer {
    fn message(&self) -> Vec<u8> {
        match self {
            StaleAnswer::ResultChanged => result_changed(),
            StaleAnswer::Failed(error) => error.to_vec(),
        }
    }
}

/// A statement the client must not use as the backend connection holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleStatement {
    /// What its use answers.
    pub answer: StaleAnswer,
    /// Its parameter types as the client was told: Postgres describes them before it finds
    /// that the statement's result cannot be described, so a Describe answers them first.
    pub param_types: Box<[u32]>,
}

/// The answer owed to the first renamed use of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owed {
    answer: StaleAnswer,
    /// The use was a Describe of the statement: its parameters come before the error.
    describe: Option<Box<[u32]>>,
}

impl Owed {
    fn message(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(types) = &self.describe {
            message(&mut out, b't', |body| {
                body.extend_from_slice(&(types.len() as u16).to_be_bytes());
                for t in types.iter() {
                    body.extend_from_slice(&t.to_be_bytes());
                }
            });
        }
        out.extend(self.answer.message());
        out
    }
}

/// The stale statements of a session on its current backend connection, and the framing of
/// both directions needed to find their uses.
#[derive(Debug, Default)]
pub struct StaleStatements {
    names: BTreeMap<Box<str>, StaleStatement>,
    /// Payload bytes of the current client message still to pass.
    client_skip: usize,
    /// Payload bytes of the current backend message still to pass.
    backend_skip: usize,
    /// The answer of the first renamed use in the batch the client is sending.
    current: Option<Owed>,
    /// Batches the client ended (Sync, Query, FunctionCall: each gets one ReadyForQuery).
    sent: u64,
    /// ReadyForQuery messages the backend sent since the filter started.
    answered: u64,
    /// Batches holding a renamed use, by number, with the answer of their first one: a
    /// client may pipeline several batches before the first is answered.
    expected: VecDeque<(u64, Owed)>,
    /// Watching at all: a revival left stale statements on this connection.
    active: bool,
}

impl StaleStatements {
    /// A fresh backend connection on which `names` must not be used as they are: each use
    /// answers its [`StaleAnswer`].
    pub fn start(names: impl IntoIterator<Item = (Box<str>, StaleStatement)>) -> StaleStatements {
        let names: BTreeMap<Box<str>, StaleStatement> = names.into_iter().collect();
        StaleStatements {
            active: !names.is_empty(),
            names,
            ..StaleStatements::default()
        }
    }

    /// True while the relay must pass bytes through this filter.
    pub fn active(&self) -> bool {
        self.active
    }

    /// True when `name` is stale.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    /// The names still stale, with what their use answers.
    pub fn names(&self) -> impl Iterator<Item = (&str, &StaleStatement)> {
        self.names.iter().map(|(n, a)| (&**n, a))
    }

    /// The client closed or deallocated `name`: a statement of that name is fresh from now on.
    pub fn forget(&mut self, name: &str) {
        self.names.remove(name);
    }

    /// Every statement was deallocated.
    pub fn forget_all(&mut self) {
        self.names.clear();
    }

    /// Client bytes, starting where the last call's `ready` ended: renames uses of stale
    /// statements in place.
    pub fn client(&mut self, data: &mut [u8]) -> Advance {
        let mut i = 0;
        loop {
            if self.client_skip > 0 {
                let n = self.client_skip.min(data.len() - i);
                i += n;
                self.client_skip -= n;
                if self.client_skip > 0 {
                    return Advance::ready(data.len());
                }
            }
            let Some((tag, body)) = header(&data[i..]) else {
                return Advance::ready(i);
            };
            let start = i + 5;
            let have = &data[start..data.len().min(start + body)];
            let mut splice = None;
            if tag == b'Q' && body <= TEXT_WINDOW && !self.names.is_empty() {
                if have.len() < body {
                    return Advance::ready(i);
                }
                if let Some((owed, with)) = self.rename_executes(have) {
                    if self.current.is_none() {
                        self.current = Some(owed);
                    }
                    splice = Some(Splice {
                        at: i,
                        len: 5 + body,
                        with,
                    });
                }
            }
            let name_at = match tag {
                b'B' => have.iter().position(|&b| b == 0).map(|p| p + 1),
                b'D' if have.first() == Some(&b'S') => Some(1),
                b'D' if have.is_empty() => None,
                _ => Some(usize::MAX),
            };
            let name = name_at.filter(|&a| a != usize::MAX).and_then(|a| {
                let end = have.get(a..)?.iter().position(|&b| b == 0)?;
                Some((a, a + end))
            });
            if matches!(tag, b'S' | b'Q' | b'F') {
                if let Some(answer) = self.current.take() {
                    self.expected.push_back((self.sent, answer));
                }
                self.sent += 1;
            }
            if splice.is_some() {
                // One edit per pass: what follows is offered again.
                return Advance {
                    ready: start + body,
                    splice,
                };
            }
            let whole = have.len() == body || have.len() >= NAME_WINDOW;
            if name_at != Some(usize::MAX) && name.is_none() && !whole {
                // The name has not all arrived: hold the message from its start.
                return Advance::ready(i);
            }
            if let Some((a, end)) = name {
                let stale = std::str::from_utf8(&have[a..end])
                    .ok()
                    .and_then(|n| self.names.get(n));
                if let Some(stale) = stale.filter(|_| end > a) {
                    if self.current.is_none() {
                        self.current = Some(Owed {
                            answer: stale.answer.clone(),
                            describe: (tag == b'D').then(|| stale.param_types.clone()),
                        });
                    }
                    data[start + a..start + end].fill(MARK);
                }
            }
            i = start;
            self.client_skip = body;
        }
    }

    /// A Query whose text runs a stale statement with SQL `EXECUTE`: the answer owed and the
    /// message with each such name replaced by a name no statement has.
    fn rename_executes(&self, body: &[u8]) -> Option<(Owed, Vec<u8>)> {
        let text = std::str::from_utf8(body.strip_suffix(&[0])?).ok()?;
        let mut owed = None;
        let mut renamed = Vec::with_capacity(body.len());
        let mut from = 0;
        for (name, at) in executed_statements(text) {
            if let Some(stale) = self.names.get(name.as_str()) {
                owed.get_or_insert_with(|| Owed {
                    answer: stale.answer.clone(),
                    describe: None,
                });
                renamed.extend_from_slice(&text.as_bytes()[from..at.start]);
                renamed.extend_from_slice(QUOTED_MARK);
                from = at.end;
            }
        }
        let owed = owed?;
        renamed.extend_from_slice(&body[from..]);
        let mut out = Vec::with_capacity(renamed.len() + 5);
        message(&mut out, b'Q', |b| b.extend_from_slice(&renamed));
        Some((owed, out))
    }

    /// Backend bytes, starting where the last call's `ready` ended: replaces the error a
    /// renamed use met with the one Postgres gives that statement's use.
    pub fn backend(&mut self, data: &[u8]) -> Advance {
        let mut i = 0;
        let mut splice = None;
        loop {
            if self.backend_skip > 0 {
                let n = self.backend_skip.min(data.len() - i);
                i += n;
                self.backend_skip -= n;
                if self.backend_skip > 0 {
                    return Advance {
                        ready: data.len(),
                        splice,
                    };
                }
            }
            let Some((tag, body)) = header(&data[i..]) else {
                return Advance { ready: i, splice };
            };
            let start = i + 5;
            let expecting = self
                .expected
                .front()
                .is_some_and(|(batch, _)| *batch == self.answered);
            match tag {
                b'Z' => {
                    self.answered += 1;
                    while self
                        .expected
                        .front()
                        .is_some_and(|(batch, _)| *batch < self.answered)
                    {
                        self.expected.pop_front();
                    }
                }
                // One edit per pass: the next is made when the relay passes these bytes again.
                b'E' if expecting && splice.is_some() => return Advance { ready: i, splice },
                b'E' if expecting && body <= ERROR_WINDOW => {
                    if data.len() < start + body {
                        return Advance { ready: i, splice };
                    }
                    let fields = error_fields(&data[start..start + body]);
                    // The batch's first error ends it: either the renamed use failed, or an
                    // earlier message did and the use never ran.
                    if let Some((_, owed)) = self.expected.pop_front()
                        && fields.code == UNDEFINED_STATEMENT
                        && fields.message.contains(MARK as char)
                    {
                        splice = Some(Splice {
                            at: i,
                            len: 5 + body,
                            with: owed.message(),
                        });
                    }
                }
                _ => {}
            }
            i = start;
            self.backend_skip = body;
        }
    }
}

impl Advance {
    fn ready(ready: usize) -> Advance {
        Advance {
            ready,
            splice: None,
        }
    }
}

/// The tag and payload length of a message header at the start of `data`, once all 5 bytes are
/// there (a length below 4 reads as an empty payload: the frame scanner refuses it anyway).
fn header(data: &[u8]) -> Option<(u8, usize)> {
    let h = data.get(..5)?;
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    Some((h[0], len.saturating_sub(4)))
}

/// The ErrorResponse Postgres sends for a cached statement whose result changed, with the
/// source fields drivers look at to recognise it.
fn result_changed() -> Vec<u8> {
    let fields: [(u8, &str); 7] = [
        (b'S', "ERROR"),
        (b'V', "ERROR"),
        (b'C', "0A000"),
        (b'M', "cached plan must not change result type"),
        (b'F', "plancache.c"),
        (b'L', "730"),
        (b'R', "RevalidateCachedQuery"),
    ];
    let mut out = Vec::new();
    message(&mut out, b'E', |body| {
        for (code, value) in fields {
            body.push(code);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn bind(statement: &str) -> Vec<u8> {
        let mut b = b"\0".to_vec();
        b.extend(statement.as_bytes());
        b.extend([0, 0, 0, 0, 0, 0, 0]);
        msg(b'B', &b)
    }

    fn describe(statement: &str) -> Vec<u8> {
        let mut b = b"S".to_vec();
        b.extend(statement.as_bytes());
        b.push(0);
        msg(b'D', &b)
    }

    /// Feeds `stream` in chunks of `size` as the relay would, returning what is written.
    fn relay_client(s: &mut StaleStatements, stream: &[u8], size: usize) -> Vec<u8> {
        let mut held: Vec<u8> = Vec::new();
        let mut out = Vec::new();
        for chunk in stream.chunks(size) {
            held.extend_from_slice(chunk);
            let a = s.client(&mut held);
            assert!(a.splice.is_none());
            out.extend(held.drain(..a.ready));
        }
        out.extend(held);
        out
    }

    fn stale(answer: StaleAnswer) -> StaleStatement {
        StaleStatement {
            answer,
            param_types: [23].into(),
        }
    }

    fn changed(names: &[&str]) -> StaleStatements {
        StaleStatements::start(
            names
                .iter()
                .map(|n| ((*n).into(), stale(StaleAnswer::ResultChanged))),
        )
    }

    #[test]
    fn renames_uses_of_stale_statements_in_place_across_chunks() {
        let stream = [
            msg(b'P', b"s1\0select 1\0\0\0"),
            bind("s1"),
            bind("fresh"),
            describe("s1"),
            msg(b'D', b"Ps1\0"),
            msg(b'S', b""),
        ]
        .concat();
        for size in [1, 2, 3, 7, 1000] {
            let mut s = changed(&["s1"]);
            let out = relay_client(&mut s, &stream, size);
            let want = [
                msg(b'P', b"s1\0select 1\0\0\0"),
                bind("\x7f\x7f"),
                bind("fresh"),
                describe("\x7f\x7f"),
                msg(b'D', b"Ps1\0"),
                msg(b'S', b""),
            ]
            .concat();
            assert_eq!(out, want, "chunks of {size}");
            let owed = Owed {
                answer: StaleAnswer::ResultChanged,
                describe: None,
            };
            assert_eq!(s.expected, [(0, owed)]);
            assert_eq!(s.sent, 1);
        }
    }

    fn error(code: &str, message: &str) -> Vec<u8> {
        msg(
            b'E',
            format!("SERROR\0VERROR\0C{code}\0M{message}\0\0").as_bytes(),
        )
    }

    /// Passes `stream` through the backend filter as the relay does (held bytes are offered
    /// again before more arrive), returning what the client receives.
    fn relay_backend(s: &mut StaleStatements, stream: &[u8]) -> Vec<u8> {
        let mut held = stream.to_vec();
        let mut out = Vec::new();
        while !held.is_empty() {
            let a = s.backend(&held);
            assert!(a.ready > 0 || a.splice.is_none());
            let mut from = 0;
            if let Some(sp) = a.splice {
                out.extend_from_slice(&held[..sp.at]);
                out.extend_from_slice(&sp.with);
                from = sp.at + sp.len;
            }
            out.extend_from_slice(&held[from..a.ready]);
            held.drain(..a.ready);
            if a.ready == 0 {
                break;
            }
        }
        out
    }

    fn missing() -> Vec<u8> {
        error("26000", "prepared statement \"\x7f\x7f\" does not exist")
    }

    #[test]
    fn replaces_the_error_of_a_renamed_use_only() {
        let mut s = changed(&["s1"]);
        relay_client(&mut s, &[bind("s1"), msg(b'S', b"")].concat(), 1000);
        let stream = [msg(b'1', b""), missing(), msg(b'Z', b"I")].concat();
        // The error is held until it is whole.
        let a = s.backend(&stream[..10]);
        assert_eq!(a.ready, 5);
        let a = s.backend(&stream[5..]);
        let splice = a.splice.expect("replaced");
        assert_eq!((splice.at, splice.len), (0, missing().len()));
        let fields = error_fields(&splice.with[5..]);
        assert_eq!(fields.code, "0A000");
        assert_eq!(fields.message, "cached plan must not change result type");
        assert_eq!(a.ready, stream.len() - 5);
        assert!(s.expected.is_empty());
        // Another statement's error, or one after the batch ended, passes as it is.
        let mut s = changed(&["s1"]);
        relay_client(&mut s, &[bind("s1"), msg(b'S', b"")].concat(), 1000);
        let other = error("26000", "prepared statement \"nope\" does not exist");
        assert_eq!(s.backend(&other).splice, None);
        assert_eq!(s.backend(&missing()).splice, None);
        let mut s = changed(&["s1"]);
        assert_eq!(s.backend(&missing()).splice, None);
    }

    #[test]
    fn pipelined_batches_get_their_own_answers() {
        let dropped = error("42P01", "relation \"t\" does not exist");
        let mut s = StaleStatements::start([
            (
                "gone".into(),
                stale(StaleAnswer::Failed(dropped.clone().into())),
            ),
            ("s1".into(), stale(StaleAnswer::ResultChanged)),
        ]);
        // Batch 0 uses nothing stale, 1 a dropped statement, 2 describes a reshaped one (its
        // parameters come first), 3 uses both (the first use answers), 4 fails before its stale
        // use runs.
        let client = [
            bind("fresh"),
            msg(b'S', b""),
            bind("gone"),
            msg(b'S', b""),
            describe("s1"),
            msg(b'S', b""),
            bind("s1"),
            bind("gone"),
            msg(b'S', b""),
            bind("fresh"),
            bind("s1"),
            msg(b'S', b""),
        ]
        .concat();
        relay_client(&mut s, &client, 3);
        let duplicate = error("42P05", "prepared statement \"x\" already exists");
        let z = msg(b'Z', b"I");
        let backend = [
            msg(b'2', b""),
            z.clone(),
            missing(),
            z.clone(),
            missing(),
            z.clone(),
            missing(),
            z.clone(),
            duplicate.clone(),
            z.clone(),
        ]
        .concat();
        let got = relay_backend(&mut s, &backend);
        let want = [
            msg(b'2', b""),
            z.clone(),
            dropped,
            z.clone(),
            msg(b't', &[0, 1, 0, 0, 0, 23]),
            result_changed(),
            z.clone(),
            result_changed(),
            z.clone(),
            duplicate,
            z,
        ]
        .concat();
        assert_eq!(got, want);
        assert!(s.expected.is_empty());
    }

    #[test]
    fn renames_stale_statements_a_query_executes() {
        let mut s = changed(&["by_a"]);
        let query = msg(b'Q', b"select 1; EXECUTE By_A(1); execute other\0");
        let first = query.len();
        let stream = [query, msg(b'Q', b"execute by_a\0")].concat();
        let a = s.client(&mut stream.clone());
        assert_eq!(a.ready, first);
        let splice = a.splice.expect("renamed");
        assert_eq!((splice.at, splice.len), (0, first));
        assert_eq!(
            splice.with,
            msg(b'Q', b"select 1; EXECUTE \"\x7f\"(1); execute other\0")
        );
        let a = s.client(&mut stream[first..].to_vec());
        assert_eq!(
            a.splice.expect("renamed").with,
            msg(b'Q', b"execute \"\x7f\"\0")
        );
        assert_eq!(s.expected.len(), 2);
        // A text that executes nothing stale passes as it is.
        let mut plain = msg(b'Q', b"execute other\0");
        assert_eq!(s.client(&mut plain), Advance::ready(plain.len()));
    }

    #[test]
    fn forgetting_and_inactive() {
        let mut s = changed(&["a", "b"]);
        assert!(s.active() && s.contains("a"));
        s.forget("a");
        assert_eq!(s.names().map(|(n, _)| n).collect::<Vec<_>>(), ["b"]);
        s.forget_all();
        assert!(!s.contains("b"));
        assert!(!StaleStatements::start(std::iter::empty()).active());
    }
}
