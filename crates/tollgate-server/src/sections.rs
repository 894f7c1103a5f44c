//! The configuration file as written (spec/service.md — Configuration): one serde type per
//! section, before validation, and [`ConfigError`]. [`crate::config`] reads and validates them;
//! [`crate::profiles`] turns the profile and price sections into profiles.

use crate::secret::Secret;
use serde::Deserialize;
use std::collections::BTreeMap;
use tollgate_core::config::RequestFields;
use tollgate_core::limits::RateLimits;
use tollgate_core::message::{Temperature, ToolChoice, ToolSpec, TopP};

/// Why the configuration cannot be used. Names files, keys and fields, never secret values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// `[server]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Listen address.
    pub listen: Option<String>,
    /// On shutdown, the longest wait for background drives (calls whose caller left) to finish.
    pub shutdown_drain_ms: Option<u64>,
    /// Requests served at once; more are answered 503 at once.
    pub concurrency_limit: Option<u64>,
    /// Longest a request may take before it is answered 504.
    pub request_timeout_ms: Option<u64>,
    /// Longest a stored API key is served from memory after it was read; 0 = read on every
    /// request.
    pub key_cache_ms: Option<u64>,
    /// Longest a request's whole body may take to arrive.
    pub body_read_timeout_ms: Option<u64>,
    /// Longest wait for a request's complete header.
    pub header_read_timeout_ms: Option<u64>,
    /// A connection with no byte read or written for this long is closed.
    pub idle_timeout_ms: Option<u64>,
    /// Connections served at once.
    pub connections_max: Option<u64>,
    /// On shutdown, the longest wait for open connections to finish their answers.
    pub http_drain_ms: Option<u64>,
    /// Requests one HTTP/2 connection carries at once.
    pub http2_max_streams: Option<u64>,
    /// Whether `GET /metrics` answers without a key on `listen` (default false: an operator key).
    pub metrics_public: Option<bool>,
    /// A second address on which `GET /metrics` alone is served without a key (none by default).
    pub metrics_listen: Option<String>,
}

/// `[cluster]`: the instances of `tollgate serve` on one database that serve each consumer's
/// calls on one of them (spec/performance.md, H-39).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Where the other instances reach this one (`http://host:port`); none → this instance
    /// serves every call itself and is no member.
    pub url: Option<String>,
    /// The environment variable holding the members' shared secret (default
    /// `TOLLGATE_CLUSTER_SECRET`).
    pub secret_env: Option<String>,
}

/// `[database]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSection {
    /// Postgres URL; none (and no `DATABASE_URL`) → the embedded default.
    pub url: Option<Secret>,
    /// Pool size.
    pub max_connections: Option<u32>,
    /// Longest one statement may run; 0 = no bound.
    pub statement_timeout_ms: Option<u64>,
    /// Longest a statement may wait for a row lock; 0 = no bound.
    pub lock_timeout_ms: Option<u64>,
    /// Longest a session may sit idle inside an open transaction; 0 = no bound.
    pub idle_in_transaction_timeout_ms: Option<u64>,
}

/// `[scheduler]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSection {
    /// Period between passes (± 20 % jitter).
    pub interval_ms: Option<u64>,
    /// Rows per scope and task per pass.
    pub batch: Option<u32>,
    /// Period of the ledger audit of the scopes with work; 0 turns it off.
    pub ledger_audit_interval_ms: Option<u64>,
    /// Fetch usage of finished responses for executions awaiting an operator (default off).
    pub fetch_evidence: Option<bool>,
}

/// `[runner]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSection {
    /// Fence lease of a claimed execution.
    pub lease_ms: Option<u64>,
    /// Longest time a finished call's last write is retried while the database is unavailable.
    pub settle_retry_ms: Option<u64>,
}

/// `[log]`: how `tollgate serve` writes its log on stderr (spec/service.md — Logs).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (the default) or `json` (one JSON object per line); the environment variable
    /// `TOLLGATE_LOG_FORMAT` wins over it.
    pub format: Option<String>,
}

/// `[[providers]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    /// Name profiles refer to.
    pub name: String,
    /// `openai-chat`, `openai-responses` or `anthropic`.
    pub kind: String,
    /// `http(s)` root of the API; the protocol's path is appended, a trailing `/v1` not doubled.
    pub base_url: String,
    /// Name of the environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Connect timeout.
    pub connect_timeout_ms: Option<u64>,
}

/// The prices of one model, decimal strings per million tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPricesSection {
    /// Uncached input.
    pub input: String,
    /// Visible output (reasoning is priced on its own).
    pub output: String,
    /// Input read from the provider's prompt cache.
    pub cache_read: String,
    /// Input written to the provider's prompt cache.
    pub cache_write: String,
    /// Reasoning (thinking) tokens.
    pub reasoning: String,
}

/// `[[prices]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceSection {
    /// Version id.
    pub version: String,
    /// Currency code.
    pub currency: String,
    /// Prices by model.
    #[serde(default)]
    pub models: BTreeMap<String, ModelPricesSection>,
}

/// `[profiles.caps]`: decimal strings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapsSection {
    /// Warn once the consumer's settled spend in one session reaches this.
    pub session_warn: Option<String>,
    /// No claim may take the consumer's session spend (settled + held) past this.
    pub session_block: Option<String>,
    /// Like `session_warn`, for the consumer's spend on one accounting day (UTC).
    pub daily_warn: Option<String>,
    /// Like `session_block`, for the consumer's spend on one accounting day (UTC).
    pub daily_block: Option<String>,
    /// Like `session_warn`, for a root's inclusive cost (calls under a root only).
    pub root_warn: Option<String>,
    /// Like `session_block`, for a root's inclusive cost (calls under a root only).
    pub root_block: Option<String>,
}

/// `[[profiles]]` (spec/service.md — Profiles).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSection {
    /// Name callers use.
    pub name: String,
    /// `text`, `json`, `structured` or `step`.
    pub kind: String,
    /// Provider name.
    pub provider: String,
    /// Model name sent to the provider; `price_version` must price it.
    pub model: String,
    /// Immutable policy id; changed behaviour needs a new one (SC-1).
    pub policy_version: String,
    /// Price version (prices are snapshotted from it).
    pub price_version: String,
    /// Output contract version (default `none`).
    pub output_contract_version: Option<String>,
    /// Who is charged.
    pub consumer: String,
    /// System prompt.
    pub system: Option<String>,
    /// Output token cap.
    pub max_tokens: Option<u32>,
    /// Input limit, UTF-16 code units.
    pub max_input_chars: Option<u64>,
    /// Output limit.
    pub max_output_chars: Option<u64>,
    /// Whole-request limit.
    pub max_request_chars: Option<u64>,
    /// Reasoning limit.
    pub max_reasoning_chars: Option<u64>,
    /// Reasoning-loop limit.
    pub max_consecutive_reasoning: Option<u32>,
    /// Bound of one run.
    pub run_timeout_ms: Option<u64>,
    /// Retention, e.g. `30d` (units s, m, h, d).
    pub result_retention: Option<String>,
    /// Prompt-cache override.
    pub cache: Option<bool>,
    /// Sampling temperature, at most two fraction digits; none leaves it to the provider (SC-5).
    pub temperature: Option<Temperature>,
    /// Nucleus sampling, 0 to 1 with at most four fraction digits; none leaves it to the
    /// provider (or to a request, SC-211).
    pub top_p: Option<TopP>,
    /// Stop sequences (at most four); none leaves them to a request.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Sampling seed; none leaves it to a request.
    pub seed: Option<i64>,
    /// What a request may set (`sampling`, `send_user`, `send_metadata`; SC-211).
    #[serde(default)]
    pub request_fields: RequestFields,
    /// JSON Schema of the output (json profiles).
    pub output_schema: Option<serde_json::Value>,
    /// Tools (structured and step profiles).
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Tool choice (structured and step profiles).
    pub tool_choice: Option<ToolChoice>,
    /// Context window for the request-fit check.
    pub context_window_tokens: Option<u64>,
    /// Money caps in the price version's currency; any subset.
    #[serde(default)]
    pub caps: CapsSection,
    /// `[profiles.limits]`: the pace of the profile's consumer (SC-220); any subset.
    #[serde(default)]
    pub limits: RateLimits,
}

/// `[[keys]]`: a static API key, by its hash only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySection {
    /// Scope the key acts in.
    pub scope: String,
    /// `caller`, `operator` or `finance`.
    pub role: String,
    /// Lower-case hex SHA-256 of the key.
    pub sha256: String,
    /// `[keys.limits]`: the pace of calls made with this key (SC-220); any subset.
    #[serde(default)]
    pub limits: RateLimits,
}
