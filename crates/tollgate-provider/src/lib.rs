//! Provider clients for tollgate.
//!
//! A client is **single-shot**: one attempt, no retry, no fallback (SC-7). Adapters translate the
//! OpenAI Chat Completions, OpenAI Responses and Anthropic Messages streaming formats into the
//! normalized [`tollgate_core::event::ProviderEvent`] sequence. Each adapter publishes a support
//! matrix and refuses an unsupported request before any network access (SC-5, TC-2).
#![warn(missing_docs)]

pub mod anthropic;
pub mod client;
pub mod fetch;
pub mod http;
pub mod openai_chat;
pub mod openai_responses;
pub mod options;
pub mod parse;
pub mod protocol;
pub mod scripted;
pub mod sse;
pub mod status;
pub mod support;
mod usage;

pub use client::{ClientDescriptor, EventStream, ProviderClient, ProviderRequest, SendError};
pub use fetch::{FetchError, FetchedUsage, UsageFetcher};
pub use protocol::Protocol;
pub use status::StatusClass;
