//! Routing through the gateway with real clients: psql over TLS (SNI, options, database name),
//! direct TLS with tokio-postgres, and the errors for conflicting or unknown tenants.

mod common;

use common::{Gateway, LOCAL_PASSWORD, backend, connections_seen};
use tokio_postgres::NoTls;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_owned()
}

#[test]
fn psql_routes_by_sni_options_and_database() {
    let pg = backend();
    let gw = Gateway::start(&pg, "", &[]);
    let user = &pg.options.user;
    for conninfo in [
        format!(
            "host=alpha.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} dbname=postgres"
        ),
        format!(
            "postgresql://{user}@127.0.0.1:{}/postgres?sslmode=require&options=endpoint%3Dalpha",
            gw.port
        ),
        format!(
            "host=127.0.0.1 sslmode=require user={user} dbname=postgres options='--tenant=alpha'"
        ),
        format!("host=127.0.0.1 sslmode=require user={user} dbname=alpha.postgres"),
        format!("host=127.0.0.1 sslmode=require user={user}.alpha dbname=postgres"),
    ] {
        let out = gw.psql(&pg, &conninfo, "select 1");
        assert_eq!(
            stdout(&out),
            "1",
            "{conninfo}: {}\n{}",
            stderr(&out),
            gw.log()
        );
    }
    // The routing parts were stripped: the backend saw the plain database and user names.
    let out = gw.psql(
        &pg,
        &format!("host=127.0.0.1 sslmode=require user={user} dbname=alpha.postgres"),
        "select current_database() || ' ' || current_user",
    );
    assert_eq!(stdout(&out), format!("postgres {user}"));
    gw.wait_idle();
}

#[test]
fn tls_to_the_backend_needs_channel_binding_off() {
    let pg = backend();
    let gw = Gateway::start(&pg, "[backend]\ntls = \"require\"", &[]);
    let user = &pg.options.user;
    let base = format!(
        "host=alpha.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} dbname=postgres"
    );
    let out = gw.psql(
        &pg,
        &format!("{base} channel_binding=disable"),
        "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
    );
    assert_eq!(stdout(&out), "t", "{}\n{}", stderr(&out), gw.log());
    // SCRAM binds to the TLS link it runs on, which ends at the gateway: the backend, which
    // offers channel binding over its own TLS link, refuses the downgrade.
    let out = gw.psql(&pg, &base, "select 1");
    assert!(stderr(&out).contains("channel binding"), "{}", stderr(&out));
    gw.wait_idle();
}

#[test]
fn conflicting_and_unknown_tenants_get_08004() {
    let pg = backend();
    // Unknown tenants are told so only when the operator chose to reveal it.
    let gw = Gateway::start(&pg, "", &[("PGWAKE_ROUTING__UNKNOWN_TENANT", "reveal")]);
    let user = &pg.options.user;
    let seen_before = connections_seen(&pg);

    let out = gw.psql(
        &pg,
        &format!("host=alpha.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} dbname=beta.postgres"),
        "select 1",
    );
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("conflicting tenant names")
            && err.contains("\"alpha\"")
            && err.contains("\"beta\""),
        "{err}"
    );

    let out = gw.psql(
        &pg,
        &format!("host=nosuch.db.localtest hostaddr=127.0.0.1 sslmode=require user={user} dbname=postgres"),
        "select 1",
    );
    let err = stderr(&out);
    assert!(err.contains("unknown or forbidden tenant"), "{err}");
    assert!(err.contains("no tenant \"nosuch\" is configured"), "{err}");
    assert!(
        err.contains("HINT") && err.contains("options=endpoint"),
        "{err}"
    );
    // A typo is named back with the tenant meant (in reveal mode only: by default it reads as a
    // wrong password, auth.rs's a_mistyped_tenant_reads_as_a_wrong_password_to_the_client_only).
    let out = gw.psql(
        &pg,
        &format!("host=127.0.0.1 sslmode=require user={user} dbname=alpah.postgres"),
        "select 1",
    );
    let err = stderr(&out);
    assert!(
        err.contains("no tenant \"alpah\" is configured")
            && err.contains("HINT:  did you mean \"alpha\"?"),
        "{err}"
    );

    // The SQLSTATE, through a driver that exposes it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let gwc = format!(
            "host=127.0.0.1 port={} user={user} password={} dbname=nosuch.postgres sslmode=disable",
            gw.port, pg.options.password
        );
        // The gateway refuses plaintext, so go through direct TLS.
        let err = connect_direct_tls(&gw, None, &gwc)
            .await
            .expect_err("refused");
        assert_eq!(err.code().map(|c| c.code()), Some("08004"), "{err}");
        let gwc = gwc.replace("nosuch.postgres", "beta.postgres");
        let err = connect_direct_tls(&gw, Some("alpha.db.localtest"), &gwc)
            .await
            .expect_err("refused");
        assert_eq!(err.code().map(|c| c.code()), Some("08004"), "{err}");
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        connections_seen(&pg),
        seen_before,
        "the backend saw a connection"
    );
    gw.wait_idle();
}

/// Opens a direct-TLS connection (ALPN postgresql, optional SNI) and runs tokio-postgres over it.
async fn connect_direct_tls(
    gw: &Gateway,
    sni: Option<&str>,
    conninfo: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    let name =
        rustls::pki_types::ServerName::try_from(sni.unwrap_or("127.0.0.1").to_owned()).unwrap();
    let connector = gw.tls_connector();
    let tls = match sni {
        Some(_) => connector.connect(name, tcp).await.unwrap(),
        // An IP address as server name sends no SNI; the cert is for names, so verify loosely.
        None => connector
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .unwrap(),
    };
    let config: tokio_postgres::Config = conninfo.parse().unwrap();
    let (client, conn) = config.connect_raw(tls, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_with_sni_routes() {
    let pg = tokio::task::spawn_blocking(backend).await.unwrap();
    let gw = Gateway::start(&pg, "", &[]);
    let conninfo = format!(
        "user={} password={} dbname=postgres sslmode=disable",
        pg.options.user, pg.options.password
    );
    let client = connect_direct_tls(&gw, Some("alpha.db.localtest"), &conninfo)
        .await
        .expect("connect through direct TLS");
    let row = client.query_one("select 1::int4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    // Extended protocol with parameters goes through the relay untouched.
    let row = client
        .query_one("select $1::text || $2::text", &[&"wa", &"ke"])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "wake");
    drop(client);
    tokio::task::spawn_blocking(move || gw.wait_idle())
        .await
        .unwrap();
}

#[test]
fn psql_without_sni_names_the_tenant_in_its_password() {
    let tenants = Gateway::local_tenants(&["alpha"], "");
    let gw = Gateway::launch_routed(
        &[],
        r#"["sni", "options", "database", "user", "password"]"#,
        "",
        &tenants,
        &[],
    );
    // host=127.0.0.1: libpq sends no SNI for an address, and no options are given.
    let psql = |password: &str, sslmode: &str| {
        std::process::Command::new(pgwake_testkit::pg_bin_dir().unwrap().join("psql"))
            .args(["-X", "-A", "-t", "-w", "-c", "select current_database()"])
            .arg(format!(
                "host=127.0.0.1 port={} sslmode={sslmode} user=pgwake dbname=postgres \
                 password='{password}'",
                gw.port
            ))
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("run psql")
    };
    // Wrong passwords, and a tenant that does not exist, get the same answer and wake nothing.
    let wrong = psql("endpoint=alpha;not-the-password", "require");
    let unknown = psql("endpoint=nosuch;not-the-password", "require");
    for out in [&wrong, &unknown] {
        assert!(
            stderr(out).contains("password authentication failed for user \"pgwake\""),
            "{}",
            stderr(out)
        );
    }
    assert_eq!(
        gw.local_starts("alpha"),
        0,
        "a wrong password woke the tenant"
    );
    for password in [
        format!("endpoint=alpha;{LOCAL_PASSWORD}"),
        format!("endpoint=alpha${LOCAL_PASSWORD}"),
    ] {
        let out = psql(&password, "require");
        assert_eq!(stdout(&out), "postgres", "{}\n{}", stderr(&out), gw.log());
    }
    // Without the prefix the client still names no tenant.
    let out = psql(LOCAL_PASSWORD, "require");
    assert!(
        stderr(&out).contains("unknown or forbidden tenant"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("endpoint=<tenant>;<password>"));
    // Over plaintext the password is never asked for in the clear.
    let log_before = gw.log().len();
    let out = psql(&format!("endpoint=alpha;{LOCAL_PASSWORD}"), "disable");
    assert!(!out.status.success());
    assert!(!gw.log()[log_before..].contains("login relayed"));
    gw.wait_idle();
}
