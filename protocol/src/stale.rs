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

use std::collections::BTreeSet;

use crate::frontend::{error_fields, message};

/// Bytes of a Bind or Describe read before its statement name must have ended.
const NAME_WINDOW: usize = 1024;
/// Largest backend ErrorResponse held back to be replaced.
const ERROR_WINDOW: usize = 16 * 1024;
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

/// The stale statements of a session on its current backend connection, and the framing of
/// both directions needed to find their uses.
#[derive(Debug, Default)]
pub struct StaleStatements {
    names: BTreeSet<Box<str>>,
    /// Payload bytes of the current client message still to pass.
    client_skip: usize,
    /// Payload bytes of the current backend message still to pass.
    backend_skip: usize,
    /// A renamed use was sent in the current batch: its error is expected back.
    expect: bool,
    /// Watching at all: a revival left stale statements on this connection.
    active: bool,
}

impl StaleStatements {
    /// A fresh backend connection on which `names` describe other rows than the client knows.
    pub fn start(names: impl IntoIterator<Item = Box<str>>) -> StaleStatements {
        let names: BTreeSet<Box<str>> = names.into_iter().collect();
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
        self.names.contains(name)
    }

    /// The names still stale.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
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
            let whole = have.len() == body || have.len() >= NAME_WINDOW;
            if name_at != Some(usize::MAX) && name.is_none() && !whole {
                // The name has not all arrived: hold the message from its start.
                return Advance::ready(i);
            }
            if let Some((a, end)) = name {
                let stale = std::str::from_utf8(&have[a..end]).is_ok_and(|n| self.contains(n));
                if stale && end > a {
                    data[start + a..start + end].fill(MARK);
                    self.expect = true;
                }
            }
            i = start;
            self.client_skip = body;
        }
    }

    /// Backend bytes, starting where the last call's `ready` ended: replaces the error a
    /// renamed use met with the one Postgres gives a statement whose rows changed.
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
            match tag {
                b'Z' => self.expect = false,
                b'E' if self.expect && splice.is_none() && body <= ERROR_WINDOW => {
                    if data.len() < start + body {
                        return Advance { ready: i, splice };
                    }
                    let fields = error_fields(&data[start..start + body]);
                    self.expect = false;
                    if fields.code == UNDEFINED_STATEMENT && fields.message.contains(MARK as char) {
                        splice = Some(Splice {
                            at: i,
                            len: 5 + body,
                            with: result_changed(),
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
            let mut s = StaleStatements::start(["s1".into()]);
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
            assert!(s.expect);
        }
    }

    fn error(code: &str, message: &str) -> Vec<u8> {
        msg(
            b'E',
            format!("SERROR\0VERROR\0C{code}\0M{message}\0\0").as_bytes(),
        )
    }

    #[test]
    fn replaces_the_error_of_a_renamed_use_only() {
        let mut s = StaleStatements::start(["s1".into()]);
        s.expect = true;
        let missing = error("26000", "prepared statement \"\x7f\x7f\" does not exist");
        let stream = [msg(b'1', b""), missing.clone(), msg(b'Z', b"I")].concat();
        // The error is held until it is whole.
        let a = s.backend(&stream[..10]);
        assert_eq!(a.ready, 5);
        let a = s.backend(&stream[5..]);
        let splice = a.splice.expect("replaced");
        assert_eq!((splice.at, splice.len), (0, missing.len()));
        let fields = error_fields(&splice.with[5..]);
        assert_eq!(fields.code, "0A000");
        assert_eq!(fields.message, "cached plan must not change result type");
        assert_eq!(a.ready, stream.len() - 5);
        assert!(!s.expect);
        // Another statement's error, or one after the batch ended, passes as it is.
        let mut s = StaleStatements::start(["s1".into()]);
        s.expect = true;
        let other = error("26000", "prepared statement \"nope\" does not exist");
        assert_eq!(s.backend(&other).splice, None);
        let mut s = StaleStatements::start(["s1".into()]);
        assert_eq!(s.backend(&missing).splice, None);
    }

    #[test]
    fn forgetting_and_inactive() {
        let mut s = StaleStatements::start(["a".into(), "b".into()]);
        assert!(s.active() && s.contains("a"));
        s.forget("a");
        assert_eq!(s.names().collect::<Vec<_>>(), ["b"]);
        s.forget_all();
        assert!(!s.contains("b"));
        assert!(!StaleStatements::start(std::iter::empty()).active());
    }
}
