//! Readiness means "accepts a Postgres login", not "the process exists": a probe opens a
//! connection, sends a startup message and reads the first answer.

use std::time::Duration;

use pgwake_protocol::backend::startup_packet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::Endpoint;

/// SQLSTATE `57P03` cannot_connect_now: the server is starting up, shutting down or in recovery.
const CANNOT_CONNECT_NOW: &[u8] = b"57P03";

/// What one probe found.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// The server answered a startup message with an authentication request (or an error
    /// unrelated to start-up, such as an unknown role): it accepts logins.
    Ready,
    /// Not yet: connection refused, `57P03`, or no answer in time.
    NotYet(String),
}

/// Probes `endpoint` once, logging in as `user` to `database`, within `limit`.
pub async fn probe(endpoint: &Endpoint, user: &str, database: &str, limit: Duration) -> Probe {
    let attempt = async {
        let mut s = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
        s.set_nodelay(true)?;
        let params = [
            ("user".to_owned(), user.to_owned()),
            ("database".to_owned(), database.to_owned()),
            ("application_name".to_owned(), "pgwake-probe".to_owned()),
        ];
        s.write_all(&startup_packet(&params)).await?;
        let mut header = [0u8; 5];
        s.read_exact(&mut header).await?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4).min(4096)];
        if header[0] == b'E' {
            s.read_exact(&mut body).await?;
        }
        Ok::<_, std::io::Error>((header[0], body))
    };
    match timeout(limit, attempt).await {
        Err(_) => Probe::NotYet("no answer in time".into()),
        Ok(Err(e)) => Probe::NotYet(e.to_string()),
        Ok(Ok((b'E', body))) if sqlstate_is(&body, CANNOT_CONNECT_NOW) => {
            Probe::NotYet("the database system is starting up".into())
        }
        Ok(Ok(_)) => Probe::Ready,
    }
}

/// True when an ErrorResponse body carries this SQLSTATE.
fn sqlstate_is(body: &[u8], code: &[u8]) -> bool {
    body.split(|b| *b == 0)
        .any(|field| field.first() == Some(&b'C') && &field[1..] == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sqlstate_fields() {
        let body = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0";
        assert!(sqlstate_is(body, CANNOT_CONNECT_NOW));
        assert!(!sqlstate_is(b"SFATAL\0C28000\0\0", CANNOT_CONNECT_NOW));
    }

    #[tokio::test]
    async fn refused_is_not_ready() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let e = Endpoint::new("127.0.0.1", port);
        assert!(matches!(
            probe(&e, "u", "d", Duration::from_secs(1)).await,
            Probe::NotYet(_)
        ));
    }
}
