//! Black-box tests of the `tollgate` binary (spec/cli.md): the built executable run as a user or a
//! script would run it, judged only by its exit status, stdout JSON, stderr and — for the
//! Postgres commands — the database it wrote.
//!
//! The Postgres tests create a brand-new database each (named `tollgate_cli_<unix secs>_<uuid>`)
//! through the admin URL `TOLLGATE_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), drop it afterwards, and drop leftovers of runs
//! more than an hour old.
#![cfg(test)]

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;
use support::{
    fresh_database, json_ok, normalized, run, serve_on, stderr, stdout, tollgate, TempFile,
};
use tollgate_testkit::captured::{captured_streams, captured_streams_in, REPOSITORY_ROOT};

/// Captured provider streams shared by the project (optional).
/// Every key of the `parse-stream` object (spec/cli.md).
const PARSE_KEYS: [&str; 6] = [
    "step",
    "usage",
    "stop",
    "provider_ref",
    "invalid_reason",
    "stream_error",
];
/// Every key of a usage object (the receipt's keys).
const USAGE_KEYS: [&str; 5] = ["input", "output", "cache_read", "cache_write", "reasoning"];

fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// demo on the embedded default
// ---------------------------------------------------------------------------------------------

#[test]
fn demo_runs_on_the_embedded_default_without_a_database() {
    let output = run(tollgate().arg("demo"));
    assert!(
        output.status.success(),
        "exit {:?}\nstderr: {}",
        output.status,
        stderr(&output)
    );
    let text = stdout(&output);
    for word in [
        "embedded",
        "call",
        "replay",
        "conflict",
        "warning",
        "preflight block",
        "post-call block",
        "recover",
        "settlement ledger",
        "spend",
    ] {
        assert!(text.contains(word), "stdout lacks {word:?}:\n{text}");
    }
}

/// The demo's steps by name.
fn steps(report: &Value) -> BTreeMap<String, Value> {
    report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["step"].as_str().expect("step name").to_string(),
                s.clone(),
            )
        })
        .collect()
}

fn step<'a>(steps: &'a BTreeMap<String, Value>, name: &str) -> &'a Value {
    steps
        .get(name)
        .unwrap_or_else(|| panic!("no {name:?} step in {:?}", steps.keys()))
}

/// Checks one `demo --json` report; returns its settlements.
fn check_demo_report(report: &Value) -> Vec<Value> {
    let steps = steps(report);
    let call = step(&steps, "call");
    assert_eq!(call["result"]["state"], "completed", "{call}");
    assert_eq!(call["result"]["outcome"], "success", "{call}");
    assert_eq!(call["provider_requests"], 1, "{call}");

    // SC-13: the replay answers from the store, so the counter does not move.
    let replay = step(&steps, "replay");
    assert_eq!(replay["result"]["replayed"], true, "{replay}");
    assert_eq!(
        replay["provider_requests"], call["provider_requests"],
        "{replay}"
    );
    assert_eq!(replay["result"]["receipt"], call["result"]["receipt"]);

    // SC-14: a conflict is an error and sends nothing.
    let conflict = step(&steps, "conflict");
    assert!(conflict["result"]["error"].is_string(), "{conflict}");
    assert_eq!(conflict["provider_requests"], call["provider_requests"]);

    let warning = step(&steps, "warning");
    assert_eq!(warning["result"]["outcome"], "success", "{warning}");
    assert_eq!(
        warning["result"]["warnings"][0]["level"], "warn",
        "{warning}"
    );

    // SC-16 preflight: an error naming the cap, nothing sent.
    let preflight = step(&steps, "preflight block");
    let error = preflight["result"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("preflight block is not an error: {preflight}"))
        .to_lowercase();
    assert!(
        error.contains("cap") && error.contains("session"),
        "{error}"
    );
    assert_eq!(
        preflight["provider_requests"], warning["provider_requests"],
        "{preflight}"
    );

    // SC-16 post-call: the known cost is settled, the output suppressed.
    let post = step(&steps, "post-call block");
    assert_eq!(post["result"]["state"], "completed", "{post}");
    assert_eq!(post["result"]["outcome"], "blocked", "{post}");
    assert!(post["result"]["output"].is_null(), "{post}");
    assert!(post["result"]["receipt"]["amount"].is_string(), "{post}");

    // SC-17 then SC-40: the store failure is an error; recovery completes from the evidence
    // without sending again.
    let failed = step(&steps, "store failure");
    assert!(failed["result"]["error"].is_string(), "{failed}");
    let recover = step(&steps, "recover");
    assert_eq!(recover["result"]["state"], "completed", "{recover}");
    assert!(
        recover["result"]["receipt"]["amount"].is_string(),
        "{recover}"
    );
    assert_eq!(
        recover["provider_requests"], failed["provider_requests"],
        "{recover}"
    );

    // One settlement per dispatched call: the last counter is the number of sends.
    let sent = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["provider_requests"].as_u64())
        .max()
        .unwrap();
    let settlements = report["settlements"]
        .as_array()
        .expect("settlements")
        .clone();
    assert_eq!(settlements.len() as u64, sent, "{settlements:?}");
    let executions: BTreeSet<&str> = settlements
        .iter()
        .map(|s| s["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        executions.len(),
        settlements.len(),
        "one charge per execution"
    );
    // Every receipt a step showed is a ledger row with the same amount.
    for s in report["steps"].as_array().unwrap() {
        let result = &s["result"];
        if let (Some(id), Some(amount)) = (
            result["execution_id"].as_str(),
            result["receipt"]["amount"].as_str(),
        ) {
            let row = settlements
                .iter()
                .find(|r| r["execution_id"] == id)
                .unwrap_or_else(|| panic!("no settlement for {s}"));
            assert_eq!(row["amount"], amount, "{s}");
        }
    }
    settlements
}

#[test]
fn demo_json_reports_one_send_per_dispatched_call() {
    let report = json_ok(&run(tollgate().args(["demo", "--json"])));
    let settlements = check_demo_report(&report);
    for row in &settlements {
        let source = row["source"].as_str().unwrap();
        assert!(
            ["stream", "recovery", "operator"].contains(&source),
            "{row}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// parse-stream
// ---------------------------------------------------------------------------------------------

/// An OpenAI Chat Completions text stream with a usage chunk, as `stream_options.include_usage`
/// sends it.
const CHAT_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-cli1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",",
    "\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-cli1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},",
    "\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-cli1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", world\"},",
    "\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-cli1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},",
    "\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-cli1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,",
    "\"completion_tokens\":3,\"total_tokens\":15,",
    "\"prompt_tokens_details\":{\"cached_tokens\":4},",
    "\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
    "data: [DONE]\n\n",
);

#[test]
fn parse_stream_prints_the_contract_fields() {
    let file = TempFile::new("chat.sse", CHAT_STREAM);
    let output = run(tollgate()
        .args(["parse-stream", "--protocol", "openai-chat"])
        .arg(&file.0));
    let parsed = json_ok(&output);
    assert_eq!(keys(&parsed), BTreeSet::from(PARSE_KEYS), "{parsed}");
    assert_eq!(
        keys(&parsed["usage"]),
        BTreeSet::from(USAGE_KEYS),
        "{parsed}"
    );
    // Disjoint classes: the 4 cached tokens are not input.
    assert_eq!(parsed["usage"]["input"], 8, "{parsed}");
    assert_eq!(parsed["usage"]["cache_read"], 4, "{parsed}");
    assert_eq!(parsed["usage"]["output"], 3, "{parsed}");
    assert_eq!(parsed["usage"]["reasoning"], 0, "{parsed}");
    assert_eq!(parsed["stop"], "stop", "{parsed}");
    assert_eq!(parsed["provider_ref"], "chatcmpl-cli1", "{parsed}");
    assert!(parsed["invalid_reason"].is_null(), "{parsed}");
    assert!(parsed["stream_error"].is_null(), "{parsed}");
    assert_eq!(parsed["step"]["text"], "Hello, world", "{parsed}");
}

#[test]
fn parse_stream_reports_a_cut_stream_as_a_stream_error() {
    // The same stream without its usage chunk and `[DONE]`: the stream ended early.
    let cut = CHAT_STREAM
        .split_inclusive("\n\n")
        .take(3)
        .collect::<String>();
    let file = TempFile::new("cut.sse", &cut);
    let output = run(tollgate()
        .args(["parse-stream", "--protocol", "openai-chat"])
        .arg(&file.0));
    let parsed = json_ok(&output);
    assert_eq!(keys(&parsed), BTreeSet::from(PARSE_KEYS), "{parsed}");
    assert!(parsed["usage"].is_null(), "{parsed}");
    assert!(parsed["stop"].is_null(), "{parsed}");
    assert_eq!(
        keys(&parsed["stream_error"]),
        BTreeSet::from(["type", "message"]),
        "{parsed}"
    );
}

#[test]
fn parse_stream_rejects_an_unknown_protocol() {
    let file = TempFile::new("any.sse", CHAT_STREAM);
    let output = run(tollgate()
        .args(["parse-stream", "--protocol", "openai-completions"])
        .arg(&file.0));
    assert!(!output.status.success(), "{output:?}");
    let err = stderr(&output);
    assert_eq!(err.trim_end().lines().count(), 1, "one-line reason: {err}");
    assert!(err.contains("protocol"), "{err}");
    assert!(stdout(&output).trim().is_empty(), "{}", stdout(&output));
}

#[test]
fn parse_stream_rejects_a_missing_file() {
    let missing = std::env::temp_dir().join(format!(
        "tollgate-cli-missing-{}.sse",
        uuid::Uuid::new_v4().simple()
    ));
    let output = run(tollgate()
        .args(["parse-stream", "--protocol", "anthropic"])
        .arg(&missing));
    assert!(!output.status.success(), "{output:?}");
    assert_eq!(stderr(&output).trim_end().lines().count(), 1, "{output:?}");
}

/// The protocol a fixture file was captured from, by its name.
fn fixture_protocol(name: &str) -> Option<&'static str> {
    if name.starts_with("openai-chat-") {
        Some("openai-chat")
    } else if name.starts_with("openai-responses-") {
        Some("openai-responses")
    } else if name.starts_with("anthropic-") {
        Some("anthropic")
    } else {
        None
    }
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}

/// `(stop, tool-call names, text)` and the usage checks a correct reader reaches, from
/// `EXPECTED.json`'s per-protocol shape.
fn check_fixture(name: &str, protocol: &str, expected: &Value, parsed: &Value) {
    let usage = &parsed["usage"];
    let names: Vec<&str> = parsed["step"]["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let malformed: Vec<bool> = parsed["step"]["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().map(|c| c["malformed"] == true).collect())
        .unwrap_or_default();
    match protocol {
        "openai-chat" => {
            let choice = &expected["choices"]["0"];
            assert_eq!(parsed["stop"], choice["finish"], "{name}: stop");
            let mut tools: Vec<(u64, &Value)> = choice["tools"]
                .as_object()
                .map(|t| t.iter().map(|(i, v)| (i.parse().unwrap(), v)).collect())
                .unwrap_or_default();
            tools.sort_by_key(|(i, _)| *i);
            let want: Vec<&str> = tools
                .iter()
                .map(|(_, t)| t["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, want, "{name}: tool calls");
            let want_text = choice["text"].as_str().unwrap_or_default();
            let text = parsed["step"]["text"].as_str().unwrap_or_default();
            assert_eq!(text, want_text, "{name}: text");
            let e = &expected["usage"];
            let cached = u(&e["prompt_tokens_details"]["cached_tokens"]);
            assert_eq!(
                u(&usage["input"]),
                u(&e["prompt_tokens"]) - cached,
                "{name}"
            );
            assert_eq!(u(&usage["cache_read"]), cached, "{name}");
            assert_eq!(
                u(&usage["output"]) + u(&usage["reasoning"]),
                u(&e["completion_tokens"]),
                "{name}: output"
            );
            assert_eq!(
                u(&usage["reasoning"]),
                u(&e["completion_tokens_details"]["reasoning_tokens"]),
                "{name}: reasoning"
            );
        }
        "anthropic" => {
            assert_eq!(parsed["stop"], expected["stop_reason"], "{name}: stop");
            let blocks = expected["blocks"].as_array().unwrap();
            let tools: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
            let want: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
            assert_eq!(names, want, "{name}: tool calls");
            // Arguments that do not parse keep only the `malformed` flag (ST-9).
            let want_malformed: Vec<bool> = tools
                .iter()
                .map(|t| {
                    t["input"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("INVALID_JSON"))
                })
                .collect();
            assert_eq!(malformed, want_malformed, "{name}: malformed flags");
            let want_text: String = blocks
                .iter()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str())
                .collect();
            let text = parsed["step"]["text"].as_str().unwrap_or_default();
            assert_eq!(text, want_text, "{name}: text");
            let e = &expected["usage"];
            assert_eq!(u(&usage["input"]), u(&e["input_tokens"]), "{name}: input");
            assert_eq!(
                u(&usage["cache_read"]),
                u(&e["cache_read_input_tokens"]),
                "{name}: cache_read"
            );
            assert_eq!(
                u(&usage["cache_write"]),
                u(&e["cache_creation_input_tokens"]),
                "{name}: cache_write"
            );
            assert_eq!(
                u(&usage["output"]) + u(&usage["reasoning"]),
                u(&e["output_tokens"]),
                "{name}: output"
            );
        }
        other => panic!("{name}: no expectations for {other}"),
    }
    let clean = expected["errors"].as_array().is_none_or(Vec::is_empty);
    if clean {
        assert!(parsed["stream_error"].is_null(), "{name}: {parsed}");
    }
}

#[test]
fn sc_118_a_missing_captured_streams_folder_fails_naming_where_it_looked() {
    let nowhere = std::env::temp_dir().join(format!("tollgate-none-{}", uuid::Uuid::new_v4()));
    let err = captured_streams_in(Some(nowhere.clone()), &REPOSITORY_ROOT).unwrap_err();
    assert!(err.contains(&nowhere.display().to_string()), "{err}");
    assert!(err.contains("TOLLGATE_CAPTURED_STREAMS"), "{err}");
    let found = captured_streams_in(None, &REPOSITORY_ROOT).unwrap();
    assert!(found.join("EXPECTED.json").is_file());
}

#[test]
fn sc_118_parse_stream_matches_the_captured_fixtures() {
    let dir = captured_streams();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("EXPECTED.json")).unwrap()).unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".sse") {
            continue;
        }
        let protocol =
            fixture_protocol(&name).unwrap_or_else(|| panic!("{name}: unknown protocol prefix"));
        let want = expected
            .get(&name)
            .unwrap_or_else(|| panic!("{name}: not in EXPECTED.json"));
        let output = run(tollgate()
            .args(["parse-stream", "--protocol", protocol])
            .arg(&path));
        let parsed = json_ok(&output);
        assert_eq!(keys(&parsed), BTreeSet::from(PARSE_KEYS), "{name}");
        check_fixture(&name, protocol, want, &parsed);
        checked += 1;
    }
    assert!(checked > 0, "no fixture was checked in {}", dir.display());
}

// ---------------------------------------------------------------------------------------------
// Postgres: migrate and demo
// ---------------------------------------------------------------------------------------------

fn migration_files() -> i64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count() as i64
}

#[tokio::test]
async fn migrate_is_idempotent_on_postgres() {
    let db = fresh_database().await;
    for attempt in 1..=2 {
        let output = run(tollgate().arg("migrate").env("DATABASE_URL", db.url()));
        let report = json_ok(&output);
        assert_eq!(report["migrated"], true, "attempt {attempt}: {report}");
    }
    let applied = db.applied_migrations().await.unwrap();
    assert_eq!(applied, migration_files(), "each migration applied once");
    let view = db.relation("finance.settlements").await.unwrap();
    assert_eq!(view.as_deref(), Some("finance.settlements"));
}

/// SC-115: `migrate` runs as the owner (`DATABASE_OWNER_URL`) while `DATABASE_URL` names a login
/// role in `tollgate_app`; the other commands then work as that role, which cannot migrate.
#[tokio::test]
async fn sc_115_migrate_as_the_owner_then_work_as_the_application_role() {
    let db = fresh_database().await;
    json_ok(&run(tollgate()
        .arg("migrate")
        .env("DATABASE_URL", db.url())));
    let app_url = db.app_role_url().await.unwrap();
    let as_app = |args: &[&str]| {
        run(tollgate()
            .args(args)
            .env("DATABASE_URL", &app_url)
            .env("DATABASE_OWNER_URL", db.url()))
    };
    let report = json_ok(&as_app(&["migrate"]));
    assert_eq!(report["migrated"], true, "{report}");
    let verify = json_ok(&as_app(&["audit", "verify", "--scope", "acme"]));
    assert_eq!(verify["ok"], true, "{verify}");
    // The application role alone cannot run the migrator (it may not create its table).
    let refused = run(tollgate().arg("migrate").env("DATABASE_URL", &app_url));
    assert!(!refused.status.success(), "{}", stdout(&refused));
    assert!(
        stderr(&refused).contains("42501"),
        "permission denied: {}",
        stderr(&refused)
    );
}

/// The server's metrics, read with the operator key `operator`, once `done` holds on them
/// (polled for at most 20 s).
async fn metrics_when(
    http: &reqwest::Client,
    base: &str,
    operator: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = support::metrics_text(http, base, Some(operator))
            .await
            .expect("the server answers its metrics");
        if done(&text) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "never:\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// SC-117: `serve` runs the scheduler. With no operator call to reconcile and no
/// `tollgate scheduler`, the running server counts its passes and acknowledges late usage
/// evidence equal to a call's settlement, which only a scheduler pass does. The call's own
/// stream evidence was acknowledged by its settlement (H-28), so passes before the late report
/// acknowledge nothing.
#[tokio::test]
async fn sc_117_serve_runs_the_scheduler_without_an_operator() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = tollgate()
        .args(["serve", "--config", "/dev/null"])
        .env("TOLLGATE_SERVER__LISTEN", "127.0.0.1:0")
        .env("TOLLGATE_SCHEDULER__INTERVAL_MS", "50")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tollgate serve starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (mut base, mut caller, mut operator) = (None, None, None);
    while base.is_none() || caller.is_none() || operator.is_none() {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("serve prints its keys and address");
        if let Some(rest) = line.split("listening on ").nth(1) {
            base = rest.split_whitespace().next().map(str::to_string);
        }
        if let Some(rest) = line.split("caller key ").nth(1) {
            caller = rest.split(',').next().map(str::to_string);
        }
        if let Some(rest) = line.split("operator key ").nth(1) {
            operator = rest.split_whitespace().next().map(str::to_string);
        }
    }
    let (base, caller, operator) = (base.unwrap(), caller.unwrap(), operator.unwrap());
    let http = reqwest::Client::new();
    let body = serde_json::json!({
        "profile": "summarize", "operation_key": "sched-1", "session_id": "s-1",
        "input_revision": "r-1", "intent": "summarize",
        "input": {"messages": [{"role": "user", "content": "hello"}]}
    });
    let answer = http
        .post(format!("{base}/v1/calls"))
        .bearer_auth(&caller)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{:?}", answer.status());
    let view: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(view["state"], "completed", "{view}");
    let passes = |text: &str| support::metric(text, "tollgate_scheduler_passes_total").unwrap_or(0);
    let acknowledged = |text: &str| support::metric(text, "tollgate_evidence_acknowledged_total");
    let after_call = passes(&metrics_when(&http, &base, &operator, |_| true).await);
    // Two whole passes after the call: its own evidence was acknowledged by its settlement.
    let text = metrics_when(&http, &base, &operator, |text| {
        passes(text) >= after_call + 2
    })
    .await;
    assert_eq!(acknowledged(&text).unwrap_or(0), 0, "{text}");
    let late = http
        .post(format!("{base}/v1/admin/usage-evidence"))
        .bearer_auth(&operator)
        .json(&serde_json::json!({
            "execution_id": view["execution_id"],
            "usage": view["receipt"]["usage"],
        }))
        .send()
        .await
        .unwrap();
    assert!(late.status().is_success(), "{:?}", late.status());
    metrics_when(&http, &base, &operator, |text| {
        acknowledged(text).unwrap_or(0) >= 1
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn migrate_without_a_database_url_fails_with_one_line() {
    let output = run(tollgate().arg("migrate"));
    assert!(!output.status.success(), "{output:?}");
    let err = stderr(&output);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("DATABASE_URL"), "{err}");
}

#[tokio::test]
async fn demo_runs_on_postgres_when_database_url_is_set() {
    let db = fresh_database().await;
    let output = run(tollgate()
        .args(["demo", "--json"])
        .env("DATABASE_URL", db.url()));
    let report = json_ok(&output);
    let reported = check_demo_report(&report);

    let column_type = db
        .column_type("finance", "settlements", "amount")
        .await
        .unwrap();
    assert_eq!(column_type, "numeric");
    let rows = db.finance_rows().await.unwrap();
    assert_eq!(rows.len(), reported.len(), "{rows:?}");
    let sources: BTreeSet<&str> = rows.iter().map(|(_, _, s)| s.as_str()).collect();
    assert!(
        sources.is_subset(&BTreeSet::from(["stream", "recovery", "operator"])),
        "{sources:?}"
    );
    // The tour settles calls from their streams and one by recovery (spec/cli.md).
    assert!(
        sources.contains("stream") && sources.contains("recovery"),
        "{sources:?}"
    );
    for (execution, amount, source) in &rows {
        let row = reported
            .iter()
            .find(|r| r["execution_id"] == execution.as_str())
            .unwrap_or_else(|| panic!("{execution} is not in the demo's ledger"));
        assert_eq!(
            normalized(amount),
            normalized(row["amount"].as_str().unwrap()),
            "{execution}"
        );
        assert_eq!(row["source"], source.as_str(), "{execution}");
    }
}

// ---------------------------------------------------------------------------------------------
// Postgres: audit ledger
// ---------------------------------------------------------------------------------------------

/// `tollgate audit ledger` on `url`, with extra arguments.
fn audit_ledger(url: &str, extra: &[&str]) -> Output {
    run(tollgate()
        .args(["audit", "ledger"])
        .args(extra)
        .env("DATABASE_URL", url))
}

#[tokio::test]
async fn sc_92_audit_ledger_is_clean_after_the_demo_and_names_damaged_rows() {
    let db = fresh_database().await;
    json_ok(&run(tollgate()
        .args(["demo", "--json"])
        .env("DATABASE_URL", db.url())));
    // Acknowledged evidence is audited too.
    let usage = json_ok(&run(tollgate()
        .args(["reconcile", "usage", "--scope", "demo"])
        .env("DATABASE_URL", db.url())));
    assert!(usage["acknowledged"].as_u64().unwrap() > 0, "{usage}");

    let report = json_ok(&audit_ledger(db.url(), &["--scope", "demo", "--json"]));
    assert_eq!(
        keys(&report),
        BTreeSet::from([
            "ok",
            "scope",
            "checked",
            "violations",
            "violations_total",
            "truncated"
        ])
    );
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["scope"], "demo");
    assert_eq!(report["violations"], serde_json::json!([]));
    let checked = &report["checked"];
    for counted in ["executions", "settlements", "spend_rows", "evidence"] {
        assert!(
            checked[counted].as_u64().unwrap() > 0,
            "{counted}: {report}"
        );
    }
    // Every scope, human form.
    let output = audit_ledger(db.url(), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).starts_with("ledger audit of every scope: ok"),
        "{}",
        stdout(&output)
    );

    // One session spend row a cent off its settlements.
    db.shift_session_spend("team-a", "0.01").await.unwrap();
    let output = audit_ledger(db.url(), &["--scope", "demo"]);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    let err = stderr(&output);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tollgate: ledger invariant violated: spend_settled (mismatch): scope=demo spend=session consumer=team-a"),
        "{err}"
    );
    assert!(
        stdout(&output).contains("\n  spend_settled (mismatch): scope=demo"),
        "{}",
        stdout(&output)
    );
    let output = audit_ledger(db.url(), &["--scope", "demo", "--json"]);
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["violations_total"], 1, "{report}");
    let v = &report["violations"][0];
    assert_eq!(v["invariant"], "spend_settled");
    assert_eq!(v["spend"]["window"], "session");
    assert_eq!(v["spend"]["consumer"], "team-a");
    // Exact decimals: what the settlements add up to, and what the row says.
    let (settled, stored) = db.settled_and_session_spend("team-a").await.unwrap();
    assert_eq!(
        normalized(v["expected"].as_str().unwrap()),
        normalized(&settled)
    );
    assert_eq!(
        normalized(v["found"].as_str().unwrap()),
        normalized(&stored)
    );
    // Repaired, then one settlement's amount changed instead.
    db.shift_session_spend("team-a", "-0.01").await.unwrap();
    json_ok(&audit_ledger(db.url(), &["--json"]));
    let execution = db.shift_first_settlement("1").await.unwrap();
    let output = audit_ledger(db.url(), &["--json"]);
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    let named: BTreeSet<&str> = report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["invariant"].as_str().unwrap())
        .collect();
    assert_eq!(
        named,
        BTreeSet::from(["settlement_priced", "spend_settled"]),
        "{report}"
    );
    let priced = report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["invariant"] == "settlement_priced")
        .unwrap();
    assert_eq!(priced["execution_id"], execution.as_str());
    assert!(stderr(&output).contains("ledger invariant violated"));
}

#[test]
fn audit_ledger_without_a_database_url_fails_with_one_line() {
    let output = run(tollgate().args(["audit", "ledger"]));
    assert_eq!(output.status.code(), Some(1));
    let err = stderr(&output);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("DATABASE_URL"), "{err}");
}

/// SC-97: `audit verify` walks the chain page by page and ends at the head the database keeps
/// apart from the rows, so a chain whose last rows were removed (triggers disabled by an owner)
/// no longer verifies.
#[tokio::test]
async fn sc_97_audit_verify_notices_a_lost_tail() {
    let db = fresh_database().await;
    json_ok(&run(tollgate()
        .args(["demo", "--json"])
        .env("DATABASE_URL", db.url())));
    let verify = || {
        run(tollgate()
            .args(["audit", "verify", "--scope", "demo"])
            .env("DATABASE_URL", db.url()))
    };
    let clean = json_ok(&verify());
    assert_eq!(clean["ok"], true, "{clean}");
    let rows = clean["rows"].as_i64().unwrap();
    assert!(rows > 1, "{clean}");

    let (chain, seq) = db.delete_last_audit_row("demo").await.unwrap();

    let broken = verify();
    assert_eq!(broken.status.code(), Some(1), "{}", stdout(&broken));
    let report: Value = serde_json::from_str(stdout(&broken).trim()).unwrap();
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["chain"], chain, "{report}");
    assert_eq!(report["seq"], seq, "{report}");
    assert_eq!(report["reason"], "rows missing before the chain head");
    assert!(
        stderr(&broken).contains(&format!("audit chain {chain} broken at seq {seq}")),
        "{}",
        stderr(&broken)
    );
}

// ---------------------------------------------------------------------------------------------
// Postgres: the reconciliation backlog (SC-110, SC-111, SC-112)
// ---------------------------------------------------------------------------------------------

fn backlog_config(mock_url: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"

[[providers]]
name = "mock"
kind = "openai-responses"
base_url = "{mock_url}"

[[prices]]
version = "prices-cli"
currency = "USD"
[prices.models."mock-cut-before-usage"]
input = "1.00"
output = "2.00"
cache_read = "0.10"
cache_write = "1.25"
reasoning = "2.00"

[[profiles]]
name = "cut"
kind = "text"
provider = "mock"
model = "mock-cut-before-usage"
policy_version = "policy-1"
price_version = "prices-cli"
consumer = "team-a"
max_tokens = 64
max_input_chars = 200
run_timeout_ms = 10000
"#
    )
}

fn reconcile(db_url: &str, args: &[&str]) -> Value {
    json_ok(&run(tollgate()
        .arg("reconcile")
        .args(args)
        .env("DATABASE_URL", db_url)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sc_110_sc_111_sc_112_backlog_fetch_and_resolve_from_the_command_line() {
    let db = fresh_database().await;
    let url = db.url().to_string();
    let mock = tollgate_mock_provider::MockProvider::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let config = TempFile::new("backlog.toml", &backlog_config(&mock.base_url()));
    let created = json_ok(&run(tollgate()
        .args([
            "--json", "keys", "create", "--scope", "acme", "--role", "caller",
        ])
        .env("DATABASE_URL", &url)));
    let caller = created["key"].as_str().unwrap().to_string();

    // A Responses call whose stream is cut after the response id: it awaits an operator.
    let (server, base) = serve_on(&config.0, &url).await;
    let body = serde_json::json!({
        "profile": "cut", "operation_key": "cli-cut", "session_id": "s-1",
        "input_revision": "r-1", "intent": "summarize",
        "input": {"messages": [{"role": "user", "content": "hello"}]}
    });
    let view: Value = reqwest::Client::new()
        .post(format!("{base}/v1/calls"))
        .bearer_auth(&caller)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["state"], "reconciliation_required", "{view}");
    drop(server);

    // SC-112: the backlog, of the scope and of every scope.
    let listed = reconcile(&url, &["backlog", "--scope", "acme"]);
    assert_eq!(keys(&listed), BTreeSet::from(["backlog"]));
    let entry = &listed["backlog"][0];
    assert_eq!(listed["backlog"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(entry["operation_key"], "cli-cut");
    assert_eq!(entry["reconciliation_reason"], "no_exact_usage");
    assert_eq!(entry["evidence"], "none");
    assert!(entry["provider_ref"].as_str().unwrap().starts_with("resp_"));
    assert!(entry["held"].as_str().is_some_and(|h| h != "0"), "{entry}");
    assert!(entry["age_ms"].as_i64().is_some_and(|a| a >= 0), "{entry}");
    let every = reconcile(&url, &["backlog"]);
    assert_eq!(every["backlog"].as_array().unwrap().len(), 1, "{every}");
    assert_eq!(every["backlog"][0]["execution_id"], entry["execution_id"]);

    // SC-110: fetch twice, one late row.
    let config_path = config.0.to_str().unwrap();
    let first = reconcile(&url, &["fetch-evidence", "--config", config_path]);
    assert_eq!(
        (first["scanned"].as_u64(), first["stored"].as_u64()),
        (Some(1), Some(1)),
        "{first}"
    );
    let second = reconcile(
        &url,
        &["fetch-evidence", "--scope", "acme", "--config", config_path],
    );
    assert_eq!(second["stored"], 0, "{second}");
    assert_eq!(
        second["skipped"][0]["reason"], "has_exact_evidence",
        "{second}"
    );
    let listed = reconcile(&url, &["backlog", "--scope", "acme"]);
    let entry = &listed["backlog"][0];
    assert_eq!(entry["evidence"], "late_exact");
    // The mock's usage: ceil(5 / 4) input and output tokens, at 1 and 2 per million.
    assert_eq!(entry["usage"]["input"], 2);
    assert_eq!(entry["usage"]["output"], 2);
    let amount = entry["amount"].as_str().unwrap().to_string();
    assert_eq!(normalized(&amount), "0.000006");

    // SC-111: the dry run lists the amount and changes nothing.
    let dry = reconcile(
        &url,
        &[
            "resolve",
            "--from-evidence",
            "--scope",
            "acme",
            "--all",
            "--dry-run",
        ],
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["items"][0]["action"], "would_settle");
    assert_eq!(dry["items"][0]["amount"], amount.as_str());
    assert_eq!(
        reconcile(&url, &["backlog"])["backlog"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Settling charges it once; a replay does nothing.
    let args = [
        "resolve",
        "--from-evidence",
        "--scope",
        "acme",
        "--key",
        "cli-cut",
    ];
    let done = reconcile(&url, &args);
    assert_eq!(done["items"][0]["action"], "settled", "{done}");
    assert_eq!(done["items"][0]["amount"], amount.as_str());
    let again = reconcile(&url, &args);
    assert_eq!(again["items"][0]["action"], "skipped");
    assert_eq!(again["items"][0]["reason"], "not_awaiting_operator");
    assert_eq!(
        reconcile(&url, &["backlog"])["backlog"],
        serde_json::json!([])
    );
    let day = chrono::Utc::now().date_naive().to_string();
    let export = json_ok(&run(tollgate()
        .args([
            "finance", "export", "--from", &day, "--to", &day, "--format", "json",
        ])
        .env("DATABASE_URL", &url)));
    let rows = export.as_array().unwrap();
    assert_eq!(rows.len(), 1, "one settlement: {export}");
    assert_eq!(rows[0]["amount"], amount.as_str());
    assert_eq!(rows[0]["source"], "operator");
    let inspected = json_ok(&run(tollgate()
        .args(["inspect", "--scope", "acme", "--key", "cli-cut"])
        .env("DATABASE_URL", &url)));
    let settled = inspected["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["event"]["kind"] == "settled")
        .count();
    assert_eq!(settled, 1, "one settled audit row");
    let ledger = run(tollgate()
        .args(["audit", "ledger", "--scope", "acme"])
        .env("DATABASE_URL", &url));
    assert!(ledger.status.success(), "{}", stderr(&ledger));

    // Neither --all nor --key: refused by the argument parser, nothing changes.
    let refused = run(tollgate()
        .args(["reconcile", "resolve", "--from-evidence", "--scope", "acme"])
        .env("DATABASE_URL", &url));
    assert!(!refused.status.success());
    mock.shutdown().await;
}

#[tokio::test]
async fn sc_140_keys_create_with_expiry_list_and_revoke() {
    let db = fresh_database().await;
    let migrated = run(tollgate().arg("migrate").env("DATABASE_URL", db.url()));
    json_ok(&migrated);
    let created = json_ok(&run(tollgate()
        .args(["keys", "create", "--scope", "acme", "--role", "caller"])
        .args(["--expires-in-days", "7", "--json"])
        .env("DATABASE_URL", db.url())));
    let key = created["key"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(created["expires_at"].is_string(), "{created}");
    json_ok(&run(tollgate()
        .args([
            "keys", "create", "--scope", "other", "--role", "operator", "--json",
        ])
        .env("DATABASE_URL", db.url())));

    let output = run(tollgate()
        .args(["keys", "list", "--scope", "acme", "--json"])
        .env("DATABASE_URL", db.url()));
    assert!(!stdout(&output).contains(&key), "never the key");
    let listed = json_ok(&output);
    let keys = listed["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{listed}");
    assert_eq!(keys[0]["id"], id.as_str());
    assert_eq!(keys[0]["role"], "caller");
    assert_eq!(keys[0]["revoked"], false);
    assert_eq!(keys[0]["expires_at"], created["expires_at"]);

    let revoked = json_ok(&run(tollgate()
        .args(["keys", "revoke", &id, "--json"])
        .env("DATABASE_URL", db.url())));
    assert_eq!(revoked["revoked"], true);
    let listed = json_ok(&run(tollgate()
        .args(["keys", "list", "--json"])
        .env("DATABASE_URL", db.url())));
    let all = listed["keys"].as_array().unwrap();
    assert_eq!(all.len(), 2);
    let mine = all.iter().find(|k| k["id"] == id.as_str()).unwrap();
    assert_eq!(mine["revoked"], true);

    let unknown = run(tollgate()
        .args(["keys", "revoke", &"0".repeat(64)])
        .env("DATABASE_URL", db.url()));
    assert!(!unknown.status.success());
}

/// `keys create --expires-at`: the stored expiry is the instant given; a past instant, a text
/// that is not RFC 3339 and both expiry flags at once are refused and store no key.
#[tokio::test]
async fn sc_144_keys_create_expires_at_an_instant() {
    let db = fresh_database().await;
    json_ok(&run(tollgate()
        .arg("migrate")
        .env("DATABASE_URL", db.url())));
    let created = json_ok(&run(tollgate()
        .args(["keys", "create", "--scope", "acme", "--role", "finance"])
        .args(["--expires-at", "2099-01-02T03:04:05+01:00", "--json"])
        .env("DATABASE_URL", db.url())));
    let at = chrono::DateTime::parse_from_rfc3339(created["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(
        at,
        chrono::DateTime::parse_from_rfc3339("2099-01-02T02:04:05Z").unwrap()
    );
    for bad in [
        vec!["--expires-at", "2020-01-01T00:00:00Z"],
        vec!["--expires-at", "tomorrow"],
        vec![
            "--expires-at",
            "2099-01-01T00:00:00Z",
            "--expires-in-days",
            "3",
        ],
    ] {
        let refused = run(tollgate()
            .args(["keys", "create", "--scope", "acme", "--role", "caller"])
            .args(&bad)
            .env("DATABASE_URL", db.url()));
        assert!(!refused.status.success(), "{bad:?}");
    }
    let listed = json_ok(&run(tollgate()
        .args(["keys", "list", "--json"])
        .env("DATABASE_URL", db.url())));
    assert_eq!(listed["keys"].as_array().unwrap().len(), 1, "{listed}");
}
