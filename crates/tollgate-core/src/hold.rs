//! Fitted holds (SC-120..SC-122): the worst-case cost of the request in hand, not of the profile.
//!
//! A provider's tokenizers are byte-level (BPE over UTF-8 bytes), so a token is at least one
//! byte: the UTF-8 length of a text is a strict upper bound of its token count. A request's worst
//! case is the bytes of everything sent as text (system prompt, every message part, tool
//! definitions, the output schema), plus the framing of its messages and tools, at the dearest
//! input class; plus `max_tokens` at the dearest output class (reasoning tokens count within it).
//! Capped by the profile's worst case ([`CallConfig::worst_case_hold`]), which bounds every
//! request the profile's input checks accept. Exact money, no floats (spec/money.md — Holds).

use crate::config::CallConfig;
use crate::message::{Message, Part};
use crate::money::{Money, MoneyError};

/// UTF-8 bytes of one message's parts: text, tool calls (id, name, arguments as JSON) and tool
/// results (the call id and the content).
pub fn message_bytes(message: &Message) -> u64 {
    message
        .content
        .iter()
        .map(|p| match p {
            Part::Text { text } => text.len() as u64,
            Part::ToolCall { id, name, input } => {
                (id.len() + name.len() + input.to_string().len()) as u64
            }
            Part::ToolResult {
                call_id, content, ..
            } => (call_id.len() + content.len()) as u64,
        })
        .sum()
}

/// UTF-8 bytes of what a snapshot adds to every request: the system prompt, the tool
/// definitions (name, description, schema as JSON) and the output contract (name, schema).
pub fn fixed_request_bytes(config: &CallConfig) -> u64 {
    let system = config.system.as_deref().map_or(0, str::len) as u64;
    let tools: u64 = config
        .tools
        .iter()
        .map(|t| (t.name.len() + t.description.len() + t.input_schema.to_string().len()) as u64)
        .sum();
    let output = config
        .output
        .as_ref()
        .map_or(0, |o| (o.name.len() + o.schema.to_string().len()) as u64);
    system + tools + output
}

/// The most input tokens `messages` under `config` can be billed for: one token per UTF-8 byte
/// plus the framing of its messages, tools, preamble and reply primer.
pub fn request_input_tokens_bound(config: &CallConfig, messages: &[Message]) -> u64 {
    let bytes: u64 = messages.iter().map(message_bytes).sum();
    bytes
        .saturating_add(fixed_request_bytes(config))
        .saturating_add(config.framing_tokens(messages.len() as u64))
}

/// Why a request has no fitted hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoldError {
    /// The request's own input bound is above what the profile's worst case covers: a hold
    /// clamped to the profile would be below what the provider may bill, so the request is not
    /// sent (the input checks refuse every such request first).
    #[error("the request's input is above what the profile's worst case covers")]
    AboveProfile,
    /// The cost overflows.
    #[error(transparent)]
    Money(#[from] MoneyError),
}

/// The fitted hold of a request: its own worst case (input bound at the dearest input class,
/// `max_tokens` at the dearest output class). Every byte sent counts toward it, so what the
/// provider bills for the request is never above its hold (SC-207).
///
/// # Errors
/// [`HoldError::AboveProfile`] when the request's input bound exceeds the profile's worst case
/// (never clamped down to it); overflow.
pub fn fitted_hold(config: &CallConfig, messages: &[Message]) -> Result<Money, HoldError> {
    let (profile_input, output) = config.worst_case_usage();
    let input = request_input_tokens_bound(config, messages);
    if input > profile_input {
        return Err(HoldError::AboveProfile);
    }
    Ok(config.cost_at_dearest(input, output)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixtures::text_config;
    use crate::config::{MESSAGES_MAX, TOKENS_PER_CHAR_WORST};
    use crate::message::{utf16_len, Role};
    use crate::money::TokenPrices;
    use crate::usage::Usage;
    use proptest::prelude::*;

    fn m(s: &str) -> Money {
        Money::parse(s, "t").unwrap()
    }

    #[test]
    fn sc_120_fitted_hold_of_a_short_request() {
        let c = text_config();
        let input = [Message::text(Role::User, "hi")];
        // input: 2 + 9 ("Be brief.") bytes + (1 + 1) * 8 + 8 = 35 tokens at 1.25; output 100 at 2.
        assert_eq!(fitted_hold(&c, &input), Ok(m("0.00024375")));
        assert!(fitted_hold(&c, &input).unwrap() < c.worst_case_hold().unwrap());
    }

    #[test]
    fn sc_120_fitted_hold_counts_bytes_not_chars() {
        let c = text_config();
        // "é" is one UTF-16 unit and two bytes; "😀" two units and four bytes.
        let a = fitted_hold(&c, &[Message::text(Role::User, "ee")]).unwrap();
        let b = fitted_hold(&c, &[Message::text(Role::User, "é")]).unwrap();
        let e = fitted_hold(&c, &[Message::text(Role::User, "😀")]).unwrap();
        assert_eq!(a, b);
        assert!(e > b);
    }

    fn text_strategy() -> impl Strategy<Value = String> {
        // ASCII, 2-byte, 3-byte and astral characters.
        proptest::collection::vec(
            prop_oneof![
                Just('a'),
                Just(' '),
                Just('é'),
                Just('€'),
                Just('中'),
                Just('😀')
            ],
            0..40,
        )
        .prop_map(|chars| chars.into_iter().collect())
    }

    fn price() -> impl Strategy<Value = Money> {
        (0u64..5_000_000).prop_map(|micros| {
            Money::new(rust_decimal::Decimal::new(micros as i64, 6), "p").unwrap()
        })
    }

    proptest! {
        /// SC-121: for random inputs and profiles, the fitted hold covers every usage the
        /// provider could report for the request (input ≤ one token per UTF-8 byte plus framing,
        /// split over any input classes; output and reasoning within `max_tokens`), and never
        /// exceeds the profile's worst case.
        #[test]
        fn sc_121_fitted_hold_bounds_any_reported_usage(
            texts in proptest::collection::vec(text_strategy(), 1..6),
            system in proptest::option::of(text_strategy()),
            max_tokens in 1u32..5000,
            slack in 0u64..100,
            prices in (price(), price(), price(), price(), price()),
            cached_share in 0u64..=100,
            reasoning_share in 0u64..=100,
        ) {
            let mut c = text_config();
            c.system = system;
            c.max_tokens = max_tokens;
            c.prices = TokenPrices {
                input: prices.0,
                output: prices.1,
                cache_read: prices.2,
                cache_write: prices.3,
                reasoning: prices.4,
            };
            let messages: Vec<Message> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let role = if i % 2 == 0 { Role::User } else { Role::Assistant };
                    Message::text(role, t.clone())
                })
                .collect();
            let chars: u64 = messages.iter().map(Message::chars_utf16).sum();
            // Any profile that accepts this input.
            c.max_input_chars = chars.max(1) + slack;
            prop_assert!(c.validate().is_ok());
            let hold = fitted_hold(&c, &messages).unwrap();
            prop_assert!(hold <= c.worst_case_hold().unwrap());
            // The strict upper bound of input tokens, split across the input classes.
            let input_max = request_input_tokens_bound(&c, &messages);
            prop_assert!(input_max <= c.worst_case_usage().0);
            let cached = input_max * cached_share / 100;
            let written = (input_max - cached) / 2;
            let reasoning = u64::from(max_tokens) * reasoning_share / 100;
            let usage = Usage {
                input: input_max - cached - written,
                cache_read: cached,
                cache_write: written,
                output: u64::from(max_tokens) - reasoning,
                reasoning,
            };
            prop_assert!(c.prices.cost(&usage).unwrap() <= hold);
        }
    }

    #[test]
    fn sc_207_every_byte_sent_counts_and_no_hold_is_clamped_below_the_request() {
        use crate::message::Part;
        let mut c = text_config();
        let call = |id_len: usize| Message {
            role: Role::Assistant,
            content: vec![Part::ToolCall {
                id: "i".repeat(id_len),
                name: "lookup".into(),
                input: serde_json::json!({}),
            }],
        };
        // A tool call's id is sent, so it counts toward the input checks' characters.
        let short = call(1).chars_utf16();
        assert_eq!(call(1_000).chars_utf16(), short + 999);
        // A request whose bound is above the profile's worst case has no fitted hold.
        c.max_input_chars = 10;
        let long = [Message::text(Role::User, "x".repeat(10_000))];
        assert_eq!(fitted_hold(&c, &long), Err(HoldError::AboveProfile));
    }

    #[test]
    fn sc_121_byte_bound_is_within_the_profile_char_bound() {
        // Three UTF-8 bytes at most per UTF-16 code unit: the profile's multiplier.
        for s in ["a", "é", "€", "中", "😀"] {
            assert!(s.len() as u64 <= TOKENS_PER_CHAR_WORST * utf16_len(s));
        }
        let c = text_config();
        let many: Vec<Message> = (0..MESSAGES_MAX)
            .map(|_| Message::text(Role::User, ""))
            .collect();
        assert!(request_input_tokens_bound(&c, &many) <= c.worst_case_usage().0);
    }
}
