//! Message boundaries in a relayed byte stream, found from the 5-byte headers alone.
//!
//! The relay copies bytes in bulk; the scanner walks the headers inside each chunk so the
//! gateway knows where messages start and end (to inject a message at a boundary, and later
//! to track session state) without buffering or re-encoding any payload.

use thiserror::Error;

/// A framing fault in the stream: the peer sent something that is not the Postgres protocol.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// A length field below 4 cannot describe any message.
    #[error("invalid message length {len} for message type {tag:?}")]
    InvalidLength {
        /// Message type byte.
        tag: char,
        /// The length field as sent.
        len: u32,
    },
    /// A message larger than the configured limit.
    #[error("message of type {tag:?} is {len} bytes, over the limit of {max}")]
    TooLarge {
        /// Message type byte.
        tag: char,
        /// The body length as sent.
        len: u32,
        /// The limit in force.
        max: u32,
    },
}

/// Tracks message boundaries across chunks of a tag-length-payload stream.
#[derive(Clone, Debug)]
pub struct FrameScanner {
    header: Header,
    remaining: u32,
    last_tag: Option<u8>,
    max_body: u32,
}

impl FrameScanner {
    /// A scanner that refuses message bodies longer than `max_body` bytes.
    pub fn new(max_body: u32) -> Self {
        FrameScanner {
            header: Header::default(),
            remaining: 0,
            last_tag: None,
            max_body,
        }
    }

    /// Walks `data`, calling `on_message(tag, body_len)` for every header completed in it.
    pub fn feed(
        &mut self,
        data: &[u8],
        mut on_message: impl FnMut(u8, u32),
    ) -> Result<(), FrameError> {
        self.feed_at(data, |tag, body, _| on_message(tag, body))
    }

    /// Like [`FrameScanner::feed`], also telling where in `data` each message's body starts
    /// (`data.len()` when it starts in the next chunk), for callers that edit bodies in place.
    pub fn feed_at(
        &mut self,
        mut data: &[u8],
        mut on_message: impl FnMut(u8, u32, usize),
    ) -> Result<(), FrameError> {
        let total = data.len();
        while !data.is_empty() {
            if self.remaining > 0 {
                let skip = (self.remaining as usize).min(data.len());
                self.remaining -= skip as u32;
                data = &data[skip..];
                continue;
            }
            if let Some((tag, len)) = self.header.take(&mut data) {
                if len < 4 {
                    return Err(FrameError::InvalidLength {
                        tag: tag as char,
                        len,
                    });
                }
                let body = len - 4;
                if body > self.max_body {
                    return Err(FrameError::TooLarge {
                        tag: tag as char,
                        len: body,
                        max: self.max_body,
                    });
                }
                self.last_tag = Some(tag);
                self.remaining = body;
                on_message(tag, body, total - data.len());
            }
        }
        Ok(())
    }

    /// True when everything fed so far ends exactly at a message boundary.
    pub fn at_boundary(&self) -> bool {
        !self.header.partial() && self.remaining == 0
    }

    /// Type byte of the last message whose header was seen.
    pub fn last_tag(&self) -> Option<u8> {
        self.last_tag
    }
}

/// A message header (type byte and length) that may arrive split across chunks.
#[derive(Debug, Default, Clone)]
pub(crate) struct Header {
    bytes: [u8; 5],
    have: usize,
}

impl Header {
    /// Takes the header's bytes from the front of `data`; its type byte and length field once
    /// it is whole.
    #[inline]
    pub(crate) fn take(&mut self, data: &mut &[u8]) -> Option<(u8, u32)> {
        // Nearly every header is whole in the chunk: read where it lies, without a copy.
        if self.have == 0
            && let Some((h, rest)) = data.split_first_chunk::<5>()
        {
            *data = rest;
            return Some((h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]])));
        }
        let take = (5 - self.have).min(data.len());
        self.bytes[self.have..self.have + take].copy_from_slice(&data[..take]);
        self.have += take;
        *data = &data[take..];
        if self.have < 5 {
            return None;
        }
        self.have = 0;
        let h = self.bytes;
        Some((h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]])))
    }

    /// Some of a header's bytes have come, not all.
    pub(crate) fn partial(&self) -> bool {
        self.have > 0
    }
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

    #[test]
    fn finds_boundaries_across_any_split() {
        let mut stream = msg(b'T', b"abc");
        stream.extend(msg(b'D', &[7; 300]));
        stream.extend(msg(b'Z', b"I"));
        for split in 0..stream.len() {
            let mut s = FrameScanner::new(1 << 20);
            let mut seen = Vec::new();
            s.feed(&stream[..split], |t, l| seen.push((t, l))).unwrap();
            s.feed(&stream[split..], |t, l| seen.push((t, l))).unwrap();
            assert_eq!(seen, vec![(b'T', 3), (b'D', 300), (b'Z', 1)]);
            assert!(s.at_boundary());
            assert_eq!(s.last_tag(), Some(b'Z'));
        }
    }

    #[test]
    fn tells_where_each_body_starts_in_its_chunk() {
        let mut stream = msg(b'A', b"pid!chan\0x\0");
        stream.extend(msg(b'Z', b"I"));
        for split in 0..stream.len() {
            let mut s = FrameScanner::new(1 << 20);
            let mut starts = Vec::new();
            s.feed_at(&stream[..split], |t, _, at| starts.push((t, at)))
                .unwrap();
            s.feed_at(&stream[split..], |t, _, at| starts.push((t, split + at)))
                .unwrap();
            assert_eq!(starts, vec![(b'A', 5), (b'Z', 21)], "split at {split}");
        }
    }

    #[test]
    fn byte_by_byte() {
        let stream = msg(b'Q', b"select 1\0");
        let mut s = FrameScanner::new(100);
        let mut n = 0;
        for (i, b) in stream.iter().enumerate() {
            s.feed(std::slice::from_ref(b), |_, _| n += 1).unwrap();
            assert_eq!(s.at_boundary(), i + 1 == stream.len());
        }
        assert_eq!(n, 1);
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut s = FrameScanner::new(10);
        assert_eq!(
            s.feed(&[b'Q', 0, 0, 0, 3], |_, _| {}),
            Err(FrameError::InvalidLength { tag: 'Q', len: 3 })
        );
        let mut s = FrameScanner::new(10);
        assert!(matches!(
            s.feed(&[b'Q', 0, 0, 1, 0], |_, _| {}),
            Err(FrameError::TooLarge { .. })
        ));
    }
}
