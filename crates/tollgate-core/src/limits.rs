//! Rate and concurrency limits (spec/limits.md): the pace at which a subject (a profile's consumer,
//! an API key) may start calls, next to the caps that govern what they cost.
//!
//! A subject's use is counted in **windows of one minute that the subject's own first call
//! opens**: a window opens at the first admission after the previous one closed and lasts
//! [`LIMIT_WINDOW_MS`]; its counts start at zero. Within one window a subject is never admitted
//! more requests, input tokens or output tokens than its limits. Calls in flight are not
//! windowed: a call counts from its admission until it leaves `prepared`/`dispatched`.
//!
//! Token limits count a call's fitted worst case when it is admitted (the input bound of the
//! request in hand, or the profile's, and `max_tokens`), and are corrected to the settled usage
//! when the call settles within the window that admitted it; a call that is never sent gives its
//! request and tokens back. Corrections to a window that has closed change nothing: the window
//! that admitted the call has already been judged.
//!
//! [`admit`] is the rule; the stores apply it in the claim's own unit (the in-memory stores with
//! it, Postgres in `tollgate_limits_admit`, which a test compares with it).

use crate::ids::ConsumerId;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The length of a limit window.
pub const LIMIT_WINDOW_MS: u64 = 60_000;
/// The wait a refusal by calls in flight names: no window ends then, a slot frees when one of the
/// subject's calls ends, so a short wait is the honest hint.
pub const IN_FLIGHT_RETRY_MS: u64 = 1_000;
/// The largest limit of any kind (the database's `bigint` holds every count below it).
pub const LIMIT_MAX: u64 = 1 << 53;

/// The limits of one subject; `None`: that kind is not limited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    /// Calls admitted per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Input tokens per window (the fitted worst case at admission, the settled usage after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens_per_minute: Option<u64>,
    /// Output tokens per window (`max_tokens` at admission, the settled usage after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_minute: Option<u64>,
    /// Calls in `prepared` or `dispatched` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
}

impl RateLimits {
    /// Whether no kind is limited.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The limit of `kind`.
    pub fn of(&self, kind: LimitKind) -> Option<u64> {
        match kind {
            LimitKind::Requests => self.requests_per_minute,
            LimitKind::InputTokens => self.input_tokens_per_minute,
            LimitKind::OutputTokens => self.output_tokens_per_minute,
            LimitKind::InFlight => self.in_flight,
        }
    }

    /// Checks every limit is within `1..=LIMIT_MAX`.
    ///
    /// # Errors
    /// The field's name and its bounds (never the value).
    pub fn validate(&self) -> Result<(), String> {
        for kind in LimitKind::ALL {
            if let Some(limit) = self.of(kind) {
                if limit == 0 || limit > LIMIT_MAX {
                    return Err(format!(
                        "{} must be between 1 and {LIMIT_MAX}",
                        kind.field()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Calls per window.
    Requests,
    /// Input tokens per window.
    InputTokens,
    /// Output tokens per window.
    OutputTokens,
    /// Calls in flight.
    InFlight,
}

impl LimitKind {
    /// Every kind, in the order a claim checks them.
    pub const ALL: [LimitKind; 4] = [
        LimitKind::InFlight,
        LimitKind::Requests,
        LimitKind::InputTokens,
        LimitKind::OutputTokens,
    ];

    /// The wire and stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::InputTokens => "input_tokens",
            Self::OutputTokens => "output_tokens",
            Self::InFlight => "in_flight",
        }
    }

    /// The configuration field of its limit.
    pub fn field(self) -> &'static str {
        match self {
            Self::Requests => "requests_per_minute",
            Self::InputTokens => "input_tokens_per_minute",
            Self::OutputTokens => "output_tokens_per_minute",
            Self::InFlight => "in_flight",
        }
    }

    /// Parses [`LimitKind::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose pace a limit governs, within a scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitSubject {
    /// A profile's consumer (`[profiles.limits]`).
    Consumer(ConsumerId),
    /// An API key, by the hex of its SHA-256 (`[[keys]] limits`, `keys create`).
    Key(String),
}

impl LimitSubject {
    /// The stored form: `consumer:<id>` or `key:<sha-256 hex>`.
    pub fn stored(&self) -> String {
        match self {
            Self::Consumer(c) => format!("consumer:{c}"),
            Self::Key(k) => format!("key:{k}"),
        }
    }

    /// Parses [`LimitSubject::stored`].
    pub fn parse(stored: &str) -> Option<Self> {
        if let Some(c) = stored.strip_prefix("consumer:") {
            return ConsumerId::from_stored(c).ok().map(Self::Consumer);
        }
        stored
            .strip_prefix("key:")
            .filter(|k| !k.is_empty())
            .map(|k| Self::Key(k.to_string()))
    }

    /// The kind of subject (`consumer` or `key`), for metrics and answers.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Consumer(_) => "consumer",
            Self::Key(_) => "key",
        }
    }
}

impl fmt::Display for LimitSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stored())
    }
}

/// One subject's limits, as a claim carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitCharge {
    /// Whose limits.
    pub subject: LimitSubject,
    /// The limits that apply to this call.
    pub limits: RateLimits,
}

/// The tokens a call counts against token limits when admitted: its fitted worst case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitTokens {
    /// Input tokens (every input class).
    pub input: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
}

impl LimitTokens {
    /// The settled counterpart of a usage: every input class, and output with reasoning.
    pub fn of_usage(usage: &crate::usage::Usage) -> Self {
        Self {
            input: usage
                .input
                .saturating_add(usage.cache_read)
                .saturating_add(usage.cache_write),
            output: usage.output.saturating_add(usage.reasoning),
        }
    }
}

/// What a claim is limited by: each subject's limits, and the tokens it counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimLimits {
    /// Each subject whose limits apply, one charge per subject (empty: no limit); they are
    /// judged, and their windows locked, in ascending order of the subjects' stored text.
    pub charges: Vec<LimitCharge>,
    /// The call's fitted worst case.
    pub tokens: LimitTokens,
}

impl ClaimLimits {
    /// Whether no limit applies.
    pub fn is_empty(&self) -> bool {
        self.charges.is_empty()
    }
}

/// One subject's window and calls in flight, as a store keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitWindow {
    /// When the window opened (its first admission).
    pub started_at: DateTime<Utc>,
    /// Calls admitted in the window (less those never sent).
    pub requests: u64,
    /// Input tokens counted in the window.
    pub input_tokens: u64,
    /// Output tokens counted in the window.
    pub output_tokens: u64,
    /// Calls in flight now (not windowed).
    pub in_flight: u64,
}

impl LimitWindow {
    /// When the window closes.
    pub fn ends_at(&self) -> DateTime<Utc> {
        self.started_at + Duration::milliseconds(LIMIT_WINDOW_MS as i64)
    }

    /// Whether the window is still open at `now`.
    pub fn open_at(&self, now: DateTime<Utc>) -> bool {
        now < self.ends_at()
    }

    /// Whether `at` falls in the window (`started_at <= at < started_at + 60 s`): for an
    /// admission time, whether this is the window that counted the call.
    pub fn contains(&self, at: DateTime<Utc>) -> bool {
        self.started_at <= at && self.open_at(at)
    }

    /// The window as seen at `now`: a closed one is replaced by an empty one opening at `now`
    /// (calls in flight carry over).
    pub fn current(window: Option<&Self>, now: DateTime<Utc>) -> Self {
        match window {
            Some(w) if w.open_at(now) => *w,
            _ => Self {
                started_at: now,
                requests: 0,
                input_tokens: 0,
                output_tokens: 0,
                in_flight: window.map_or(0, |w| w.in_flight),
            },
        }
    }

    /// The count of `kind`.
    pub fn used(&self, kind: LimitKind) -> u64 {
        match kind {
            LimitKind::Requests => self.requests,
            LimitKind::InputTokens => self.input_tokens,
            LimitKind::OutputTokens => self.output_tokens,
            LimitKind::InFlight => self.in_flight,
        }
    }

    /// Milliseconds from `now` until the window closes (at least 1).
    pub fn reset_ms(&self, now: DateTime<Utc>) -> u64 {
        let left = (self.ends_at() - now).num_milliseconds();
        u64::try_from(left).unwrap_or(0).max(1)
    }
}

/// A claim refused by a limit: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRefused {
    /// Whose limit.
    pub subject: LimitSubject,
    /// Which limit.
    pub kind: LimitKind,
    /// The limit.
    pub limit: u64,
    /// What the subject has used of it (in the window, or in flight).
    pub used: u64,
    /// What this call asked (1 for requests and calls in flight, its tokens otherwise).
    pub asked: u64,
    /// Milliseconds until the refusing count can fall: the window's end, or
    /// [`IN_FLIGHT_RETRY_MS`] for calls in flight.
    pub reset_ms: u64,
}

impl LimitRefused {
    /// What is left of the limit.
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// Whether waiting can let this call in: `false` when it asks more than the limit itself.
    pub fn retryable(&self) -> bool {
        self.asked <= self.limit
    }
}

/// What an admitted call counted, kept with its execution: when it was admitted, whose windows
/// counted it and with which tokens. Its end changes the window of each subject that contains the
/// admission time ([`LimitWindow::contains`]): a subject's windows are disjoint and ordered, so
/// that is the window that counted the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsHeld {
    /// The admission's "now".
    pub admitted_at: DateTime<Utc>,
    /// Each subject that counted the call.
    pub subjects: Vec<LimitSubject>,
    /// The tokens counted at admission.
    pub tokens: LimitTokens,
}

/// The rule of one subject's admission at `now`: the window after it, or the refusal. Kinds are
/// checked in [`LimitKind::ALL`]'s order; the first that would pass its limit refuses.
///
/// # Errors
/// The refusal, naming `subject`.
pub fn admit(
    window: Option<&LimitWindow>,
    charge: &LimitCharge,
    tokens: LimitTokens,
    now: DateTime<Utc>,
) -> Result<LimitWindow, LimitRefused> {
    let current = LimitWindow::current(window, now);
    for kind in LimitKind::ALL {
        let Some(limit) = charge.limits.of(kind) else {
            continue;
        };
        let asked = match kind {
            LimitKind::Requests | LimitKind::InFlight => 1,
            LimitKind::InputTokens => tokens.input,
            LimitKind::OutputTokens => tokens.output,
        };
        let used = current.used(kind);
        if used.saturating_add(asked) > limit {
            return Err(LimitRefused {
                subject: charge.subject.clone(),
                kind,
                limit,
                used,
                asked,
                reset_ms: if kind == LimitKind::InFlight {
                    IN_FLIGHT_RETRY_MS
                } else {
                    current.reset_ms(now)
                },
            });
        }
    }
    Ok(LimitWindow {
        requests: current.requests.saturating_add(1),
        input_tokens: current.input_tokens.saturating_add(tokens.input),
        output_tokens: current.output_tokens.saturating_add(tokens.output),
        in_flight: current.in_flight.saturating_add(1),
        ..current
    })
}

/// What a call's end does to one subject's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitEnd {
    /// It leaves flight without being sent (`not_dispatched`): the request and its tokens are
    /// given back to the window that counted them, and a call in flight ends.
    NotSent,
    /// It leaves flight for an operator (`reconciliation_required`): a call in flight ends; the
    /// tokens stay as counted until it settles.
    Parked,
    /// It settles with `tokens` (`from_flight`: straight from `dispatched`, so a call in flight
    /// ends too): the window that counted it is corrected to them.
    Settled {
        /// The settled tokens.
        tokens: LimitTokens,
        /// Whether the call was in flight until now.
        from_flight: bool,
    },
}

/// The window after a call's `end`, admitted at `admitted_at` with `held`: the request and the
/// tokens are given back or corrected when `window` contains `admitted_at` (it is the window that
/// counted the call); a call in flight ends either way. Counts never go below zero.
pub fn end(
    window: LimitWindow,
    admitted_at: DateTime<Utc>,
    held: LimitTokens,
    end: LimitEnd,
) -> LimitWindow {
    let mut w = window;
    let same = w.contains(admitted_at);
    match end {
        LimitEnd::NotSent => {
            w.in_flight = w.in_flight.saturating_sub(1);
            if same {
                w.requests = w.requests.saturating_sub(1);
                w.input_tokens = w.input_tokens.saturating_sub(held.input);
                w.output_tokens = w.output_tokens.saturating_sub(held.output);
            }
        }
        LimitEnd::Parked => w.in_flight = w.in_flight.saturating_sub(1),
        LimitEnd::Settled {
            tokens,
            from_flight,
        } => {
            if from_flight {
                w.in_flight = w.in_flight.saturating_sub(1);
            }
            if same {
                w.input_tokens = w
                    .input_tokens
                    .saturating_sub(held.input)
                    .saturating_add(tokens.input);
                w.output_tokens = w
                    .output_tokens
                    .saturating_sub(held.output)
                    .saturating_add(tokens.output);
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn charge(limits: RateLimits) -> LimitCharge {
        LimitCharge {
            subject: LimitSubject::Consumer(ConsumerId::parse("app").unwrap()),
            limits,
        }
    }

    const T: LimitTokens = LimitTokens {
        input: 10,
        output: 5,
    };

    #[test]
    fn sc_220_requests_per_minute_admits_exactly_the_limit_in_a_window() {
        let c = charge(RateLimits {
            requests_per_minute: Some(3),
            ..RateLimits::default()
        });
        let mut w = None;
        for i in 0..3 {
            w = Some(admit(w.as_ref(), &c, T, at(i * 100)).unwrap());
        }
        let refused = admit(w.as_ref(), &c, T, at(1_000)).unwrap_err();
        assert_eq!(refused.kind, LimitKind::Requests);
        assert_eq!(
            (refused.limit, refused.used, refused.remaining()),
            (3, 3, 0)
        );
        // The window opened at 0: it closes at 60 s.
        assert_eq!(refused.reset_ms, 59_000);
        assert!(refused.retryable());
        // At its end a new window opens at the next call, with calls in flight carried over.
        let next = admit(w.as_ref(), &c, T, at(60_000)).unwrap();
        assert_eq!(
            (next.started_at, next.requests, next.in_flight),
            (at(60_000), 1, 4)
        );
    }

    #[test]
    fn sc_221_token_limits_count_the_worst_case_and_refuse_what_never_fits() {
        let c = charge(RateLimits {
            input_tokens_per_minute: Some(25),
            output_tokens_per_minute: Some(100),
            ..RateLimits::default()
        });
        let w = admit(None, &c, T, at(0)).unwrap();
        let w = admit(Some(&w), &c, T, at(1)).unwrap();
        let refused = admit(Some(&w), &c, T, at(2)).unwrap_err();
        assert_eq!(
            (refused.kind, refused.used, refused.asked),
            (LimitKind::InputTokens, 20, 10)
        );
        let huge = LimitTokens {
            input: 26,
            output: 0,
        };
        assert!(!admit(None, &c, huge, at(0)).unwrap_err().retryable());
    }

    #[test]
    fn sc_222_in_flight_counts_until_a_call_ends() {
        let c = charge(RateLimits {
            in_flight: Some(1),
            ..RateLimits::default()
        });
        let w = admit(None, &c, T, at(0)).unwrap();
        let refused = admit(Some(&w), &c, T, at(1)).unwrap_err();
        assert_eq!(
            (refused.kind, refused.reset_ms),
            (LimitKind::InFlight, IN_FLIGHT_RETRY_MS)
        );
        let parked = end(w, w.started_at, T, LimitEnd::Parked);
        assert_eq!(parked.in_flight, 0);
        assert!(admit(Some(&parked), &c, T, at(2)).is_ok());
    }

    #[test]
    fn sc_223_a_call_never_sent_gives_back_and_a_settled_one_corrects_its_window() {
        let c = charge(RateLimits {
            requests_per_minute: Some(10),
            ..RateLimits::default()
        });
        let w = admit(None, &c, T, at(0)).unwrap();
        let w = admit(Some(&w), &c, T, at(1)).unwrap();
        let given_back = end(w, at(0), T, LimitEnd::NotSent);
        assert_eq!(
            (
                given_back.requests,
                given_back.input_tokens,
                given_back.in_flight
            ),
            (1, 10, 1)
        );
        let settled = end(
            w,
            at(0),
            T,
            LimitEnd::Settled {
                tokens: LimitTokens {
                    input: 3,
                    output: 50,
                },
                from_flight: true,
            },
        );
        assert_eq!(
            (
                settled.input_tokens,
                settled.output_tokens,
                settled.in_flight
            ),
            (13, 55, 1)
        );
        // A window that has closed since is not corrected; calls in flight still end.
        let later = LimitWindow::current(Some(&w), at(61_000));
        let after = end(
            later,
            at(0),
            T,
            LimitEnd::Settled {
                tokens: LimitTokens::default(),
                from_flight: true,
            },
        );
        assert_eq!((after.input_tokens, after.in_flight), (0, 1));
        // The window that counted a call is the one that contains its admission time: from its
        // start, inclusive, to its end, exclusive.
        assert_eq!(end(w, at(59_999), T, LimitEnd::NotSent).requests, 1);
        for outside in [at(-1), at(60_000)] {
            let untouched = end(w, outside, T, LimitEnd::NotSent);
            assert_eq!((untouched.requests, untouched.in_flight), (2, 1));
        }
    }

    #[test]
    fn limits_validate_their_bounds_by_name() {
        let zero = RateLimits {
            in_flight: Some(0),
            ..RateLimits::default()
        };
        assert_eq!(
            zero.validate().unwrap_err(),
            format!("in_flight must be between 1 and {LIMIT_MAX}")
        );
        assert!(RateLimits::default().validate().is_ok());
        let subject = LimitSubject::Key("ab".into());
        assert_eq!(LimitSubject::parse(&subject.stored()), Some(subject));
    }
}
