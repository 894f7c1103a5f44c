//! Domain types and pure logic of tollgate.
//!
//! Nothing in this crate performs I/O: ids and digests, exact money and versioned prices, caps,
//! the execution states and views, the normalized provider event model and the step collector.
#![warn(missing_docs)]

pub mod caps;
pub mod collector;
pub mod config;
pub mod digest;
pub mod event;
pub mod hold;
pub mod ids;
pub mod invalid;
pub mod limits;
pub mod message;
pub mod money;
pub mod narrow;
pub mod request_fit;
pub mod state;
pub mod step;
pub mod usage;
pub mod view;

pub use ids::*;
pub use money::{Currency, Money};
pub use usage::Usage;
