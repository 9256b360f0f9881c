//! A pgwake process under test, with its own certificate and config, stopped on drop.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgwake_testkit::{PgOptions, TestCert, TestPostgres, free_port, pg_bin_dir};

pub mod cnpg_operator;
pub mod replicas;

pub const SNI_SUFFIX: &str = "db.localtest";

/// Superuser password of local-backend tenants in tests.
pub const LOCAL_PASSWORD: &str = "local-test-password";

/// A tokio-postgres client for `info` (plaintext), its connection driven on this runtime.
pub async fn connect_plain(info: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(info, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Runs a blocking client (psql) off the runtime's workers.
pub fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(f)
}

/// The backend process serving `client` (tells a kept connection from a new one).
pub async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// A counter's value for one `outcome` label (0 when never counted).
pub fn counted(gw: &Gateway, name: &str, outcome: &str) -> f64 {
    gw.labelled_metric(name, &[("outcome", outcome)])
}

/// Waits until `pgwake_backend_reuse_returns_total{outcome}` reaches `n` (a kept connection is
/// handed back after its client is gone).
pub async fn wait_returns(gw: &Gateway, outcome: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while counted(gw, "pgwake_backend_reuse_returns_total", outcome) < n {
        assert!(Instant::now() < deadline, "no {n} returns {outcome:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A real Postgres with TLS and connection logging, as a tenant's backend.
pub fn backend() -> TestPostgres {
    TestPostgres::start(PgOptions {
        tls: Some(TestCert::new(&["localhost", "127.0.0.1"])),
        extra_conf: vec!["log_connections = on".into()],
        ..PgOptions::default()
    })
    .expect("start postgres")
}

/// Lines in the backend's log that record an incoming connection.
pub fn connections_seen(pg: &TestPostgres) -> usize {
    pg.log().matches("connection received").count()
}

pub struct Gateway {
    child: Option<Child>,
    pub port: u16,
    pub admin: u16,
    pub cert: TestCert,
    pub dir: tempfile::TempDir,
    log: PathBuf,
}

impl Gateway {
    /// Starts pgwake with tenant `alpha` on `pg` plus `extra` TOML, and env overrides.
    pub fn start(pg: &TestPostgres, extra: &str, env: &[(&str, &str)]) -> Gateway {
        let tenants = format!(
            "[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n",
            pg.port
        );
        Gateway::launch(extra, &tenants, env)
    }

    /// The `[local]` section and tenant tables of local-backend tenants `ids`.
    pub fn local_tenants(ids: &[&str], local_settings: &str) -> String {
        let mut tenants = format!(
            "[local]\ndata_dir = \"data\"\npassword = \"{LOCAL_PASSWORD}\"\n[local.settings]\n{local_settings}\n"
        );
        for id in ids {
            tenants.push_str(&format!(
                "[[tenant]]\nid = \"{id}\"\nbackend = {{ kind = \"local\" }}\n"
            ));
        }
        tenants
    }

    /// Starts pgwake with local-backend tenants (`ids`), the `[local]` section pointing into the
    /// gateway's folder, plus `extra` top-level TOML and `local_settings` under `[local.settings]`.
    pub fn start_local(
        ids: &[&str],
        extra: &str,
        local_settings: &str,
        env: &[(&str, &str)],
    ) -> Gateway {
        Gateway::launch(extra, &Gateway::local_tenants(ids, local_settings), env)
    }

    /// The data folder of a local tenant.
    pub fn local_dir(&self, tenant: &str) -> PathBuf {
        self.dir.path().join("data").join(tenant)
    }

    /// Number of times a local tenant's Postgres reported itself ready (needs
    /// `log_min_messages = 'log'` in the tenant's settings).
    pub fn local_starts(&self, tenant: &str) -> usize {
        std::fs::read_to_string(self.local_dir(tenant).join("postgres.log"))
            .unwrap_or_default()
            .matches("database system is ready to accept connections")
            .count()
    }

    /// A tenant's entry from `GET /v1/tenants`.
    pub fn tenant(&self, tenant: &str) -> serde_json::Value {
        let (_, body) = self.http_get("/v1/tenants").expect("tenants");
        let all: serde_json::Value = serde_json::from_str(&body).expect("json");
        all.as_array()
            .and_then(|a| a.iter().find(|t| t["id"] == tenant))
            .unwrap_or_else(|| panic!("no tenant {tenant} in {body}"))
            .clone()
    }

    /// A tenant's entry from `GET /v1/tenants`, as (state, connections, waiters).
    pub fn tenant_state(&self, tenant: &str) -> (String, u64, u64) {
        let t = self.tenant(tenant);
        (
            t["state"].as_str().unwrap_or_default().to_owned(),
            t["connections"].as_u64().unwrap_or(0),
            t["waiters"].as_u64().unwrap_or(0),
        )
    }

    /// Waits until a tenant reaches `state`.
    pub fn wait_state(&self, tenant: &str, state: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.tenant_state(tenant).0;
            if now == state {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tenant {tenant} is {now}, not {state}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts pgwake with `extra` top-level TOML and `tenants` (tenant tables and anything after).
    pub fn launch(extra: &str, tenants: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::launch_under(&[], extra, tenants, env)
    }

    /// Like [`Gateway::launch`], with the gateway's command run by `wrapper` (e.g. `prlimit
    /// --nofile=256`), which must exec it in its own process.
    pub fn launch_under(
        wrapper: &[&str],
        extra: &str,
        tenants: &str,
        env: &[(&str, &str)],
    ) -> Gateway {
        Gateway::launch_routed(
            wrapper,
            r#"["sni", "options", "database", "user"]"#,
            extra,
            tenants,
            env,
        )
    }

    /// Like [`Gateway::launch_under`], with `rules` (a TOML array) as `routing.rules`.
    pub fn launch_routed(
        wrapper: &[&str],
        rules: &str,
        extra: &str,
        tenants: &str,
        env: &[(&str, &str)],
    ) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        // The local backend's servers run as another account and must reach their folders.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let cert = TestCert::new(&["*.db.localtest", "localhost"]);
        cert.write_to(dir.path()).unwrap();
        let (port, admin) = (free_port(), free_port());
        let config = format!(
            r#"[listen]
postgres = "127.0.0.1:{port}"
admin = "127.0.0.1:{admin}"
{extra}
[tls]
cert = "cert.pem"
key = "key.pem"
[routing]
sni_suffix = "{SNI_SUFFIX}"
rules = {rules}
{tenants}"#
        );
        let path = dir.path().join("pgwake.toml");
        std::fs::write(&path, config).unwrap();
        let log = dir.path().join("pgwake.log");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(env!("CARGO_BIN_EXE_pgwake"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_pgwake")),
        };
        cmd.args(["serve", "--config"])
            .arg(&path)
            .env("PGWAKE_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn pgwake");
        let mut gw = Gateway {
            child: Some(child),
            port,
            admin,
            cert,
            dir,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while gw.http_get("/readyz").map(|(s, _)| s) != Some(200) {
            if let Some(status) = gw.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("pgwake exited with {status}: {}", gw.log());
            }
            assert!(Instant::now() < deadline, "pgwake not ready: {}", gw.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        gw
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// A GET on the admin listener: (status, body).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        self.http("GET", path)
    }

    /// A request without body on the admin listener: (status, body).
    pub fn http(&self, method: &str, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.admin)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        // The admin API takes POSTs only as JSON (so web pages cannot send them).
        let content_type = if method == "POST" {
            "Content-Type: application/json\r\nContent-Length: 0\r\n"
        } else {
            ""
        };
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: localhost\r\n{content_type}\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((status, body))
    }

    /// The value of an unlabelled (or fully labelled) metric line.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.http_get("/metrics").expect("metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// `select 1` as `user` on database `<tenant>.postgres`, over plaintext: the answer, or the
    /// error (with its SQLSTATE) the client got.
    pub async fn select_one(
        &self,
        tenant: &str,
        user: &str,
        password: &str,
    ) -> Result<i32, tokio_postgres::Error> {
        let conninfo = format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={tenant}.postgres sslmode=disable connect_timeout=30",
            self.port
        );
        let (client, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let row = client.query_one("select 1::int4", &[]).await?;
        Ok(row.get(0))
    }

    /// Whether the admin API lists the tenant.
    pub fn lists_tenant(&self, tenant: &str) -> bool {
        let (_, body) = self.http_get("/v1/tenants").expect("tenants");
        let list: serde_json::Value = serde_json::from_str(&body).expect("tenant list");
        list.as_array()
            .expect("tenant list")
            .iter()
            .any(|t| t["id"] == tenant)
    }

    /// Waits until the admin API lists the tenant (`listed`) or no longer does.
    pub fn wait_listed(&self, tenant: &str, listed: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.lists_tenant(tenant) != listed {
            assert!(
                Instant::now() < deadline,
                "tenant {tenant} listed: {}, wanted {listed}\n{}",
                !listed,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of a labelled metric's line carrying every given `label="value"` pair (0 when
    /// never counted).
    pub fn labelled_metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (_, body) = self.http_get("/metrics").expect("metrics");
        body.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until no client connection is open at the gateway.
    pub fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let active = self.metric("pgwake_connections_active");
            if active == 0.0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{active} connections still active"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .unwrap();
    }

    /// Waits for the process to exit; returns whether it did in time.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut()
                && c.try_wait().unwrap().is_some()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Runs psql with this connection string (key=value, the gateway's port is added; or a
    /// URI, taken as is) and SQL; returns its output.
    pub fn psql(&self, pg: &TestPostgres, conninfo: &str, sql: &str) -> Output {
        let conninfo = if conninfo.starts_with("postgresql://") {
            conninfo.to_owned()
        } else {
            format!("{conninfo} port={}", self.port)
        };
        Command::new(pg_bin_dir().unwrap().join("psql"))
            .args(["-X", "-A", "-t", "-w", "-c", sql])
            .arg(conninfo)
            .env("PGPASSWORD", &pg.options.password)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("run psql")
    }

    /// A tokio-rustls connector trusting the gateway's certificate, speaking ALPN postgresql.
    pub fn tls_connector(&self) -> tokio_rustls::TlsConnector {
        tls_connector_trusting(&[&self.cert.cert_pem])
    }
}

/// A tokio-rustls connector trusting each of these PEM certificates, speaking ALPN postgresql.
pub fn tls_connector_trusting(pems: &[&str]) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for pem in pems {
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        roots.add(der).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"postgresql".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // SIGTERM first, so the gateway stops the local servers it started.
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `SHOW name` over the simple protocol.
pub async fn show(client: &tokio_postgres::Client, name: &str) -> String {
    let rows = client.simple_query(&format!("SHOW {name}")).await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap()
}

/// A StartupMessage of protocol `version` with these parameters.
pub fn startup_packet(params: &[(&str, &str)], version: u32) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut p = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    p.extend(body);
    p
}

/// A StartupMessage (database `postgres`), a PasswordMessage and a simple Query, as one byte
/// string: what the serverless driver pipelines over WebSocket.
pub fn pipelined_login(user: &str, password: &str, sql: &str) -> Vec<u8> {
    let mut out = startup_packet(&[("user", user), ("database", "postgres")], 196_608);
    for (tag, text) in [(b'p', password), (b'Q', sql)] {
        out.push(tag);
        out.extend_from_slice(&((text.len() + 5) as u32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
        out.push(0);
    }
    out
}

/// Splits a backend byte stream into (tag, body) messages; a partial tail stays unsplit.
pub fn messages(stream: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = stream;
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if rest.len() < len + 1 {
            break;
        }
        out.push((rest[0], rest[5..len + 1].to_vec()));
        rest = &rest[len + 1..];
    }
    out
}

pub type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

pub async fn open_ws(port: u16, path: &str) -> Ws {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (ws, _) = tokio_tungstenite::client_async(format!("ws://localhost:{port}{path}"), tcp)
        .await
        .expect("websocket handshake");
    ws
}

/// Reads binary frames until `done` holds for the messages so far, or the socket ends.
pub async fn read_until(
    ws: &mut Ws,
    done: impl Fn(&[(u8, Vec<u8>)]) -> bool,
) -> Vec<(u8, Vec<u8>)> {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut bytes = Vec::new();
    loop {
        let m = messages(&bytes);
        if done(&m) {
            return m;
        }
        let next = tokio::time::timeout(Duration::from_secs(30), ws.next()).await;
        match next.expect("an answer in time") {
            Some(Ok(Message::Binary(b))) => bytes.extend_from_slice(&b),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return messages(&bytes),
            Some(Ok(_)) => {}
        }
    }
}

/// The Node project folder `proxy/tests/<folder>`, installed with `npm ci` on first use
/// (`package` names a dependency whose presence shows it is installed).
pub fn node_project(folder: &str, package: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(folder);
    if !dir.join("node_modules").join(package).exists() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .expect("npm (install nodejs and npm to run this test)");
        assert!(status.success(), "npm ci failed in {}", dir.display());
    }
    dir
}

/// A plaintext session through the gateway on local tenant `tenant` as the local superuser
/// (routed by database name), kept open until dropped.
pub async fn local_session(gw: &Gateway, tenant: &str) -> tokio_postgres::Client {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={LOCAL_PASSWORD} dbname={tenant}.postgres \
         sslmode=disable connect_timeout=60",
        gw.port
    );
    let (client, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
        .await
        .expect("login through the gateway");
    tokio::spawn(conn);
    client
}

/// The Java clients and the Maven project that names their driver (pgjdbc).
pub fn jdbc_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jdbc"))
}

/// Whether `program arg` runs and succeeds (is the tool installed).
pub fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// pgjdbc's class path, fetched by Maven on first use (again when pom.xml changes); `None`
/// when there is no JDK or Maven to run it.
pub fn jdbc_classpath() -> Option<String> {
    if !runs("java", "-version") || !runs("mvn", "-v") {
        // Straight to stderr, past the test harness's capture, so the skip shows in CI logs.
        let _ = writeln!(
            std::io::stderr(),
            "pgjdbc test SKIPPED: `java` and `mvn` are needed (e.g. apt-get install \
             default-jdk-headless maven)"
        );
        return None;
    }
    let lib = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pgjdbc");
    let pom = std::fs::read(jdbc_dir().join("pom.xml")).unwrap();
    if std::fs::read(lib.join("pom.xml")).ok().as_ref() != Some(&pom) {
        let _ = std::fs::remove_dir_all(&lib);
        let out = Command::new("mvn")
            .args([
                "-q",
                "-B",
                "-Dstyle.color=never",
                "dependency:copy-dependencies",
            ])
            .arg(format!("-DoutputDirectory={}", lib.display()))
            .current_dir(jdbc_dir())
            .output()
            .expect("run mvn");
        assert!(
            out.status.success(),
            "mvn could not fetch the driver:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Written last: it marks a complete download.
        std::fs::write(lib.join("pom.xml"), pom).unwrap();
    }
    Some(format!("{}/*", lib.display()))
}

/// The head of a plain HTTP/1.1 `POST /sql` whose connection string names `user`, `password`
/// and `tenant` (by the SNI suffix), for a body of `length` bytes.
pub fn sql_request_head((user, password, tenant): (&str, &str, &str), length: usize) -> String {
    format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n\
         Neon-Connection-String: postgresql://{user}:{password}@{tenant}.{SNI_SUFFIX}:5432/postgres\r\n\
         Content-Length: {length}\r\n\r\n"
    )
}

/// The status (none when the answer has no status line) and body of a raw HTTP answer.
pub fn http_answer(raw: &[u8]) -> (Option<u16>, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}

/// `POST /sql` of a JSON `body` over plain HTTP on `http`, logged in as `who` (user, password,
/// tenant): the status and body of the answer.
pub async fn post_sql_body(http: u16, who: (&str, &str, &str), body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", http))
        .await
        .unwrap();
    s.write_all(sql_request_head(who, body.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let (status, body) = http_answer(&raw);
    (status.expect("an HTTP status line"), body)
}

/// Reads one backend message from a raw client socket: (tag, body); `None` at its end.
pub async fn read_message(s: &mut tokio::net::TcpStream) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 5];
    s.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; len.checked_sub(4)?];
    s.read_exact(&mut body).await.ok()?;
    Some((head[0], body))
}

/// The SQLSTATE of an ErrorResponse body.
pub fn sqlstate(body: &[u8]) -> String {
    body.split(|&b| b == 0)
        .find_map(|f| f.strip_prefix(b"C"))
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .unwrap_or_default()
}

/// A TCP connection to the gateway's `port` from the loopback address `source`.
pub async fn connect_from(source: &str, port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap()
}

/// A whole plaintext SCRAM login as `user` on `<tenant>.postgres` from `source`: "" once the
/// gateway said AuthenticationOk, else the SQLSTATE of its refusal.
pub async fn scram_login(
    source: &str,
    port: u16,
    tenant: &str,
    user: &str,
    password: &str,
) -> String {
    use pgwake_protocol::scram::{Nonce, ScramClient, ScramKeys};
    let mut s = connect_from(source, port).await;
    let database = format!("{tenant}.postgres");
    let startup = startup_packet(&[("user", user), ("database", &database)], 196_608);
    tokio::io::AsyncWriteExt::write_all(&mut s, &startup)
        .await
        .unwrap();
    match read_message(&mut s).await {
        Some((b'R', _)) => {}
        Some((b'E', body)) => return sqlstate(&body),
        other => panic!("unexpected answer to the startup: {other:?}"),
    }
    let client = ScramClient::new(Nonce::from_random(rand::random()));
    let first =
        pgwake_protocol::auth::sasl_initial_response("SCRAM-SHA-256", &client.client_first());
    tokio::io::AsyncWriteExt::write_all(&mut s, &first)
        .await
        .unwrap();
    let (tag, body) = read_message(&mut s).await.expect("SASLContinue");
    assert_eq!((tag, &body[..4]), (b'R', &11u32.to_be_bytes()[..]));
    let challenge = client.handle_server_first(&body[4..]).unwrap();
    let keys = ScramKeys::from_password(password, challenge.salt(), challenge.iterations());
    let (_, client_final) = challenge.client_final(&keys).unwrap();
    let response = pgwake_protocol::auth::sasl_response(&client_final);
    tokio::io::AsyncWriteExt::write_all(&mut s, &response)
        .await
        .unwrap();
    loop {
        match read_message(&mut s).await {
            Some((b'E', body)) => return sqlstate(&body),
            // AuthenticationOk: the password was accepted (the wake and the rest follow).
            Some((b'R', body)) if body[..4] == 0u32.to_be_bytes() => return String::new(),
            Some(_) => {}
            None => return "closed".into(),
        }
    }
}

/// One admin request with this head (`Connection: close` added), the status answered.
pub async fn admin_status(admin: u16, request_line: &str, headers: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", admin))
        .await
        .unwrap();
    let head = format!("{request_line}\r\n{headers}Connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A client that sends `POST /sql` of `sql` to `tenant` (a local one, as `pgwake`), reads the
/// first bytes of the answer and then stops reading, with a small receive buffer so that a
/// large body stays on the gateway's side.
pub async fn sql_then_stop_reading(
    http: u16,
    tenant: &str,
    sql: &str,
) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], http)))
        .await
        .unwrap();
    let body = serde_json::to_vec(&serde_json::json!({ "query": sql, "params": [] })).unwrap();
    let who = ("pgwake", LOCAL_PASSWORD, tenant);
    s.write_all(sql_request_head(who, body.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(&body).await.unwrap();
    let mut first = vec![0u8; 512];
    let n = s.read(&mut first).await.unwrap();
    (s, String::from_utf8_lossy(&first[..n]).into_owned())
}

/// What a CancelRequest starts with after its length.
pub const CANCEL_REQUEST_CODE: u32 = 80_877_102;

/// The key a client holds, as (pid, secret): the client's cancel token is pointed at a
/// listener of the test, which reads the CancelRequest it sends.
pub async fn issued_key(token: &tokio_postgres::CancelToken) -> (i32, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let send = async {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = token.cancel_query_raw(stream, tokio_postgres::NoTls).await;
    };
    let read = async {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut packet = [0u8; 16];
        s.read_exact(&mut packet).await.unwrap();
        packet
    };
    let (_, packet) = tokio::join!(send, read);
    assert_eq!(&packet[4..8], &CANCEL_REQUEST_CODE.to_be_bytes());
    let pid = i32::from_be_bytes(packet[8..12].try_into().unwrap());
    (pid, packet[12..16].to_vec())
}

/// A fixed tenant `alpha` on `pg` whose users the gateway authenticates (with the backend's own
/// SCRAM verifier, in a static credentials file written to `dir`), so its sessions can move.
pub fn verified_fixed_tenant(dir: &Path, pg: &TestPostgres) -> String {
    let verifier = pg
        .psql(&format!(
            "select rolpassword from pg_authid where rolname = '{}'",
            pg.options.user
        ))
        .unwrap();
    let path = dir.join("users.txt");
    std::fs::write(&path, format!("\"{}\" \"{verifier}\"\n", pg.options.user)).unwrap();
    format!(
        "[[tenant]]\nid = \"alpha\"\nbackend = {{ kind = \"fixed\", address = \"127.0.0.1:{}\" }}\n\
         credentials = {{ kind = \"static\", file = \"{}\" }}\n",
        pg.port,
        path.display()
    )
}

/// Sessions park on their own after 300 ms of quiet (snapshots after 100 ms); tenants never
/// sleep.
pub const PARK_ON_OWN: &str = "allow_plaintext = true
[wake]
idle_timeout = \"1h\"
[revival]
snapshot_after = \"100ms\"
park_session_after = \"300ms\"
";
