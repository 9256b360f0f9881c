//! The gateway's SCRAM server side against libpq (through `psql`) over TLS: SCRAM-SHA-256-PLUS
//! with `tls-server-end-point` binding, as `channel_binding=require` demands.
//!
//! The server here is a fake that speaks only the login (TLS, startup, SASL, then ReadyForQuery),
//! enough for `psql -c '\q'` to connect and leave.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::thread;

use common::read_message;
use pgwake_protocol::ErrorMessage;
use pgwake_protocol::auth::{
    authentication_ok, authentication_sasl, authentication_sasl_continue,
    authentication_sasl_final, parse_sasl_initial_response,
};
use pgwake_protocol::channel_binding::tls_server_end_point;
use pgwake_protocol::scram::{Nonce, ScramError, ScramSecret, ScramServer, mechanisms};
use pgwake_testkit::{TestCert, pg_bin_dir};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const PASSWORD: &str = "libpq pass word";

/// What the fake server saw: the mechanism the client chose and how the exchange ended.
type Seen = (String, Result<(), ScramError>);

/// Serves one TLS login, checking the password with the gateway's SCRAM server.
/// `binding` is the end-point hash the server checks against (normally its own certificate's).
fn serve_one(
    listener: TcpListener,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
    binding: Option<Vec<u8>>,
) -> Seen {
    let (mut tcp, _) = listener.accept().unwrap();
    let mut ssl_request = [0u8; 8];
    tcp.read_exact(&mut ssl_request).unwrap();
    tcp.write_all(b"S").unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert_der)],
        PrivateKeyDer::try_from(key_der).unwrap(),
    )
    .unwrap();
    let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);

    let mut len = [0u8; 4];
    tls.read_exact(&mut len).unwrap();
    let mut startup = vec![0u8; u32::from_be_bytes(len) as usize - 4];
    tls.read_exact(&mut startup).unwrap();

    tls.write_all(&authentication_sasl(mechanisms(binding.is_some())))
        .unwrap();
    let (_, body) = read_message(&mut tls).unwrap();
    let initial = parse_sasl_initial_response(&body).unwrap();
    let secret = ScramSecret::from_password(PASSWORD, b"sixteen byte slt", 4096);
    let outcome = ScramServer::start(
        &secret,
        binding.as_deref(),
        Nonce::from_random([42; 18]),
        &initial.auth_method,
        initial.data.as_deref().unwrap_or_default(),
    )
    .and_then(|(server, server_first)| {
        tls.write_all(&authentication_sasl_continue(&server_first))
            .unwrap();
        let (_, client_final) = read_message(&mut tls).unwrap();
        server.finish(&client_final)
    });
    match &outcome {
        Ok((server_final, _)) => {
            tls.write_all(&authentication_sasl_final(server_final))
                .unwrap();
            tls.write_all(&authentication_ok()).unwrap();
            tls.write_all(&parameter_status("server_version", "15.0"))
                .unwrap();
            tls.write_all(&parameter_status("client_encoding", "UTF8"))
                .unwrap();
            tls.write_all(b"Z\0\0\0\x05I").unwrap();
            // Wait for psql's Terminate or its hang-up.
            let _ = read_message(&mut tls);
        }
        Err(e) => {
            let code = e.sqlstate();
            tls.write_all(&ErrorMessage::fatal(code, e.to_string()).to_bytes())
                .unwrap();
        }
    }
    tls.conn.send_close_notify();
    let _ = tls.flush();
    (initial.auth_method, outcome.map(|_| ()))
}

fn parameter_status(name: &str, value: &str) -> Vec<u8> {
    let body = [name.as_bytes(), b"\0", value.as_bytes(), b"\0"].concat();
    let mut msg = vec![b'S'];
    msg.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// Runs `psql` against a fake server with this certificate; returns psql's success and stderr,
/// and what the server saw. The server binds to `binding_cert`'s hash.
fn psql_login(
    cert: &TestCert,
    binding_cert: &TestCert,
    password: &str,
    channel_binding: &str,
) -> (bool, String, Seen) {
    let cert_der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes())
        .unwrap()
        .to_vec();
    let key_der = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .unwrap()
        .secret_der()
        .to_vec();
    let binding = CertificateDer::from_pem_slice(binding_cert.cert_pem.as_bytes())
        .ok()
        .and_then(|der| tls_server_end_point(&der).ok());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || serve_one(listener, cert_der, key_der, binding));
    let out = Command::new(pg_bin_dir().unwrap().join("psql"))
        .arg(format!(
            "host=127.0.0.1 port={port} user=alice dbname=app sslmode=require \
             gssencmode=disable channel_binding={channel_binding} connect_timeout=10"
        ))
        .args(["-X", "-c", "\\q"])
        .env("PGPASSWORD", password)
        .env("PGPASSFILE", "/dev/null")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr, server.join().unwrap())
}

/// `psql_login` against a server that binds to its own certificate, as the gateway does.
fn psql_login_to(cert: &TestCert, password: &str, channel_binding: &str) -> (bool, String, Seen) {
    psql_login(cert, cert, password, channel_binding)
}

fn ecdsa_cert() -> TestCert {
    TestCert::new(&["localhost"])
}

/// An Ed25519 certificate: libpq has no end-point hash for it.
fn ed25519_cert() -> TestCert {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    TestCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[test]
fn libpq_channel_binding_require_works() {
    let (ok, stderr, (mechanism, outcome)) = psql_login_to(&ecdsa_cert(), PASSWORD, "require");
    assert!(ok, "{stderr}");
    assert_eq!(mechanism, "SCRAM-SHA-256-PLUS");
    assert_eq!(outcome, Ok(()));
}

#[test]
fn libpq_binding_to_another_certificate_fails() {
    // The server checks against another certificate's hash, as if a man in the middle with his
    // own certificate relayed the exchange.
    let (ok, _, (mechanism, outcome)) =
        psql_login(&ecdsa_cert(), &ecdsa_cert(), PASSWORD, "require");
    assert!(!ok);
    assert_eq!(mechanism, "SCRAM-SHA-256-PLUS");
    assert_eq!(outcome, Err(ScramError::ChannelBindingMismatch));
}

#[test]
fn libpq_wrong_password_is_refused() {
    let (ok, stderr, (mechanism, outcome)) = psql_login_to(&ecdsa_cert(), "wrong", "prefer");
    assert!(!ok);
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert_eq!(mechanism, "SCRAM-SHA-256-PLUS");
    assert_eq!(outcome, Err(ScramError::AuthenticationFailed));
}

#[test]
fn libpq_without_binding_over_tls() {
    // `disable`: libpq sends `n` with plain SCRAM; accepted even though -PLUS was offered.
    let (ok, stderr, (mechanism, outcome)) = psql_login_to(&ecdsa_cert(), PASSWORD, "disable");
    assert!(ok, "{stderr}");
    assert_eq!((mechanism.as_str(), outcome), ("SCRAM-SHA-256", Ok(())));
    // Ed25519: no -PLUS offered, libpq (`prefer`) sends `y`, which is no downgrade here.
    let (ok, stderr, (mechanism, outcome)) = psql_login_to(&ed25519_cert(), PASSWORD, "prefer");
    assert!(ok, "{stderr}");
    assert_eq!((mechanism.as_str(), outcome), ("SCRAM-SHA-256", Ok(())));
}
