//! The three wire formats the mock provider streams, event by event: OpenAI Chat Completions,
//! OpenAI Responses and Anthropic Messages.

mod anthropic;
mod chat;
mod responses;

use crate::scenario::{Plan, Shape};
use crate::wire::{Gone, Sink};
use tollgate_provider::Protocol;

/// Streams `plan` in `protocol`'s format. `Ok` once the stream ended (cleanly or by a cut).
pub(crate) async fn render(protocol: Protocol, plan: &Plan, sink: &Sink) -> Result<(), Gone> {
    if plan.shape == Shape::Hang {
        return sink.hold().await;
    }
    match protocol {
        Protocol::OpenAiChat => chat::render(plan, sink).await,
        Protocol::OpenAiResponses => responses::render(plan, sink).await,
        Protocol::Anthropic => anthropic::render(plan, sink).await,
    }
}
