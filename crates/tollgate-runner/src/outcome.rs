//! What a collected stream means for the journal: settle with its cost, settle a verified
//! refusal at zero, or hand it to an operator (ST-23, RF-1, RF-2). Pure.

use tollgate_core::collector::{Collected, RefusalProof};
use tollgate_core::invalid::InvalidReason;
use tollgate_core::state::Outcome;
use tollgate_core::step::{Block, Step};
use tollgate_core::usage::Usage;
use tollgate_core::view::Output;

/// Provider stop reasons that mean the output cap cut the answer.
pub const TRUNCATION_STOPS: [&str; 4] = ["length", "max_tokens", "max_output_tokens", "incomplete"];
/// Provider stop reasons that mean a refusal.
pub const REFUSAL_STOPS: [&str; 2] = ["refusal", "content_filter"];

/// How a kind of call turns a valid step into output.
pub trait OutputPolicy: Send + Sync {
    /// The output of a step whose stream was valid, or the reason it is invalid.
    ///
    /// # Errors
    /// The invalid reason (e.g. `text_malformed` for JSON that fails its schema).
    fn output(&self, step: &Step) -> Result<Output, InvalidReason>;

    /// Whether the stored result keeps the step (structured and step calls).
    fn keeps_step(&self) -> bool {
        false
    }
}

/// What [`decide`] makes of a stream: settle at its cost, at zero, or hand it to an operator.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Settle with the terminal usage.
    Settle {
        /// The terminal usage; the charge is priced from it.
        usage: Usage,
        /// `success`, `invalid`, `refused` or `truncated`; settling may still turn it `blocked`.
        outcome: Outcome,
        /// Output, when usable.
        output: Option<Output>,
        /// Step, when the kind keeps it.
        step: Option<Box<Step>>,
        /// First invalid reason, for the run's own response.
        invalid_reason: Option<InvalidReason>,
    },
    /// A verified refusal proof: zero settlement (RF-1, RF-2).
    ZeroSettle {
        /// `unavailable` (pre-stream) or `refused` (empty refusal).
        outcome: Outcome,
        /// Which proof held: pre-stream (RF-2) or empty refusal (RF-1).
        proof: RefusalProof,
    },
    /// No terminal usage: cost unknown, operator reconciliation (ST-23).
    Reconcile {
        /// First invalid reason, for the run's own response.
        invalid_reason: Option<InvalidReason>,
    },
}

fn has_refusal_block(step: &Step) -> bool {
    step.blocks
        .iter()
        .any(|b| matches!(b, Block::Refusal { .. }))
}

/// Decides what a collected stream means.
pub fn decide(collected: &Collected, policy: &dyn OutputPolicy) -> Decision {
    match collected.refusal {
        Some(RefusalProof::PreStream) => {
            return Decision::ZeroSettle {
                outcome: Outcome::Unavailable,
                proof: RefusalProof::PreStream,
            }
        }
        Some(RefusalProof::EmptyRefusal) => {
            return Decision::ZeroSettle {
                outcome: Outcome::Refused,
                proof: RefusalProof::EmptyRefusal,
            }
        }
        None => {}
    }
    let Some(usage) = collected.terminal_usage() else {
        // A stream that failed before its usage is cut where the protocol allows no end: the
        // run's view names it `event_type` (ST-23), unless a check rejected it first.
        let cut = collected
            .stream_error
            .as_ref()
            .map(|_| InvalidReason::EventType);
        return Decision::Reconcile {
            invalid_reason: collected.invalid_reason.or(cut),
        };
    };
    let step = &collected.step;
    let kept = |s: &Step| policy.keeps_step().then(|| Box::new(s.clone()));
    // Invalid output never authorizes tools (ST-9): partial blocks stay, the tool-call list
    // that a consumer would act on is emptied.
    let invalid = |reason: InvalidReason| Decision::Settle {
        usage,
        outcome: Outcome::Invalid,
        output: None,
        step: kept(step).map(|mut s| {
            s.tool_calls.clear();
            s
        }),
        invalid_reason: Some(reason),
    };
    if let Some(reason) = collected.invalid_reason {
        return invalid(reason);
    }
    // Usage arrived, then the stream failed or never reached its stop: the answer is cut, its
    // cost is known (ST-23). The closed set names this `event_type`: the stream ended where the
    // protocol allows no end.
    if collected.stream_error.is_some() || step.stop.is_none() {
        return invalid(InvalidReason::EventType);
    }
    let stop = step.stop.as_deref().unwrap_or_default();
    if REFUSAL_STOPS.contains(&stop) || has_refusal_block(step) {
        return Decision::Settle {
            usage,
            outcome: Outcome::Refused,
            output: None,
            step: kept(step),
            invalid_reason: None,
        };
    }
    if TRUNCATION_STOPS.contains(&stop) {
        return Decision::Settle {
            usage,
            outcome: Outcome::Truncated,
            output: Some(Output {
                text: Some(step.text.clone()),
                json: None,
            }),
            step: kept(step),
            invalid_reason: None,
        };
    }
    match policy.output(step) {
        Ok(output) => Decision::Settle {
            usage,
            outcome: Outcome::Success,
            output: Some(output),
            step: kept(step),
            invalid_reason: None,
        },
        Err(reason) => invalid(reason),
    }
}
