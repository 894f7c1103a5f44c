//! Settlements as CSV, in the finance view's columns and order (spec/storage.md — Finance view),
//! the same text `tollgate finance export` prints.

use tollgate_store::SettlementRecord;

/// The header row: the columns of `finance.settlements`, in order.
pub const HEADER: &str = "settlement_id,scope,consumer,session_id,accounting_day,execution_id,\
operation_key,kind,provider,model,price_version,policy_version,currency,input_tokens,\
output_tokens,cache_read_tokens,cache_write_tokens,reasoning_tokens,amount,source,settled_at";

/// The CSV text of `rows`: the header, then one line per row, each line ending in `\n`.
pub fn settlements_csv(rows: &[SettlementRecord]) -> String {
    let mut out = String::with_capacity(64 + rows.len() * 256);
    out.push_str(HEADER);
    out.push('\n');
    for r in rows {
        out.push_str(&settlement_row(r));
        out.push('\n');
    }
    out
}

/// One settlement as a CSV line in [`HEADER`]'s columns (without the newline); also what
/// `tollgate finance export` writes.
pub fn settlement_row(r: &SettlementRecord) -> String {
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
    fields.map(|f| field(&f)).join(",")
}

/// One CSV field: a text a spreadsheet would read as a formula (starting with `=`, `+`, `-`,
/// `@`, tab or CR) is prefixed with `'`; fields with commas, quotes or line breaks are quoted.
pub fn field(value: &str) -> String {
    let value = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_string()
    };
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sc_157_csv_fields_are_quoted_and_formulas_neutralized() {
        assert_eq!(field("0.000017"), "0.000017");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(field("@sum"), "'@sum");
        assert_eq!(settlements_csv(&[]), format!("{HEADER}\n"));
        assert_eq!(HEADER.split(',').count(), 21);
    }
}
