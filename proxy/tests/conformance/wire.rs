//! The main session's client: the Postgres wire protocol spoken over a raw TCP socket, so every
//! field the server (or the gateway) sends is seen as it was sent, nothing hidden by a driver.
//! Logs in with SCRAM-SHA-256 (the gateway's plaintext login) using the protocol crate's SCRAM
//! client.

use std::time::Duration;

use pgwake_protocol::scram::{NONCE_RANDOM_LEN, Nonce, SCRAM_SHA_256, ScramClient, ScramKeys};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest a step's answer may take before it counts as a hang.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a session logs in, and as whom.
#[derive(Clone, Debug)]
pub struct Login {
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
    pub application_name: String,
}

/// One backend message: its tag and body.
#[derive(Clone, Debug)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

/// Why the connection cannot go on.
#[derive(Debug)]
pub enum WireError {
    /// The server closed the connection (after any messages returned so far).
    Closed,
    /// No complete answer in time.
    Timeout,
    /// The login failed or broke the protocol.
    Login(String),
}

/// The client's end of one session.
pub struct WireClient {
    stream: TcpStream,
    buf: Vec<u8>,
    /// The cancel key the server gave at login (process id, secret).
    pub key: (i32, i32),
    pub port: u16,
    /// The client socket's local address, as the gateway's log names the connection.
    pub local: String,
}

/// A frontend message: tag, then a body the caller fills.
fn message(tag: u8, fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut body = Vec::new();
    fill(&mut body);
    let mut out = vec![tag];
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// A simple Query.
pub fn query(sql: &str) -> Vec<u8> {
    message(b'Q', |b| cstr(b, sql))
}

/// A simple Query whose text is sent in LATIN1, as a client whose `client_encoding` is LATIN1
/// sends it (a character past U+00FF becomes `?`).
pub fn query_latin1(sql: &str) -> Vec<u8> {
    message(b'Q', |b| {
        b.extend(
            sql.chars()
                .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?')),
        );
        b.push(0);
    })
}

/// Parse of `sql` as statement `name` with parameter type OIDs.
pub fn parse(name: &str, sql: &str, oids: &[u32]) -> Vec<u8> {
    message(b'P', |b| {
        cstr(b, name);
        cstr(b, sql);
        b.extend_from_slice(&(oids.len() as i16).to_be_bytes());
        for o in oids {
            b.extend_from_slice(&o.to_be_bytes());
        }
    })
}

/// Bind of statement `stmt` to the unnamed portal, every parameter and result in text.
pub fn bind(stmt: &str, params: &[Option<String>]) -> Vec<u8> {
    message(b'B', |b| {
        cstr(b, "");
        cstr(b, stmt);
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(params.len() as i16).to_be_bytes());
        for p in params {
            match p {
                Some(v) => {
                    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v.as_bytes());
                }
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        b.extend_from_slice(&0i16.to_be_bytes());
    })
}

/// Describe of a statement (`b'S'`) or portal (`b'P'`).
pub fn describe(kind: u8, name: &str) -> Vec<u8> {
    message(b'D', |b| {
        b.push(kind);
        cstr(b, name);
    })
}

/// Execute of the unnamed portal, all rows.
pub fn execute() -> Vec<u8> {
    message(b'E', |b| {
        cstr(b, "");
        b.extend_from_slice(&0i32.to_be_bytes());
    })
}

/// Close of a statement (`b'S'`) or portal (`b'P'`).
pub fn close(kind: u8, name: &str) -> Vec<u8> {
    message(b'C', |b| {
        b.push(kind);
        cstr(b, name);
    })
}

pub fn sync() -> Vec<u8> {
    message(b'S', |_| {})
}

pub fn copy_data(data: &[u8]) -> Vec<u8> {
    message(b'd', |b| b.extend_from_slice(data))
}

pub fn copy_done() -> Vec<u8> {
    message(b'c', |_| {})
}

impl WireClient {
    /// Connects and logs in; the messages after AuthenticationOk up to ReadyForQuery are read.
    pub async fn connect(login: &Login) -> Result<WireClient, WireError> {
        let stream = TcpStream::connect(("127.0.0.1", login.port))
            .await
            .map_err(|e| WireError::Login(format!("connect: {e}")))?;
        stream.set_nodelay(true).ok();
        let local = stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let mut c = WireClient {
            stream,
            buf: Vec::new(),
            key: (0, 0),
            port: login.port,
            local,
        };
        let mut startup = 196_608u32.to_be_bytes().to_vec();
        // The parameters tokio-postgres sends, in its order: the other sessions of a scenario
        // (tokio-postgres) then share the gateway's reuse key with this one, so a backend
        // connection this session leaves can serve them.
        let params = [
            ("client_encoding", "UTF8"),
            ("user", &login.user),
            ("database", &login.database),
            ("application_name", &login.application_name),
        ];
        for (k, v) in params {
            cstr(&mut startup, k);
            cstr(&mut startup, v);
        }
        startup.push(0);
        let mut packet = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
        packet.extend(startup);
        c.send(&packet).await?;
        c.authenticate(&login.password).await?;
        loop {
            let m = c.read().await?;
            match m.tag {
                b'K' if m.body.len() >= 8 => {
                    c.key = (
                        i32::from_be_bytes(m.body[0..4].try_into().unwrap()),
                        i32::from_be_bytes(m.body[4..8].try_into().unwrap()),
                    );
                }
                b'Z' => return Ok(c),
                b'E' => return Err(WireError::Login(error_text(&m.body))),
                _ => {}
            }
        }
    }

    /// Answers authentication requests until AuthenticationOk.
    async fn authenticate(&mut self, password: &str) -> Result<(), WireError> {
        let mut scram = None;
        let mut challenge_done = None;
        loop {
            let m = self.read().await?;
            if m.tag == b'E' {
                return Err(WireError::Login(error_text(&m.body)));
            }
            if m.tag != b'R' || m.body.len() < 4 {
                return Err(WireError::Login(format!(
                    "unexpected {:?} during login",
                    m.tag as char
                )));
            }
            let code = i32::from_be_bytes(m.body[0..4].try_into().unwrap());
            let data = &m.body[4..];
            match code {
                0 => return Ok(()),
                3 => {
                    let msg = message(b'p', |b| cstr(b, password));
                    self.send(&msg).await?;
                }
                10 => {
                    let client = ScramClient::new(Nonce::from_random(rand::random::<
                        [u8; NONCE_RANDOM_LEN],
                    >()));
                    let first = client.client_first();
                    let msg = message(b'p', |b| {
                        cstr(b, SCRAM_SHA_256);
                        b.extend_from_slice(&(first.len() as i32).to_be_bytes());
                        b.extend_from_slice(&first);
                    });
                    self.send(&msg).await?;
                    scram = Some(client);
                }
                11 => {
                    let client = scram
                        .take()
                        .ok_or_else(|| WireError::Login("SASL continue first".into()))?;
                    let challenge = client
                        .handle_server_first(data)
                        .map_err(|e| WireError::Login(e.to_string()))?;
                    let keys = ScramKeys::from_password(
                        password,
                        challenge.salt(),
                        challenge.iterations(),
                    );
                    let (awaiting, last) = challenge
                        .client_final(&keys)
                        .map_err(|e| WireError::Login(e.to_string()))?;
                    self.send(&message(b'p', |b| b.extend_from_slice(&last)))
                        .await?;
                    challenge_done = Some(awaiting);
                }
                12 => {
                    let awaiting = challenge_done
                        .take()
                        .ok_or_else(|| WireError::Login("SASL final first".into()))?;
                    awaiting
                        .verify_server_final(data)
                        .map_err(|e| WireError::Login(e.to_string()))?;
                }
                other => {
                    return Err(WireError::Login(format!(
                        "authentication method {other} is not spoken here"
                    )));
                }
            }
        }
    }

    /// Writes bytes as they are.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|_| WireError::Closed)?;
        self.stream.flush().await.map_err(|_| WireError::Closed)
    }

    /// The next whole message.
    pub async fn read(&mut self) -> Result<Msg, WireError> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() > len {
                    let body = self.buf[5..len + 1].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..len + 1);
                    return Ok(Msg { tag, body });
                }
            }
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout(ANSWER_TIMEOUT, self.stream.read(&mut chunk))
                .await
                .map_err(|_| WireError::Timeout)?
                .map_err(|_| WireError::Closed)?;
            if n == 0 {
                return Err(WireError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends a CancelRequest with this session's key on a connection of its own.
    pub async fn send_cancel(&self) {
        send_cancel(self.port, self.key).await;
    }

    /// Says goodbye.
    pub async fn terminate(mut self) {
        let _ = self.send(&message(b'X', |_| {})).await;
    }
}

/// Sends a CancelRequest for `key` to the server at `port`, and waits for it to close the
/// connection (the server answers nothing).
pub async fn send_cancel(port: u16, key: (i32, i32)) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let mut packet = 16u32.to_be_bytes().to_vec();
    packet.extend_from_slice(&80_877_102u32.to_be_bytes());
    packet.extend_from_slice(&key.0.to_be_bytes());
    packet.extend_from_slice(&key.1.to_be_bytes());
    if s.write_all(&packet).await.is_ok() {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    }
}

/// The fields of an ErrorResponse or NoticeResponse, by their one-letter codes.
pub fn fields(body: &[u8]) -> Vec<(u8, String)> {
    body.split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| (f[0], String::from_utf8_lossy(&f[1..]).into_owned()))
        .collect()
}

/// One field of an ErrorResponse or NoticeResponse.
pub fn field(body: &[u8], code: u8) -> Option<String> {
    fields(body)
        .into_iter()
        .find(|(c, _)| *c == code)
        .map(|(_, v)| v)
}

fn error_text(body: &[u8]) -> String {
    format!(
        "{} {}: {}",
        field(body, b'S').unwrap_or_default(),
        field(body, b'C').unwrap_or_default(),
        field(body, b'M').unwrap_or_default()
    )
}

/// Reads NUL-terminated strings and big-endian integers from a message body.
pub struct Reader<'a> {
    pub rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(body: &'a [u8]) -> Reader<'a> {
        Reader { rest: body }
    }

    pub fn cstr(&mut self) -> String {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.rest.len());
        let s = String::from_utf8_lossy(&self.rest[..end]).into_owned();
        self.rest = &self.rest[(end + 1).min(self.rest.len())..];
        s
    }

    pub fn i16(&mut self) -> i16 {
        let v = i16::from_be_bytes(self.rest[..2].try_into().unwrap());
        self.rest = &self.rest[2..];
        v
    }

    pub fn i32(&mut self) -> i32 {
        let v = i32::from_be_bytes(self.rest[..4].try_into().unwrap());
        self.rest = &self.rest[4..];
        v
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (b, rest) = self.rest.split_at(n);
        self.rest = rest;
        b
    }
}
