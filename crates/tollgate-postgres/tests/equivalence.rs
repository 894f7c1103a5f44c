//! SC-208: one behaviour, several implementations. The same sequence of store calls, issued in
//! concurrent groups, writes the same rows and gets the same answers on the in-memory stores
//! (the reference) and on Postgres by the claim and settlement functions one statement each, by
//! their batch forms, and by the general transactions. Each run is read back through the store
//! traits into sorted `path = value` lines; a difference fails with an expected/found diff.
#![cfg(test)]

use futures::future::{join_all, OptionFuture};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use tollgate_core::config::CallConfig;
use tollgate_core::ids::SessionId;
use tollgate_core::usage::Usage;
use tollgate_postgres::test_support::{BatchFaults, BatchPoint};
use tollgate_postgres::PgStores;
use tollgate_store::audit::verify_chain;
use tollgate_store::{
    AuditChain, AuditPosition, ClaimOutcome, ClaimRequest, EvidenceSource, ExecutionRecord,
    ExecutionView, LedgerAudit, MemoryStores, NewEvidence, SettleOutcome, SettleRequest,
    StoreError, StoreResult, Stores,
};
use tollgate_testkit::conformance::{claim_req, key, money, scope, settle_req, t0, text_config};
use tollgate_testkit::pg::{test_admin_url, TestDatabase};

/// The scope every call of the sequence is in.
const SCOPE: &str = "sc208";
/// The claims of the first group, all sent together: the batch hook gathers this many calls
/// before a runner sends its statement (smaller groups are sent once quiet for 200 ms).
const GATHER: usize = 10;
/// Every key the sequence names, the refused ones (`b1`, `b2`) included.
const KEYS: [&str; 11] = [
    "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "b1", "b2",
];

/// A run, normalized: `path = value`, sorted.
type Lines = BTreeMap<String, String>;

/// `key`'s claim, in a session of its own (`s-<key>`): session caps and session totals then
/// depend on that call only, never on the order of the calls of its group.
fn claim(key_: &str, config: CallConfig, hold: &str, dispatch: bool) -> ClaimRequest {
    let mut request = claim_req(SCOPE, key_, config, hold);
    request.binding.session_id = SessionId::parse(format!("s-{key_}")).expect("a session id");
    request.dispatch = dispatch;
    request
}

fn capped(caps: impl FnOnce(&mut tollgate_core::caps::Caps)) -> CallConfig {
    let mut config = text_config();
    caps(&mut config.caps);
    config
}

/// The settlement of `r` for `input` and `output` tokens at its snapshot's prices (so the ledger
/// audit finds the charge priced), with the call's own stream evidence when `exact` is given
/// (its usage is the usage charged, so exact evidence is acknowledged by the settlement).
fn settle(r: &ExecutionRecord, (input, output): (u64, u64), exact: Option<bool>) -> SettleRequest {
    let mut request = settle_req(r, "0", &format!("output of {}", r.operation_key.as_str()));
    request.usage = Usage {
        input,
        output,
        ..Usage::ZERO
    };
    request.amount = r
        .binding
        .config
        .prices
        .cost(&request.usage)
        .expect("priced");
    request.evidence = exact.map(|exact| NewEvidence {
        scope: r.scope.clone(),
        execution_id: r.id,
        operation_key: r.operation_key.clone(),
        provider_ref: Some("req-1".into()),
        usage: request.usage,
        exact,
        source: EvidenceSource::Stream,
        now: t0(),
    });
    request
}

fn to_json(value: impl Serialize) -> Value {
    serde_json::to_value(value).expect("store rows serialize")
}

fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Unavailable(_) => "Unavailable",
        StoreError::StaleFence(_) => "StaleFence",
        StoreError::NotFound(_) => "NotFound",
        StoreError::Duplicate(_) => "Duplicate",
        StoreError::Corrupt(_) => "Corrupt",
        StoreError::HoldGrows(_) => "HoldGrows",
        StoreError::HoldUnderflow { .. } => "HoldUnderflow",
        StoreError::CurrencyMismatch { .. } => "CurrencyMismatch",
    }
}

/// A journal row. Its binding is kept as the digest of the binding as read back (the stored
/// binding digest stays beside it), so that the diff is not hundreds of config lines while a
/// binding that does not round-trip still differs. Ids are kept and named later ([`name_ids`]).
fn execution_json(r: &ExecutionRecord) -> Value {
    let mut value = to_json(r);
    if let Some(row) = value.as_object_mut() {
        row.remove("binding");
        row.insert(
            "binding_read_digest".into(),
            json!(r.binding.digest().to_hex()),
        );
    }
    value
}

fn view_json(view: Option<&ExecutionView>) -> Value {
    view.map_or(Value::Null, |v| {
        json!({
            "execution": execution_json(&v.execution),
            "result": to_json(&v.result),
            "settlement": to_json(&v.settlement),
            "root_receipt": to_json(&v.root_receipt),
        })
    })
}

fn claim_answer(answer: &StoreResult<ClaimOutcome>) -> Value {
    match answer {
        Ok(ClaimOutcome::Claimed(r)) => json!({"kind": "Claimed", "execution": execution_json(r)}),
        Ok(ClaimOutcome::Existing(view)) => {
            json!({"kind": "Existing", "view": view_json(Some(view))})
        }
        Ok(ClaimOutcome::Blocked(blocked)) => {
            json!({"kind": "Blocked", "blocked": to_json(blocked)})
        }
        Ok(ClaimOutcome::RootRefused(_)) => json!({"kind": "RootRefused"}),
        Ok(ClaimOutcome::Limited(refused)) => {
            json!({"kind": "Limited", "refused": to_json(refused)})
        }
        Err(e) => json!({"kind": "Err", "error": error_kind(e)}),
    }
}

/// A settlement's answer. Its daily totals are left out: every call of the sequence counts
/// against the one day row, so they depend on the order in which a group's settlements commit,
/// which the sequence leaves open; the day row is compared once every group has finished.
fn settle_answer(answer: &StoreResult<SettleOutcome>) -> Value {
    match answer {
        Ok(out) => json!({
            "kind": "Settled",
            "execution": execution_json(&out.record),
            "settlement": to_json(&out.settlement),
            "result": to_json(&out.result),
            "session": to_json(out.session),
            "root_receipt": to_json(&out.root_receipt),
        }),
        Err(e) => json!({"kind": "Err", "error": error_kind(e)}),
    }
}

fn record_answer(answer: &StoreResult<ExecutionRecord>) -> Value {
    match answer {
        Ok(r) => json!({"kind": "Record", "execution": execution_json(r)}),
        Err(e) => json!({"kind": "Err", "error": error_kind(e)}),
    }
}

/// Runs the sequence on `s` and reads everything back, normalized. `name` labels failures.
async fn run<S: Stores + LedgerAudit>(name: &str, s: &S) -> Lines {
    let mut answers = Map::new();
    // 1. New claims, all at once: prepared (a1, a4, a7) and dispatched by the claim itself (the
    //    others), a warn cap (a5) and a block cap (a6) the settlement will cross, and one claim
    //    its session block cap refuses (b1: its hold alone is above the cap, and its session has
    //    no other call, so it is refused whatever the order).
    let warn = capped(|c| c.session_warn = Some(money("0.3")));
    let block = capped(|c| c.session_block = Some(money("0.6")));
    let refuse = capped(|c| c.session_block = Some(money("0.3")));
    let claims = vec![
        claim("a1", text_config(), "0.5", false),
        claim("a2", text_config(), "0.5", true),
        claim("a3", text_config(), "0.5", true),
        claim("a4", text_config(), "0.5", false),
        claim("a5", warn, "0.4", true),
        claim("a6", block, "0.5", true),
        claim("a7", text_config(), "0.3", false),
        claim("a8", text_config(), "0.2", true),
        claim("a9", text_config(), "0.5", true),
        claim("b1", refuse, "0.5", true),
    ];
    let labels: Vec<String> = claims.iter().map(|c| c.operation_key.to_string()).collect();
    let replay_a1 = claims[0].clone();
    let replay_a8 = claims[7].clone();
    let outcomes = join_all(claims.into_iter().map(|c| s.claim(c))).await;
    let mut rows: BTreeMap<String, ExecutionRecord> = BTreeMap::new();
    for (label, outcome) in labels.iter().zip(&outcomes) {
        answers.insert(format!("1-claim/{label}"), claim_answer(outcome));
        if let Ok(ClaimOutcome::Claimed(r)) = outcome {
            rows.insert(label.clone(), r.clone());
        }
    }
    // 2. The dispatch marks of the prepared calls that go on (a7 stays prepared).
    let marks: Vec<ExecutionRecord> = ["a1", "a4"]
        .iter()
        .filter_map(|k| rows.get(*k).cloned())
        .collect();
    let marked = join_all(marks.iter().map(|r| s.mark_dispatched(r.fence(), t0()))).await;
    for (r, answer) in marks.iter().zip(&marked) {
        answers.insert(
            format!("2-dispatch/{}", r.operation_key),
            record_answer(answer),
        );
        if let Ok(d) = answer {
            rows.insert(d.operation_key.to_string(), d.clone());
        }
    }
    // 3. Settlements, all at once (input at 1, output at 2 per million tokens): exact own
    //    evidence (a1 0.1, a2 0.2; acknowledged), none (a3 0.15), inexact evidence (a4 0.25;
    //    left open), a warn cap crossed (a5: 0.35 ≥ 0.3), a block cap exceeded by a charge
    //    above its hold (a6: 0.9 > 0.6, hold 0.5; exact evidence), a plain one (a9 0.1).
    //    a7 (prepared) and a8 (dispatched) are never settled: their holds stay.
    let plan: [(&str, (u64, u64), Option<bool>); 7] = [
        ("a1", (60_000, 20_000), Some(true)),
        ("a2", (100_000, 50_000), Some(true)),
        ("a3", (50_000, 50_000), None),
        ("a4", (150_000, 50_000), Some(false)),
        ("a5", (150_000, 100_000), None),
        ("a6", (500_000, 200_000), Some(true)),
        ("a9", (60_000, 20_000), None),
    ];
    let settles: Vec<(&str, SettleRequest)> = plan
        .iter()
        .filter_map(|(k, tokens, exact)| rows.get(*k).map(|r| (*k, settle(r, *tokens, *exact))))
        .collect();
    let settled = join_all(settles.iter().map(|(_, req)| s.settle(req.clone()))).await;
    for ((label, _), answer) in settles.iter().zip(&settled) {
        answers.insert(format!("3-settle/{label}"), settle_answer(answer));
    }
    // 4. Nothing of these writes, so they are decided the same in any order: replays of a
    //    settled key (a1) and of a dispatched one (a8) with the same binding, a claim the day's
    //    block cap refuses (b2; the day row no longer moves), and a9's settlement sent again with
    //    the same fence (a retry after a lost answer).
    let day_cap = capped(|c| c.daily_block = Some(money("1")));
    let b2 = claim("b2", day_cap, "0.5", false);
    let again = settles.iter().find(|(k, _)| *k == "a9");
    let (replays, retry) = futures::join!(
        join_all([replay_a1, replay_a8, b2].map(|c| s.claim(c))),
        OptionFuture::from(again.map(|(_, request)| s.settle(request.clone()))),
    );
    for (label, answer) in ["a1", "a8", "b2"].iter().zip(&replays) {
        answers.insert(format!("4-claim/{label}"), claim_answer(answer));
    }
    if let Some(answer) = &retry {
        answers.insert("4-settle-again/a9".into(), settle_answer(answer));
    }
    let mut snapshot = read_back(name, s).await;
    snapshot.insert("answers".into(), Value::Object(answers));
    let names = id_names(&snapshot);
    let mut snapshot = Value::Object(snapshot);
    name_ids(&mut snapshot, &names);
    let mut lines = Lines::new();
    flatten("", &snapshot, &mut lines);
    lines
}

/// Everything the sequence wrote, read back through the traits.
async fn read_back<S: Stores + LedgerAudit>(name: &str, s: &S) -> Map<String, Value> {
    let sc = scope(SCOPE);
    let usd = text_config().currency;
    let consumer = text_config().consumer;
    let mut rows = Map::new();
    for k in KEYS {
        let view = s.execution_view(&sc, &key(k)).await.expect("a view");
        let evidence = match &view {
            // Each evidence row without its `seq`: a store-wide insertion counter whose values
            // depend on the commit order of a group's settlements (and may have gaps on
            // Postgres); the rows of one execution stay in insertion order.
            Some(v) => s
                .evidence_for(v.execution.id)
                .await
                .expect("evidence")
                .into_iter()
                .map(|e| {
                    let mut row = to_json(&e);
                    row.as_object_mut().map(|r| r.remove("seq"));
                    row
                })
                .collect(),
            None => Vec::new(),
        };
        let session = SessionId::parse(format!("s-{k}")).expect("a session id");
        let spend = s
            .session_spend(&sc, &consumer, &session, &usd)
            .await
            .expect("session spend");
        let row = json!({
            "view": view_json(view.as_ref()),
            "evidence": evidence,
            "session_spend": to_json(spend),
        });
        rows.insert(k.into(), row);
    }
    let daily = s
        .daily_spend(&sc, &consumer, t0().date_naive(), &usd)
        .await
        .expect("daily spend");
    let audit = s
        .audit_rows(&sc, AuditPosition::START, 1000)
        .await
        .expect("audit rows");
    assert!(audit.len() < 1000, "{name}: the audit trail fits one page");
    verify_chain(&audit).unwrap_or_else(|e| panic!("{name}: the audit chains verify: {e:?}"));
    // Per execution, its rows in order. Left out: the chain (chosen by the random execution id;
    // checked to be that id's chain instead), the seq (shared by the executions of a chain, so
    // it depends on how they interleave) and the hashes (over ids and seqs; verified above).
    let mut trails: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for row in &audit {
        let execution = row.event.execution_id;
        let trail = execution.map_or_else(|| "none".to_string(), |id| id.to_string());
        trails.entry(trail).or_default().push(json!({
            "kind": row.event.kind,
            "detail": row.event.detail,
            "at": row.event.at,
            "in_its_chain": execution.is_some_and(|id| AuditChain::of_execution(id) == row.chain),
        }));
    }
    let ledger = s
        .audit_ledger(Some(&sc), 100)
        .await
        .expect("a ledger audit");
    assert!(
        ledger.ok,
        "{name}: the ledger audit finds violations: {ledger:?}"
    );
    let mut snapshot = Map::new();
    snapshot.insert("rows".into(), Value::Object(rows));
    snapshot.insert("daily_spend".into(), to_json(daily));
    snapshot.insert("audit".into(), to_json(trails));
    snapshot.insert("ledger".into(), to_json(&ledger));
    snapshot
}

/// The names of the run's random ids: each execution, settlement and evidence id (as read back)
/// by the key of its call. They differ on every run by design; what is compared is which row
/// each one names.
fn id_names(snapshot: &Map<String, Value>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let Some(Value::Object(rows)) = snapshot.get("rows") else {
        return names;
    };
    for (k, row) in rows {
        let view = &row["view"];
        if let Some(id) = view["execution"]["id"].as_str() {
            names.insert(id.to_string(), format!("<execution {k}>"));
        }
        if let Some(id) = view["settlement"]["id"].as_str() {
            names.insert(id.to_string(), format!("<settlement {k}>"));
        }
        for (i, evidence) in row["evidence"].as_array().into_iter().flatten().enumerate() {
            if let Some(id) = evidence["id"].as_str() {
                names.insert(id.to_string(), format!("<evidence {k} #{i}>"));
            }
        }
    }
    names
}

/// Replaces every id named in `names`, in values and in object keys (the audit trails are keyed
/// by execution id). An id not named stays as it is and so differs between implementations.
fn name_ids(value: &mut Value, names: &BTreeMap<String, String>) {
    match value {
        Value::String(text) => {
            if let Some(name) = names.get(text.as_str()) {
                *text = name.clone();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| name_ids(v, names)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (k, mut v) in entries {
                name_ids(&mut v, names);
                map.insert(names.get(&k).cloned().unwrap_or(k), v);
            }
        }
        _ => {}
    }
}

fn flatten(path: &str, value: &Value, lines: &mut Lines) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                flatten(&format!("{path}/{k}"), v, lines);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{path}[{i}]"), v, lines);
            }
        }
        leaf => {
            lines.insert(path.to_string(), leaf.to_string());
        }
    }
}

/// The lines that differ, expected (the reference) against found.
fn diff(expected: &Lines, found: &Lines) -> Vec<String> {
    let absent = "(absent)".to_string();
    let mut paths: Vec<&String> = expected.keys().chain(found.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|p| {
            let (e, f) = (expected.get(p), found.get(p));
            (e != f).then(|| {
                let (e, f) = (e.unwrap_or(&absent), f.unwrap_or(&absent));
                format!("  {p}\n    expected: {e}\n    found:    {f}")
            })
        })
        .collect()
}

/// The reference run, with the checks that it shows what the sequence is meant to show.
async fn reference() -> Lines {
    let lines = run("memory", &MemoryStores::new()).await;
    let expect = |path: &str, value: &str| {
        assert_eq!(
            lines.get(path).map(String::as_str),
            Some(value),
            "the reference run: {path}"
        );
    };
    expect("/answers/1-claim/b1/kind", "\"Blocked\"");
    expect("/answers/4-claim/b2/kind", "\"Blocked\"");
    expect("/answers/4-claim/a1/kind", "\"Existing\"");
    expect("/answers/4-claim/a8/kind", "\"Existing\"");
    expect("/answers/4-settle-again/a9/error", "\"StaleFence\"");
    expect("/answers/3-settle/a5/result/warnings[0]/level", "\"warn\"");
    expect("/rows/a6/view/result/outcome", "\"blocked\"");
    expect("/rows/a6/view/result/output", "null");
    expect("/rows/a7/view/execution/state", "\"prepared\"");
    expect("/rows/a8/view/execution/state", "\"dispatched\"");
    expect("/rows/b1/view", "null");
    expect("/rows/b2/view", "null");
    expect("/daily_spend/held", "\"0.5\"");
    expect("/daily_spend/settled", "\"2.05\"");
    for k in ["a1", "a2", "a6"] {
        // Exact own evidence, acknowledged by its settlement at the settlement's time.
        let acknowledged = format!("/rows/{k}/evidence[0]/acknowledged_at");
        expect(&acknowledged, "\"2026-11-29T10:00:00Z\"");
    }
    expect("/rows/a4/evidence[0]/acknowledged_at", "null");
    lines
}

/// The lines of a run on `stores` that differ from the reference run's.
async fn differences(name: &str, stores: &PgStores) -> Vec<String> {
    let expected = reference().await;
    let found = run(name, stores).await;
    diff(&expected, &found)
}

/// Fails with the diff when there is one.
fn assert_same(name: &str, lines: &[String]) {
    // The stored post-call cap warnings are checked apart, so that a difference there names
    // its cause: the settlement function (alone and batched) must store `spent` as `Money`
    // serializes it ("0.35"), as the memory stores and the general transaction do, not at the
    // spend column's scale ("0.350000000000", `numeric(38, 12)::text` in `tollgate_crossed`,
    // caps.sql). Equal as numbers, the rows still differ, and so does a serialized result view.
    let warnings: Vec<String> = lines
        .iter()
        .filter(|l| l.contains("/warnings["))
        .cloned()
        .collect();
    assert!(
        warnings.is_empty(),
        "SC-208: {name} stores the post-call cap warnings otherwise than the in-memory stores \
         (settle function: `tollgate_crossed` writes `spent` as numeric(38, 12)::text):\n{}",
        warnings.join("\n")
    );
    assert!(
        lines.is_empty(),
        "SC-208: {name} wrote or answered otherwise than the in-memory stores, {} line(s):\n{}",
        lines.len(),
        lines.join("\n")
    );
}

/// Stores over a fresh migrated database of their own, with `connections` connections and
/// leases on the caller's clock (the memory stores' rule, so lease ends compare).
async fn fresh(connections: u32) -> (TestDatabase, PgStores) {
    let database = TestDatabase::create(&test_admin_url())
        .await
        .expect("a test database");
    let stores = database.stores(connections).await.expect("stores");
    stores.migrate().await.expect("migrated");
    (database, stores.with_caller_lease_clock())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_208_the_functions_one_call_a_statement_write_what_memory_writes() {
    // Fewer than four connections: no lane, so no batches; every call is its own statement.
    let (_database, stores) = fresh(2).await;
    assert_eq!(
        stores.batch_shard(SCOPE, "team-a"),
        None,
        "stores without batches"
    );
    assert_same("functions", &differences("functions", &stores).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_208_h_43_the_batch_forms_write_what_memory_writes() {
    let (_database, stores) = fresh(8).await;
    let hook = BatchFaults::new(GATHER);
    let stores = stores.with_batch_faults(&hook);
    let lines = differences("batches", &stores).await;
    // Checked first: without batches of two calls or more the comparison shows nothing of them.
    let batches = hook.batches();
    for point in BatchPoint::ALL {
        assert!(
            batches.get(&point).copied().unwrap_or(0) >= 1,
            "no {} of two calls or more was sent, so nothing was compared: {:?}",
            point.as_str(),
            hook.sizes()
        );
    }
    // Step 4's claims and settlement reach one shard together: one statement carries both
    // (H-43).
    assert!(
        hook.shared() >= 1,
        "no statement carried claims and settlements together: {:?}",
        hook.sizes()
    );
    assert_same("batches", &lines);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sc_208_the_general_transactions_write_what_memory_writes() {
    let (_database, stores) = fresh(8).await;
    let stores = stores.with_general_transactions();
    assert_same(
        "general transactions",
        &differences("general transactions", &stores).await,
    );
}
