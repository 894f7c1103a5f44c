//! Execution states, outcomes and not-dispatched causes.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// The wire name.
            pub fn as_str(&self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(UnknownName(stringify!($name))),
                }
            }
        }
    };
}

/// A stored name that is not part of the enum (a store holding data from a newer version).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {0} name")]
pub struct UnknownName(pub &'static str);

wire_enum!(
    /// The journal state of an execution (spec/journal.md — States).
    ExecutionState {
        /// Claimed, input may be loading; nothing has been sent.
        Prepared => "prepared",
        /// The dispatch mark is durable: the call may have been sent.
        Dispatched => "dispatched",
        /// Settled and stored.
        Completed => "completed",
        /// Provably never sent.
        NotDispatched => "not_dispatched",
        /// Sent, but its cost cannot be proven: an operator settles it.
        ReconciliationRequired => "reconciliation_required",
    }
);

wire_enum!(
    /// What a completed call produced.
    Outcome {
        /// Valid output.
        Success => "success",
        /// Output failed a check (`invalid_reason` on the run's own response).
        Invalid => "invalid",
        /// The provider refused.
        Refused => "refused",
        /// A block cap suppressed the output after the known cost was settled (SC-16).
        Blocked => "blocked",
        /// The provider stopped at its output cap.
        Truncated => "truncated",
        /// No usable output: lost, erased, expired, or a verified pre-stream refusal.
        Unavailable => "unavailable",
    }
);

wire_enum!(
    /// Why a claimed call never reached the provider (spec: not-dispatched-cause, SC-30).
    NotDispatchedCause {
        /// Configuration or loaded input was invalid; an unmodified retry will fail again.
        Invalid => "invalid",
        /// The host's input loader failed.
        Input => "input",
        /// The caller aborted before dispatch.
        Aborted => "aborted",
        /// An audit write failed before dispatch.
        Audit => "audit",
        /// A store write failed before dispatch.
        Store => "store",
        /// The claim's fence expired before dispatch (cause unknown).
        Expired => "expired",
    }
);

wire_enum!(
    /// Why an execution waits for an operator (`reconciliation_required`): what could not be
    /// proven about its cost.
    ReconciliationReason {
        /// The stream reported usage, but the profile's price table cannot price it.
        UnpricedUsage => "unpriced_usage",
        /// The stream ended without exact final usage (cut, malformed or inexact counts).
        NoExactUsage => "no_exact_usage",
        /// The request may have reached the provider, but no answer came (timeout, lost
        /// connection after sending).
        NoResponse => "no_response",
        /// The provider's endpoint answered an HTTP error status that does not prove the request
        /// went unprocessed (a gateway's answer, a server error): it may have been billed.
        AmbiguousStatus => "ambiguous_status",
        /// Recovery found the lease expired after dispatch and no exact usage evidence.
        RecoveryNoExactUsage => "recovery_no_exact_usage",
        /// Recovery found exact usage evidence that the price table cannot price.
        RecoveryUnpricedUsage => "recovery_unpriced_usage",
    }
);

wire_enum!(
    /// The kind of call an execution is.
    CallKind {
        /// Text output.
        Text => "text",
        /// JSON output with a schema.
        Json => "json",
        /// Structured single call (forced tool extraction).
        Structured => "structured",
        /// One governed step inside an operation root.
        Step => "step",
    }
);

wire_enum!(
    /// Where a settlement's usage came from.
    SettlementSource {
        /// The call's own stream.
        Stream => "stream",
        /// Recovery, from inbox evidence.
        Recovery => "recovery",
        /// An operator's stated usage.
        Operator => "operator",
    }
);

impl ExecutionState {
    /// Every state, in the journal's order.
    pub const ALL: [ExecutionState; 5] = [
        Self::Prepared,
        Self::Dispatched,
        Self::Completed,
        Self::NotDispatched,
        Self::ReconciliationRequired,
    ];

    /// Whether no further transition is possible without an operator.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Completed | Self::NotDispatched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sc_30_causes_round_trip() {
        for c in ["invalid", "input", "aborted", "audit", "store", "expired"] {
            assert_eq!(c.parse::<NotDispatchedCause>().map(|c| c.as_str()), Ok(c));
        }
        assert!("other".parse::<NotDispatchedCause>().is_err());
    }

    #[test]
    fn sc_20_state_names() {
        let names: Vec<_> = [
            ExecutionState::Completed,
            ExecutionState::NotDispatched,
            ExecutionState::ReconciliationRequired,
        ]
        .iter()
        .map(|s| s.as_str())
        .collect();
        assert_eq!(
            names,
            ["completed", "not_dispatched", "reconciliation_required"]
        );
    }
}
