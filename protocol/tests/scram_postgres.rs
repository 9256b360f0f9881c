//! The SCRAM and password code against a real PostgreSQL: its stored verifiers, and logins over
//! TCP the way the gateway logs in to a backend on a user's behalf.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU8, Ordering};

use common::read_message;
use pgwake_protocol::auth::{
    md5_password, parse_authentication, password_message, sasl_initial_response, sasl_response,
};
use pgwake_protocol::backend::startup_packet;
use pgwake_protocol::scram::{
    Nonce, SCRAM_SHA_256, ScramClient, ScramKeys, ScramSecret, ScramServer,
};
use pgwake_testkit::{PgOptions, TestPostgres};
use pgwire::messages::startup::Authentication;

/// The SQLSTATE (`C` field) of an ErrorResponse body.
pub fn error_code(body: &[u8]) -> String {
    body.split(|&c| c == 0)
        .find_map(|field| field.strip_prefix(b"C"))
        .map(|code| String::from_utf8_lossy(code).into_owned())
        .unwrap_or_default()
}

fn nonce() -> Nonce {
    // Distinct nonces without a random generator: enough for a test, never for production.
    static NEXT: AtomicU8 = AtomicU8::new(0);
    Nonce::from_random([NEXT.fetch_add(1, Ordering::Relaxed); 18])
}

fn verifier(pg: &TestPostgres, user: &str) -> ScramSecret {
    let text = pg
        .psql(&format!(
            "select rolpassword from pg_authid where rolname = '{user}'"
        ))
        .unwrap();
    ScramSecret::parse(&text).unwrap()
}

/// How a login went: the authentication requests the backend made, in order.
type Requests = Vec<&'static str>;

/// Logs in as `user` over TCP answering whatever the backend asks. With SCRAM, `keys` are used
/// when they fit the backend's verifier, else keys are derived from `password`. Returns the
/// backend's SQLSTATE when it refuses.
fn login(
    pg: &TestPostgres,
    user: &str,
    password: &str,
    keys: Option<&ScramKeys>,
) -> Result<Requests, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", pg.port)).unwrap();
    let params = [
        ("user".to_owned(), user.to_owned()),
        ("database".to_owned(), "postgres".to_owned()),
    ];
    stream.write_all(&startup_packet(&params)).unwrap();
    let mut requests = Vec::new();
    let mut scram = None;
    let mut awaiting = None;
    loop {
        let (tag, body) = read_message(&mut stream).unwrap();
        match tag {
            b'E' => return Err(error_code(&body)),
            b'Z' => return Ok(requests),
            b'R' => {}
            _ => continue,
        }
        match parse_authentication(&body).unwrap() {
            Authentication::Ok => requests.push("ok"),
            Authentication::CleartextPassword => {
                requests.push("cleartext");
                stream
                    .write_all(&password_message(password.as_bytes()))
                    .unwrap();
            }
            Authentication::MD5Password(salt) => {
                requests.push("md5");
                let answer = md5_password(user, password, salt.try_into().unwrap());
                stream
                    .write_all(&password_message(answer.as_bytes()))
                    .unwrap();
            }
            Authentication::SASL(mechanisms) => {
                requests.push("sasl");
                assert!(
                    mechanisms.iter().any(|m| m == SCRAM_SHA_256),
                    "{mechanisms:?}"
                );
                let client = ScramClient::new(nonce());
                let first = client.client_first();
                stream
                    .write_all(&sasl_initial_response(SCRAM_SHA_256, &first))
                    .unwrap();
                scram = Some(client);
            }
            Authentication::SASLContinue(data) => {
                let challenge = scram.take().unwrap().handle_server_first(&data).unwrap();
                let keys = match keys {
                    Some(k) if challenge.matches(k) => {
                        requests.push("sasl-continue:kept-keys");
                        k.clone()
                    }
                    _ => {
                        requests.push("sasl-continue:password");
                        ScramKeys::from_password(password, challenge.salt(), challenge.iterations())
                    }
                };
                let (next, client_final) = challenge.client_final(&keys).unwrap();
                stream.write_all(&sasl_response(&client_final)).unwrap();
                awaiting = Some(next);
            }
            Authentication::SASLFinal(data) => {
                requests.push("sasl-final");
                awaiting.take().unwrap().verify_server_final(&data).unwrap();
            }
            other => panic!("unexpected request {other:?}"),
        }
    }
}

#[test]
fn scram_against_real_postgres() {
    let pg = TestPostgres::start(PgOptions::default()).unwrap();
    let user = pg.options.user.clone();
    let password = pg.options.password.clone();

    // (a) The stored verifier parses, formats back to the same text, and is reproduced from the
    // password with its salt and iteration count.
    let secret = verifier(&pg, &user);
    let text = pg
        .psql(&format!(
            "select rolpassword from pg_authid where rolname = '{user}'"
        ))
        .unwrap();
    assert_eq!(secret.to_string(), text);
    assert_eq!(
        ScramSecret::from_password(&password, &secret.salt, secret.iterations),
        secret
    );
    assert!(secret.verify_password(&password));

    // The gateway's server side checks a client against that verifier and recovers the
    // ClientKey: exactly the material that then logs in to Postgres without the password.
    let client = ScramClient::new(nonce());
    let (server, server_first) = ScramServer::start(
        &secret,
        None,
        nonce(),
        SCRAM_SHA_256,
        &client.client_first(),
    )
    .unwrap();
    let challenge = client.handle_server_first(&server_first).unwrap();
    let client_keys = ScramKeys::from_password(&password, challenge.salt(), challenge.iterations());
    let (awaiting, client_final) = challenge.client_final(&client_keys).unwrap();
    let (server_final, client_key) = server.finish(&client_final).unwrap();
    awaiting.verify_server_final(&server_final).unwrap();
    let recovered = secret.keys(client_key);

    // (b) Logins over TCP: with the recovered keys (no password needed) ...
    let requests = login(&pg, &user, "not the password", Some(&recovered)).unwrap();
    assert_eq!(
        requests,
        ["sasl", "sasl-continue:kept-keys", "sasl-final", "ok"]
    );
    // ... with keys derived from the password for the server's salt ...
    let requests = login(&pg, &user, &password, None).unwrap();
    assert_eq!(
        requests,
        ["sasl", "sasl-continue:password", "sasl-final", "ok"]
    );
    // ... and a wrong password is refused by Postgres with 28P01.
    assert_eq!(login(&pg, &user, "wrong", None).unwrap_err(), "28P01");

    // After a password change the kept keys no longer fit (new salt): the password is needed.
    pg.psql(&format!("alter role {user} password 'changed'"))
        .unwrap();
    let requests = login(&pg, &user, "changed", Some(&recovered)).unwrap();
    assert_eq!(requests[1], "sasl-continue:password");
    // Same salt and iterations but another password: the keys fit the challenge, and the backend
    // refuses the proof.
    let changed = verifier(&pg, &user);
    let stale = ScramKeys::from_password("stale", &changed.salt, changed.iterations);
    assert_eq!(login(&pg, &user, "", Some(&stale)).unwrap_err(), "28P01");
}

#[test]
fn md5_cleartext_and_trust_backends() {
    let pg = TestPostgres::start(PgOptions::default()).unwrap();
    pg.psql("set password_encryption = 'md5'; create role md5_user login password 'md5 secret'")
        .unwrap();
    pg.psql("create role cleartext_user login password 'plain secret'")
        .unwrap();
    pg.psql("create role trust_user login").unwrap();
    // First matching line wins: put per-user methods before initdb's scram-sha-256 lines.
    let hba = pg.data_dir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    let lines = "host all md5_user 127.0.0.1/32 md5\n\
                 host all cleartext_user 127.0.0.1/32 password\n\
                 host all trust_user 127.0.0.1/32 trust\n";
    std::fs::write(&hba, format!("{lines}{old}")).unwrap();
    pg.psql("select pg_reload_conf()").unwrap();
    assert!(
        pg.psql("select rolpassword from pg_authid where rolname = 'md5_user'")
            .unwrap()
            .starts_with("md5")
    );

    // The reload is asynchronous: retry until the new rules apply.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while login(&pg, "trust_user", "", None) != Ok(vec!["ok"]) {
        assert!(
            std::time::Instant::now() < deadline,
            "pg_hba.conf not reloaded"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        login(&pg, "md5_user", "md5 secret", None),
        Ok(vec!["md5", "ok"])
    );
    assert_eq!(login(&pg, "md5_user", "wrong", None), Err("28P01".into()));
    assert_eq!(
        login(&pg, "cleartext_user", "plain secret", None),
        Ok(vec!["cleartext", "ok"])
    );
    assert_eq!(
        login(&pg, "cleartext_user", "wrong", None),
        Err("28P01".into())
    );
}
