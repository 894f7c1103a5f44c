//! Rate and concurrency limits on Postgres (spec/limits.md, SC-220..SC-223): a claim's limits as
//! `tollgate_limits_admit` takes them ([`ClaimLimitArgs`]), its refusal (SQLSTATE `TG003`) decoded, the end of a call
//! that was counted (`tollgate_limits_end`), and the windows as stored. The functions' source is
//! `limits.sql`.
//!
//! A call under no limit keeps its execution's limit columns NULL: its claim sends no limits and
//! its end runs no statement of this module.

use crate::error::DbResultExt;
use crate::PgStores;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use tollgate_core::ids::Scope;
use tollgate_core::limits::{
    ClaimLimits, LimitEnd, LimitKind, LimitRefused, LimitSubject, LimitWindow,
};
use tollgate_store::{StoreError, StoreResult};

/// What a call admitted under limits counted, as its execution keeps it (`limit_subjects`,
/// `limit_input_tokens`, `limit_output_tokens`, `limit_admitted_at`), for its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldLimits {
    /// The subjects' stored text.
    pub(crate) subjects: Vec<String>,
    /// The input tokens counted.
    pub(crate) input_tokens: i64,
    /// The output tokens counted.
    pub(crate) output_tokens: i64,
    /// The admission time.
    pub(crate) admitted_at: DateTime<Utc>,
}

/// The limit columns of a row ([`limit_columns`](crate::rows::limit_columns); `None` for a call
/// under no limit).
///
/// # Errors
/// [`StoreError::Corrupt`] when only some of them are set.
pub(crate) fn limits_of(row: &sqlx::postgres::PgRow) -> StoreResult<Option<HeldLimits>> {
    use sqlx::Row as _;
    let subjects: Option<Vec<String>> = row.try_get("limit_subjects").store_err()?;
    let input: Option<i64> = row.try_get("limit_input_tokens").store_err()?;
    let output: Option<i64> = row.try_get("limit_output_tokens").store_err()?;
    let admitted: Option<DateTime<Utc>> = row.try_get("limit_admitted_at").store_err()?;
    match (subjects, input, output, admitted) {
        (None, None, None, None) => Ok(None),
        (Some(subjects), Some(input_tokens), Some(output_tokens), Some(admitted_at)) => {
            Ok(Some(HeldLimits {
                subjects,
                input_tokens,
                output_tokens,
                admitted_at,
            }))
        }
        _ => Err(StoreError::Corrupt(
            "an execution's limit columns are partly set".into(),
        )),
    }
}

/// SQLSTATE of a limit's refusal; its detail is the refusal as JSON.
pub(crate) const LIMITED: &str = "TG003";

/// The admission of the claim of execution `$1` (inserted by this transaction with its limits
/// and admission time, after its spend rows) at that time: it writes the window rows only.
const ADMIT: &str = "SELECT tollgate_limits_admit($2, $3, $4, $5, limit_admitted_at) \
     FROM executions WHERE id = $1";

/// The end of a counted call, in its transition's transaction.
const END: &str = "SELECT tollgate_limits_end($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Every window of a scope, by subject.
const WINDOWS: &str = "SELECT subject, started_at, requests, input_tokens, output_tokens, \
     in_flight FROM limit_windows WHERE scope = $1 ORDER BY subject";

/// [`ClaimLimitArgs::binds`]: subjects, values and tokens, each `None` for a call under no limit.
pub(crate) type LimitBinds<'a> = (
    Option<&'a [String]>,
    Option<&'a [Option<i64>]>,
    Option<&'a [i64]>,
);

/// A claim's limits as `tollgate_limits_admit` and the claim function take them: each subject's
/// stored text, its four limits at its place (in [`LimitKind::ALL`]'s order; `None`: that kind is
/// not limited), and the tokens the call counts (input, output). The execution keeps the subjects
/// and tokens with its admission time ([`HeldLimits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimLimitArgs {
    pub(crate) subjects: Vec<String>,
    pub(crate) values: Vec<Option<i64>>,
    pub(crate) tokens: Vec<i64>,
}

impl ClaimLimitArgs {
    /// The arguments of `limits` (`None`: no limit applies, and the claim does nothing more).
    pub(crate) fn of(limits: &ClaimLimits) -> Option<Self> {
        if limits.is_empty() {
            return None;
        }
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        Some(Self {
            subjects: limits
                .charges
                .iter()
                .map(|charge| charge.subject.stored())
                .collect(),
            values: limits
                .charges
                .iter()
                .flat_map(|charge| {
                    LimitKind::ALL
                        .into_iter()
                        .map(|kind| charge.limits.of(kind).map(count))
                })
                .collect(),
            tokens: vec![count(limits.tokens.input), count(limits.tokens.output)],
        })
    }

    /// `(subjects, values, tokens)` to bind, all `NULL` for a call under no limit.
    pub(crate) fn binds(limits: Option<&Self>) -> LimitBinds<'_> {
        (
            limits.map(|l| l.subjects.as_slice()),
            limits.map(|l| l.values.as_slice()),
            limits.map(|l| l.tokens.as_slice()),
        )
    }
}

/// The refusal in a `TG003` error's detail.
///
/// # Errors
/// [`StoreError::Corrupt`] when the detail is not a refusal.
pub(crate) fn refused(error: &sqlx::Error) -> StoreResult<LimitRefused> {
    let bad = || StoreError::Corrupt("limit refusal without its detail".into());
    let detail = crate::error::detail(error).ok_or_else(bad)?;
    let value: Value = serde_json::from_str(detail).map_err(|_| bad())?;
    let number = |field: &str| value.get(field).and_then(Value::as_u64).ok_or_else(bad);
    let text = |field: &str| value.get(field).and_then(Value::as_str).ok_or_else(bad);
    Ok(LimitRefused {
        subject: LimitSubject::parse(text("subject")?).ok_or_else(bad)?,
        kind: LimitKind::parse(text("kind")?).ok_or_else(bad)?,
        limit: number("limit")?,
        used: number("used")?,
        asked: number("asked")?,
        reset_ms: number("reset_ms")?,
    })
}

/// The admission of a claim by the general transaction, its last write before the commit (the
/// row `id` was inserted with its limit columns and admission time); a refusal leaves the transaction
/// to be rolled back.
///
/// # Errors
/// Store failure; a refusal without its detail.
pub(crate) async fn admit(
    conn: &mut PgConnection,
    id: uuid::Uuid,
    scope: &str,
    limits: &ClaimLimitArgs,
) -> StoreResult<Result<(), LimitRefused>> {
    let admitted = sqlx::query(ADMIT)
        .bind(id)
        .bind(scope)
        .bind(&limits.subjects)
        .bind(&limits.values)
        .bind(&limits.tokens)
        .execute(&mut *conn)
        .await;
    match admitted {
        Ok(_) => Ok(Ok(())),
        Err(e) if crate::error::sqlstate(&e).as_deref() == Some(LIMITED) => Ok(Err(refused(&e)?)),
        Err(e) => Err(crate::error::db(e)),
    }
}

/// What a call's end does to the windows that counted it (`held`: the execution's limit columns,
/// as its claim kept them), after every other write of the transaction (the windows are the last
/// locks).
pub(crate) async fn end(
    conn: &mut PgConnection,
    scope: &str,
    held: &HeldLimits,
    end: LimitEnd,
) -> StoreResult<()> {
    let (name, tokens, from_flight) = match end {
        LimitEnd::NotSent => ("not_sent", None, false),
        LimitEnd::Parked => ("parked", None, false),
        LimitEnd::Settled {
            tokens,
            from_flight,
        } => ("settled", Some(tokens), from_flight),
    };
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    sqlx::query(END)
        .bind(scope)
        .bind(&held.subjects)
        .bind(held.input_tokens)
        .bind(held.output_tokens)
        .bind(held.admitted_at)
        .bind(name)
        .bind(tokens.map(|t| count(t.input)))
        .bind(tokens.map(|t| count(t.output)))
        .bind(from_flight)
        .execute(&mut *conn)
        .await
        .store_err()?;
    Ok(())
}

/// One stored window.
#[derive(sqlx::FromRow)]
struct WindowRow {
    subject: String,
    started_at: DateTime<Utc>,
    requests: i64,
    input_tokens: i64,
    output_tokens: i64,
    in_flight: i64,
}

impl WindowRow {
    fn into_window(self) -> StoreResult<(LimitSubject, LimitWindow)> {
        let count = |n: i64, field: &str| {
            u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("limit window {field}")))
        };
        let subject = LimitSubject::parse(&self.subject)
            .ok_or_else(|| StoreError::Corrupt("limit window subject".into()))?;
        Ok((
            subject,
            LimitWindow {
                started_at: self.started_at,
                requests: count(self.requests, "requests")?,
                input_tokens: count(self.input_tokens, "input_tokens")?,
                output_tokens: count(self.output_tokens, "output_tokens")?,
                in_flight: count(self.in_flight, "in_flight")?,
            },
        ))
    }
}

impl PgStores {
    /// [`SpendStore::limit_windows`](tollgate_store::traits::SpendStore::limit_windows): every
    /// window of `scope`, by subject.
    pub(crate) async fn limit_windows_of(
        &self,
        scope: &Scope,
    ) -> StoreResult<Vec<(LimitSubject, LimitWindow)>> {
        let rows: Vec<WindowRow> = sqlx::query_as(WINDOWS)
            .bind(scope.as_str())
            .fetch_all(self.pool())
            .await
            .store_err()?;
        let mut windows = rows
            .into_iter()
            .map(WindowRow::into_window)
            .collect::<StoreResult<Vec<_>>>()?;
        // By subject as the in-memory stores order them (the database's collation may not).
        windows.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(windows)
    }
}
