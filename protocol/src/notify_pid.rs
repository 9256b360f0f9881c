//! The process id in a session's own notifications, after the session moved.
//!
//! A client is given its login backend's process id, and filters its own notifications by it
//! (`NOTIFY` reaches the session that sent it too). Once the session runs on another backend,
//! Postgres stamps that backend's id on them; the relay puts the client's back, in place (the
//! id is four bytes either way), holding back the bytes of an id whose end has not arrived.

/// Edits the process id of NotificationResponses from one id to another in a relay buffer.
#[derive(Debug)]
pub struct NotifyPid {
    from: [u8; 4],
    to: [u8; 4],
    /// Where, in the unwritten buffer, NotificationResponse bodies start that were found since
    /// the last [`NotifyPid::apply`] (or whose id was not complete then).
    starts: Vec<usize>,
}

impl NotifyPid {
    /// Rewrites `backend` (the id Postgres stamps) to `client` (the id the client was given);
    /// `None` when they are the same and nothing needs editing.
    pub fn new(backend: i32, client: i32) -> Option<NotifyPid> {
        (backend != client).then(|| NotifyPid {
            from: backend.to_be_bytes(),
            to: client.to_be_bytes(),
            starts: Vec::new(),
        })
    }

    /// A NotificationResponse body starts at `at` in the unwritten buffer.
    pub fn body_at(&mut self, at: usize) {
        self.starts.push(at);
    }

    /// Edits every id whose four bytes are in `unwritten`; returns where bytes must wait for
    /// more input (the start of an id not complete yet), if anywhere.
    pub fn apply(&mut self, unwritten: &mut [u8]) -> Option<usize> {
        let mut wait = None;
        for &at in &self.starts {
            match unwritten.get_mut(at..at + 4) {
                Some(pid) => {
                    if *pid == self.from {
                        pid.copy_from_slice(&self.to);
                    }
                }
                None => wait = Some(at),
            }
        }
        // Only the last message can be cut short.
        self.starts.clear();
        self.starts.extend(wait);
        wait
    }

    /// The first `n` bytes of the buffer were written and the rest moved to its start.
    pub fn shift(&mut self, n: usize) {
        for at in &mut self.starts {
            *at -= n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameScanner;

    fn notification(pid: i32, channel: &str) -> Vec<u8> {
        let mut body = pid.to_be_bytes().to_vec();
        body.extend_from_slice(channel.as_bytes());
        body.extend_from_slice(b"\0payload\0");
        let mut m = vec![b'A'];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(&body);
        m
    }

    /// Relays `stream` in chunks cut at `cuts`, as the relay does: edits, writes what may go,
    /// keeps the rest at the buffer's start.
    fn relay(stream: &[u8], cuts: &[usize], rewrite: &mut NotifyPid) -> Vec<u8> {
        let mut scanner = FrameScanner::new(1 << 16);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let mut bounds = cuts.to_vec();
        bounds.push(stream.len());
        let mut from = 0;
        for to in bounds {
            let base = buf.len();
            buf.extend_from_slice(&stream[from..to]);
            scanner
                .feed_at(&stream[from..to], |tag, _, at| {
                    if tag == b'A' {
                        rewrite.body_at(base + at)
                    }
                })
                .unwrap();
            let ready = rewrite.apply(&mut buf).unwrap_or(buf.len());
            out.extend(buf.drain(..ready));
            rewrite.shift(ready);
            from = to;
        }
        out.extend(buf);
        out
    }

    #[test]
    fn own_ids_become_the_clients_at_every_cut() {
        let mut stream = notification(4242, "mine");
        stream.extend(notification(777, "theirs"));
        stream.extend(notification(4242, "again"));
        let mut want = notification(99, "mine");
        want.extend(notification(777, "theirs"));
        want.extend(notification(99, "again"));
        for a in 0..=stream.len() {
            for b in a..=stream.len() {
                let mut rewrite = NotifyPid::new(4242, 99).unwrap();
                assert_eq!(relay(&stream, &[a, b], &mut rewrite), want, "cuts {a} {b}");
            }
        }
    }

    #[test]
    fn nothing_to_do_when_the_ids_agree() {
        assert!(NotifyPid::new(5, 5).is_none());
    }
}
