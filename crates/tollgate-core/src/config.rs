//! The immutable configuration snapshot of a call (SC-1..SC-8, ST-4).
//!
//! A snapshot is taken from a host-side call profile, digested into the execution's binding and
//! persisted with it; replay and recovery use the persisted snapshot, never the current profile.

use crate::caps::Caps;
use crate::collector::{CollectorLimits, MAX_REASONING_CHARS_CEILING};
use crate::ids::{ConsumerId, VersionId};
use crate::message::{utf16_len, Temperature, ToolChoice, ToolSpec, TopP};
use crate::money::{Currency, Money, MoneyError, TokenPrices};
use crate::state::CallKind;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Upper bound of a byte-level token count per UTF-16 code unit (a code unit is at most three
/// UTF-8 bytes; a token is at least one byte). Used only for worst-case holds.
pub const TOKENS_PER_CHAR_WORST: u64 = 3;
/// Messages a request may hold.
pub const MESSAGES_MAX: u64 = 256;
/// Worst-case framing tokens per message (the system prompt counts as one more message).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 8;
/// Worst-case tokens a provider adds to prime the reply (e.g. `<|start|>assistant<|message|>`).
pub const REPLY_PRIMER_TOKENS: u64 = 8;
/// Worst-case framing tokens per tool definition, besides its name, description and schema.
pub const TOOL_OVERHEAD_TOKENS: u64 = 64;
/// Worst-case tokens of the instructions a provider adds when a request carries tools or an
/// output schema (Anthropic documents at most 530 for its tool-use system prompt).
pub const TOOLING_PREAMBLE_TOKENS: u64 = 1024;
/// Longest run timeout (ST-34): ten minutes.
pub const RUN_TIMEOUT_MS_MAX: u64 = 600_000;
/// Largest `max_tokens`.
pub const MAX_TOKENS_MAX: u32 = 1_000_000;
/// Largest `max_input_chars` / `max_output_chars` / `max_request_chars`.
pub const CHARS_MAX: u64 = 10_000_000;

/// Local JSON output contract (SC-4). The host's `validate` capability is not part of the
/// snapshot; it is bound through `output_contract_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputContract {
    /// Contract name.
    pub name: String,
    /// JSON Schema the output must satisfy.
    pub schema: serde_json::Value,
}

/// The immutable snapshot of everything that decides a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallConfig {
    /// Call kind.
    pub kind: CallKind,
    /// Provider name (host config).
    pub provider: String,
    /// Model name.
    pub model: String,
    /// Immutable policy id (SC-1).
    pub policy_version: VersionId,
    /// Immutable price table id (SC-1).
    pub price_version: VersionId,
    /// Immutable output contract id (SC-1).
    pub output_contract_version: VersionId,
    /// Who is charged (SC-2).
    pub consumer: ConsumerId,
    /// Currency of `prices` and caps.
    pub currency: Currency,
    /// The model's prices from `price_version`, snapshotted.
    pub prices: TokenPrices,
    /// Money caps.
    pub caps: Caps,
    /// System prompt.
    pub system: Option<String>,
    /// Output token cap sent to the provider.
    pub max_tokens: u32,
    /// Largest loaded input, UTF-16 code units.
    pub max_input_chars: u64,
    /// Largest output (text + tool/provider JSON), UTF-16 code units.
    pub max_output_chars: u64,
    /// Largest whole request (system + input + tools), UTF-16 code units.
    pub max_request_chars: Option<u64>,
    /// Largest reasoning, UTF-16 code units (≤ 1,000,000).
    pub max_reasoning_chars: u64,
    /// Reasoning-loop limit (ST-22).
    pub max_consecutive_reasoning: Option<u32>,
    /// Bound of one run (≤ 10 minutes).
    pub run_timeout_ms: u64,
    /// How long results are kept.
    pub result_retention_secs: u64,
    /// Prompt-cache override; `None` = the policy decides (SC-3).
    pub cache: Option<bool>,
    /// Sampling temperature (SC-5).
    pub temperature: Option<Temperature>,
    /// JSON output contract (json kind only).
    pub output: Option<OutputContract>,
    /// Host-authorized tools (structured and step kinds only).
    pub tools: Vec<ToolSpec>,
    /// Explicit tool choice (structured and step kinds only; SC-8).
    pub tool_choice: Option<ToolChoice>,
    /// Model context window, when known: input that cannot fit it beside the output cap is refused
    /// before anything is sent, since the provider would reject it anyway (H-6).
    pub context_window_tokens: Option<u64>,
    /// Nucleus sampling sent to the provider: the profile's, or a request's within
    /// `request_fields` (SC-211). Absent from the snapshot's JSON when unset, so a snapshot
    /// without it digests as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<TopP>,
    /// Stop sequences sent to the provider (at most [`STOP_SEQUENCES_MAX`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Sampling seed sent to the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// The end user a request named: recorded with the call, sent only with
    /// `request_fields.send_user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A request's metadata: recorded with the call, sent only with
    /// `request_fields.send_metadata`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// What a request may set within this snapshot (SC-211).
    #[serde(default, skip_serializing_if = "RequestFields::is_default")]
    pub request_fields: RequestFields,
}

/// Most stop sequences of a snapshot.
pub const STOP_SEQUENCES_MAX: usize = 4;

/// What a request may set within its profile (SC-211): the profile governs, and a request may
/// narrow it, never widen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestFields {
    /// Whether a request may set `temperature`, `top_p`, `stop` and `seed` where the profile
    /// sets none (default true: they pass through to the provider). A value the profile sets
    /// is fixed either way.
    #[serde(default = "yes")]
    pub sampling: bool,
    /// Whether a request's `user` is sent to the provider (default false: recorded only).
    #[serde(default)]
    pub send_user: bool,
    /// Whether a request's `metadata` is sent to the provider (default false: recorded only).
    #[serde(default)]
    pub send_metadata: bool,
}

fn yes() -> bool {
    true
}

impl Default for RequestFields {
    fn default() -> Self {
        Self {
            sampling: true,
            send_user: false,
            send_metadata: false,
        }
    }
}

impl RequestFields {
    /// Whether these are the defaults (left out of the snapshot's JSON).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Why a configuration was rejected. Names fields, never content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A limit is zero or above its ceiling.
    #[error("{field} must be between {min} and {max}")]
    Limit {
        /// Name of the snapshot field out of range, e.g. `max_tokens`.
        field: &'static str,
        /// Minimum.
        min: u64,
        /// Maximum.
        max: u64,
    },
    /// Tool choice on a text/JSON call (SC-8, TC-5).
    #[error("tool_choice is not allowed on {0} calls")]
    ToolChoiceNotAllowed(CallKind),
    /// Tools on a text/JSON call.
    #[error("tools are not allowed on {0} calls")]
    ToolsNotAllowed(CallKind),
    /// A forced tool that is not among the tools (TC-1, TC-2).
    #[error("tool_choice names a tool that is not in the registry")]
    UnknownTool,
    /// Two tools with one name, or an empty name.
    #[error("tool names must be unique and non-empty")]
    ToolNames,
    /// JSON output contract missing on a json call, or present on another kind.
    #[error("output contract: {0}")]
    Output(&'static str),
    /// Prices invalid.
    #[error("prices: {0}")]
    Prices(#[from] MoneyError),
}

fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        Err(ConfigError::Limit { field, min, max })
    } else {
        Ok(())
    }
}

impl CallConfig {
    /// Validates the snapshot.
    ///
    /// # Errors
    /// The first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "max_tokens",
            self.max_tokens.into(),
            1,
            MAX_TOKENS_MAX.into(),
        )?;
        check_range("max_input_chars", self.max_input_chars, 1, CHARS_MAX)?;
        check_range("max_output_chars", self.max_output_chars, 1, CHARS_MAX)?;
        if let Some(v) = self.max_request_chars {
            check_range("max_request_chars", v, 1, CHARS_MAX)?;
        }
        check_range(
            "max_reasoning_chars",
            self.max_reasoning_chars,
            0,
            MAX_REASONING_CHARS_CEILING,
        )?;
        check_range("run_timeout_ms", self.run_timeout_ms, 1, RUN_TIMEOUT_MS_MAX)?;
        check_range(
            "result_retention_secs",
            self.result_retention_secs,
            1,
            u64::MAX,
        )?;
        self.prices.validate()?;
        let tool_kind = matches!(self.kind, CallKind::Structured | CallKind::Step);
        if !tool_kind {
            if self.tool_choice.is_some() {
                return Err(ConfigError::ToolChoiceNotAllowed(self.kind));
            }
            if !self.tools.is_empty() {
                return Err(ConfigError::ToolsNotAllowed(self.kind));
            }
        }
        match (self.kind, &self.output) {
            (CallKind::Json, None) => return Err(ConfigError::Output("json calls need one")),
            (CallKind::Json, Some(_)) | (_, None) => {}
            (_, Some(_)) => return Err(ConfigError::Output("only json calls take one")),
        }
        let mut names = BTreeSet::new();
        for tool in &self.tools {
            if tool.name.is_empty() || !names.insert(tool.name.as_str()) {
                return Err(ConfigError::ToolNames);
            }
        }
        if let Some(ToolChoice::Tool { name }) = &self.tool_choice {
            if !names.contains(name.as_str()) {
                return Err(ConfigError::UnknownTool);
            }
        }
        check_range("stop", self.stop.len() as u64, 0, STOP_SEQUENCES_MAX as u64)?;
        Ok(())
    }

    /// Collector limits of this snapshot.
    pub fn collector_limits(&self) -> CollectorLimits {
        CollectorLimits {
            max_output_chars: self.max_output_chars,
            max_reasoning_chars: self.max_reasoning_chars,
            max_consecutive_reasoning: self.max_consecutive_reasoning,
        }
    }

    /// Fixed request chars besides the loaded input: system prompt and tool specs.
    pub fn fixed_request_chars(&self) -> u64 {
        let system = self.system.as_deref().map(utf16_len).unwrap_or(0);
        let tools: u64 = self
            .tools
            .iter()
            .map(|t| {
                utf16_len(&t.name)
                    + utf16_len(&t.description)
                    + utf16_len(&t.input_schema.to_string())
            })
            .sum();
        system + tools
    }

    /// Chars of the JSON output contract sent with the request (name and schema), if any.
    pub fn output_contract_chars(&self) -> u64 {
        self.output
            .as_ref()
            .map(|o| utf16_len(&o.name) + utf16_len(&o.schema.to_string()))
            .unwrap_or(0)
    }

    /// Framing tokens of a request of `messages` messages under this snapshot: per message (the
    /// system prompt is one more), per tool, the tooling preamble and the reply primer.
    pub fn framing_tokens(&self, messages: u64) -> u64 {
        let system = u64::from(self.system.is_some());
        let tools = self.tools.len() as u64;
        let preamble = if self.tools.is_empty() && self.output.is_none() {
            0
        } else {
            TOOLING_PREAMBLE_TOKENS
        };
        messages
            .saturating_add(system)
            .saturating_mul(MESSAGE_OVERHEAD_TOKENS)
            .saturating_add(tools.saturating_mul(TOOL_OVERHEAD_TOKENS))
            .saturating_add(preamble)
            .saturating_add(REPLY_PRIMER_TOKENS)
    }

    /// Worst-case usage of one call under this profile, whatever its input: every input char a
    /// maximal token at the dearest input class, plus the framing of [`MESSAGES_MAX`] messages,
    /// and `max_tokens` at the dearest output class (spec/money.md — Holds).
    pub fn worst_case_usage(&self) -> (u64, u64) {
        let input_chars =
            self.max_input_chars + self.fixed_request_chars() + self.output_contract_chars();
        let input = input_chars
            .saturating_mul(TOKENS_PER_CHAR_WORST)
            .saturating_add(self.framing_tokens(MESSAGES_MAX));
        (input, u64::from(self.max_tokens))
    }

    /// The cost of `input` and `output` tokens at the dearest input and output class.
    ///
    /// # Errors
    /// Overflow.
    pub fn cost_at_dearest(&self, input: u64, output: u64) -> Result<Money, MoneyError> {
        let worst = TokenPrices {
            input: self.prices.input_max(),
            output: self.prices.output_max(),
            cache_read: Money::ZERO,
            cache_write: Money::ZERO,
            reasoning: Money::ZERO,
        };
        worst.cost(&Usage {
            input,
            output,
            ..Usage::ZERO
        })
    }

    /// The worst-case cost held against caps at claim (see [`crate::caps`]).
    ///
    /// # Errors
    /// Overflow.
    pub fn worst_case_hold(&self) -> Result<Money, MoneyError> {
        let (input, output) = self.worst_case_usage();
        self.cost_at_dearest(input, output)
    }
}

/// Example snapshots for tests, examples and benches.
pub mod fixtures {
    use super::*;

    fn m(s: &str) -> Money {
        Money::parse(s, "t").unwrap_or(Money::ZERO)
    }

    /// A valid text config: model `mock-echo`, prices 1 / 2 / 0.1 / 1.25 / 2 per million tokens,
    /// no caps, `max_tokens` 100, 1000-char input and output limits, a 10 s run timeout.
    pub fn text_config() -> CallConfig {
        CallConfig {
            kind: CallKind::Text,
            provider: "mock".into(),
            model: "mock-echo".into(),
            policy_version: VersionId::parse("policy-1").unwrap_or_else(|_| unreachable!()),
            price_version: VersionId::parse("prices-1").unwrap_or_else(|_| unreachable!()),
            output_contract_version: VersionId::parse("out-1").unwrap_or_else(|_| unreachable!()),
            consumer: ConsumerId::parse("team-a").unwrap_or_else(|_| unreachable!()),
            currency: Currency::parse("USD").unwrap_or_else(|_| unreachable!()),
            prices: TokenPrices {
                input: m("1"),
                output: m("2"),
                cache_read: m("0.1"),
                cache_write: m("1.25"),
                reasoning: m("2"),
            },
            caps: Caps::default(),
            system: Some("Be brief.".into()),
            max_tokens: 100,
            max_input_chars: 1000,
            max_output_chars: 1000,
            max_request_chars: None,
            max_reasoning_chars: 1000,
            max_consecutive_reasoning: None,
            run_timeout_ms: 10_000,
            result_retention_secs: 3600,
            cache: None,
            temperature: None,
            output: None,
            tools: vec![],
            tool_choice: None,
            context_window_tokens: None,
            top_p: None,
            stop: Vec::new(),
            seed: None,
            user: None,
            metadata: BTreeMap::new(),
            request_fields: RequestFields::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::text_config;
    use super::*;

    #[test]
    fn sc_8_tool_choice_rejected_on_text_config() {
        let mut c = text_config();
        c.tool_choice = Some(ToolChoice::Auto);
        assert_eq!(
            c.validate(),
            Err(ConfigError::ToolChoiceNotAllowed(CallKind::Text))
        );
    }

    #[test]
    fn worst_case_hold_covers_max_tokens_and_input() {
        let c = text_config();
        assert!(c.validate().is_ok());
        // input: (1000 + 9) * 3 + (256 + 1) * 8 + 8 = 5091 tokens at 1.25; output 100 at 2.
        let expected = Money::parse("0.00656375", "t").unwrap_or(Money::ZERO);
        assert_eq!(c.worst_case_hold(), Ok(expected));
    }

    #[test]
    fn st_34_run_timeout_is_bounded_to_ten_minutes() {
        let mut c = text_config();
        c.run_timeout_ms = RUN_TIMEOUT_MS_MAX + 1;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Limit {
                field: "run_timeout_ms",
                ..
            })
        ));
    }

    #[test]
    fn st_21_reasoning_ceiling() {
        let mut c = text_config();
        c.max_reasoning_chars = MAX_REASONING_CHARS_CEILING + 1;
        assert!(c.validate().is_err());
    }
}
