//! The floor of a TLS + SCRAM login on this machine: how little CPU per connection a gateway can
//! spend when it does nothing but accept TLS (rustls, ring, the same certificate and
//! configuration shape as pgwake's client side) and check a SCRAM-SHA-256 proof against a stored
//! verifier. No backend, no routing, no tracking: after the login it answers every simple query
//! itself with one constant row, so a client such as `pgbench -C -S` can run against it and the
//! CPU it spends per connection is the handshake and the SCRAM exchange.
//!
//! ```sh
//! cargo run -p pgwake-bench --release --example login_floor -- LISTEN_PORT CERT_PEM KEY_PEM USERS
//! ```
//!
//! `USERS` is a file of `"name" "SCRAM-SHA-256$…"` lines, the format of pgwake's static
//! credentials file (the verifier as in `pg_authid.rolpassword`). It offers SCRAM-SHA-256-PLUS
//! (channel binding `tls-server-end-point`) and SCRAM-SHA-256, as pgwake does on TLS links,
//! and runs one multi-threaded tokio runtime with a worker per CPU. The harness's `churn`
//! section measures it beside pgwake's gateway-authenticated login.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use pgwake_protocol::channel_binding::tls_server_end_point;
use pgwake_protocol::scram::{self, Nonce, ScramSecret, ScramServer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

/// SSLRequest's request code.
const SSL_REQUEST: u32 = 80_877_103;
/// GSSENCRequest's request code.
const GSSENC_REQUEST: u32 = 80_877_104;
/// CancelRequest's request code.
const CANCEL_REQUEST: u32 = 80_877_102;
/// Protocol 3.0.
const PROTOCOL_3: u32 = 196_608;
/// Largest message accepted from a client.
const MAX_MESSAGE: usize = 64 * 1024;

/// What every connection shares: the TLS acceptor, the channel-binding hash of the
/// certificate, and the verifiers by user name.
struct Shared {
    tls: TlsAcceptor,
    binding: Vec<u8>,
    users: HashMap<String, ScramSecret>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, cert, key, users] = args.as_slice() else {
        bail!("usage: login_floor LISTEN_PORT CERT_PEM KEY_PEM USERS_FILE");
    };
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut BufReader::new(File::open(cert)?))
        .collect::<Result<_, _>>()
        .context("read the certificate")?;
    let key = rustls_pemfile::private_key(&mut BufReader::new(File::open(key)?))?
        .context("no private key in the key file")?;
    let binding = tls_server_end_point(certs.first().context("no certificate")?)?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    let shared = Arc::new(Shared {
        tls: TlsAcceptor::from(Arc::new(config)),
        binding,
        users: read_users(users)?,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_io()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (client, _) = listener.accept().await?;
            let shared = shared.clone();
            tokio::spawn(async move {
                let _ = client.set_nodelay(true);
                let _ = serve(client, &shared).await;
            });
        }
    })
}

/// `"name" "verifier"` lines; blank lines and `#` comments are skipped.
fn read_users(path: &str) -> Result<HashMap<String, ScramSecret>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    let mut users = HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('"').collect();
        let [_, name, _, verifier, ..] = fields.as_slice() else {
            bail!("{path}: expected \"name\" \"verifier\", got {line}");
        };
        users.insert(name.to_string(), ScramSecret::parse(verifier)?);
    }
    Ok(users)
}

/// One connection: SSLRequest, the TLS handshake, the startup message, SCRAM, then constant
/// answers until the client leaves.
async fn serve(mut client: TcpStream, shared: &Shared) -> Result<()> {
    loop {
        let (code, _) = read_startup(&mut client).await?;
        match code {
            SSL_REQUEST => break,
            GSSENC_REQUEST => client.write_all(b"N").await?,
            _ => bail!("the floor serves TLS only"),
        }
    }
    client.write_all(b"S").await?;
    let mut tls = shared.tls.accept(client).await?;
    let (code, body) = read_startup(&mut tls).await?;
    if code == CANCEL_REQUEST {
        return Ok(());
    }
    if code != PROTOCOL_3 {
        bail!("unsupported protocol {code}");
    }
    let user = startup_parameter(&body, "user").context("no user")?;
    let Some(secret) = shared.users.get(&user) else {
        return fail(&mut tls, "28P01", "password authentication failed").await;
    };
    login(&mut tls, secret, &shared.binding).await?;
    answer(&mut tls).await
}

/// The SCRAM exchange up to ReadyForQuery.
async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &ScramSecret,
    binding: &[u8],
) -> Result<()> {
    let mut offer = 10u32.to_be_bytes().to_vec();
    for m in scram::mechanisms(true) {
        offer.extend_from_slice(m.as_bytes());
        offer.push(0);
    }
    offer.push(0);
    send(s, b'R', &offer).await?;
    let (tag, body) = read_message(s).await?;
    if tag != b'p' {
        bail!("expected SASLInitialResponse, got {}", tag as char);
    }
    let nul = body.iter().position(|&b| b == 0).context("no mechanism")?;
    let mechanism = std::str::from_utf8(&body[..nul])?;
    let data = body.get(nul + 5..).unwrap_or_default();
    let nonce = Nonce::from_random(rand::random());
    let (server, server_first) =
        match ScramServer::start(secret, Some(binding), nonce, mechanism, data) {
            Ok(v) => v,
            Err(e) => return fail(s, e.sqlstate(), &e.to_string()).await,
        };
    send(
        s,
        b'R',
        &[&11u32.to_be_bytes()[..], &server_first[..]].concat(),
    )
    .await?;
    let (tag, body) = read_message(s).await?;
    if tag != b'p' {
        bail!("expected SASLResponse, got {}", tag as char);
    }
    let server_final = match server.finish(&body) {
        Ok((server_final, _)) => server_final,
        Err(e) => return fail(s, e.sqlstate(), &e.to_string()).await,
    };
    let mut out = Vec::with_capacity(256);
    message(
        &mut out,
        b'R',
        &[&12u32.to_be_bytes()[..], &server_final[..]].concat(),
    );
    message(&mut out, b'R', &0u32.to_be_bytes());
    for (name, value) in [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ] {
        message(&mut out, b'S', format!("{name}\0{value}\0").as_bytes());
    }
    let key: [u8; 8] = rand::random();
    message(&mut out, b'K', &key);
    message(&mut out, b'Z', b"I");
    s.write_all(&out).await?;
    Ok(())
}

/// Answers every simple query with one constant row of three columns, `1`, NULL and `0`: what
/// pgbench reads at its start (`count(*)` of pgbench_branches in the first column, and the
/// partitioning query's search-path position, method and partition count) and what it ignores
/// afterwards. Until Terminate or EOF.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<()> {
    let mut reply = Vec::with_capacity(160);
    let mut fields = 3u16.to_be_bytes().to_vec();
    for name in ["a", "b", "c"] {
        fields.extend_from_slice(name.as_bytes());
        fields.push(0);
        fields.extend_from_slice(&0u32.to_be_bytes()); // table
        fields.extend_from_slice(&0u16.to_be_bytes()); // column
        fields.extend_from_slice(&25u32.to_be_bytes()); // text
        fields.extend_from_slice(&(-1i16).to_be_bytes());
        fields.extend_from_slice(&(-1i32).to_be_bytes());
        fields.extend_from_slice(&0u16.to_be_bytes()); // text format
    }
    message(&mut reply, b'T', &fields);
    let mut row = 3u16.to_be_bytes().to_vec();
    row.extend_from_slice(&1u32.to_be_bytes());
    row.push(b'1');
    row.extend_from_slice(&(-1i32).to_be_bytes());
    row.extend_from_slice(&1u32.to_be_bytes());
    row.push(b'0');
    message(&mut reply, b'D', &row);
    message(&mut reply, b'C', b"SELECT 1\0");
    message(&mut reply, b'Z', b"I");
    loop {
        let (tag, _) = match read_message(s).await {
            Ok(m) => m,
            Err(_) => return Ok(()),
        };
        match tag {
            b'Q' => s.write_all(&reply).await?,
            b'X' => return Ok(()),
            other => {
                return fail(
                    s,
                    "0A000",
                    &format!(
                        "the floor answers simple queries only, not {}",
                        other as char
                    ),
                )
                .await;
            }
        }
    }
}

/// Sends an ErrorResponse and ends the connection.
async fn fail<S: AsyncWrite + Unpin>(s: &mut S, code: &str, text: &str) -> Result<()> {
    let body = format!("SFATAL\0C{code}\0M{text}\0\0");
    send(s, b'E', body.as_bytes()).await?;
    s.shutdown().await?;
    Ok(())
}

/// Appends one backend message to `out`.
fn message(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, tag: u8, body: &[u8]) -> Result<()> {
    let mut out = Vec::with_capacity(body.len() + 5);
    message(&mut out, tag, body);
    s.write_all(&out).await?;
    Ok(())
}

/// A length-prefixed startup-phase message: its code and the rest of its body.
async fn read_startup<S: AsyncRead + Unpin>(s: &mut S) -> Result<(u32, Vec<u8>)> {
    let len = s.read_u32().await? as usize;
    if !(8..=MAX_MESSAGE).contains(&len) {
        bail!("startup message of {len} bytes");
    }
    let code = s.read_u32().await?;
    let mut body = vec![0; len - 8];
    s.read_exact(&mut body).await?;
    Ok((code, body))
}

/// One tagged frontend message.
async fn read_message<S: AsyncRead + Unpin>(s: &mut S) -> Result<(u8, Vec<u8>)> {
    let tag = s.read_u8().await?;
    let len = s.read_u32().await? as usize;
    if !(4..=MAX_MESSAGE).contains(&len) {
        bail!("message of {len} bytes");
    }
    let mut body = vec![0; len - 4];
    s.read_exact(&mut body).await?;
    Ok((tag, body))
}

/// A parameter of a StartupMessage body (NUL-separated names and values).
fn startup_parameter(body: &[u8], name: &str) -> Option<String> {
    let mut parts = body.split(|&b| b == 0);
    while let Some(key) = parts.next() {
        let value = parts.next()?;
        if key == name.as_bytes() {
            return Some(String::from_utf8_lossy(value).into_owned());
        }
    }
    None
}
