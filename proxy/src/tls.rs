//! TLS for both links: the server side that clients see (certificates chosen by SNI, ALPN
//! `postgresql`, read again when their files change or on SIGHUP) and the client side the
//! gateway uses towards backends.

use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{BackendConfig, TlsConfig};

/// ALPN protocol name of Postgres (required for direct TLS).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// A certificate or key file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Reading or parsing a PEM file failed.
    #[error("{path}: {problem}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        problem: String,
    },
    /// rustls refused the material.
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Logs a client's TLS handshake that did not finish, the same way on every listener: one the
/// client left (it closed or reset the connection, as clients that do not trust the
/// certificate and port checks do) at debug, any other failure at info with its reason.
pub fn log_failed_handshake(error: &std::io::Error) {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    match error.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
            debug!(error = %error, "client left during the TLS handshake")
        }
        _ => info!(error = %error, "TLS handshake failed"),
    }
}

fn file_error(path: &Path, problem: impl fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        problem: problem.to_string(),
    }
}

/// The process-wide crypto provider: ring only.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let f = File::open(path).map_err(|e| file_error(path, e))?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut BufReader::new(f))
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate found"));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let f = File::open(path).map_err(|e| file_error(path, e))?;
    rustls_pemfile::private_key(&mut BufReader::new(f))
        .map_err(|e| file_error(path, e))?
        .ok_or_else(|| file_error(path, "no PEM private key found"))
}

fn certified_key(
    provider: &CryptoProvider,
    cert: &Path,
    key: &Path,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    // Also checks that the key belongs to the certificate: a rotation caught between writing
    // the certificate and the key must not serve a pair that fails every handshake.
    let certified = CertifiedKey::from_der(chain, load_key(key)?, provider)
        .map_err(|e| file_error(key, format!("{e} (with certificate {})", cert.display())))?;
    Ok(Arc::new(certified))
}

/// Picks a certificate by SNI: exact names, then `*.` wildcards, then the default.
#[derive(Debug)]
struct SniResolver {
    default: Arc<CertifiedKey>,
    by_name: Vec<(String, Arc<CertifiedKey>)>,
}

impl SniResolver {
    fn pick(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        let Some(sni) = sni.map(|s| s.to_ascii_lowercase()) else {
            return self.default.clone();
        };
        let exact = self.by_name.iter().find(|(n, _)| *n == sni);
        let wildcard = || {
            let parent = sni.split_once('.')?.1;
            self.by_name
                .iter()
                .find(|(n, _)| n.strip_prefix("*.") == Some(parent))
        };
        exact
            .or_else(wildcard)
            .map(|(_, k)| k.clone())
            .unwrap_or_else(|| self.default.clone())
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

/// One generation of the gateway's TLS identity towards clients: the rustls configurations of
/// both listeners and the certificate choice behind them, which SCRAM-SHA-256-PLUS binds to.
pub struct ServerTls {
    /// Configuration for the Postgres listener (ALPN `postgresql`).
    pub config: Arc<ServerConfig>,
    /// Configuration for the HTTP listener (ALPN `h2`, `http/1.1`).
    pub http_config: Arc<ServerConfig>,
    resolver: Arc<SniResolver>,
}

impl ServerTls {
    /// `tls-server-end-point` channel-binding data of the certificate this generation serves
    /// for this SNI.
    pub fn channel_binding(&self, sni: Option<&str>) -> Option<Vec<u8>> {
        let key = self.resolver.pick(sni);
        let leaf = key.cert.first()?;
        pgwake_protocol::channel_binding::tls_server_end_point(leaf.as_ref()).ok()
    }
}

/// The server-side TLS configuration for client connections, read from the files of `tls`.
fn server_config(tls: &TlsConfig) -> Result<ServerTls, TlsError> {
    let provider = provider();
    let default = certified_key(&provider, &tls.cert, &tls.key)?;
    let mut by_name = Vec::new();
    for c in &tls.certs {
        let key = certified_key(&provider, &c.cert, &c.key)?;
        for n in &c.server_names {
            by_name.push((n.to_ascii_lowercase(), key.clone()));
        }
    }
    let resolver = Arc::new(SniResolver { default, by_name });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    let mut http_config = config.clone();
    http_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerTls {
        config: Arc::new(config),
        http_config: Arc::new(http_config),
        resolver,
    })
}

/// The gateway's certificates as they are now: read at start-up, and read again when their
/// files change (cert-manager rotating a Secret) or on SIGHUP. Each handshake takes the
/// generation current when it starts; open sessions keep theirs.
pub struct ServerCertificates {
    files: TlsConfig,
    current: RwLock<Arc<ServerTls>>,
    /// Digest of the files' contents at the last attempt, so a change is tried (and a bad
    /// file reported) once.
    seen: Mutex<Vec<u8>>,
}

impl ServerCertificates {
    /// Reads the certificates of `files`; fails when any is unusable.
    pub fn load(files: &TlsConfig) -> Result<ServerCertificates, TlsError> {
        let seen = files_digest(files);
        let first = server_config(files)?;
        Ok(ServerCertificates {
            files: files.clone(),
            current: RwLock::new(Arc::new(first)),
            seen: Mutex::new(seen),
        })
    }

    /// The generation new handshakes use.
    pub fn current(&self) -> Arc<ServerTls> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the files again when their contents changed since the last attempt (or always,
    /// when `force`); a failure keeps the current generation and is logged with its reason.
    pub fn reload(&self, reason: &'static str, force: bool) -> Reload {
        let digest = files_digest(&self.files);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !force && *seen == digest {
                return Reload::Unchanged;
            }
            *seen = digest;
        }
        match server_config(&self.files) {
            Ok(next) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
                info!(reason, "TLS certificates reloaded: new handshakes use them");
                Reload::Loaded
            }
            Err(e) => {
                warn!(reason, error = %e, "TLS certificates not reloaded: keeping the previous ones");
                Reload::Failed
            }
        }
    }

    /// Polls the files every `interval` and reloads on SIGHUP, until `stop` fires; `on_failure`
    /// is called for each reload that kept the previous certificates. The SIGHUP handler is in
    /// place when this returns, before the future first runs.
    pub fn watch(
        self: Arc<Self>,
        interval: Duration,
        stop: CancellationToken,
        on_failure: impl Fn() + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "no SIGHUP handler: certificates reload only when their files change");
                None
            }
        };
        async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let (reason, force) = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => ("files_changed", false),
                    Some(()) = async { hangup.as_mut()?.recv().await } => ("sighup", true),
                };
                // File reads and key parsing block; keep them off the runtime's workers.
                let certs = self.clone();
                let outcome =
                    tokio::task::spawn_blocking(move || certs.reload(reason, force)).await;
                if matches!(outcome, Ok(Reload::Failed)) {
                    on_failure();
                }
            }
        }
    }
}

/// What a reload did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files had not changed.
    Unchanged,
    /// New handshakes use the new certificates.
    Loaded,
    /// The new files were unusable; the previous certificates stay.
    Failed,
}

/// SHA-256 over every certificate and key file's contents (or its read error), in order.
fn files_digest(files: &TlsConfig) -> Vec<u8> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let paths = [(&files.cert, &files.key)]
        .into_iter()
        .chain(files.certs.iter().map(|c| (&c.cert, &c.key)));
    for (cert, key) in paths {
        for path in [cert, key] {
            let bytes = std::fs::read(path).unwrap_or_else(|e| e.to_string().into_bytes());
            ctx.update(&(bytes.len() as u64).to_be_bytes());
            ctx.update(&bytes);
        }
    }
    ctx.finish().as_ref().to_vec()
}

/// The client-side TLS configuration for backend connections.
pub fn backend_client_config(backend: &BackendConfig) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match &backend.ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(ca)? {
                roots.add(cert).map_err(|e| file_error(ca, e))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// Short names for the signature checks' types (message, certificate, signature, verdict).
type Cert<'a> = CertificateDer<'a>;
type Dss = DigitallySignedStruct;
type Signature = Result<HandshakeSignatureValid, rustls::Error>;

/// libpq's `sslmode=require`: the link is encrypted and handshake signatures are checked, but the
/// certificate is not tied to a trusted CA. Used only when no `[backend] ca` is configured.
#[derive(Debug)]
struct EncryptOnly(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(&self, m: &[u8], c: &Cert<'_>, s: &Dss) -> Signature {
        rustls::crypto::verify_tls12_signature(m, c, s, &self.0)
    }

    fn verify_tls13_signature(&self, m: &[u8], c: &Cert<'_>, s: &Dss) -> Signature {
        rustls::crypto::verify_tls13_signature(m, c, s, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}
