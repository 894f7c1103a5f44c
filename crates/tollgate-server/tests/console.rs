//! The console in a real browser: headless Chromium driven over WebDriver (chromedriver) from
//! `cargo test`, against the service on Postgres. Fails, never skips, when Chromium or
//! chromedriver is missing (`.ci/run` installs them).
//!
//! Screenshots of every page are written under `target/console-screenshots/`.
#![cfg(test)]

mod support;

use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use rust_decimal::Decimal;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{admin_url, call, Server};
use tollgate_core::ids::Scope;
use tollgate_server::Backend;
use tollgate_store::KeyRole;
use tollgate_testkit::pg::TestDatabase;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Sent as message content in calls; must appear on no console page, asset or read.
const CANARY: &str = "canary-console-9d41e7-never-shown";
/// Longest wait for the browser, chromedriver or a download.
const WAIT: Duration = Duration::from_secs(30);
/// A provider on the Responses protocol (its finished responses can be fetched) and a profile
/// whose stream is cut after the response id, before any usage.
const RESPONSES_PROFILE: &str = r#"
[[providers]]
name = "mock-responses"
kind = "openai-responses"
base_url = "{mock_url}"

[[profiles]]
name = "cut-responses"
kind = "text"
provider = "mock-responses"
model = "mock-cut-before-usage"
policy_version = "policy-1"
price_version = "prices-t"
consumer = "team-a"
max_tokens = 64
max_input_chars = 200
run_timeout_ms = 10000
"#;

/// chromedriver on a free loopback port, ended when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver() -> Driver {
    for binary in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(binary).exists(),
            "{binary} is missing: apt-get install -y chromium chromium-driver (the console test \
             needs a real browser and never skips)"
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let driver = Driver { child, url };
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let ready = http
            .get(format!("{}/status", driver.url))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        if ready.is_some() {
            return driver;
        }
        assert!(started.elapsed() < WAIT, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn browser(driver: &Driver, downloads: &Path) -> Client {
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1100", "--no-first-run", "--disable-extensions"],
            "prefs": {
                "download.default_directory": downloads.to_str().unwrap(),
                "download.prompt_for_download": false,
                "download.directory_upgrade": true,
                "safebrowsing.enabled": false
            }
        }
    });
    let Value::Object(capabilities) = capabilities else {
        unreachable!()
    };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .unwrap()
}

fn screenshots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(screenshots_dir().join(format!("{name}.png")), png).unwrap();
}

/// Waits until `#view` shows `page` rendered (the script marks it when its data arrived).
async fn wait_page(client: &Client, page: &str) {
    let css = format!("#view[data-page='{page}'][data-ready]");
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(&css))
        .await
        .unwrap_or_else(|e| panic!("page {page} did not render: {e}"));
}

async fn open_page(client: &Client, page: &str) {
    client
        .execute(
            "document.getElementById('view').removeAttribute('data-page'); location.hash = arguments[0];",
            vec![json!(format!("#{page}"))],
        )
        .await
        .unwrap();
    let page = page.split('/').next().unwrap();
    wait_page(client, page).await;
}

async fn text_of(client: &Client, css: &str) -> String {
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// Pastes `key` into the key form (after forgetting any key the tab holds).
async fn sign_in(client: &Client, base: &str, key: &str) {
    client.goto(&format!("{base}/console")).await.unwrap();
    client
        .execute("sessionStorage.clear(); location.hash = '';", vec![])
        .await
        .unwrap();
    client.refresh().await.unwrap();
    let input = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#login:not([hidden]) #key"))
        .await
        .unwrap();
    input.send_keys(key).await.unwrap();
    client
        .find(Locator::Css("#key-open"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Every resource the current document loaded (resource timing), with its own URL.
async fn loaded_urls(client: &Client) -> Vec<String> {
    let names = client
        .execute(
            "return [location.href].concat(performance.getEntriesByType('navigation').map(e => e.name), performance.getEntriesByType('resource').map(e => e.name));",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(names).unwrap()
}

/// No load of the current document was blocked by the Content-Security-Policy.
async fn assert_no_policy_violation(client: &Client) {
    let count = client
        .execute(
            "return document.body.getAttribute('data-csp-violations');",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(count, Value::Null, "the policy blocked {count} loads");
}

fn assert_same_origin(urls: &[String], base: &str) {
    assert!(!urls.is_empty());
    for url in urls {
        assert!(
            url.starts_with(&format!("{base}/")),
            "a request went to another origin: {url}"
        );
    }
}

/// `team-a`'s settled and held amounts on the overview.
async fn team_a_spend(client: &Client) -> (Decimal, Decimal) {
    open_page(client, "overview").await;
    let settled = text_of(client, "#spend tr[data-consumer='team-a'] td.settled").await;
    let held = text_of(client, "#spend tr[data-consumer='team-a'] td.held").await;
    (
        Decimal::from_str(&settled).unwrap(),
        Decimal::from_str(&held).unwrap(),
    )
}

async fn key(s: &Server, role: KeyRole) -> String {
    let scope = Scope::parse("acme").unwrap();
    s.keys
        .create(&scope, role)
        .await
        .unwrap()
        .expose()
        .to_string()
}

async fn wait_for_download(dir: &Path) -> PathBuf {
    let started = Instant::now();
    loop {
        let done = std::fs::read_dir(dir).unwrap().flatten().find(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.ends_with(".csv")
        });
        if let Some(entry) = done {
            return entry.path();
        }
        assert!(started.elapsed() < WAIT, "no CSV was downloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An exact amount in its shortest form (`0.000050000000` and `0.00005` are one amount).
fn exact(amount: &str) -> String {
    Decimal::from_str(amount).unwrap().normalize().to_string()
}

/// `(execution_id, amount, source)` of each CSV row (the columns of `finance.settlements`).
fn csv_rows(text: &str) -> BTreeSet<(String, String, String)> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (id, amount, source) = (at("execution_id"), at("amount"), at("source"));
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (
                fields[id].to_string(),
                exact(fields[amount]),
                fields[source].to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_147_sc_148_sc_149_sc_153_sc_154_sc_155_sc_158_sc_159_the_console_in_a_real_browser() {
    let driver = start_driver().await;
    let db = TestDatabase::create(&admin_url()).await.unwrap();
    let stores = db.stores(4).await.unwrap();
    stores.migrate().await.unwrap();
    let stores = Arc::new(stores);
    let s = Server::start_with(Backend::Postgres(stores), RESPONSES_PROFILE).await;
    let base = s.base.clone();
    let operator = key(&s, KeyRole::Operator).await;
    let finance = key(&s, KeyRole::Finance).await;
    let doomed = key(&s, KeyRole::Caller).await;

    // Calls whose content carries the canary: three settle, one is cut and awaits an operator.
    for n in 0..3 {
        let body = call("summarize", &format!("order-{n}"), "r", CANARY);
        let (status, view, _) = s.post("/v1/calls", &s.caller, &body).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        assert_eq!(view["state"], "completed");
    }
    let (_, echoed, _) = s.get("/v1/calls/order-0", &s.caller).await;
    assert!(
        echoed.to_string().contains(CANARY),
        "the canary is stored, so its absence below means something"
    );
    let (status, cut, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("cut", "order-cut", "r", CANARY),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cut}");
    assert_eq!(cut["state"], "reconciliation_required");
    // Cut on the Responses protocol after the response id: its usage can be fetched later.
    let (status, cut_r, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("cut-responses", "order-evidence", "r", CANARY),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cut_r}");
    assert_eq!(cut_r["state"], "reconciliation_required");

    let downloads = tempdir();
    let client = browser(&driver, &downloads).await;
    let mut sources = Vec::new();

    // SC-153: a caller key is refused.
    sign_in(&client, &base, &s.caller).await;
    let refused = text_of(&client, "#error:not([hidden])").await;
    assert!(refused.contains("may not open the console"), "{refused}");
    assert!(client
        .find_all(Locator::Css("#nav a"))
        .await
        .unwrap()
        .is_empty());
    screenshot(&client, "refused").await;

    // SC-154: an operator resolves a backlog item; the overview's spend moves by its amount.
    sign_in(&client, &base, &operator).await;
    wait_page(&client, "overview").await;
    let (settled_before, held_before) = team_a_spend(&client).await;
    assert!(
        held_before > Decimal::ZERO,
        "the cut calls hold their worst case"
    );
    assert_eq!(text_of(&client, "#backlog-count").await, "2");
    screenshot(&client, "overview").await;
    sources.push(client.source().await.unwrap());

    // SC-147: the backlog shows the evidence status; fetching stores the Responses call's usage
    // as late evidence and settles nothing (the chat call cannot be fetched).
    open_page(&client, "backlog").await;
    for key in ["order-cut", "order-evidence"] {
        let css = format!("#backlog-table tr[data-operation-key='{key}'][data-evidence='none']");
        text_of(&client, &css).await;
    }
    client
        .find(Locator::Css("#fetch-evidence"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let fetched = text_of(
        &client,
        "tr[data-operation-key='order-evidence'][data-evidence='late_exact'] td.evidence",
    )
    .await;
    let (_, admin, _) = s.get("/v1/admin/backlog", &operator).await;
    let admin_entry = admin["backlog"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["operation_key"] == "order-evidence")
        .unwrap()
        .clone();
    assert_eq!(admin_entry["evidence"], "late_exact");
    let evidence_amount = Decimal::from_str(admin_entry["amount"].as_str().unwrap()).unwrap();
    assert!(evidence_amount > Decimal::ZERO);
    assert!(
        fetched.contains(&format!(
            "would charge {}",
            admin_entry["amount"].as_str().unwrap()
        )),
        "{fetched}"
    );
    let report = text_of(&client, "#fetch-report").await;
    assert!(
        report.contains("1 stored") && report.contains("order-cut (unsupported)"),
        "{report}"
    );
    text_of(
        &client,
        "tr[data-operation-key='order-cut'][data-evidence='none'] button.resolve",
    )
    .await;
    let (_, unchanged, _) = s.get("/v1/calls/order-evidence", &s.caller).await;
    assert_eq!(
        unchanged["state"], "reconciliation_required",
        "a fetch never settles"
    );
    screenshot(&client, "backlog").await;
    sources.push(client.source().await.unwrap());
    client
        .find(Locator::Css(
            "tr[data-operation-key='order-cut'] button.resolve",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for (class, tokens) in [("input", "10"), ("output", "20")] {
        let input = client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(&format!("#usage-{class}")))
            .await
            .unwrap();
        input.clear().await.unwrap();
        input.send_keys(tokens).await.unwrap();
    }
    client
        .find(Locator::Css("#quote"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let quote = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#quote-result"))
        .await
        .unwrap();
    let amount = Decimal::from_str(&quote.attr("data-amount").await.unwrap().unwrap()).unwrap();
    assert_eq!(amount, Decimal::from_str("0.00005").unwrap());
    // Nothing is charged before the confirmation.
    let (status, unchanged, _) = s.get("/v1/calls/order-cut", &s.caller).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(unchanged["state"], "reconciliation_required");
    screenshot(&client, "backlog-quote").await;
    client
        .find(Locator::Css("#confirm-resolve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let resolved = text_of(&client, "#resolved").await;
    assert!(resolved.contains("completed"), "{resolved}");
    let (settled_after, held_after) = team_a_spend(&client).await;
    assert_eq!(settled_after - settled_before, amount);
    assert!(held_after < held_before);
    assert_eq!(text_of(&client, "#backlog-count").await, "1");

    // SC-148: the Responses item is resolved from its evidence: a dry run shows the amount and
    // changes nothing; the confirmation settles it once; the settled spend moves by that amount.
    open_page(&client, "backlog").await;
    client
        .find(Locator::Css(
            "tr[data-operation-key='order-evidence'] button.resolve-evidence",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#evidence-dry-run"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let dry = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#evidence-quote"))
        .await
        .unwrap();
    let dry_amount = Decimal::from_str(&dry.attr("data-amount").await.unwrap().unwrap()).unwrap();
    assert_eq!(dry_amount, evidence_amount);
    let (_, unchanged, _) = s.get("/v1/calls/order-evidence", &s.caller).await;
    assert_eq!(
        unchanged["state"], "reconciliation_required",
        "a dry run changes nothing"
    );
    screenshot(&client, "backlog-evidence-dry-run").await;
    client
        .find(Locator::Css("#confirm-evidence"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let settled = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#resolved[data-amount]"))
        .await
        .unwrap();
    let charged = Decimal::from_str(&settled.attr("data-amount").await.unwrap().unwrap()).unwrap();
    assert_eq!(charged, dry_amount);
    screenshot(&client, "backlog-evidence-settled").await;
    // Once: a second settlement finds nothing awaiting an operator and charges nothing (the
    // spend below moves by the one amount).
    let again = json!({"keys": ["order-evidence"]});
    let (_, replay, _) = s
        .post(
            "/v1/admin/reconcile/resolve-from-evidence",
            &operator,
            &again,
        )
        .await;
    assert_eq!(replay["items"][0]["reason"], "not_awaiting_operator");
    let (settled_evidence, _) = team_a_spend(&client).await;
    assert_eq!(settled_evidence - settled_after, dry_amount);
    assert_eq!(text_of(&client, "#backlog-count").await, "0");
    let (_, view, _) = s.get("/v1/calls/order-evidence", &s.caller).await;
    assert_eq!(view["state"], "completed");
    assert_eq!(
        exact(view["receipt"]["amount"].as_str().unwrap()),
        exact(&dry_amount.to_string())
    );
    open_page(&client, "execution/order-evidence").await;
    let trail = text_of(&client, "#audit-trail").await;
    assert!(trail.contains("settled"), "{trail}");
    sources.push(client.source().await.unwrap());

    open_page(&client, "execution/order-cut").await;
    assert_eq!(text_of(&client, "#journal-state").await, "completed");
    assert!(text_of(&client, "#settlement-amount")
        .await
        .starts_with("0.00005"));
    let trail = text_of(&client, "#audit-trail").await;
    assert!(trail.contains("reconciliation_required") && trail.contains("settled"));
    screenshot(&client, "execution").await;
    sources.push(client.source().await.unwrap());

    // SC-149: the keys page lists the scope's keys, never a key; a revocation needs a
    // confirmation and the revoked key is refused on its next request.
    let (_, listed, _) = s.get("/v1/admin/keys", &operator).await;
    let ids: Vec<String> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids.len(),
        5,
        "caller, two operators, finance and the doomed caller"
    );
    let doomed_id = tollgate_store::KeyDigest::of_key(&doomed).to_hex();
    assert!(ids.contains(&doomed_id));
    open_page(&client, "keys").await;
    let rows = client
        .find_all(Locator::Css("#keys-table tbody tr"))
        .await
        .unwrap();
    assert_eq!(rows.len(), ids.len());
    let keys_page = client.source().await.unwrap();
    for secret in [&s.caller, &s.operator, &operator, &finance, &doomed] {
        assert!(
            !keys_page.contains(secret.as_str()),
            "the keys page shows a key"
        );
    }
    client
        .find(Locator::Css(&format!(
            "tr[data-key-id='{doomed_id}'] button.revoke"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_of(
        &client,
        &format!("#revoke-confirm[data-key-id='{doomed_id}']"),
    )
    .await;
    let (status, _, _) = s.get("/v1/calls/order-0", &doomed).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "nothing is revoked before the confirmation"
    );
    screenshot(&client, "keys-confirm").await;
    client
        .find(Locator::Css("#confirm-revoke"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    text_of(
        &client,
        &format!("tr[data-key-id='{doomed_id}'][data-revoked='true']"),
    )
    .await;
    let (status, _, _) = s.get("/v1/calls/order-0", &doomed).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the revoked key is refused"
    );
    assert_eq!(
        client
            .find_all(Locator::Css("#keys-table tr[data-revoked='true']"))
            .await
            .unwrap()
            .len(),
        1
    );
    screenshot(&client, "keys").await;
    sources.push(client.source().await.unwrap());
    assert_same_origin(&loaded_urls(&client).await, &base);
    assert_no_policy_violation(&client).await;

    open_page(&client, "audit").await;
    let chain = text_of(&client, "#chain-status").await;
    assert!(chain.starts_with("verified"), "{chain}");
    assert_eq!(text_of(&client, "#ledger-audit-status").await, "clean");
    screenshot(&client, "audit").await;
    sources.push(client.source().await.unwrap());
    assert_same_origin(&loaded_urls(&client).await, &base);
    assert_no_policy_violation(&client).await;
    // The operator may not open the finance page.
    client
        .execute("location.hash = '#finance';", vec![])
        .await
        .unwrap();
    let denied = text_of(&client, "#view p").await;
    assert!(denied.contains("may not open"), "{denied}");

    // SC-155: a finance key sees a non-empty chart and downloads the CSV of finance.settlements.
    sign_in(&client, &base, &finance).await;
    wait_page(&client, "overview").await;
    assert_same_origin(&loaded_urls(&client).await, &base);
    assert_no_policy_violation(&client).await;
    open_page(&client, "finance").await;
    screenshot(&client, "finance").await;
    let bars = client
        .find_all(Locator::Css("#finance .chart svg rect"))
        .await
        .unwrap()
        .len();
    assert!(bars >= 4, "the chart has no bars ({bars} rects)");
    let table = text_of(&client, "#finance-table").await;
    assert!(
        table.contains("team-a") && table.contains("mock-echo"),
        "{table}"
    );
    screenshot(&client, "finance").await;
    sources.push(client.source().await.unwrap());
    client
        .find(Locator::Css("#download-csv"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let file = wait_for_download(&downloads).await;
    let csv = std::fs::read_to_string(&file).unwrap();
    let view: BTreeSet<(String, String, String)> = db
        .finance_rows()
        .await
        .unwrap()
        .into_iter()
        .map(|(id, amount, source)| (id, exact(&amount), source))
        .collect();
    assert_eq!(view.len(), 5);
    assert_eq!(csv_rows(&csv), view, "{csv}");
    assert!(csv.starts_with(tollgate_server::console::csv::HEADER));
    assert_same_origin(&loaded_urls(&client).await, &base);
    assert_no_policy_violation(&client).await;
    // Reaching an operator page by address shows nothing of it.
    client
        .execute("location.hash = '#backlog';", vec![])
        .await
        .unwrap();
    let denied = text_of(&client, "#view p").await;
    assert!(denied.contains("may not open"), "{denied}");
    client.close().await.unwrap();

    // SC-153, SC-151: a caller key reads nothing; each role is refused the other's pages.
    let reads = [
        "/v1/console/session",
        "/v1/console/overview",
        "/v1/console/backlog",
        "/v1/console/executions/order-0",
        "/v1/console/audit",
        "/v1/console/finance",
        "/v1/console/finance/settlements.csv",
    ];
    for path in reads {
        let (status, _, _) = s.get(path, &s.caller).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
    }
    for (path, key) in [
        ("/v1/console/finance", &operator),
        ("/v1/console/finance/settlements.csv", &operator),
        ("/v1/console/backlog", &finance),
        ("/v1/console/audit", &finance),
    ] {
        let (status, _, _) = s.get(path, key).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
    }
    // SC-150: the page is served under the strict policy.
    let page = s.http.get(format!("{base}/console")).send().await.unwrap();
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe"));

    // SC-159: the canary is on no page, asset or console read.
    for path in [
        "/console",
        "/console/assets/console.js",
        "/console/assets/console.css",
    ] {
        let (status, _, text) = s.send(reqwest::Method::GET, path, None, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        sources.push(text);
    }
    for (path, key) in [
        ("/v1/console/overview", &operator),
        ("/v1/console/backlog", &operator),
        ("/v1/console/executions/order-0", &operator),
        ("/v1/console/executions/order-cut", &operator),
        ("/v1/console/audit", &operator),
        ("/v1/console/finance", &finance),
        ("/v1/console/finance/settlements.csv", &finance),
    ] {
        let (status, _, text) = s.get(path, key).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        sources.push(text);
    }
    sources.push(csv);
    for (i, text) in sources.iter().enumerate() {
        assert!(!text.contains(CANARY), "source {i} shows content");
    }
    s.stop().await;
    drop(driver);
    let _ = std::fs::remove_dir_all(&downloads);
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-console-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn sc_154_a_quote_writes_nothing_and_needs_an_execution_awaiting_an_operator() {
    let s = Server::memory().await;
    let operator = key(&s, KeyRole::Operator).await;
    let (_, done, _) = s
        .post(
            "/v1/calls",
            &s.caller,
            &call("summarize", "o-done", "r", "hi"),
        )
        .await;
    let (_, cut, _) = s
        .post("/v1/calls", &s.caller, &call("cut", "o-cut", "r", "hi"))
        .await;
    assert_eq!(cut["state"], "reconciliation_required");
    // More than the cut call's hold: quoted only with the override a resolution would need.
    let over = json!({"usage": {"input": 1000, "output": 500}});
    let usage = json!({"usage": {"input": 1000, "output": 500}, "override_hold": true});
    let path = |id: &Value| format!("/v1/console/backlog/{}/quote", id.as_str().unwrap());
    let (status, refused, _) = s.post(&path(&cut["execution_id"]), &operator, &over).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");

    let (status, quote, _) = s.post(&path(&cut["execution_id"]), &operator, &usage).await;
    assert_eq!(status, StatusCode::OK, "{quote}");
    assert_eq!(quote["amount"], "0.002");
    assert_eq!(quote["price_version"], "prices-t");
    let (_, again, _) = s.post(&path(&cut["execution_id"]), &operator, &usage).await;
    assert_eq!(again, quote, "quoting twice charges nothing");
    let (_, view, _) = s.get("/v1/calls/o-cut", &s.caller).await;
    assert_eq!(view["state"], "reconciliation_required");
    let (_, backlog, _) = s.get("/v1/console/backlog", &operator).await;
    assert_eq!(backlog["items"].as_array().unwrap().len(), 1);

    let (status, _, _) = s
        .post(&path(&done["execution_id"]), &operator, &usage)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let bad = json!({"usage": {"input": -1}});
    let (status, _, _) = s.post(&path(&cut["execution_id"]), &operator, &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = s
        .post("/v1/console/backlog/not-a-uuid/quote", &operator, &usage)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _, _) = s.post(&path(&cut["execution_id"]), &s.caller, &usage).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    s.stop().await;
}

/// The audit page names the first violation of the chain and of the ledger. A server serves its
/// checks of a scope for `AUDIT_CHECK_CACHE_MS` (SC-194), so the damage is read by a second
/// server on the database, which has not checked the scope yet.
#[tokio::test]
async fn console_audit_page_names_the_first_violation_of_chain_and_ledger() {
    let db = TestDatabase::create(&admin_url()).await.unwrap();
    let stores = db.stores(4).await.unwrap();
    stores.migrate().await.unwrap();
    let first = Server::start(Backend::Postgres(Arc::new(stores))).await;
    let operator = key(&first, KeyRole::Operator).await;
    let s = &first;
    for n in 0..2 {
        let body = call("summarize", &format!("a-{n}"), "r", "hi");
        let (status, _, _) = s.post("/v1/calls", &s.caller, &body).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, clean, _) = s.get("/v1/console/audit", &operator).await;
    assert_eq!(status, StatusCode::OK, "{clean}");
    assert_eq!(clean["chain"]["ok"], true);
    assert_eq!(clean["chain"]["rows_verified"], clean["chain"]["head_seq"]);
    assert_eq!(clean["ledger"]["ok"], true);

    let (chain, seq) = db.delete_last_audit_row("acme").await.unwrap();
    db.shift_session_spend("team-a", "0.5").await.unwrap();
    let (_, cached, _) = s.get("/v1/console/audit", &operator).await;
    assert_eq!(cached["chain"]["cached"], true, "{cached}");
    let second = Server::start(Backend::Postgres(Arc::new(db.stores(4).await.unwrap()))).await;
    let s = &second;
    let (status, broken, _) = s.get("/v1/console/audit", &operator).await;
    assert_eq!(status, StatusCode::OK, "{broken}");
    assert_eq!(broken["chain"]["ok"], false);
    assert_eq!(broken["chain"]["first_violation"]["chain"], chain);
    assert_eq!(broken["chain"]["first_violation"]["seq"], seq);
    assert_eq!(broken["ledger"]["ok"], false);
    assert!(!broken["ledger"]["violations"]
        .as_array()
        .unwrap()
        .is_empty());
    let (_, overview, _) = s.get("/v1/console/overview", &operator).await;
    assert_eq!(overview["ledger"]["ok"], false);
    assert!(overview["ledger"]["first_violation"].is_string());
    second.stop().await;
    first.stop().await;
}

/// SC-147: the console's backlog read is the reconciler's backlog: the same items, evidence
/// status and exact amount as `GET /v1/admin/backlog`, before and after late evidence arrives.
#[tokio::test]
async fn sc_147_the_console_backlog_shows_the_admin_backlogs_evidence_status() {
    let s = Server::memory().await;
    let (_, cut, _) = s
        .post("/v1/calls", &s.caller, &call("cut", "e-cut", "r", "hi"))
        .await;
    assert_eq!(cut["state"], "reconciliation_required");
    let (_, console, _) = s.get("/v1/console/backlog", &s.operator).await;
    let item = &console["items"][0];
    assert_eq!(item["operation_key"], "e-cut");
    assert_eq!(item["evidence"], "none");
    assert_eq!(item["exact_amount"], Value::Null);
    let evidence =
        json!({"execution_id": cut["execution_id"], "usage": {"input": 10, "output": 20}});
    let (status, _, _) = s
        .post("/v1/admin/usage-evidence", &s.operator, &evidence)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, console, _) = s.get("/v1/console/backlog", &s.operator).await;
    let (_, admin, _) = s.get("/v1/admin/backlog", &s.operator).await;
    let (item, entry) = (&console["items"][0], &admin["backlog"][0]);
    assert_eq!(item["evidence"], "late_exact");
    assert_eq!(item["evidence"], entry["evidence"]);
    assert_eq!(item["exact_amount"], "0.00005");
    assert_eq!(item["exact_amount"], entry["amount"]);
    assert_eq!(item["exact_usage"], entry["usage"]);
    assert_eq!(item["hold"], entry["held"]);
    assert_eq!(item["provider_ref"], entry["provider_ref"]);
    s.stop().await;
}

/// An SVG a chart must never carry into the page: handlers, script and data links, animations
/// that set handlers or links, script elements, embedded documents and styles that load URLs.
const HOSTILE_SVG: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="100" height="100" onload="window.fired='svg'">
  <rect id="bar" x="1" y="1" width="10" height="10" fill="#123456" onclick="window.fired='rect'" ONMOUSEOVER="window.fired='over'"/>
  <a id="link" href="javascript:window.fired='a'"><text id="label" x="1" y="20">&lt;script&gt;team-a</text></a>
  <a id="xlink" xlink:href=" JaVa&#x09;Script:window.fired='xa'"><text>x</text></a>
  <image id="img" href="javascript:window.fired='img'" width="5" height="5"/>
  <image id="data-svg" href="data:image/svg+xml;base64,PHN2Zy8+" width="5" height="5"/>
  <image id="data-png" href="data:image/png;base64,iVBORw0KGgo=" width="5" height="5"/>
  <use id="use" href="data:text/html,hi"/>
  <set attributeName="onload" to="window.fired='set'"/>
  <animate attributeName="href" to="javascript:window.fired='animate'" begin="0s"/>
  <rect id="styled" style="fill: url(javascript:window.fired='style')" width="1" height="1"/>
  <script>window.fired='script'</script>
  <foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div></foreignObject>
  <html:iframe xmlns:html="http://www.w3.org/1999/xhtml" src="javascript:window.fired='iframe'"/>
</svg>"##;

/// SC-199: the console's chart path (`window.tollgateConsole.chart`, the function every chart
/// goes through) keeps an SVG's shapes and text and drops every event handler, every script,
/// `javascript:` or non-image `data:` link, animations, script and embedded documents, whatever
/// the server sent.
#[tokio::test]
async fn sc_199_the_console_strips_handlers_script_links_and_animations_from_charts() {
    let driver = start_driver().await;
    let s = Server::memory().await;
    let downloads = std::env::temp_dir().join(format!("tollgate-svg-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&downloads).unwrap();
    let client = browser(&driver, &downloads).await;
    client.goto(&format!("{}/console", s.base)).await.unwrap();
    let kept = client
        .execute(
            r##"const node = window.tollgateConsole.chart(arguments[0]);
               document.body.append(node);
               for (const target of node.querySelectorAll("*")) {
                 target.dispatchEvent(new MouseEvent("click", { bubbles: true }));
                 target.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
               }
               return {
                 elements: [...node.querySelectorAll("*")].map((e) => ({
                   tag: e.localName,
                   id: e.getAttribute("id"),
                   attrs: [...e.attributes].map((a) => [a.name, a.value]),
                 })),
                 label: node.querySelector("#label") ? node.querySelector("#label").textContent : null,
               };"##,
            vec![json!(HOSTILE_SVG)],
        )
        .await
        .unwrap();
    let elements = kept["elements"].as_array().unwrap();
    let tags: BTreeSet<&str> = elements
        .iter()
        .map(|e| e["tag"].as_str().unwrap())
        .collect();
    for dropped in ["script", "foreignObject", "set", "animate", "iframe", "div"] {
        assert!(!tags.contains(dropped), "{dropped} kept: {kept}");
    }
    for element in elements {
        for attr in element["attrs"].as_array().unwrap() {
            let name = attr[0].as_str().unwrap().to_ascii_lowercase();
            let value: String = attr[1]
                .as_str()
                .unwrap()
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect::<String>()
                .to_ascii_lowercase();
            assert!(!name.starts_with("on"), "handler kept: {element}");
            assert!(
                !value.contains("javascript:"),
                "script link kept: {element}"
            );
            assert!(
                !value.starts_with("data:") || value.starts_with("data:image/png"),
                "data link kept: {element}"
            );
            assert!(!value.contains("url("), "style URL kept: {element}");
        }
    }
    let by_id = |id: &str| {
        elements
            .iter()
            .find(|e| e["id"] == id)
            .unwrap_or_else(|| panic!("#{id} is gone: {kept}"))
    };
    let has = |id: &str, name: &str| {
        by_id(id)["attrs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a[0] == name)
    };
    // The shapes and their text stay; only what was dangerous goes.
    assert!(tags.contains("svg") && has("bar", "fill"), "{kept}");
    assert!(
        !has("link", "href") && !has("xlink", "xlink:href"),
        "{kept}"
    );
    assert!(
        !has("img", "href") && !has("data-svg", "href") && !has("use", "href"),
        "{kept}"
    );
    assert!(
        has("data-png", "href"),
        "a raster image's data URL stays: {kept}"
    );
    assert!(!has("styled", "style"), "{kept}");
    assert_eq!(kept["label"], "<script>team-a");
    let fired = client
        .execute("return window.fired || null;", vec![])
        .await
        .unwrap();
    assert_eq!(fired, Value::Null, "something ran");
    client.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&downloads);
    s.stop().await;
}
