//! A minimal HTTP/1.0 client for the gateway's admin listener on 127.0.0.1.
//!
//! Hand-written so the harness needs no HTTP client crate: every request is one short exchange
//! on a fresh connection, and the server closes it after the answer (HTTP/1.0).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

/// An answer: status code and body.
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body as text.
    pub body: String,
}

/// Sends `method path` to 127.0.0.1:`port` and reads the whole answer, waiting at most `limit`
/// for each read.
pub fn request(port: u16, method: &str, path: &str, limit: Duration) -> Result<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connect to the admin port {port}"))?;
    stream.set_read_timeout(Some(limit))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    // Admin answers are a few KiB at most; the cap only guards against a runaway answer.
    stream
        .take(1 << 20)
        .read_to_end(&mut raw)
        .with_context(|| format!("read the answer to {method} {path}"))?;
    let text = String::from_utf8_lossy(&raw);
    let status =
        parse_status_line(&text).ok_or_else(|| anyhow!("no HTTP status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok(Response { status, body })
}

/// The status code of a plain HTTP/1.0 GET, or `None` if there is no valid answer in 2 s.
pub fn status(port: u16, path: &str) -> Option<u16> {
    request(port, "GET", path, Duration::from_secs(2))
        .ok()
        .map(|r| r.status)
}

fn parse_status_line(response: &str) -> Option<u16> {
    let line = response.lines().next()?;
    let mut parts = line.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

/// The sum of a Prometheus text body's samples of metric `name` whose labels contain `label`
/// (`outcome="hit"`); 0 when there are none.
pub fn metric_sum(body: &str, name: &str, label: &str) -> f64 {
    let prefix = format!("{name}{{");
    body.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line() {
        assert_eq!(
            parse_status_line("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"),
            Some(200)
        );
        assert_eq!(
            parse_status_line("HTTP/1.0 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(parse_status_line("garbage"), None);
        assert_eq!(parse_status_line(""), None);
    }
}
