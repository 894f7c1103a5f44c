//! The three wire formats the mock provider streams, event by event: OpenAI Chat Completions,
//! OpenAI Responses and Anthropic Messages.

mod anthropic;
mod chat;
mod responses;

use crate::scenario::{Plan, Shape};
use crate::stored::StoredResponses;
use crate::wire::{Gone, Sink};
use tollgate_provider::Protocol;

/// Streams `plan` in `protocol`'s format. `Ok` once the stream ended (cleanly or by a cut).
/// A Responses plan with `store` keeps its final response in `stored` once its id is known.
pub(crate) async fn render(
    protocol: Protocol,
    plan: &Plan,
    sink: &Sink,
    stored: &StoredResponses,
) -> Result<(), Gone> {
    if plan.shape == Shape::Hang {
        return sink.hold().await;
    }
    match protocol {
        Protocol::OpenAiChat => chat::render(plan, sink).await,
        Protocol::OpenAiResponses => responses::render(plan, sink, stored).await,
        Protocol::Anthropic => anthropic::render(plan, sink).await,
    }
}
