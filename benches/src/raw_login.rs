//! A password login spoken directly on the wire, for scenarios that hold thousands of
//! connections and cannot afford a driver's connection object for each: the SCRAM-SHA-256
//! StartupMessage, the exchange up to AuthenticationOk, and reading the messages it needs.

use anyhow::{Result, bail};
use pgwake_protocol::auth;
use pgwake_protocol::scram::{Nonce, SCRAM_SHA_256, ScramClient, ScramKeys};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Authentication request codes (the Int32 after an `R` message's length).
const AUTH_OK: i32 = 0;
const AUTH_SASL: i32 = 10;
const AUTH_SASL_CONTINUE: i32 = 11;
const AUTH_SASL_FINAL: i32 = 12;

/// Longest message read: far above anything a login or `SELECT 1` is answered with.
const MAX_MESSAGE: usize = 1 << 20;

/// A StartupMessage (protocol 3.0) with these parameters.
pub fn startup_message(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = 196_608u32.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    msg
}

/// Runs the SCRAM-SHA-256 exchange on `s` (its StartupMessage already sent) up to
/// AuthenticationOk. `keys` derives the client keys from the server's salt and iteration
/// count, so a caller can derive them once for many logins.
pub async fn scram(s: &mut TcpStream, keys: impl FnOnce(&[u8], u32) -> ScramKeys) -> Result<()> {
    expect_auth(s, AUTH_SASL).await?;
    let scram = ScramClient::new(Nonce::from_random(rand::random()));
    s.write_all(&auth::sasl_initial_response(
        SCRAM_SHA_256,
        &scram.client_first(),
    ))
    .await?;
    let server_first = expect_auth(s, AUTH_SASL_CONTINUE).await?;
    let challenge = scram.handle_server_first(&server_first)?;
    let keys = keys(challenge.salt(), challenge.iterations());
    let (awaiting, client_final) = challenge.client_final(&keys)?;
    s.write_all(&auth::sasl_response(&client_final)).await?;
    awaiting.verify_server_final(&expect_auth(s, AUTH_SASL_FINAL).await?)?;
    expect_auth(s, AUTH_OK).await?;
    Ok(())
}

/// Reads one message: its tag and body. An ErrorResponse becomes an error carrying the
/// server's message.
pub async fn read_message(s: &mut TcpStream) -> Result<(u8, Vec<u8>)> {
    let mut header = [0u8; 5];
    s.read_exact(&mut header).await?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if !(4..=MAX_MESSAGE).contains(&len) {
        bail!("message length {len} out of range");
    }
    let mut body = vec![0u8; len - 4];
    s.read_exact(&mut body).await?;
    if header[0] == b'E' {
        let message = body
            .split(|b| *b == 0)
            .find_map(|f| f.strip_prefix(b"M"))
            .map(|m| String::from_utf8_lossy(m).into_owned())
            .unwrap_or_default();
        bail!("error from the gateway: {message}");
    }
    Ok((header[0], body))
}

/// Reads an Authentication request, which must carry `code`; returns the data after it.
async fn expect_auth(s: &mut TcpStream, code: i32) -> Result<Vec<u8>> {
    let (tag, mut body) = read_message(s).await?;
    if tag != b'R' || body.len() < 4 {
        bail!(
            "expected authentication request {code}, got {:?}",
            tag as char
        );
    }
    let got = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    if got != code {
        bail!("expected authentication request {code}, got {got}");
    }
    Ok(body.split_off(4))
}
