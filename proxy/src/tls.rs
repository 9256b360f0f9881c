//! TLS for both links: the server side that clients see (certificates chosen by SNI, ALPN
//! `postgresql`) and the client side the gateway uses towards backends.

use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

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
    let key = provider
        .key_provider
        .load_private_key(load_key(key)?)
        .map_err(|e| file_error(key, e))?;
    Ok(Arc::new(CertifiedKey::new(chain, key)))
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

/// The gateway's TLS identity towards clients: the rustls configuration and the certificate
/// choice behind it, which SCRAM-SHA-256-PLUS binds to.
pub struct ServerTls {
    /// Configuration for the TLS acceptor.
    pub config: Arc<ServerConfig>,
    resolver: Arc<SniResolver>,
}

impl ServerTls {
    /// `tls-server-end-point` channel-binding data of the certificate served for this SNI.
    pub fn channel_binding(&self, sni: Option<&str>) -> Option<Vec<u8>> {
        let key = self.resolver.pick(sni);
        let leaf = key.cert.first()?;
        pgwake_protocol::channel_binding::tls_server_end_point(leaf.as_ref()).ok()
    }
}

/// The server-side TLS configuration for client connections.
pub fn server_config(tls: &TlsConfig) -> Result<ServerTls, TlsError> {
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
    Ok(ServerTls {
        config: Arc::new(config),
        resolver,
    })
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
