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
//! A statement that could not be made again for a reason that passes (a lock another session
//! held during the revival, a deadlock, a cancel) is made again at its first use instead: the
//! messages that make it are spliced in front of the client's Bind or Describe of it (its SQL
//! `PREPARE` in front of the statement of a simple Query that executes it), their answers are
//! taken out of the backend's, and an error they meet reaches the client as the use's own, which
//! is what Postgres answers when it revalidates a statement at that moment.
//!
//! Sans-io: the relay hands each direction's unwritten bytes to [`StaleStatements::client`] or
//! [`StaleStatements::backend`], which edit them and say how many are final ([`Advance`]).

use std::collections::{BTreeMap, VecDeque};

use crate::frontend::{error_fields, message};
use crate::sql_text::{executed_statements, split_statements};

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
    /// It could not be made again for a reason that passes: it is made at its first use.
    Remake(Remake),
}

impl StaleAnswer {
    /// The ErrorResponse a renamed use answers (a statement to remake is never renamed).
    fn message(&self) -> Vec<u8> {
        match self {
            StaleAnswer::Failed(error) => error.to_vec(),
            StaleAnswer::ResultChanged | StaleAnswer::Remake(_) => result_changed(),
        }
    }
}

/// How a statement is made again at its first use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remake {
    /// Extended-protocol messages (no Sync) spliced in front of a Bind or Describe of it: a
    /// Close of its name first, so that a second try in a pipelined batch finds nothing in the
    /// way, then what makes it. Each is answered by one message when all succeed.
    pub messages: Box<[u8]>,
    /// Its SQL `PREPARE`, spliced in front of the statement of a simple Query that executes it;
    /// `None` when it was made with a protocol Parse (an `EXECUTE` of it then finds nothing).
    pub prepare: Option<Box<str>>,
    /// A batch of its own (ending in Sync, a Describe of it last) that makes it again while the
    /// session is at rest, under the settings it was prepared under and waiting only briefly
    /// for a lock, so that it is back before the client's next request whether or not that uses
    /// it; empty when it is no longer tried at rest.
    pub at_rest: Box<[u8]>,
    /// How its rows were described to the client (`Some(None)`: no rows), when known: made
    /// again with other rows, its uses answer that its result changed.
    pub told: Option<Option<u64>>,
}

impl Remake {
    /// Whether the statement, made again with rows that look as `rows` (`None`: no rows), looks
    /// as the client was told (or nobody knows how it was told).
    pub fn same_rows(&self, rows: Option<u64>) -> bool {
        self.told.is_none_or(|told| told == rows)
    }

    /// The messages' tags, in order.
    fn tags(&self) -> impl Iterator<Item = u8> + '_ {
        let mut rest = &self.messages[..];
        std::iter::from_fn(move || {
            let (tag, body) = header(rest)?;
            rest = rest.get(5 + body..)?;
            Some(tag)
        })
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

impl StaleStatement {
    /// How it is made again while the session is at rest, if it still is tried there.
    pub fn tried_at_rest(&self) -> Option<&Remake> {
        match &self.answer {
            StaleAnswer::Remake(r) if !r.at_rest.is_empty() => Some(r),
            _ => None,
        }
    }
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
        let mut out = self
            .describe
            .as_deref()
            .map(parameter_description)
            .unwrap_or_default();
        out.extend(self.answer.message());
        out
    }
}

/// A use of a statement to remake, and where the answers of what makes it are.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RemakeUse {
    name: Box<str>,
    /// Spliced in a simple Query: its answer is the Query's CommandComplete of ordinal `at`;
    /// else its answers start at the batch's CloseComplete of ordinal `at`.
    in_query: bool,
    at: u32,
    /// Messages answering it when all succeed.
    answers: usize,
    /// The use was a Describe of the statement: an error comes after its parameters.
    describe: Option<Box<[u32]>>,
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
    /// Close messages in the batch the client is sending, the spliced ones included.
    sent_closes: u32,
    /// Statements remade in the batch the client is sending (each once).
    sending: Vec<RemakeUse>,
    /// Batches in which statements are remade, by number.
    remakes: VecDeque<(u64, VecDeque<RemakeUse>)>,
    /// CloseComplete and CommandComplete messages of the batch being answered.
    answered_closes: u32,
    answered_completes: u32,
    /// The remade statement whose answers are being taken out, and how many are left.
    stripping: Option<(RemakeUse, usize)>,
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

    /// Statements to make again while the session is at rest, each with the batch that does it.
    pub fn at_rest(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.names
            .iter()
            .filter_map(|(n, s)| Some((&**n, &*s.tried_at_rest()?.at_rest)))
    }

    /// A try at rest made `name` again, its rows looking as `rows`: its uses go to the backend
    /// as they are, unless its rows now look otherwise than the client was told
    /// ([`Remake::same_rows`]), when its uses answer as Postgres answers a cached plan whose
    /// result changed.
    pub fn made_at_rest(&mut self, name: &str, rows: Option<u64>) {
        let Some(s) = self.names.get_mut(name) else {
            return;
        };
        match &s.answer {
            StaleAnswer::Remake(r) if !r.same_rows(rows) => s.answer = StaleAnswer::ResultChanged,
            _ => {
                self.names.remove(name);
            }
        }
    }

    /// A try at rest met an error that does not pass: it is not tried at rest again, and its
    /// first use makes it (answering that error, or the one of the moment).
    pub fn stop_trying_at_rest(&mut self, name: &str) {
        if let Some(StaleStatement {
            answer: StaleAnswer::Remake(r),
            ..
        }) = self.names.get_mut(name)
        {
            r.at_rest = Box::default();
        }
    }

    /// Every statement was deallocated.
    pub fn forget_all(&mut self) {
        self.names.clear();
    }

    /// Client bytes, starting where the last call's `ready` ended: renames uses of stale
    /// statements in place, and splices what makes a statement again in front of its first use.
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
                if let Some((owed, with)) = self.rewrite_query(have) {
                    if let Some(owed) = owed
                        && self.current.is_none()
                    {
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
            if tag == b'C' {
                self.sent_closes += 1;
            }
            if matches!(tag, b'S' | b'Q' | b'F') {
                self.end_batch();
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
            if let Some((a, end)) = name.filter(|(a, end)| end > a) {
                let stale = std::str::from_utf8(&have[a..end])
                    .ok()
                    .and_then(|n| Some((n, self.names.get(n)?)));
                match stale {
                    Some((
                        n,
                        StaleStatement {
                            answer: StaleAnswer::Remake(remake),
                            param_types,
                        },
                    )) if !self.sending.iter().any(|u| *u.name == *n) => {
                        let describe = (tag == b'D').then(|| param_types.clone());
                        let remake = remake.clone();
                        let with = self.remake_at(n.into(), &remake, describe);
                        self.client_skip = body;
                        let splice = Splice {
                            at: i,
                            len: 0,
                            with,
                        };
                        return Advance {
                            ready: start,
                            splice: Some(splice),
                        };
                    }
                    // Made already in this batch.
                    Some((
                        _,
                        StaleStatement {
                            answer: StaleAnswer::Remake(_),
                            ..
                        },
                    )) => {}
                    Some((_, stale)) => {
                        if self.current.is_none() {
                            self.current = Some(Owed {
                                answer: stale.answer.clone(),
                                describe: (tag == b'D').then(|| stale.param_types.clone()),
                            });
                        }
                        data[start + a..start + end].fill(MARK);
                    }
                    None => {}
                }
            }
            i = start;
            self.client_skip = body;
        }
    }

    /// Notes that `remake` makes statement `name` in the batch being sent, in front of a Bind
    /// or (with its parameter types) a Describe of it; returns the messages to splice.
    fn remake_at(
        &mut self,
        name: Box<str>,
        remake: &Remake,
        describe: Option<Box<[u32]>>,
    ) -> Vec<u8> {
        self.sending.push(RemakeUse {
            name,
            in_query: false,
            at: self.sent_closes,
            answers: remake.tags().count(),
            describe,
        });
        self.sent_closes += remake.tags().filter(|&t| t == b'C').count() as u32;
        remake.messages.to_vec()
    }

    /// The client ended a batch (Sync, Query, FunctionCall): what it owes and remakes goes with
    /// its number.
    fn end_batch(&mut self) {
        if let Some(answer) = self.current.take() {
            self.expected.push_back((self.sent, answer));
        }
        if !self.sending.is_empty() {
            let uses = std::mem::take(&mut self.sending).into();
            self.remakes.push_back((self.sent, uses));
        }
        self.sent_closes = 0;
        self.sent += 1;
    }

    /// A Query whose text runs a stale statement with SQL `EXECUTE`: the message with each
    /// such name replaced by a name no statement has (and the answer owed for the first), and
    /// with the `PREPARE` of each statement to remake in front of the first statement that
    /// executes it (its uses are noted in the batch being sent).
    fn rewrite_query(&mut self, body: &[u8]) -> Option<(Option<Owed>, Vec<u8>)> {
        let text = std::str::from_utf8(body.strip_suffix(&[0])?).ok()?;
        let mut owed = None;
        let mut changed = false;
        let mut rewritten = Vec::with_capacity(body.len());
        let mut from = 0;
        let mut completes = 0u32;
        for statement in split_statements(text) {
            let start = statement.as_ptr() as usize - text.as_ptr() as usize;
            let executed = executed_statements(statement).into_iter().next();
            let stale = executed
                .as_ref()
                .and_then(|(name, _)| Some((name, self.names.get(name.as_str())?)));
            if let Some((name, s)) = stale {
                match &s.answer {
                    StaleAnswer::Remake(r) => {
                        if let Some(prepare) = &r.prepare
                            && !self.sending.iter().any(|u| *u.name == **name)
                        {
                            rewritten.extend_from_slice(&text.as_bytes()[from..start]);
                            rewritten.extend_from_slice(prepare.as_bytes());
                            rewritten.push(b';');
                            from = start;
                            self.sending.push(RemakeUse {
                                name: name.as_str().into(),
                                in_query: true,
                                at: completes,
                                answers: 1,
                                describe: None,
                            });
                            completes += 1;
                            changed = true;
                        }
                    }
                    answer => {
                        owed.get_or_insert_with(|| Owed {
                            answer: answer.clone(),
                            describe: None,
                        });
                        let at = executed.as_ref().map(|(_, at)| at.clone())?;
                        rewritten.extend_from_slice(&text.as_bytes()[from..start + at.start]);
                        rewritten.extend_from_slice(QUOTED_MARK);
                        from = start + at.end;
                        changed = true;
                    }
                }
            }
            completes += 1;
        }
        if !changed {
            return None;
        }
        rewritten.extend_from_slice(&body[from..]);
        let mut out = Vec::with_capacity(rewritten.len() + 5);
        message(&mut out, b'Q', |b| b.extend_from_slice(&rewritten));
        Some((owed, out))
    }

    /// Backend bytes, starting where the last call's `ready` ended: replaces the error a
    /// renamed use met with the one Postgres gives that statement's use, and takes out the
    /// answers of what remade a statement.
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
            let have = &data[start..data.len().min(start + body)];
            // One edit per pass: the next is made when the relay passes these bytes again.
            match self.answer(tag, have, body, splice.is_none()) {
                Verdict::Hold => return Advance { ready: i, splice },
                Verdict::Replace(with) => {
                    splice = Some(Splice {
                        at: i,
                        len: 5 + body,
                        with,
                    });
                    i = start + body;
                }
                Verdict::Pass => {
                    i = start;
                    self.backend_skip = body;
                }
            }
        }
    }

    /// What becomes of one backend message whose payload (`len` bytes) starts with `have`;
    /// `can_edit` is false once this pass made its edit. State moves only when the message
    /// passes or is replaced, never when it is held (it is offered again).
    fn answer(&mut self, tag: u8, have: &[u8], len: usize, can_edit: bool) -> Verdict {
        let whole = have.len() == len;
        if matches!(tag, b'N' | b'S' | b'A') {
            return Verdict::Pass;
        }
        if let Some((remade, left)) = &mut self.stripping {
            match tag {
                b'E' => {
                    // Making it failed: the use answers that error, after its parameters
                    // when it was a Describe; it is made again at its next use.
                    let Some(types) = remade.describe.clone().filter(|_| len <= ERROR_WINDOW)
                    else {
                        self.stripping = None;
                        return Verdict::Pass;
                    };
                    if !whole || !can_edit {
                        return Verdict::Hold;
                    }
                    self.stripping = None;
                    let mut with = parameter_description(&types);
                    message(&mut with, b'E', |b| b.extend_from_slice(have));
                    return Verdict::Replace(with);
                }
                b'Z' => self.stripping = None,
                _ => {
                    if !whole || !can_edit {
                        return Verdict::Hold;
                    }
                    *left -= 1;
                    if *left == 0 {
                        self.names.remove(&remade.name);
                        self.stripping = None;
                    }
                    return Verdict::Replace(Vec::new());
                }
            }
        }
        match tag {
            b'Z' => {
                self.answered += 1;
                self.answered_closes = 0;
                self.answered_completes = 0;
                let answered = self.answered;
                self.remakes.retain(|(batch, _)| *batch >= answered);
                self.expected.retain(|(batch, _)| *batch >= answered);
                Verdict::Pass
            }
            b'3' | b'C' => self.remade(tag, have, whole && can_edit),
            b'E' => {
                let expecting = self
                    .expected
                    .front()
                    .is_some_and(|(batch, _)| *batch == self.answered);
                if !expecting || len > ERROR_WINDOW {
                    return Verdict::Pass;
                }
                if !whole || !can_edit {
                    return Verdict::Hold;
                }
                let fields = error_fields(have);
                // The batch's first error ends it: either the renamed use failed, or an
                // earlier message did and the use never ran.
                match self.expected.pop_front() {
                    Some((_, owed))
                        if fields.code == UNDEFINED_STATEMENT
                            && fields.message.contains(MARK as char) =>
                    {
                        Verdict::Replace(owed.message())
                    }
                    _ => Verdict::Pass,
                }
            }
            _ => Verdict::Pass,
        }
    }

    /// A CloseComplete or CommandComplete: the first answer of a statement remade in this
    /// batch is taken out (and the rest after it), else it passes and is counted.
    fn remade(&mut self, tag: u8, have: &[u8], editable: bool) -> Verdict {
        let in_query = tag == b'C';
        let count = if in_query {
            self.answered_completes
        } else {
            self.answered_closes
        };
        let answered = self.answered;
        let ours = self
            .remakes
            .front()
            .filter(|(batch, _)| *batch == answered)
            .and_then(|(_, uses)| uses.front())
            .is_some_and(|u| u.in_query == in_query && u.at == count);
        if ours && !editable {
            return Verdict::Hold;
        }
        *self.counter(in_query) += 1;
        let Some(remade) = self
            .remakes
            .front_mut()
            .filter(|_| ours)
            .and_then(|(_, uses)| uses.pop_front())
        else {
            return Verdict::Pass;
        };
        if in_query && have != b"PREPARE\0" {
            // Not the spliced PREPARE's answer after all: the text was read otherwise.
            return Verdict::Pass;
        }
        if remade.answers <= 1 {
            self.names.remove(&remade.name);
        } else {
            let left = remade.answers - 1;
            self.stripping = Some((remade, left));
        }
        Verdict::Replace(Vec::new())
    }

    fn counter(&mut self, in_query: bool) -> &mut u32 {
        if in_query {
            &mut self.answered_completes
        } else {
            &mut self.answered_closes
        }
    }
}

/// What becomes of a backend message.
enum Verdict {
    /// Written as it is.
    Pass,
    /// Kept back until it is whole, or until the next pass.
    Hold,
    /// Written as these bytes instead (none: taken out).
    Replace(Vec<u8>),
}

/// A ParameterDescription of `types`.
fn parameter_description(types: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    message(&mut out, b't', |body| {
        body.extend_from_slice(&(types.len() as u16).to_be_bytes());
        for t in types {
            body.extend_from_slice(&t.to_be_bytes());
        }
    });
    out
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

    /// A protocol statement to remake: Close then Parse of its name.
    fn remake(name: &str, prepare: Option<&str>) -> StaleStatement {
        let mut messages = msg(b'C', format!("S{name}\0").as_bytes());
        messages.extend(msg(b'P', format!("{name}\0select 1\0\0\0").as_bytes()));
        StaleStatement {
            answer: StaleAnswer::Remake(Remake {
                messages: messages.into(),
                prepare: prepare.map(Into::into),
                at_rest: Box::default(),
                told: None,
            }),
            param_types: [23].into(),
        }
    }

    /// Passes client bytes through the filter as the relay does, splices included.
    fn relay_client_spliced(s: &mut StaleStatements, stream: &[u8]) -> Vec<u8> {
        let mut held = stream.to_vec();
        let mut out = Vec::new();
        while !held.is_empty() {
            let a = s.client(&mut held);
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
        out.extend(held);
        out
    }

    #[test]
    fn a_statement_to_remake_is_made_in_front_of_its_first_use_and_its_answers_taken_out() {
        let mut s = StaleStatements::start([("r".into(), remake("r", None))]);
        let made = [msg(b'C', b"Sr\0"), msg(b'P', b"r\0select 1\0\0\0")].concat();
        // A Close of another statement before it in the batch: the remake's Close is the second.
        let client = [msg(b'C', b"Sother\0"), bind("r"), bind("r"), msg(b'S', b"")].concat();
        let got = relay_client_spliced(&mut s, &client);
        let want = [
            msg(b'C', b"Sother\0"),
            made.clone(),
            bind("r"),
            bind("r"),
            msg(b'S', b""),
        ]
        .concat();
        assert_eq!(got, want, "made once per batch");
        let z = msg(b'Z', b"I");
        let backend = [
            msg(b'3', b""),
            msg(b'3', b""),
            msg(b'N', b"SNOTICE\0\0"),
            msg(b'1', b""),
            msg(b'2', b""),
            msg(b'2', b""),
            z.clone(),
        ]
        .concat();
        let got = relay_backend(&mut s, &backend);
        let want = [
            msg(b'3', b""),
            msg(b'N', b"SNOTICE\0\0"),
            msg(b'2', b""),
            msg(b'2', b""),
            z.clone(),
        ]
        .concat();
        assert_eq!(got, want);
        assert!(!s.contains("r"), "made: fresh from now on");
        // Failing, a Describe's parameters come before the error, and it stays to remake.
        let mut s = StaleStatements::start([("r".into(), remake("r", None))]);
        relay_client_spliced(&mut s, &[describe("r"), msg(b'S', b"")].concat());
        let locked = error("55P03", "canceling statement due to lock timeout");
        let backend = [msg(b'3', b""), locked.clone(), z.clone()].concat();
        let got = relay_backend(&mut s, &backend);
        assert_eq!(got, [msg(b't', &[0, 1, 0, 0, 0, 23]), locked, z].concat());
        assert!(s.contains("r"));
    }

    #[test]
    fn a_query_executing_a_statement_to_remake_prepares_it_first() {
        let prepare = "PREPARE r AS select 1";
        let mut s = StaleStatements::start([
            ("r".into(), remake("r", Some(prepare))),
            ("gone".into(), stale(StaleAnswer::ResultChanged)),
        ]);
        let query = msg(b'Q', b"select 0; execute r; execute gone; execute r\0");
        let a = s.client(&mut query.clone());
        let with = a.splice.expect("rewritten").with;
        assert_eq!(
            with,
            msg(
                b'Q',
                b"select 0;PREPARE r AS select 1; execute r; execute \"\x7f\"; execute r\0"
            )
        );
        let z = msg(b'Z', b"I");
        let done = |tag: &str| msg(b'C', format!("{tag}\0").as_bytes());
        let backend = [
            done("SELECT 1"),
            done("PREPARE"),
            done("SELECT 1"),
            missing(),
            z.clone(),
        ]
        .concat();
        let got = relay_backend(&mut s, &backend);
        let want = [done("SELECT 1"), done("SELECT 1"), result_changed(), z].concat();
        assert_eq!(got, want);
        assert!(!s.contains("r"));
        // A protocol statement has no PREPARE: the query passes as it is.
        let mut s = StaleStatements::start([("p".into(), remake("p", None))]);
        let mut plain = msg(b'Q', b"execute p\0");
        assert_eq!(s.client(&mut plain), Advance::ready(plain.len()));
    }
}
