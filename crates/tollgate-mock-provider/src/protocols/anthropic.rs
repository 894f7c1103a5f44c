//! The mock provider's Anthropic Messages stream: `event: TYPE` + `data: {...}` from
//! `message_start` to `message_stop`.

use crate::scenario::{Content, Ending, Plan, Shape};
use crate::wire::{
    loop_thought, pieces, simple_id, Gone, Sink, ARGS_DELTA_CHARS, LOOP_EVENTS_MAX, SIGNATURE,
    TEXT_DELTA_CHARS,
};
use serde_json::{json, Value};

/// Streams `plan` as an Anthropic Messages stream.
pub(super) async fn render(plan: &Plan, sink: &Sink) -> Result<(), Gone> {
    let t = &plan.tokens;
    // The early count of `message_start`: real streams report 1 output token there; the
    // refusals report 0.
    let start_output = match plan.shape {
        Shape::PreStream | Shape::EmptyRefusal => 0,
        _ => 1,
    };
    let message = json!({
        "id": format!("msg_{}", simple_id()),
        "type": "message",
        "role": "assistant",
        "model": plan.model,
        "content": [],
        "stop_reason": null,
        "stop_sequence": null,
        "usage": usage_json(t.input, start_output)
    });
    let start = json!({"type": "message_start", "message": message});
    sink.event("message_start", &start).await?;
    let messages = Messages {
        sink,
        final_usage: usage_json(t.input, t.output.saturating_add(t.reasoning)),
    };
    match &plan.shape {
        Shape::PreStream => messages.stop().await,
        Shape::EmptyRefusal => {
            messages.delta(json!("refusal")).await?;
            messages.stop().await
        }
        Shape::ReasoningLoop => {
            sink.event("ping", &json!({"type": "ping"})).await?;
            let thinking = json!({"type": "thinking", "thinking": "", "signature": ""});
            messages.block_start(0, thinking).await?;
            for n in 0..LOOP_EVENTS_MAX {
                sink.pace().await?;
                let delta = json!({"type": "thinking_delta", "thinking": loop_thought(n)});
                messages.block_delta(0, delta).await?;
            }
            sink.cut().await;
            Ok(())
        }
        Shape::Hang => Ok(()),
        Shape::Normal(content, ending) => messages.normal(content, *ending).await,
    }
}

fn usage_json(input: u64, output: u64) -> Value {
    json!({
        "input_tokens": input,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output
    })
}

/// Writes the rest of one Messages stream after `message_start`.
struct Messages<'a> {
    sink: &'a Sink,
    /// The final count of `message_delta`.
    final_usage: Value,
}

impl Messages<'_> {
    async fn normal(&self, content: &Content, ending: Ending) -> Result<(), Gone> {
        self.sink.event("ping", &json!({"type": "ping"})).await?;
        let mut index = 0;
        if let Some(reasoning) = &content.reasoning {
            let thinking = json!({"type": "thinking", "thinking": "", "signature": ""});
            self.block_start(index, thinking).await?;
            for piece in pieces(reasoning, TEXT_DELTA_CHARS) {
                let delta = json!({"type": "thinking_delta", "thinking": piece});
                self.block_delta(index, delta).await?;
            }
            let delta = json!({"type": "signature_delta", "signature": SIGNATURE});
            self.block_delta(index, delta).await?;
            self.block_stop(index).await?;
            index += 1;
        }
        if !content.text.is_empty() {
            self.block_start(index, json!({"type": "text", "text": ""}))
                .await?;
            for piece in pieces(&content.text, TEXT_DELTA_CHARS) {
                let delta = json!({"type": "text_delta", "text": piece});
                self.block_delta(index, delta).await?;
            }
            if ending == Ending::CutBeforeUsage {
                self.sink.cut().await;
                return Ok(());
            }
            self.block_stop(index).await?;
            index += 1;
        }
        if let Some(tool) = &content.tool {
            let block = json!({"type": "tool_use", "id": format!("toolu_{}", simple_id()),
                "name": tool.name, "input": {}});
            self.block_start(index, block).await?;
            let first = json!({"type": "input_json_delta", "partial_json": ""});
            self.block_delta(index, first).await?;
            for piece in pieces(&tool.args, ARGS_DELTA_CHARS) {
                let delta = json!({"type": "input_json_delta", "partial_json": piece});
                self.block_delta(index, delta).await?;
            }
            self.block_stop(index).await?;
        }
        if ending == Ending::CutAfterUsage {
            // The final usage without a stop reason, then the cut before `message_stop`.
            self.delta(Value::Null).await?;
            self.sink.cut().await;
            return Ok(());
        }
        let reason = if content.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        };
        self.delta(json!(reason)).await?;
        self.stop().await
    }

    /// `message_delta` with `stop_reason` and the final usage.
    async fn delta(&self, stop_reason: Value) -> Result<(), Gone> {
        let value = json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": self.final_usage});
        self.sink.event("message_delta", &value).await
    }

    async fn stop(&self) -> Result<(), Gone> {
        let value = json!({"type": "message_stop"});
        self.sink.event("message_stop", &value).await
    }

    async fn block_start(&self, index: u32, block: Value) -> Result<(), Gone> {
        let value = json!({"type": "content_block_start", "index": index, "content_block": block});
        self.sink.event("content_block_start", &value).await
    }

    async fn block_delta(&self, index: u32, delta: Value) -> Result<(), Gone> {
        let value = json!({"type": "content_block_delta", "index": index, "delta": delta});
        self.sink.event("content_block_delta", &value).await
    }

    async fn block_stop(&self, index: u32) -> Result<(), Gone> {
        let value = json!({"type": "content_block_stop", "index": index});
        self.sink.event("content_block_stop", &value).await
    }
}
