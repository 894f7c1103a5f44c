//! Operator commands against `DATABASE_URL`: recover, reconcile, inspect, audit verify, audit
//! ledger, finance export. Each prints JSON on stdout (audit ledger: a human form unless
//! `--json`) and a one-line reason on failure.

use crate::database::{connect_migrated, database_url};
use crate::error::CommandError;
use crate::print;
use chrono::NaiveDate;
use serde_json::json;
use std::io::Write;
use std::sync::Arc;
use tollgate_core::ids::{OperationKey, Scope};
use tollgate_postgres::PgStores;
use tollgate_runner::backlog::{FetchReport, Selection};
use tollgate_runner::recovery::Reconciler;
use tollgate_runner::{views, SystemClock};
use tollgate_server::console::csv::settlement_row as csv_row;
use tollgate_store::audit::{ChainBroken, ChainVerifier};
use tollgate_store::ledger::{ledger_limit, LedgerReport};
use tollgate_store::{
    AllStores, AuditChain, AuditHead, AuditLog, AuditPosition, ExecutionStore, FeedPosition,
    LedgerAudit, ResultStore, SettlementStore, UsageInbox, WorkScan,
};

/// Scopes read per page when a command runs over every scope with work.
const SCOPES_PAGE: u32 = 1_000;
/// Audit rows read per page when verifying or inspecting.
const AUDIT_PAGE_ROWS: u32 = 1_000;
/// Settlement rows `finance export` reads per page (it writes each page before reading the next).
const EXPORT_PAGE_ROWS: u32 = 1_000;

async fn stores() -> Result<Arc<PgStores>, CommandError> {
    let url = database_url().ok_or(CommandError::NoDatabase(
        " (operator commands work on Postgres)",
    ))?;
    Ok(Arc::new(connect_migrated(&url).await?))
}

fn scope(text: &str) -> Result<Scope, CommandError> {
    Ok(Scope::parse(text)?)
}

fn key(text: &str) -> Result<OperationKey, CommandError> {
    Ok(OperationKey::parse(text)?)
}

fn reconciler(stores: Arc<PgStores>) -> Reconciler {
    let roots: Arc<dyn AllStores> = stores;
    Reconciler::with_roots(roots, Arc::new(SystemClock))
}

/// `tollgate recover --scope S --key K [--lease-ms N]`.
pub async fn recover(scope_: &str, key_: &str, lease_ms: u64) -> Result<(), CommandError> {
    let (scope, key) = (scope(scope_)?, key(key_)?);
    let view = reconciler(stores().await?)
        .recover(&scope, &key, lease_ms)
        .await?
        .ok_or(CommandError::NoExecution { scope, key })?;
    print::json(&serde_json::to_value(view)?);
    Ok(())
}

/// `tollgate reconcile expired --scope S [--limit N]`.
pub async fn reconcile_expired(
    scope_: &str,
    limit: u32,
    lease_ms: u64,
) -> Result<(), CommandError> {
    let counts = reconciler(stores().await?)
        .reconcile_expired(&scope(scope_)?, limit, lease_ms)
        .await?;
    print::json(&json!({"roots": counts.roots, "executions": counts.executions}));
    Ok(())
}

/// `tollgate reconcile usage --scope S [--limit N] [--after CURSOR]`.
pub async fn reconcile_usage(
    scope_: &str,
    limit: Option<u32>,
    after: Option<i64>,
) -> Result<(), CommandError> {
    let none = |_: &OperationKey| false;
    let counts = reconciler(stores().await?)
        .reconcile_usage(&scope(scope_)?, limit, after, &none)
        .await?;
    print::json(
        &json!({"scanned": counts.scanned, "acknowledged": counts.acknowledged, "cursor": counts.cursor}),
    );
    Ok(())
}

/// `scope`, or every scope with work (in name order) when `None`.
async fn scopes_of(stores: &PgStores, scope_: Option<&str>) -> Result<Vec<Scope>, CommandError> {
    if let Some(text) = scope_ {
        return Ok(vec![scope(text)?]);
    }
    let mut all: Vec<Scope> = Vec::new();
    loop {
        let page = stores.scopes_with_work(all.last(), SCOPES_PAGE).await?;
        let full = page.len() >= SCOPES_PAGE as usize;
        all.extend(page);
        if !full {
            return Ok(all);
        }
    }
}

/// `tollgate reconcile backlog [--scope S] [--limit N]` (SC-112).
pub async fn backlog(scope_: Option<&str>, limit: u32) -> Result<(), CommandError> {
    let stores = stores().await?;
    let scopes = scopes_of(&stores, scope_).await?;
    let reconciler = reconciler(stores);
    let mut backlog = Vec::new();
    for scope in &scopes {
        backlog.extend(reconciler.backlog(scope, limit).await?);
    }
    print::json(&json!({ "backlog": backlog }));
    Ok(())
}

/// `tollgate reconcile fetch-evidence [--scope S] [--limit N] [--config FILE]` (SC-110).
pub async fn fetch_evidence(
    scope_: Option<&str>,
    limit: u32,
    config: Option<std::path::PathBuf>,
) -> Result<(), CommandError> {
    let fetchers =
        tollgate_server::start::fetchers(&tollgate_server::start::Options::from_process(config))?;
    let fetcher_for = |name: &str| fetchers.get(name).cloned();
    let stores = stores().await?;
    let scopes = scopes_of(&stores, scope_).await?;
    let reconciler = reconciler(stores);
    let mut total = FetchReport::default();
    let mut skipped = Vec::new();
    for scope in &scopes {
        let report = reconciler
            .fetch_evidence(scope, limit, &fetcher_for)
            .await?;
        total.scanned += report.scanned;
        total.stored += report.stored;
        total.duplicate += report.duplicate;
        skipped.extend(report.skipped.into_iter().map(
            |s| json!({"scope": scope, "operation_key": s.operation_key, "reason": s.reason}),
        ));
    }
    print::json(&json!({
        "scanned": total.scanned,
        "stored": total.stored,
        "duplicate": total.duplicate,
        "skipped": skipped,
    }));
    Ok(())
}

/// `tollgate reconcile resolve --from-evidence --scope S (--all | --key K…) [--dry-run]`
/// (SC-111).
pub async fn resolve_from_evidence(
    scope_: &str,
    all: bool,
    keys: &[String],
    dry_run: bool,
    limit: u32,
) -> Result<(), CommandError> {
    let scope = scope(scope_)?;
    let selection = match (all, keys.is_empty()) {
        (true, true) => Selection::All(limit),
        (false, false) => {
            Selection::Keys(keys.iter().map(|k| key(k)).collect::<Result<Vec<_>, _>>()?)
        }
        _ => {
            return Err(CommandError::InvalidArgument(
                "name either --all or --key, not both".into(),
            ))
        }
    };
    let report = reconciler(stores().await?)
        .resolve_from_evidence(&scope, &selection, dry_run)
        .await?;
    print::json(&serde_json::to_value(&report)?);
    Ok(())
}

/// `tollgate inspect --scope S --key K [--with-content]`: the view, the journal row (without
/// the snapshot's system prompt unless asked), settlement, evidence and the execution's audit rows.
pub async fn inspect(scope_: &str, key_: &str, with_content: bool) -> Result<(), CommandError> {
    let (scope, key) = (scope(scope_)?, key(key_)?);
    let stores = stores().await?;
    let record =
        stores
            .execution(&scope, &key)
            .await?
            .ok_or_else(|| CommandError::NoExecution {
                scope: scope.clone(),
                key: key.clone(),
            })?;
    let mut view = views::view_of(stores.as_ref(), &record, chrono::Utc::now()).await?;
    if !with_content {
        view.output = None;
        view.step = None;
    }
    let mut journal = serde_json::to_value(&record)?;
    if !with_content {
        journal["binding"]["config"]["system"] = json!(null);
    }
    let settlement = stores.settlement(record.id).await?;
    let evidence = stores.evidence_for(record.id).await?;
    let result = stores.result(record.id).await?;
    // Every row of the execution is in its one chain.
    let chain = AuditChain::of_execution(record.id);
    let mut trail = Vec::new();
    let mut after = AuditPosition { chain, seq: 0 };
    loop {
        let page = stores.audit_rows(&scope, after, AUDIT_PAGE_ROWS).await?;
        let Some(last) = page.last() else { break };
        after = last.position();
        let past = last.chain != chain;
        trail.extend(
            page.into_iter()
                .filter(|r| r.chain == chain && r.event.execution_id == Some(record.id)),
        );
        if past {
            break;
        }
    }
    print::json(&json!({
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
pub async fn audit_verify(scope_: &str) -> Result<(), CommandError> {
    let scope = scope(scope_)?;
    let stores = stores().await?;
    // The heads first: rows appended while the walk runs are past them and not read.
    let heads = stores.audit_heads(&scope).await?;
    let checked = walk_chain(stores.as_ref(), &scope, &heads).await?;
    match checked {
        Ok(rows) => {
            print::json(&json!({"scope": scope, "rows": rows, "ok": true}));
            Ok(())
        }
        Err(broken) => {
            print::json(
                &json!({"scope": scope, "ok": false, "chain": broken.chain, "seq": broken.seq, "reason": broken.reason}),
            );
            Err(CommandError::CheckFailed(broken.to_string()))
        }
    }
}

/// Verifies each chain up to its head page by page (bounded memory), then against the heads.
async fn walk_chain(
    stores: &PgStores,
    scope: &Scope,
    heads: &[AuditHead],
) -> Result<Result<i64, ChainBroken>, CommandError> {
    let end = |chain: AuditChain| {
        heads
            .iter()
            .find(|h| h.chain == chain)
            .map_or(i64::MAX, |h| h.seq)
    };
    let mut verifier = ChainVerifier::default();
    let mut after = AuditPosition::START;
    loop {
        let page = stores.audit_rows(scope, after, AUDIT_PAGE_ROWS).await?;
        let Some(last) = page.last() else { break };
        after = last.position();
        for row in page.iter().filter(|r| r.seq <= end(r.chain)) {
            if let Err(broken) = verifier.push(row) {
                return Ok(Err(broken));
            }
        }
        if after.seq >= end(after.chain) {
            // The rest of this chain was appended after the heads were read.
            after.seq = i64::MAX;
        }
    }
    let rows = verifier.rows();
    Ok(verifier.finish(heads).map(|()| rows))
}

/// `tollgate audit ledger [--scope S] [--limit N]`: the ledger audit (spec/storage.md — Ledger
/// audit) of one scope or of every scope. Prints the report (`--json`: the report object); exit
/// 1 naming the first violated invariant and its rows (ids and amounts only).
pub async fn audit_ledger(
    scope_: Option<&str>,
    limit: Option<u32>,
    json_out: bool,
) -> Result<(), CommandError> {
    let scope = scope_.map(scope).transpose()?;
    let stores = stores().await?;
    let report = stores
        .audit_ledger(scope.as_ref(), ledger_limit(limit))
        .await?;
    if json_out {
        print::json(&serde_json::to_value(&report)?);
    } else {
        print_ledger(&report);
    }
    match report.first() {
        None if report.ok => Ok(()),
        Some(first) => Err(CommandError::CheckFailed(format!(
            "ledger invariant violated: {first}"
        ))),
        None => Err(CommandError::CheckFailed(format!(
            "{} ledger violations found",
            report.violations_total
        ))),
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
    print::line(&format!(
        "ledger audit of {of}: {status} (checked: scopes {}, executions {}, settlements {}, \
         spend rows {}, roots {}, root receipts {}, acknowledged evidence {})",
        c.scopes, c.executions, c.settlements, c.spend_rows, c.roots, c.root_receipts, c.evidence
    ));
    for violation in &report.violations {
        print::line(&format!("  {violation}"));
    }
    if report.truncated {
        let more = report.violations_total - report.violations.len() as u64;
        print::line(&format!("  ... and {more} more"));
    }
}

/// `tollgate finance export --from DAY --to DAY [--format csv|json]`, from `finance.settlements`.
pub async fn finance_export(
    from: NaiveDate,
    to: NaiveDate,
    format: &str,
) -> Result<(), CommandError> {
    let format = ExportFormat::parse(format)?;
    let stores = stores().await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    export_settlements(&*stores, from, to, format, EXPORT_PAGE_ROWS, &mut out).await?;
    out.flush().map_err(export_io)
}

/// How `finance export` writes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExportFormat {
    Csv,
    /// One JSON array, written row by row.
    Json,
}

impl ExportFormat {
    fn parse(format: &str) -> Result<Self, CommandError> {
        match format {
            "csv" => Ok(Self::Csv),
            "json" => Ok(Self::Json),
            other => Err(CommandError::InvalidArgument(format!(
                "unknown format {other:?} (csv, json)"
            ))),
        }
    }
}

fn export_io(source: std::io::Error) -> CommandError {
    CommandError::Io {
        action: "write the export".into(),
        source,
    }
}

/// The finance view's columns, in order (shared with the console's CSV download).
const EXPORT_CSV_HEADER: &str = tollgate_server::console::csv::HEADER;

/// Writes every settlement with `from ≤ accounting_day ≤ to` to `out` as it is read, one page
/// of `page_rows` at a time through the finance feed's cursor (SC-143): no row limit, memory
/// bounded by a page. The feed lists settlements whose transactions have ended, in feed order.
async fn export_settlements<S: SettlementStore + ?Sized, W: Write>(
    stores: &S,
    from: NaiveDate,
    to: NaiveDate,
    format: ExportFormat,
    page_rows: u32,
    out: &mut W,
) -> Result<u64, CommandError> {
    match format {
        ExportFormat::Csv => writeln!(out, "{EXPORT_CSV_HEADER}"),
        ExportFormat::Json => write!(out, "["),
    }
    .map_err(export_io)?;
    let mut after = FeedPosition::START;
    let mut written = 0u64;
    loop {
        let page = stores.settlements_after(None, after, page_rows).await?;
        let Some(last) = page.last() else { break };
        after = last.position;
        for entry in page {
            let r = entry.settlement;
            if r.accounting_day < from || r.accounting_day > to {
                continue;
            }
            match format {
                ExportFormat::Csv => writeln!(out, "{}", csv_row(&r)),
                ExportFormat::Json => {
                    let sep = if written == 0 { "" } else { "," };
                    write!(out, "{sep}{}", serde_json::to_string(&r)?)
                }
            }
            .map_err(export_io)?;
            written += 1;
        }
    }
    if format == ExportFormat::Json {
        writeln!(out, "]").map_err(export_io)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_server::console::csv::field as csv_field;
    use tollgate_store::SettlementRecord;

    #[test]
    fn csv_fields_are_quoted_and_formulas_neutralized() {
        assert_eq!(csv_field("plain-key"), "plain-key");
        assert_eq!(csv_field("0.000017"), "0.000017");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_field("+1"), "'+1");
        assert_eq!(csv_field("-2"), "'-2");
        assert_eq!(csv_field("@sum"), "'@sum");
    }

    /// More settlements than a page, with a formula in a caller-controlled cell: all of them
    /// are written once, outside the day range none, and the formula stays neutralized.
    #[tokio::test]
    async fn sc_143_export_pages_through_every_row_of_the_range() {
        use tollgate_store::{ClaimOutcome, ExecutionStore, MemoryStores};
        use tollgate_testkit::conformance::{claim_req, settle_req, text_config};
        let stores = MemoryStores::new();
        let mut keys = Vec::new();
        for i in 0..7 {
            let key = if i == 3 {
                "=cmd()".to_string()
            } else {
                format!("k{i}")
            };
            let ClaimOutcome::Claimed(r) = stores
                .claim(claim_req("a", &key, text_config(), "0.5"))
                .await
                .unwrap()
            else {
                panic!("fresh key")
            };
            let r = stores
                .mark_dispatched(r.fence(), tollgate_testkit::conformance::t0())
                .await
                .unwrap();
            stores.settle(settle_req(&r, "0.01", "x")).await.unwrap();
            keys.push(key);
        }
        let day = tollgate_testkit::conformance::t0().date_naive();
        let mut out = Vec::new();
        let written = export_settlements(&stores, day, day, ExportFormat::Csv, 2, &mut out)
            .await
            .unwrap();
        assert_eq!(written, 7, "7 rows over 4 pages of 2");
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], EXPORT_CSV_HEADER);
        assert_eq!(lines.len(), 8);
        assert!(lines[4].contains(",'=cmd(),"), "{}", lines[4]);
        for (line, key) in lines[1..].iter().zip(&keys) {
            assert_eq!(line.split(',').nth(6), Some(csv_field(key).as_str()));
        }
        let mut json = Vec::new();
        export_settlements(&stores, day, day, ExportFormat::Json, 3, &mut json)
            .await
            .unwrap();
        let rows: Vec<SettlementRecord> = serde_json::from_slice(&json).unwrap();
        assert_eq!(rows.len(), 7);
        let next = day.succ_opt().unwrap();
        let mut none = Vec::new();
        let written = export_settlements(&stores, next, next, ExportFormat::Json, 2, &mut none)
            .await
            .unwrap();
        assert_eq!(written, 0);
        assert_eq!(String::from_utf8(none).unwrap(), "[]\n");
    }
}
