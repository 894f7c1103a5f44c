//! Operator commands against `DATABASE_URL`: recover, reconcile, inspect, audit verify, audit
//! ledger, finance export. Each prints JSON on stdout (audit ledger: a human form unless
//! `--json`) and a one-line reason on failure.

use crate::commands::{connect_migrated, database_url};
use crate::out;
use chrono::NaiveDate;
use serde_json::json;
use std::sync::Arc;
use tollgate_core::ids::{OperationKey, Scope};
use tollgate_postgres::PgStores;
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::{views, SystemClock};
use tollgate_store::audit::verify_chain;
use tollgate_store::ledger::{ledger_limit, LedgerReport};
use tollgate_store::{
    AllStores, AuditLog, ExecutionStore, LedgerAudit, ResultStore, SettlementStore, UsageInbox,
};

/// Audit rows read per page when verifying or inspecting.
const AUDIT_PAGE_ROWS: u32 = 1_000;
/// Settlement rows exported at most.
const EXPORT_ROWS_MAX: u32 = 100_000;

async fn stores() -> Result<Arc<PgStores>, String> {
    let url =
        database_url().ok_or("DATABASE_URL is not set (operator commands work on Postgres)")?;
    Ok(Arc::new(connect_migrated(&url).await?))
}

fn scope(text: &str) -> Result<Scope, String> {
    Scope::parse(text).map_err(|e| e.to_string())
}

fn key(text: &str) -> Result<OperationKey, String> {
    OperationKey::parse(text).map_err(|e| e.to_string())
}

fn reconciler(stores: Arc<PgStores>) -> Reconciler {
    let roots: Arc<dyn AllStores> = stores;
    Reconciler::with_roots(roots, Arc::new(SystemClock))
}

/// `tollgate recover --scope S --key K [--lease-ms N]`.
pub async fn recover(scope_: &str, key_: &str, lease_ms: u64) -> Result<(), String> {
    let (scope, key) = (scope(scope_)?, key(key_)?);
    let view = reconciler(stores().await?)
        .recover(&scope, &key, lease_ms)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no execution {key} in scope {scope}"))?;
    out::json(&serde_json::to_value(view).map_err(|e| e.to_string())?);
    Ok(())
}

/// `tollgate reconcile expired --scope S [--limit N]`.
pub async fn reconcile_expired(scope_: &str, limit: u32, lease_ms: u64) -> Result<(), String> {
    let counts = reconciler(stores().await?)
        .reconcile_expired(&scope(scope_)?, limit, lease_ms)
        .await
        .map_err(|e| e.to_string())?;
    out::json(&json!({"roots": counts.roots, "executions": counts.executions}));
    Ok(())
}

/// `tollgate reconcile usage --scope S [--limit N] [--after CURSOR]`.
pub async fn reconcile_usage(
    scope_: &str,
    limit: Option<u32>,
    after: Option<i64>,
) -> Result<(), String> {
    let none = |_: &OperationKey| false;
    let counts = reconciler(stores().await?)
        .reconcile_usage(&scope(scope_)?, limit, after, &none)
        .await
        .map_err(|e| e.to_string())?;
    out::json(
        &json!({"scanned": counts.scanned, "acknowledged": counts.acknowledged, "cursor": counts.cursor}),
    );
    Ok(())
}

/// `tollgate inspect --scope S --key K [--with-content]`: the view, the journal row (without
/// the snapshot's system prompt unless asked), settlement, evidence and the execution's audit rows.
pub async fn inspect(scope_: &str, key_: &str, with_content: bool) -> Result<(), String> {
    let (scope, key) = (scope(scope_)?, key(key_)?);
    let stores = stores().await?;
    let err = |e: tollgate_store::StoreError| e.to_string();
    let record = stores
        .execution(&scope, &key)
        .await
        .map_err(err)?
        .ok_or_else(|| format!("no execution {key} in scope {scope}"))?;
    let mut view = views::view_of(stores.as_ref(), &record, chrono::Utc::now())
        .await
        .map_err(err)?;
    if !with_content {
        view.output = None;
        view.step = None;
    }
    let mut journal = serde_json::to_value(&record).map_err(|e| e.to_string())?;
    if !with_content {
        journal["binding"]["config"]["system"] = json!(null);
    }
    let settlement = stores.settlement(record.id).await.map_err(err)?;
    let evidence = stores.evidence_for(record.id).await.map_err(err)?;
    let result = stores.result(record.id).await.map_err(err)?;
    let mut trail = Vec::new();
    let mut after = 0;
    loop {
        let page = stores
            .audit_rows(&scope, after, AUDIT_PAGE_ROWS)
            .await
            .map_err(err)?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        trail.extend(
            page.into_iter()
                .filter(|r| r.event.execution_id == Some(record.id)),
        );
    }
    out::json(&json!({
        "view": view,
        "journal": journal,
        "settlement": settlement,
        "evidence": evidence,
        "retention": result.map(|r| json!({"expires_at": r.retention_expires_at, "erased_at": r.erased_at})),
        "audit": trail,
    }));
    Ok(())
}

/// `tollgate audit verify --scope S`: exit 1 with the first bad row when the chain is broken.
pub async fn audit_verify(scope_: &str) -> Result<(), String> {
    let scope = scope(scope_)?;
    let stores = stores().await?;
    let mut rows = Vec::new();
    let mut after = 0;
    loop {
        let page = stores
            .audit_rows(&scope, after, AUDIT_PAGE_ROWS)
            .await
            .map_err(|e| e.to_string())?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        rows.extend(page);
    }
    match verify_chain(&rows) {
        Ok(()) => {
            out::json(&json!({"scope": scope, "rows": rows.len(), "ok": true}));
            Ok(())
        }
        Err(broken) => {
            out::json(
                &json!({"scope": scope, "ok": false, "seq": broken.seq, "reason": broken.reason}),
            );
            Err(broken.to_string())
        }
    }
}

/// `tollgate audit ledger [--scope S] [--limit N]`: the ledger audit (spec/storage.md — Ledger
/// audit) of one scope or of every scope. Prints the report (`--json`: the report object); exit
/// 1 naming the first violated invariant and its rows (ids and amounts only).
pub async fn audit_ledger(
    scope_: Option<&str>,
    limit: Option<u32>,
    json_out: bool,
) -> Result<(), String> {
    let scope = scope_.map(scope).transpose()?;
    let stores = stores().await?;
    let report = stores
        .audit_ledger(scope.as_ref(), ledger_limit(limit))
        .await
        .map_err(|e| e.to_string())?;
    if json_out {
        out::json(&serde_json::to_value(&report).map_err(|e| e.to_string())?);
    } else {
        print_ledger(&report);
    }
    match report.first() {
        None if report.ok => Ok(()),
        Some(first) => Err(format!("ledger invariant violated: {first}")),
        None => Err(format!(
            "{} ledger violations found",
            report.violations_total
        )),
    }
}

fn print_ledger(report: &LedgerReport) {
    let of = match &report.scope {
        Some(scope) => format!("scope {scope}"),
        None => "every scope".to_string(),
    };
    let c = &report.checked;
    let status = match report.violations_total {
        0 => "ok".to_string(),
        1 => "1 violation".to_string(),
        n => format!("{n} violations"),
    };
    out::line(&format!(
        "ledger audit of {of}: {status} (checked: scopes {}, executions {}, settlements {}, \
         spend rows {}, roots {}, root receipts {}, acknowledged evidence {})",
        c.scopes, c.executions, c.settlements, c.spend_rows, c.roots, c.root_receipts, c.evidence
    ));
    for violation in &report.violations {
        out::line(&format!("  {violation}"));
    }
    if report.truncated {
        let more = report.violations_total - report.violations.len() as u64;
        out::line(&format!("  ... and {more} more"));
    }
}

/// `tollgate finance export --from DAY --to DAY [--format csv|json]`, from `finance.settlements`.
pub async fn finance_export(from: NaiveDate, to: NaiveDate, format: &str) -> Result<(), String> {
    if !matches!(format, "csv" | "json") {
        return Err(format!("unknown format {format:?} (csv, json)"));
    }
    let stores = stores().await?;
    let rows = stores
        .settlements(from, to, EXPORT_ROWS_MAX)
        .await
        .map_err(|e| e.to_string())?;
    if format == "json" {
        out::json(&serde_json::to_value(&rows).map_err(|e| e.to_string())?);
        return Ok(());
    }
    out::line("settlement_id,scope,consumer,session_id,accounting_day,execution_id,operation_key,kind,provider,model,price_version,policy_version,currency,input_tokens,output_tokens,cache_read_tokens,cache_write_tokens,reasoning_tokens,amount,source,settled_at");
    for r in rows {
        let fields = [
            r.id.to_string(),
            r.scope.to_string(),
            r.consumer.to_string(),
            r.session_id.to_string(),
            r.accounting_day.to_string(),
            r.execution_id.to_string(),
            r.operation_key.to_string(),
            r.kind.to_string(),
            r.provider.clone(),
            r.model.clone(),
            r.price_version.clone(),
            r.policy_version.clone(),
            r.currency.to_string(),
            r.usage.input.to_string(),
            r.usage.output.to_string(),
            r.usage.cache_read.to_string(),
            r.usage.cache_write.to_string(),
            r.usage.reasoning.to_string(),
            r.amount.to_string(),
            r.source.to_string(),
            r.settled_at.to_rfc3339(),
        ];
        out::line(&fields.map(|f| csv_field(&f)).join(","));
    }
    Ok(())
}

fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_string()
    }
}
