//! Store errors.

use tollgate_core::ids::ExecutionId;
use tollgate_core::money::{Currency, Money, MoneyError};

/// What every store method returns; a failure never carries content.
pub type StoreResult<T> = Result<T, StoreError>;

/// Why a store operation failed. Never carries content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or the transaction failed; nothing was written.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write carried a fence token that is no longer current, or the execution was not in a
    /// state the transition allows: a stale executor. Nothing was written, so a process that lost its
    /// lease cannot overwrite the one that took it over (H-3).
    #[error("stale fence or state for execution {0}")]
    StaleFence(ExecutionId),
    /// A row the operation needs does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A uniqueness rule refused the write (e.g. a second settlement for one execution).
    #[error("duplicate: {0}")]
    Duplicate(String),
    /// Stored data could not be decoded.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A hold may only shrink before dispatch: the new hold is above the execution's current
    /// one (SC-122). Nothing was written.
    #[error("the hold of execution {0} may only shrink")]
    HoldGrows(ExecutionId),
    /// A release of more than is held (a spend row's or a root's `held` below the execution's
    /// hold): never floored at zero; the unit changed nothing (SC-107).
    #[error("hold underflow: releasing {release} of {held} held")]
    HoldUnderflow {
        /// What the row holds.
        held: Money,
        /// What was to be released.
        release: Money,
    },
    /// A cap or total in one currency met spend in another: nothing is added up across
    /// currencies; the unit changed nothing (SC-106).
    #[error("currency mismatch: expected {expected}, found {found}")]
    CurrencyMismatch {
        /// The currency of the cap or total.
        expected: Currency,
        /// The currency of the spend or amount.
        found: Currency,
    },
}

impl From<MoneyError> for StoreError {
    fn from(error: MoneyError) -> Self {
        match error {
            MoneyError::CurrencyMismatch { expected, found } => {
                Self::CurrencyMismatch { expected, found }
            }
            other => Self::Corrupt(other.to_string()),
        }
    }
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}
