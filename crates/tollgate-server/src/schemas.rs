//! The schemas of the OpenAPI document ([`crate::openapi`]) that the service's own types do not
//! derive: the error body, and hand-written descriptions of the lower crates' types (the view,
//! evidence, the ledger report, reconciliation counts), which do not depend on `utoipa`.

use serde::Serialize;
use std::borrow::Cow;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// `{"error": {"code", "message", …}}` (spec/service.md — Errors).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// One error: a stable code, a message naming fields and limits only, and the code's extra
/// fields (`operation_key`, `fields`, `cap`, `level`, `limit`, `settled`, `held`, `hold`,
/// `cause`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// The stable code (the error table).
    pub code: String,
    /// What is wrong, by field names, limits and ids.
    pub message: String,
    /// OpenAI's error type (the front door only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::Type(Type::String))
}

fn object(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .description(Some(description))
}

fn enumerated(values: &[&str]) -> ObjectBuilder {
    string().enum_values(Some(values.iter().copied()))
}

macro_rules! described {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $schema:expr) => {
        $(#[$doc])*
        pub struct $ty;
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                let schema: ObjectBuilder = $schema;
                RefOr::T(Schema::Object(schema.build()))
            }
        }
        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

fn receipt() -> ObjectBuilder {
    object("The governed charge; amounts are decimal strings.")
        .property("amount", string())
        .property("currency", string())
        .property("price_version", string())
        .property(
            "usage",
            object("Token counts by disjoint class.")
                .property("input", ObjectBuilder::new().schema_type(Type::Integer))
                .property("output", ObjectBuilder::new().schema_type(Type::Integer))
                .property(
                    "cache_read",
                    ObjectBuilder::new().schema_type(Type::Integer),
                )
                .property(
                    "cache_write",
                    ObjectBuilder::new().schema_type(Type::Integer),
                )
                .property("reasoning", ObjectBuilder::new().schema_type(Type::Integer)),
        )
        .required("amount")
        .required("currency")
        .required("price_version")
        .required("usage")
}

described!(
    /// `tollgate_core::view::View` (spec/service.md — The view).
    ViewDoc,
    "View",
    object("What every call, step, read, recover and resolve answers with (spec/service.md — The view).")
        .property(
            "state",
            enumerated(&["completed", "in_progress", "not_dispatched", "reconciliation_required"]),
        )
        .property("replayed", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("operation_key", string())
        .property("execution_id", string().format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Uuid))))
        .property(
            "outcome",
            enumerated(&["success", "invalid", "refused", "blocked", "truncated", "unavailable"]),
        )
        .property("invalid_reason", object("The first invalid reason (spec/output.md)."))
        .property(
            "not_dispatched_cause",
            enumerated(&["invalid", "input", "aborted", "audit", "store", "expired"]),
        )
        .property("reconciliation_reason", string())
        .property(
            "output",
            object("`{text}` or `{text, json}`; null when unavailable, erased, expired or blocked.")
                .schema_type(SchemaType::from_iter([Type::Object, Type::Null])),
        )
        .property("step", object("`{blocks, text, tool_calls, reasoning, provider_blocks, stop}` (spec/output.md)."))
        .property("receipt", receipt())
        .property("root_receipt", receipt())
        .property(
            "warnings",
            ArrayBuilder::new().items(
                object("A cap crossed at settlement.")
                    .property("cap", enumerated(&["session", "daily", "root"]))
                    .property("level", enumerated(&["warn", "block"]))
                    .property("limit", string())
                    .property("spent", string()),
            ),
        )
        .required("state")
        .required("replayed")
        .required("operation_key")
        .required("output")
);

described!(
    /// `tollgate_store::Evidence`: a usage evidence row.
    EvidenceDoc,
    "Evidence",
    object("A usage evidence row (spec/storage.md — inbox): `{id, execution_id, source, usage, provider_ref, …}`.")
);

described!(
    /// `tollgate_store::LedgerReport`.
    LedgerReportDoc,
    "LedgerReport",
    object("The ledger audit report (spec/storage.md — Ledger audit).")
        .property("ok", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("scope", string())
        .property("checked", object("Rows checked by table."))
        .property("violations", ArrayBuilder::new().items(object("One violated invariant with its rows' ids.")))
        .property("violations_total", ObjectBuilder::new().schema_type(Type::Integer))
        .property("truncated", ObjectBuilder::new().schema_type(Type::Boolean))
);

described!(
    /// `tollgate_runner::recovery::ExpiredCounts`.
    ExpiredCountsDoc,
    "ExpiredCounts",
    object("What one reconcile-expired pass did.")
        .property("roots", ObjectBuilder::new().schema_type(Type::Integer))
        .property("executions", ObjectBuilder::new().schema_type(Type::Integer))
);

described!(
    /// `tollgate_runner::recovery::UsageCounts`.
    UsageCountsDoc,
    "UsageCounts",
    object("What one reconcile-usage pass did.")
        .property("scanned", ObjectBuilder::new().schema_type(Type::Integer))
        .property("acknowledged", ObjectBuilder::new().schema_type(Type::Integer))
        .property("cursor", ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::Integer, Type::Null])))
);

described!(
    /// `crate::service::admin::ExecutionList`.
    ExecutionListDoc,
    "ExecutionList",
    object("Executions, oldest first: metadata only.").property(
        "executions",
        ArrayBuilder::new().items(
            object("`{execution_id, operation_key, kind, root_key, state, not_dispatched_cause, reconciliation_reason, outcome, provider, model, provider_ref, created_at, updated_at}`")
        ),
    )
);

described!(
    /// A small JSON status object (`/healthz`, `/readyz`).
    StatusDoc,
    "Status",
    object("`{\"status\": \"ok\"}`, or `{\"status\": \"ready\", \"stores\": \"memory\" | \"postgres\"}`.")
        .property("status", string())
);

fn integer() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::Integer)
}

described!(
    /// `crate::service::backlog::Backlog`.
    BacklogDoc,
    "Backlog",
    object("The scope's executions awaiting an operator, oldest first (SC-112).").property(
        "backlog",
        ArrayBuilder::new().items(
            object("One execution awaiting an operator; amounts are decimal strings.")
                .property("scope", string())
                .property("execution_id", string())
                .property("operation_key", string())
                .property("kind", string())
                .property("provider", string())
                .property("model", string())
                .property("reconciliation_reason", string())
                .property("provider_ref", string())
                .property("held", string())
                .property("created_at", string())
                .property("awaiting_since", string())
                .property("age_ms", integer())
                .property(
                    "evidence",
                    enumerated(&["none", "late_exact", "exact", "conflicting", "inexact"]),
                )
                .property("usage", object("Usage of the one consistent exact evidence, or null."))
                .property("amount", string()),
        ),
    )
);

described!(
    /// `crate::service::finance::FeedPage`.
    FeedPageDoc,
    "FinanceFeedPage",
    object("A page of the scope's finance feed (SC-141): settlements after the cursor in feed order, and the cursor to resume from.")
        .property(
            "settlements",
            ArrayBuilder::new().items(
                object("One settlement (the columns of `finance.settlements`; amounts are decimal strings) and its `cursor`.")
                    .property("cursor", string())
                    .property("id", string())
                    .property("execution_id", string())
                    .property("scope", string())
                    .property("operation_key", string())
                    .property("kind", string())
                    .property("consumer", string())
                    .property("session_id", string())
                    .property("accounting_day", string())
                    .property("provider", string())
                    .property("model", string())
                    .property("price_version", string())
                    .property("policy_version", string())
                    .property("currency", string())
                    .property("usage", object("Token counts."))
                    .property("amount", string())
                    .property("source", string())
                    .property("settled_at", string()),
            ),
        )
        .property("next", string())
);

described!(
    /// The body of `POST /v1/admin/reconcile/fetch-evidence`.
    FetchBodyDoc,
    "FetchEvidenceBody",
    object("How many executions to fetch for (default 50, at most 100).").property("limit", integer())
);

described!(
    /// `tollgate_runner::backlog::FetchReport`.
    FetchReportDoc,
    "FetchReport",
    object("What one evidence fetch did (SC-110); it never settles.")
        .property("scanned", integer())
        .property("stored", integer())
        .property("duplicate", integer())
        .property(
            "skipped",
            ArrayBuilder::new().items(
                object("An execution not fetched, with the reason.")
                    .property("operation_key", string())
                    .property("reason", string()),
            ),
        )
);

described!(
    /// The body of `POST /v1/admin/reconcile/resolve-from-evidence`.
    ResolveFromEvidenceBodyDoc,
    "ResolveFromEvidenceBody",
    object("Exactly one of `keys` and `all`; `dry_run` lists what would be charged.")
        .property("keys", ArrayBuilder::new().items(string()))
        .property("all", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("dry_run", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("limit", integer())
);

described!(
    /// `tollgate_runner::backlog::ResolveReport`.
    ResolveReportDoc,
    "ResolveReport",
    object("Each execution settled from its stored exact evidence, or skipped (SC-111).")
        .property("dry_run", ObjectBuilder::new().schema_type(Type::Boolean))
        .property(
            "items",
            ArrayBuilder::new().items(
                object("One execution's action.")
                    .property("operation_key", string())
                    .property("execution_id", string())
                    .property("action", enumerated(&["settled", "would_settle", "skipped"]))
                    .property("usage", object("The evidence's usage."))
                    .property("amount", string())
                    .property("evidence_id", integer())
                    .property("reason", string()),
            ),
        )
);
