//! The PROXY protocol header (HAProxy's, versions 1 and 2) that a load balancer puts in front
//! of a TCP stream to name the client it accepted the connection from.
//!
//! Sans-io: [`detect`] tells from a stream's first bytes whether a header starts there, and
//! [`parse`] reads one from a buffer and says how many bytes it needs when the buffer is short,
//! so the caller can read exactly the header and leave the Postgres (or HTTP) bytes after it
//! unread.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The twelve bytes that open every version 2 header.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// What opens every version 1 header.
pub const V1_PREFIX: &[u8] = b"PROXY ";
/// Longest version 1 header the specification allows, CRLF included.
pub const V1_MAX: usize = 107;
/// Fixed part of a version 2 header: signature, version and command, family, length.
pub const V2_FIXED: usize = 16;
/// The longest prefix [`detect`] may need to decide.
pub const DETECT_LEN: usize = V2_SIGNATURE.len();

/// A PROXY header that cannot be accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    /// The bytes are not a PROXY header at all.
    #[error("no PROXY protocol header")]
    Missing,
    /// The header is longer than the configured limit (or a v1 line than 107 bytes).
    #[error("PROXY header longer than {0} bytes")]
    TooLong(usize),
    /// A version 2 header with a version or command this parser does not know.
    #[error("PROXY v2 header: unsupported version or command byte {0:#04x}")]
    Command(u8),
    /// A version 2 header with an unknown address family or transport.
    #[error("PROXY v2 header: unsupported address family byte {0:#04x}")]
    Family(u8),
    /// A version 2 header shorter than its addresses.
    #[error("PROXY v2 header: {0} bytes cannot hold its addresses")]
    Truncated(usize),
    /// A version 1 line that does not follow the grammar.
    #[error("PROXY v1 header: {0}")]
    Text(&'static str),
}

/// Whether a stream's first bytes start a PROXY header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detection {
    /// They start a version 1 or 2 header.
    Header,
    /// They do not (a Postgres message, a TLS record, an HTTP request).
    NotHeader,
    /// They are a prefix of a header signature: read more to tell.
    NeedMore,
}

/// Tells whether `prefix` starts a PROXY header; needs at most [`DETECT_LEN`] bytes.
pub fn detect(prefix: &[u8]) -> Detection {
    let matches = |sig: &[u8]| {
        let n = prefix.len().min(sig.len());
        prefix[..n] == sig[..n]
    };
    let complete = |sig: &[u8]| prefix.len() >= sig.len();
    match (matches(V1_PREFIX), matches(&V2_SIGNATURE)) {
        (true, _) if complete(V1_PREFIX) => Detection::Header,
        (_, true) if complete(&V2_SIGNATURE) => Detection::Header,
        (false, false) => Detection::NotHeader,
        _ => Detection::NeedMore,
    }
}

/// The protocol version a header was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// The text form.
    V1,
    /// The binary form.
    V2,
}

/// What a header says about the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyHeader {
    /// Which form it was.
    pub version: Version,
    /// The client the load balancer accepted; `None` for a connection of the balancer's own
    /// (v2 `LOCAL`, v1 `UNKNOWN`, non-IP families), which keeps the socket's address.
    pub source: Option<SocketAddr>,
    /// The address the client connected to, when given.
    pub destination: Option<SocketAddr>,
}

/// The result of [`parse`] on a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// The buffer holds only part of a header: have at least `need` bytes in all before asking
    /// again (never more than the header, so nothing after it is read).
    Incomplete {
        /// Total bytes to have.
        need: usize,
    },
    /// A whole header, `len` bytes long; what follows belongs to the stream.
    Complete {
        /// What it says.
        header: ProxyHeader,
        /// Its length in bytes.
        len: usize,
    },
}

/// Reads a header at the start of `buf`, refusing one longer than `max` bytes.
pub fn parse(buf: &[u8], max: usize) -> Result<Parsed, ProxyHeaderError> {
    match detect(buf) {
        Detection::NotHeader => Err(ProxyHeaderError::Missing),
        Detection::NeedMore => Ok(Parsed::Incomplete {
            need: buf.len() + 1,
        }),
        Detection::Header if buf.starts_with(V1_PREFIX) => parse_v1(buf, max.min(V1_MAX)),
        Detection::Header => parse_v2(buf, max),
    }
}

fn parse_v2(buf: &[u8], max: usize) -> Result<Parsed, ProxyHeaderError> {
    if buf.len() < V2_FIXED {
        return Ok(Parsed::Incomplete { need: V2_FIXED });
    }
    let (command, family) = (buf[12], buf[13]);
    let body = u16::from_be_bytes([buf[14], buf[15]]) as usize;
    let len = V2_FIXED + body;
    if len > max {
        return Err(ProxyHeaderError::TooLong(max));
    }
    // High nibble: version 2; low nibble: 0 LOCAL, 1 PROXY.
    let local = match command {
        0x20 => true,
        0x21 => false,
        other => return Err(ProxyHeaderError::Command(other)),
    };
    // High nibble: family (0 unspecified, 1 IPv4, 2 IPv6, 3 Unix); low nibble: transport
    // (0 unspecified, 1 stream, 2 datagram).
    if family >> 4 > 3 || family & 0x0f > 2 {
        return Err(ProxyHeaderError::Family(family));
    }
    let address_len = match family >> 4 {
        1 => 12,
        2 => 36,
        3 => 216,
        _ => 0,
    };
    if body < address_len {
        return Err(ProxyHeaderError::Truncated(body));
    }
    if buf.len() < len {
        return Ok(Parsed::Incomplete { need: len });
    }
    let a = &buf[V2_FIXED..V2_FIXED + address_len];
    let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
    let (source, destination) = match family >> 4 {
        _ if local => (None, None),
        1 => {
            let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]));
            (
                Some(SocketAddr::new(ip(0), port(8))),
                Some(SocketAddr::new(ip(4), port(10))),
            )
        }
        2 => {
            let ip = |at: usize| {
                let octets: [u8; 16] = a[at..at + 16].try_into().expect("16 bytes");
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            (
                Some(SocketAddr::new(ip(0), port(32))),
                Some(SocketAddr::new(ip(16), port(34))),
            )
        }
        _ => (None, None),
    };
    // Type-length-value extensions after the addresses are skipped: nothing here needs them.
    Ok(Parsed::Complete {
        header: ProxyHeader {
            version: Version::V2,
            source,
            destination,
        },
        len,
    })
}

fn parse_v1(buf: &[u8], max: usize) -> Result<Parsed, ProxyHeaderError> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= max {
            return Err(ProxyHeaderError::TooLong(max));
        }
        // A v1 line has no length field: one byte at a time keeps the read inside it.
        return Ok(Parsed::Incomplete {
            need: buf.len() + 1,
        });
    };
    let len = end + 2;
    if len > max {
        return Err(ProxyHeaderError::TooLong(max));
    }
    let line = std::str::from_utf8(&buf[V1_PREFIX.len()..end])
        .map_err(|_| ProxyHeaderError::Text("not ASCII"))?;
    let mut fields = line.split(' ');
    let protocol = fields.next().unwrap_or_default();
    if protocol == "UNKNOWN" {
        // The rest of an UNKNOWN line is to be ignored.
        return Ok(Parsed::Complete {
            header: ProxyHeader {
                version: Version::V1,
                source: None,
                destination: None,
            },
            len,
        });
    }
    let v6 = match protocol {
        "TCP4" => false,
        "TCP6" => true,
        _ => {
            return Err(ProxyHeaderError::Text(
                "protocol is not TCP4, TCP6 or UNKNOWN",
            ));
        }
    };
    let rest: Vec<&str> = fields.collect();
    let [src, dst, src_port, dst_port] = rest[..] else {
        return Err(ProxyHeaderError::Text(
            "expected two addresses and two ports, separated by single spaces",
        ));
    };
    let ip = |s: &str| -> Result<IpAddr, ProxyHeaderError> {
        let parsed: IpAddr = s
            .parse()
            .map_err(|_| ProxyHeaderError::Text("malformed address"))?;
        match (parsed, v6) {
            (IpAddr::V4(_), false) | (IpAddr::V6(_), true) => Ok(parsed),
            _ => Err(ProxyHeaderError::Text(
                "address does not match the protocol",
            )),
        }
    };
    let port = |s: &str| -> Result<u16, ProxyHeaderError> {
        let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        // The specification forbids leading zeros.
        if !digits || (s.len() > 1 && s.starts_with('0')) {
            return Err(ProxyHeaderError::Text("malformed port"));
        }
        s.parse()
            .map_err(|_| ProxyHeaderError::Text("port out of range"))
    };
    Ok(Parsed::Complete {
        header: ProxyHeader {
            version: Version::V1,
            source: Some(SocketAddr::new(ip(src)?, port(src_port)?)),
            destination: Some(SocketAddr::new(ip(dst)?, port(dst_port)?)),
        },
        len,
    })
}

/// A version 2 `PROXY` header for a TCP connection from `source` to `destination` (both of
/// one family): what a load balancer sends; used by tests and fuzz seeds.
pub fn encode_v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x21);
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend_from_slice(&[0x11, 0, 12]);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.extend_from_slice(&[0x21, 0, 36]);
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    out
}

/// A version 1 header line for a TCP connection from `source` to `destination`.
pub fn encode_v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let protocol = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {protocol} {} {} {} {}\r\n",
        source.ip(),
        destination.ip(),
        source.port(),
        destination.port()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 4096;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Feeds `bytes` the way a reader would: only as many as `parse` asks for.
    fn read_like_a_socket(bytes: &[u8]) -> Result<(ProxyHeader, usize), ProxyHeaderError> {
        let mut have = 1;
        loop {
            match parse(&bytes[..have.min(bytes.len())], MAX)? {
                Parsed::Complete { header, len } => return Ok((header, len)),
                Parsed::Incomplete { need } => {
                    assert!(need > have, "no progress at {have}");
                    assert!(need <= bytes.len(), "asked past the header: {need}");
                    have = need;
                }
            }
        }
    }

    #[test]
    fn v2_round_trips_and_stops_at_its_end() {
        for (src, dst) in [
            ("203.0.113.7:51000", "10.0.0.1:5432"),
            ("[2001:db8::7]:51000", "[2001:db8::1]:5432"),
        ] {
            let mut bytes = encode_v2(addr(src), addr(dst));
            let header_len = bytes.len();
            bytes.extend_from_slice(b"\0\0\0\x08\x04\xd2\x16\x2f");
            let (header, len) = read_like_a_socket(&bytes[..header_len]).unwrap();
            assert_eq!(len, header_len);
            assert_eq!(header.version, Version::V2);
            assert_eq!(header.source, Some(addr(src)));
            assert_eq!(header.destination, Some(addr(dst)));
            assert!(
                matches!(parse(&bytes, MAX), Ok(Parsed::Complete { len, .. }) if len == header_len)
            );
        }
    }

    #[test]
    fn v2_local_and_tlvs() {
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        let (header, len) = read_like_a_socket(&local).unwrap();
        assert_eq!((header.source, len), (None, 16));
        // An IPv4 header followed by a 7-byte TLV (type 0x04, no-op).
        let mut tlv = encode_v2(addr("1.2.3.4:5"), addr("6.7.8.9:10"));
        tlv[15] += 7;
        tlv.extend_from_slice(&[0x04, 0, 4, 1, 2, 3, 4]);
        let (header, len) = read_like_a_socket(&tlv).unwrap();
        assert_eq!((header.source, len), (Some(addr("1.2.3.4:5")), 35));
    }

    #[test]
    fn v2_refusals() {
        let base = encode_v2(addr("1.2.3.4:5"), addr("6.7.8.9:10"));
        let mut bad_command = base.clone();
        bad_command[12] = 0x22;
        assert_eq!(
            parse(&bad_command, MAX),
            Err(ProxyHeaderError::Command(0x22))
        );
        let mut bad_family = base.clone();
        bad_family[13] = 0x41;
        assert_eq!(parse(&bad_family, MAX), Err(ProxyHeaderError::Family(0x41)));
        let mut short = base.clone();
        short[15] = 4;
        assert_eq!(parse(&short, MAX), Err(ProxyHeaderError::Truncated(4)));
        let mut long = base.clone();
        long[14] = 0xff;
        assert_eq!(parse(&long, MAX), Err(ProxyHeaderError::TooLong(MAX)));
    }

    #[test]
    fn v1_lines() {
        for (src, dst) in [
            ("198.51.100.9:40000", "10.0.0.1:5432"),
            ("[2001:db8::9]:40000", "[2001:db8::1]:5432"),
        ] {
            let line = encode_v1(addr(src), addr(dst));
            let (header, len) = read_like_a_socket(&line).unwrap();
            assert_eq!((header.version, len), (Version::V1, line.len()));
            assert_eq!(header.source, Some(addr(src)));
        }
        let unknown = b"PROXY UNKNOWN whatever\r\n";
        let (header, _) = read_like_a_socket(unknown).unwrap();
        assert_eq!(header.source, None);
        for bad in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n"[..],
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 70000\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        ] {
            assert!(
                matches!(parse(bad, MAX), Err(ProxyHeaderError::Text(_))),
                "{bad:?}"
            );
        }
        let endless = [b"PROXY ".as_slice(), &[b'A'; 120]].concat();
        assert_eq!(parse(&endless, MAX), Err(ProxyHeaderError::TooLong(V1_MAX)));
    }

    #[test]
    fn detection_of_what_else_starts_a_stream() {
        assert_eq!(detect(b""), Detection::NeedMore);
        assert_eq!(detect(b"PRO"), Detection::NeedMore);
        assert_eq!(detect(b"PROXY "), Detection::Header);
        assert_eq!(detect(b"\r\n\r\n\0"), Detection::NeedMore);
        assert_eq!(detect(&V2_SIGNATURE), Detection::Header);
        // A startup message, an SSLRequest, a TLS record, HTTP requests.
        assert_eq!(
            detect(&[0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f]),
            Detection::NotHeader
        );
        assert_eq!(detect(&[0x16, 3, 1]), Detection::NotHeader);
        assert_eq!(detect(b"POST /sql"), Detection::NotHeader);
        assert_eq!(detect(b"PUT"), Detection::NotHeader);
        assert_eq!(
            parse(b"GET / HTTP/1.1", MAX),
            Err(ProxyHeaderError::Missing)
        );
    }
}
