//! Reading a provider's usage object (SC-95): which counts each protocol requires, and when the
//! counts are exact.
//!
//! A required count that is missing, a count that is not a non-negative integer, or a detail
//! larger than the total it is part of (cached > prompt, reasoning > completion) makes the usage
//! **inexact**: the adapter sends it as a non-terminal [`ProviderEvent::Usage`], so it is never
//! settled and the call goes to an operator (`no_exact_usage`) with the counts kept as inexact
//! evidence. A count is never read as a silent 0 and never subtracted with saturation.
//!
//! Inexact counts keep what could be read: an unreadable count is 0, and a detail larger than its
//! total is not subtracted (the total stays whole in its base class, the detail in its own).
//!
//! [`ProviderEvent::Usage`]: tollgate_core::event::ProviderEvent::Usage

use serde_json::Value;
use tollgate_core::Usage;

/// One count as the provider sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Count {
    /// Not sent, or `null`.
    #[default]
    Absent,
    /// A non-negative integer.
    Valid(u64),
    /// Sent, but not a non-negative integer (negative, fractional, a string, an object, ...).
    Invalid,
}

impl Count {
    /// The count at `path` in `u`. A parent that is neither an object nor null is unreadable.
    pub(crate) fn read(u: &Value, path: &[&str]) -> Self {
        let mut cur = u;
        for key in path {
            match cur {
                Value::Null => return Self::Absent,
                Value::Object(map) => match map.get(*key) {
                    Some(v) => cur = v,
                    None => return Self::Absent,
                },
                _ => return Self::Invalid,
            }
        }
        match cur {
            Value::Null => Self::Absent,
            v => v.as_u64().map_or(Self::Invalid, Self::Valid),
        }
    }

    /// A required count: only a valid one.
    pub(crate) fn required(self) -> Option<u64> {
        match self {
            Self::Valid(n) => Some(n),
            Self::Absent | Self::Invalid => None,
        }
    }

    /// An optional count: absent is 0, unreadable is none.
    pub(crate) fn optional(self) -> Option<u64> {
        match self {
            Self::Valid(n) => Some(n),
            Self::Absent => Some(0),
            Self::Invalid => None,
        }
    }

    /// The count for inexact evidence: 0 when absent or unreadable.
    pub(crate) fn or_zero(self) -> u64 {
        match self {
            Self::Valid(n) => n,
            Self::Absent | Self::Invalid => 0,
        }
    }
}

/// A required `total` and an optional `part` of it that the provider breaks out:
/// `(total − part, part, exact)`. Inexact when the total is missing or unreadable, the part is
/// unreadable, or the part exceeds the total; the counts are then `(total, part)` as read.
pub(crate) fn split(total: Count, part: Count) -> (u64, u64, bool) {
    let exact = total
        .required()
        .zip(part.optional())
        .and_then(|(t, p)| t.checked_sub(p).map(|rest| (rest, p)));
    match exact {
        Some((rest, p)) => (rest, p, true),
        None => (total.or_zero(), part.or_zero(), false),
    }
}

/// OpenAI usage (Chat Completions with `prompt`/`completion`, Responses with `input`/`output`):
/// `{input}_tokens` and `{output}_tokens` are required; `{input}_tokens_details.cached_tokens`
/// (at most the input) and `{output}_tokens_details.reasoning_tokens` (at most the output) are
/// optional. Returns the disjoint classes and whether they are exact.
pub(crate) fn openai(u: &Value, input: &str, output: &str) -> (Usage, bool) {
    let count = |base: &str, detail: Option<&str>| {
        let total = format!("{base}_tokens");
        match detail {
            None => Count::read(u, &[&total]),
            Some(detail) => Count::read(u, &[&format!("{total}_details"), detail]),
        }
    };
    let (input_rest, cached, input_exact) =
        split(count(input, None), count(input, Some("cached_tokens")));
    let (output_rest, reasoning, output_exact) =
        split(count(output, None), count(output, Some("reasoning_tokens")));
    let usage = Usage {
        input: input_rest,
        output: output_rest,
        cache_read: cached,
        cache_write: 0,
        reasoning,
    };
    (usage, input_exact && output_exact)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sc_95_counts_are_read_without_defaults() {
        let u = json!({"a": 3, "b": -1, "c": 1.5, "d": "4", "e": null, "f": {"g": 2}, "h": 7});
        assert_eq!(Count::read(&u, &["a"]), Count::Valid(3));
        assert_eq!(Count::read(&u, &["b"]), Count::Invalid);
        assert_eq!(Count::read(&u, &["c"]), Count::Invalid);
        assert_eq!(Count::read(&u, &["d"]), Count::Invalid);
        assert_eq!(Count::read(&u, &["e"]), Count::Absent);
        assert_eq!(Count::read(&u, &["x"]), Count::Absent);
        assert_eq!(Count::read(&u, &["f", "g"]), Count::Valid(2));
        assert_eq!(Count::read(&u, &["e", "g"]), Count::Absent);
        assert_eq!(Count::read(&u, &["h", "g"]), Count::Invalid);
    }

    #[test]
    fn sc_95_split_is_checked() {
        assert_eq!(split(Count::Valid(10), Count::Valid(4)), (6, 4, true));
        assert_eq!(split(Count::Valid(10), Count::Absent), (10, 0, true));
        assert_eq!(split(Count::Valid(10), Count::Valid(10)), (0, 10, true));
        assert_eq!(split(Count::Valid(4), Count::Valid(10)), (4, 10, false));
        assert_eq!(split(Count::Absent, Count::Valid(3)), (0, 3, false));
        assert_eq!(split(Count::Invalid, Count::Absent), (0, 0, false));
        assert_eq!(split(Count::Valid(5), Count::Invalid), (5, 0, false));
    }
}
