//! The runners of tollgate: the text/JSON single-call runner, recovery and reconciliation.
//!
//! Every runner follows one order (SC-12, spec/journal.md): claim (with the worst-case cost held
//! against every block cap) → load input → durable dispatch mark → one send through a
//! single-shot client → collect the stream into a step → usage evidence into the inbox →
//! settlement, spend, result and journal completion in one fenced unit → read back the stored
//! view, so the caller sees what was committed (H-1).
#![warn(missing_docs)]

pub mod backlog;
pub mod clock;
mod drive;
pub mod engine;
pub mod error;
pub mod input;
pub mod lease;
pub mod live;
pub mod outcome;
pub mod recovery;
pub mod retry;
pub mod settings;
pub mod single;
pub mod stated;
pub mod step;
pub mod structured;
pub mod views;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Interruption, RunError};
pub use settings::{BackgroundFailure, InputLoader, RunnerSettings};
pub use single::{RunRequest, SingleCallRunner};
