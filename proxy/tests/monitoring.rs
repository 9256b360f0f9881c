//! `deploy/monitoring/` against a running gateway: every metric the Grafana dashboard and the
//! Prometheus alerts query is one the gateway exports, the series each alert selects exist (at
//! zero) from the first scrape, so `increase()` sees the first event, and both files are shaped
//! the way Grafana and the Prometheus Operator expect.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Gateway;
use pgwake_testkit::kube::{deploy_dir, parse_manifests};
use serde_json::Value;

fn dashboard() -> Value {
    let path = deploy_dir().join("monitoring/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rule_file() -> Value {
    let path = deploy_dir().join("monitoring/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut docs = parse_manifests(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(docs.len(), 1, "one PrometheusRule");
    docs.remove(0)
}

/// Every PromQL query of the dashboard: panel targets and template variable queries.
fn dashboard_queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query" | "definition", Value::String(q)) => out.push(q.clone()),
                    _ => dashboard_queries(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| dashboard_queries(i, out)),
        _ => {}
    }
}

/// Every alerting rule as (name, rule).
fn rules(file: &Value) -> Vec<(String, Value)> {
    file["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| (r["alert"].as_str().expect("alert").to_owned(), r.clone()))
        .collect()
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The `pgwake_*` metric names a PromQL expression uses, each with the equality matchers
/// (`label="value"`) of its selector.
fn selectors(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("pgwake_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c| !is_name_char(c)).unwrap_or(tail.len());
        let (name, after) = tail.split_at(end);
        rest = after;
        if before.is_some_and(is_name_char) {
            continue;
        }
        let mut matchers = Vec::new();
        if let Some(body) = after.strip_prefix('{').and_then(|b| b.split_once('}')) {
            for m in body.0.split(',') {
                // Only plain equality selects one series; `=~` and `!=` select several.
                if let Some((k, v)) = m.split_once('=')
                    && !k.ends_with('!')
                    && !v.starts_with('~')
                {
                    matchers.push((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()));
                }
            }
        }
        found.push((name.to_owned(), matchers));
    }
    found
}

/// One scrape of `/metrics`: family types by name, and samples as (name, labels, value).
struct Exposition {
    types: HashMap<String, String>,
    samples: Vec<(String, HashMap<String, String>, f64)>,
}

impl Exposition {
    fn scrape(gw: &Gateway) -> Exposition {
        let (status, text) = gw.http_get("/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{text}");
        let mut types = HashMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix("# TYPE ") {
                let (name, kind) = decl.split_once(' ').expect("# TYPE name kind");
                types.insert(name.to_owned(), kind.to_owned());
            } else if !line.starts_with('#') && !line.is_empty() {
                let (series, value) = line.rsplit_once(' ').expect("series value");
                let (name, labels) = match series.split_once('{') {
                    Some((n, l)) => (n, l.trim_end_matches('}')),
                    None => (series, ""),
                };
                let labels = labels
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                    .collect();
                samples.push((name.to_owned(), labels, value.parse().expect("a number")));
            }
        }
        Exposition { types, samples }
    }

    /// The family a sample name belongs to: itself, or the histogram it is a `_bucket`, `_sum`
    /// or `_count` series of.
    fn family<'a>(&self, name: &'a str) -> Option<&'a str> {
        if self.types.contains_key(name) {
            return Some(name);
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let family = name.strip_suffix(suffix)?;
            (self.types.get(family).map(String::as_str) == Some("histogram")).then_some(family)
        })
    }

    /// The value of the sample `name` whose labels include every matcher, if exported.
    fn value(&self, name: &str, matchers: &[(String, String)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, labels, _)| {
                n == name
                    && matchers
                        .iter()
                        .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
            })
            .map(|(_, _, v)| *v)
    }
}

/// `POST /sql` of `select 1` on tenant `alpha` with a wrong password; returns the status.
fn post_sql_wrong_password(http: u16) -> u16 {
    let body = br#"{"query": "select 1", "params": []}"#;
    let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n\
         Neon-Connection-String: postgresql://pgwake:wrong@alpha.{}:5432/postgres\r\n\
         Content-Length: {}\r\n\r\n",
        common::SNI_SUFFIX,
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_dashboard_and_the_alerts_are_well_formed() {
    let dash = dashboard();
    assert_eq!(dash["uid"], "pgwake-gateway");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let id = panel["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} used twice");
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("title");
        assert!(panel["description"].is_string(), "{title}: a description");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(
                t["expr"].as_str().is_some_and(|e| e.contains("pgwake_")),
                "{title}: {t}"
            );
        }
    }
    let variables: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "instance"]);

    let file = rule_file();
    assert_eq!(file["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(file["kind"], "PrometheusRule");
    let rules = rules(&file);
    let names: BTreeSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), rules.len(), "alert names are unique");
    for expected in [
        "PgwakeWakeFailures",
        "PgwakeWakeSlow",
        "PgwakeWakeQueueFull",
        "PgwakeLoginsThrottled",
        "PgwakeRevivalFailures",
    ] {
        assert!(names.contains(expected), "{expected} in {names:?}");
    }
    for (name, rule) in &rules {
        assert!(rule["expr"].as_str().is_some_and(|e| e.contains("pgwake_")));
        let wait = rule["for"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: for"));
        humantime::parse_duration(wait).unwrap_or_else(|e| panic!("{name}: for {wait}: {e}"));
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name}: annotation {key}"
            );
        }
    }
}

#[test]
fn every_metric_queried_is_exported_and_alerted_series_exist_from_the_first_scrape() {
    let http = pgwake_testkit::free_port();
    let extra = format!("allow_plaintext = true\nhttp = \"127.0.0.1:{http}\"\n");
    let gw = Gateway::start_local(&["alpha"], &extra, "", &[]);

    // Before anything happened: every series an alert selects is there, at zero.
    let first = Exposition::scrape(&gw);
    let rules = rules(&rule_file());
    for (alert, rule) in &rules {
        for (name, matchers) in selectors(rule["expr"].as_str().unwrap()) {
            let value = first.value(&name, &matchers).unwrap_or_else(|| {
                panic!("{alert}: no {name} {matchers:?} at the first scrape (labels never used?)")
            });
            assert_eq!(value, 0.0, "{alert}: {name} {matchers:?}");
        }
    }

    // A refused SQL-over-HTTP request: the one family only a request creates, and a refusal
    // on the way to the database counted by kind as a TCP login's is (53300 for a full wake
    // queue takes the same path as this 28P01).
    assert_eq!(post_sql_wrong_password(http), 400);
    let after = Exposition::scrape(&gw);
    assert_eq!(
        after.value(
            "pgwake_http_requests_total",
            &[("status".into(), "400".into())]
        ),
        Some(1.0)
    );
    assert_eq!(
        after.value(
            "pgwake_errors_total",
            &[("kind".into(), "auth_failed".into())]
        ),
        Some(1.0)
    );

    let mut queries = Vec::new();
    dashboard_queries(&dashboard(), &mut queries);
    queries.extend(
        rules
            .iter()
            .map(|(_, r)| r["expr"].as_str().unwrap().to_owned()),
    );
    let mut used = BTreeSet::new();
    for q in &queries {
        for (name, _) in selectors(q) {
            let family = after.family(&name).unwrap_or_else(|| {
                panic!("{name} (in {q}) is not exported:\n{:?}", after.types.keys())
            });
            assert!(
                after.samples.iter().any(|(n, _, _)| n == &name),
                "{name} (family {family}) has no sample"
            );
            used.insert(family.to_owned());
        }
    }
    // The dashboard covers every family the gateway exports.
    let unused: Vec<&String> = after.types.keys().filter(|f| !used.contains(*f)).collect();
    assert!(unused.is_empty(), "exported but on no panel: {unused:?}");
}

#[test]
fn selectors_are_read_from_promql() {
    let found = selectors(
        "sum by (le) (rate(pgwake_wake_duration_seconds_bucket{instance=~\"$i\",outcome=\"ok\"}[5m])) \
         / x_pgwake_other + absent(pgwake_connections_active)",
    );
    assert_eq!(
        found,
        [
            (
                "pgwake_wake_duration_seconds_bucket".to_owned(),
                vec![("outcome".to_owned(), "ok".to_owned())]
            ),
            ("pgwake_connections_active".to_owned(), vec![]),
        ]
    );
}
