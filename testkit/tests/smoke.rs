use pgwake_testkit::{PgOptions, TestPostgres};

#[test]
fn starts_and_answers() {
    let pg = TestPostgres::start(PgOptions::default()).expect("start postgres");
    assert_eq!(pg.psql("select 1").unwrap(), "1");
    assert_eq!(pg.client_backends().unwrap(), 0);
}
