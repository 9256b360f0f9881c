//! The status page at `/` on the admin listener, loaded in a real headless Chromium: it shows
//! each tenant's state from the JSON API (which its same-origin fetch may use despite the API's
//! refusal of web pages), and asks for the token when the API has one.
//!
//! Chromium comes from Debian's `chromium` package (`.ci/run` installs it); without it these
//! tests are skipped, except in CI (`CI=true`), where they fail.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Gateway;

/// How long one Chromium run may take before the test gives up on it.
const BROWSER_LIMIT: Duration = Duration::from_secs(90);

/// The Chromium to drive, or `None` (with a message) when there is none outside CI.
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        let hint = "`chromium` is needed (apt-get install chromium)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{hint}: .ci/run installs it"
        );
        // Straight to stderr, past the test harness's capture, so the skip shows in the log.
        let _ = writeln!(std::io::stderr(), "status page test SKIPPED: {hint}");
    }
    found
}

/// Loads `url` in headless Chromium for a few seconds of page time (the page polls its API
/// meanwhile); returns the DOM it ended with, or writes a screenshot when `screenshot` is set.
fn browse(browser: &str, url: &str, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(file) => cmd
            .arg(format!("--screenshot={}", file.display()))
            .arg("--window-size=1280,800"),
        None => cmd.arg("--dump-dom"),
    };
    let mut child = cmd
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + BROWSER_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish within {BROWSER_LIMIT:?}: {}",
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.success(), "chromium failed ({status}): {err}");
    out
}

/// Where a screenshot goes: kept after the test, as its artifact.
fn artifact(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn take_screenshot(browser: &str, url: &str, name: &str) -> PathBuf {
    let path = artifact(name);
    browse(browser, url, Some(&path));
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    assert!(size > 10_000, "no real screenshot at {}", path.display());
    println!("status page screenshot: {}", path.display());
    path
}

/// A session on `tenant`, checked with a first query, kept open until dropped.
async fn session(gw: &Gateway, tenant: &str) -> tokio_postgres::Client {
    let client = common::local_session(gw, tenant).await;
    let row = client.query_one("select 1::int4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    client
}

/// Puts a tenant to sleep through the admin API, once its last session has gone.
fn put_to_sleep(gw: &Gateway, tenant: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = gw
            .http("POST", &format!("/v1/tenants/{tenant}/sleep"))
            .unwrap();
        if status == 200 {
            return;
        }
        assert!(
            status == 409 && Instant::now() < deadline,
            "sleep: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn json(gw: &Gateway, path: &str) -> serde_json::Value {
    let (status, body) = gw.http_get(path).unwrap();
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_shows_each_tenant_in_chromium() {
    let Some(browser) = chromium() else { return };
    // `analytics` has run daily for a week and opted in to the widest prediction there is.
    let history = tempfile::tempdir().unwrap();
    let history_file = daily_history(history.path(), "analytics");
    let extra = format!(
        "allow_plaintext = true\n[wake]\npredict_history_file = \"{}\"\n",
        history_file.display()
    );
    let tenants = Gateway::local_tenants(&["billing", "shop"], "")
        + "[[tenant]]\nid = \"analytics\"\nbackend = { kind = \"local\" }\n\
           predict = \"wake_and_sleep\"\n";
    let gw = tokio::task::spawn_blocking(move || Gateway::launch(&extra, &tenants, &[]))
        .await
        .unwrap();
    // A few wakes of `shop` for its latency history, then a session that stays.
    for _ in 0..3 {
        drop(session(&gw, "shop").await);
        tokio::task::block_in_place(|| put_to_sleep(&gw, "shop"));
    }
    let _open = session(&gw, "shop").await;
    // The rest is blocking (the admin API over std sockets, Chromium); the session's
    // connection task runs on another worker meanwhile.
    tokio::task::block_in_place(|| check_page(&gw, browser));

    // Every column, the prediction last, can be read at common screen widths; narrower, the
    // table scrolls inside its panel to show it.
    let url = format!("http://127.0.0.1:{}/", gw.admin);
    let mut tab = Devtools::open(browser, &url).await;
    tab.wait_for("document.querySelector('td[data-predict=\"wake_and_sleep\"]') !== null")
        .await;
    for width in [1280, 1400, 1920] {
        let clipped = tab.last_column_clipped(width, false).await;
        assert_eq!(clipped, "", "the last column is cut off at {width} px");
        tab.screenshot(&format!("status_page_{width}.png")).await;
    }
    let clipped = tab.last_column_clipped(720, false).await;
    assert_ne!(clipped, "", "720 px is too narrow for every column");
    let clipped = tab.last_column_clipped(720, true).await;
    assert_eq!(
        clipped, "",
        "at 720 px the last column cannot be scrolled to"
    );
}

/// Writes a run history file in `dir` in which `tenant` started a run at the same time every
/// day for the past eight days, the next one due in an hour.
fn daily_history(dir: &Path, tenant: &str) -> PathBuf {
    const DAY: u64 = 86_400;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let newest = now + 3_600 - DAY;
    let starts: Vec<u64> = (0..8).rev().map(|d| newest - d * DAY).collect();
    let path = dir.join("runs.json");
    let text = serde_json::json!({ "tenants": { tenant: starts } }).to_string();
    std::fs::write(&path, text).unwrap();
    path
}

/// Finds the last column's cells (its header and each tenant's) that are not wholly inside what
/// can be seen: the window and every box around them that clips. With `scroll`, every box that
/// scrolls sideways is first scrolled to its end, as a reader would.
const LAST_COLUMN_CLIPPED: &str = r##"(scroll) => {
  const view = document.documentElement;
  const cells = [...document.querySelectorAll("#main thead th:last-child, #tenants td:last-child")];
  if (cells.length < 2) return "no last column";
  const clipping = (node) => {
    const boxes = [];
    for (let a = node.parentElement; a && a !== view; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") boxes.push(a);
    }
    return boxes;
  };
  if (scroll) {
    for (const box of clipping(cells[0])) {
      if (["auto", "scroll"].includes(getComputedStyle(box).overflowX)) box.scrollLeft = box.scrollWidth;
    }
  }
  const problems = [];
  for (const cell of cells) {
    const r = cell.getBoundingClientRect();
    let left = 0, right = view.clientWidth;
    for (const box of clipping(cell)) {
      const b = box.getBoundingClientRect();
      left = Math.max(left, b.left + box.clientLeft);
      right = Math.min(right, b.left + box.clientLeft + box.clientWidth);
    }
    if (r.left < left - 0.5 || r.right > right + 0.5 || cell.scrollWidth > cell.clientWidth) {
      problems.push(`"${cell.innerText.replace(/\s+/g, " ").trim()}" spans ${Math.round(r.left)}..${Math.round(r.right)} px, ` +
        `${cell.scrollWidth} px of content in ${cell.clientWidth}; visible: ${Math.round(left)}..${Math.round(right)} px`);
    }
  }
  return problems.join("\n");
}"##;

/// Checks the JSON the page reads, the page, and what Chromium shows of it; `shop` has been
/// woken four times and has one open session, `billing` is woken here, `analytics` sleeps.
fn check_page(gw: &Gateway, browser: &str) {
    let (status, _) = gw.http("POST", "/v1/tenants/billing/wake").unwrap();
    assert_eq!(status, 200);

    // What the page reads: the new fields of /v1/tenants and /v1/summary.
    let tenants = json(gw, "/v1/tenants");
    let shop = tenants
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "shop")
        .unwrap();
    assert_eq!(shop["state"], "awake");
    assert_eq!(shop["connections"], 1);
    assert_eq!(shop["parked"], 0);
    let wakes = shop["wakes"].as_array().unwrap();
    assert_eq!(wakes.len(), 4, "{shop}");
    assert!(
        wakes
            .iter()
            .all(|w| w["ok"] == true && w["ms"].as_f64() > Some(0.0))
    );
    assert_eq!(shop["last_wake_at"], wakes[3]["at"]);
    assert_eq!(shop["last_wake_ms"], wakes[3]["ms"]);
    let summary = json(gw, "/v1/summary");
    assert_eq!(summary["tenants"], 3);
    assert_eq!(summary["wakes_ok"], 5, "{summary}");
    assert_eq!(summary["connections_active"], 1, "{summary}");
    assert!(summary["uptime_s"].as_f64() > Some(0.0), "{summary}");

    // The page itself: one self-contained document, nothing loaded from elsewhere.
    let (status, page) = gw.http_get("/").unwrap();
    assert_eq!(status, 200);
    assert!(page.contains("<title>pgwake status</title>"));
    for external in [
        "http://",
        "https://",
        "//fonts",
        "<script src",
        "<link rel=\"stylesheet\"",
    ] {
        let outside = page
            .match_indices(external)
            .any(|(i, _)| !page[i..].starts_with("http://www.w3.org/2000/svg"));
        assert!(!outside, "the page refers to {external}");
    }

    let url = format!("http://127.0.0.1:{}/", gw.admin);
    let dom = browse(browser, &url, None);
    assert!(
        dom.contains(r#"<tr data-tenant="shop" data-state="awake">"#),
        "shop is not shown awake:\n{dom}"
    );
    assert!(dom.contains(r#"<tr data-tenant="billing" data-state="awake">"#));
    assert!(dom.contains(r#"<tr data-tenant="analytics" data-state="asleep">"#));
    assert!(dom.contains(r#"<span class="badge awake">awake</span>"#));
    assert!(dom.contains("1 / 0"), "shop's one active session");
    assert!(
        dom.contains("median ") && dom.contains(r#"class="bar""#),
        "no wake latency bars"
    );
    // The others take the default policy, and none has runs enough for a pattern.
    assert!(
        dom.contains(r#"<td data-predict="wake">"#)
            && dom.contains("<span>no pattern</span>")
            && dom.contains("predict: wake"),
        "no prediction column:\n{dom}"
    );
    // `analytics`'s daily runs are shown with the next one due.
    let analytics = gw.tenant("analytics");
    assert_eq!(analytics["predict"], "wake_and_sleep", "{analytics}");
    assert_eq!(analytics["runs"]["pattern"]["kind"], "daily", "{analytics}");
    assert!(analytics["runs"]["next_run"].is_number(), "{analytics}");
    assert!(
        dom.contains(r#"<td data-predict="wake_and_sleep">in "#)
            && dom.contains(" UTC</span> · <span>every day</span>")
            && dom.contains("predict: wake and sleep"),
        "no prediction for analytics:\n{dom}"
    );
    assert!(
        dom.contains(r#"<section id="auth" hidden="">"#),
        "no token asked"
    );
    take_screenshot(browser, &url, "status_page.png");
}

/// A tenant kept awake past its idle timeout by a session holding an advisory lock: the page
/// names the pinned session, its pin, its application and its address.
#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_says_which_pinned_session_keeps_a_tenant_awake() {
    let Some(browser) = chromium() else { return };
    let config = "allow_plaintext = true
[wake]
idle_timeout = \"1s\"
idle_check_interval = \"100ms\"
[revival]
snapshot_after = \"200ms\"
";
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["shop"], config, "", &[]))
        .await
        .unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=pgwake password={} dbname=shop.postgres sslmode=disable \
         application_name=nightly-report",
        gw.port,
        common::LOCAL_PASSWORD
    );
    let locker = common::connect_plain(&conninfo).await;
    locker
        .query_one("select pg_advisory_lock(42)", &[])
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        // Past the idle timeout, still awake, and the API says why.
        let deadline = Instant::now() + Duration::from_secs(20);
        let pinned = loop {
            let shop = gw.tenant("shop");
            let pinned = &shop["awake_because"]["pinned"];
            if pinned.as_array().is_some_and(|p| p.len() == 1) {
                break pinned[0].clone();
            }
            assert!(Instant::now() < deadline, "no pinned session: {shop}");
            std::thread::sleep(Duration::from_millis(50));
        };
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(gw.tenant_state("shop").0, "awake");
        assert_eq!(pinned["application_name"], "nightly-report");
        let client = pinned["client"].as_str().unwrap().to_owned();

        let url = format!("http://127.0.0.1:{}/", gw.admin);
        let dom = browse(browser, &url, None);
        let row = dom
            .split(r#"<tr data-tenant="shop""#)
            .nth(1)
            .and_then(|r| r.split("</tr>").next())
            .unwrap_or_else(|| panic!("no row for shop:\n{dom}"));
        let said = format!(
            r#"<div class="pin" data-pin="advisory_lock">pinned session "nightly-report" from {client}: session advisory lock, since "#
        );
        assert!(row.contains(&said), "{said} not in shop's row:\n{row}");
        take_screenshot(browser, &url, "status_page_pinned.png");
    });
    drop(locker);
}

/// A headless Chromium driven over the DevTools protocol (its WebSocket on loopback), for what
/// the command line cannot do: type into the page. The browser is stopped on drop.
struct Devtools {
    ws: common::Ws,
    next_id: u64,
    session: String,
    browser: tokio::process::Child,
    _profile: tempfile::TempDir,
}

impl Devtools {
    /// Starts the browser and opens `url` in a tab.
    async fn open(browser: &str, url: &str) -> Devtools {
        use tokio::io::AsyncBufReadExt;
        let profile = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1280,800",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromium");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let address = tokio::time::timeout(BROWSER_LIMIT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(a) = line.strip_prefix("DevTools listening on ") {
                    return a.trim().to_owned();
                }
            }
            panic!("chromium ended without its DevTools address");
        })
        .await
        .expect("chromium's DevTools address in time");
        // Chromium keeps writing to stderr; a full pipe would stall it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let host = address
            .strip_prefix("ws://")
            .and_then(|a| a.split('/').next())
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(host).await.unwrap();
        let (ws, _) = tokio_tungstenite::client_async(address.as_str(), tcp)
            .await
            .expect("DevTools handshake");
        let mut dt = Devtools {
            ws,
            next_id: 0,
            session: String::new(),
            browser: child,
            _profile: profile,
        };
        let target = dt
            .call("Target.createTarget", serde_json::json!({ "url": url }))
            .await;
        let attached = dt
            .call(
                "Target.attachToTarget",
                serde_json::json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        dt.session = attached["sessionId"].as_str().unwrap().to_owned();
        dt
    }

    /// Sends one command (to the tab once attached) and returns its result.
    async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        self.next_id += 1;
        let mut command =
            serde_json::json!({ "id": self.next_id, "method": method, "params": params });
        if !self.session.is_empty() {
            command["sessionId"] = self.session.clone().into();
        }
        self.ws
            .send(Message::text(command.to_string()))
            .await
            .unwrap();
        loop {
            let next = tokio::time::timeout(BROWSER_LIMIT, self.ws.next()).await;
            let Some(Ok(Message::Text(text))) = next.expect("a DevTools answer in time") else {
                continue;
            };
            let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
            if answer["id"] == self.next_id {
                assert!(answer["error"].is_null(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    async fn eval(&mut self, expression: &str) -> serde_json::Value {
        let result = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({ "expression": expression, "returnByValue": true }),
            )
            .await;
        result["result"]["value"].clone()
    }

    /// Waits until a JavaScript expression is true in the page.
    async fn wait_for(&mut self, expression: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.eval(expression).await != true {
            assert!(
                Instant::now() < deadline,
                "the page never showed `{expression}`; it says: {}",
                self.eval("document.body.innerText").await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lays the page out `width` CSS pixels wide and says which cells of the table's last
    /// column cannot be seen whole (empty when all can): see [`LAST_COLUMN_CLIPPED`].
    async fn last_column_clipped(&mut self, width: u32, scroll: bool) -> String {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            serde_json::json!({ "width": width, "height": 800, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
        let clipped = self
            .eval(&format!("({LAST_COLUMN_CLIPPED})({scroll})"))
            .await;
        clipped.as_str().expect("the check's report").to_owned()
    }

    /// Types into the token field and submits it.
    async fn enter_token(&mut self, token: &str) {
        let script = format!(
            "document.getElementById('token').value = {}; \
             document.getElementById('auth-form').requestSubmit(); true",
            serde_json::Value::from(token)
        );
        assert_eq!(self.eval(&script).await, true);
    }

    /// Saves a PNG of the tab.
    async fn screenshot(&mut self, name: &str) -> PathBuf {
        use base64::Engine;
        let shot = self
            .call("Page.captureScreenshot", serde_json::json!({}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        let path = artifact(name);
        std::fs::write(&path, png).unwrap();
        println!("status page screenshot: {}", path.display());
        path
    }
}

impl Drop for Devtools {
    fn drop(&mut self) {
        let _ = self.browser.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_asks_for_the_admin_token() {
    let Some(browser) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin-token");
    let token = "status-page-test-token";
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let extra = format!(
        "allow_plaintext = true\n[admin]\ntoken_file = \"{}\"\n",
        token_file.display()
    );
    let gw = tokio::task::spawn_blocking(move || Gateway::start_local(&["shop"], &extra, "", &[]))
        .await
        .unwrap();
    let url = format!("http://127.0.0.1:{}/", gw.admin);
    tokio::task::block_in_place(|| {
        // The page loads without the token and carries no secret; its data needs the token.
        let (status, page) = gw.http_get("/").unwrap();
        assert_eq!(status, 200);
        assert!(!page.contains(token));
        assert_eq!(gw.http_get("/v1/summary").unwrap().0, 401);

        let dom = browse(browser, &url, None);
        assert!(
            dom.contains(r#"<section id="auth">"#) && dom.contains("This admin API needs a token"),
            "the page does not ask for the token:\n{dom}"
        );
        assert!(dom.contains(r#"<main id="main" hidden="">"#));
        assert!(
            !dom.contains("data-tenant="),
            "tenants shown without the token"
        );
        take_screenshot(browser, &url, "status_page_token.png");
    });

    // Typed into the page: a wrong token is refused and forgotten, the right one shows the
    // tenants and stays in the tab's sessionStorage only.
    let mut tab = Devtools::open(browser, &url).await;
    tab.wait_for("document.getElementById('live-text').textContent === 'token needed'")
        .await;
    tab.enter_token("wrong").await;
    tab.wait_for("!document.getElementById('auth-error').hidden")
        .await;
    assert_eq!(
        tab.eval("sessionStorage.getItem('pgwake.adminToken')")
            .await,
        serde_json::Value::Null
    );
    tab.enter_token(token).await;
    tab.wait_for("document.querySelector('tr[data-tenant=\"shop\"]') !== null")
        .await;
    assert_eq!(
        tab.eval("document.getElementById('auth').hidden").await,
        true
    );
    assert_eq!(
        tab.eval("sessionStorage.getItem('pgwake.adminToken')")
            .await,
        token
    );
    assert_eq!(
        tab.eval("localStorage.length").await,
        0,
        "nothing kept beyond the tab"
    );
    tab.screenshot("status_page_with_token.png").await;
}
