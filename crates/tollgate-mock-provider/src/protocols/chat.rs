//! The mock provider's OpenAI Chat Completions stream: `data: {chunk}` lines, a final
//! `choices: []` usage chunk, then `data: [DONE]`.

use crate::scenario::{Content, Ending, Plan, Shape, Tokens};
use crate::wire::{
    loop_thought, pieces, simple_id, unix_now, Gone, Sink, ARGS_DELTA_CHARS, LOOP_EVENTS_MAX,
    TEXT_DELTA_CHARS,
};
use serde_json::{json, Value};

/// Streams `plan` as a Chat Completions stream.
pub(super) async fn render(plan: &Plan, sink: &Sink) -> Result<(), Gone> {
    let chat = Chat {
        plan,
        sink,
        id: format!("chatcmpl-{}", simple_id()),
        created: unix_now(),
    };
    match &plan.shape {
        Shape::PreStream => {
            // One chunk with the id and an empty delta, no finish reason, no usage.
            chat.chunk(json!({}), Value::Null).await?;
            chat.done().await
        }
        Shape::EmptyRefusal => {
            chat.chunk(role(Value::Null), Value::Null).await?;
            chat.chunk(json!({}), json!("content_filter")).await?;
            chat.usage().await?;
            chat.done().await
        }
        Shape::ReasoningLoop => {
            chat.chunk(role(json!("")), Value::Null).await?;
            for n in 0..LOOP_EVENTS_MAX {
                sink.pace().await?;
                let delta = json!({"reasoning_content": loop_thought(n)});
                chat.chunk(delta, Value::Null).await?;
            }
            sink.cut().await;
            Ok(())
        }
        Shape::Hang => Ok(()),
        Shape::Normal(content, ending) => chat.normal(content, *ending).await,
    }
}

/// The first delta of an answer.
fn role(content: Value) -> Value {
    json!({"role": "assistant", "content": content, "refusal": null})
}

fn usage_json(t: &Tokens) -> Value {
    let completion = t.output.saturating_add(t.reasoning);
    json!({
        "prompt_tokens": t.input,
        "completion_tokens": completion,
        "total_tokens": t.input.saturating_add(completion),
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": t.reasoning}
    })
}

/// Writes one Chat Completions stream.
struct Chat<'a> {
    plan: &'a Plan,
    sink: &'a Sink,
    id: String,
    created: u64,
}

impl Chat<'_> {
    fn envelope(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.plan.model,
            "system_fingerprint": "fp_mock",
            "choices": choices
        })
    }

    async fn chunk(&self, delta: Value, finish: Value) -> Result<(), Gone> {
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
        self.sink.data(&self.envelope(json!([choice]))).await
    }

    /// The `stream_options.include_usage` chunk (always sent).
    async fn usage(&self) -> Result<(), Gone> {
        let mut value = self.envelope(json!([]));
        value["usage"] = usage_json(&self.plan.tokens);
        self.sink.data(&value).await
    }

    async fn done(&self) -> Result<(), Gone> {
        self.sink.send("data: [DONE]\n\n".to_string()).await
    }

    async fn normal(&self, content: &Content, ending: Ending) -> Result<(), Gone> {
        let first = if content.text.is_empty() && content.tool.is_some() {
            Value::Null
        } else {
            json!("")
        };
        self.chunk(role(first), Value::Null).await?;
        // Reasoning as `reasoning_content` deltas (the OpenAI-compatible servers' convention).
        for piece in pieces(content.reasoning.as_deref().unwrap_or(""), TEXT_DELTA_CHARS) {
            self.chunk(json!({"reasoning_content": piece}), Value::Null)
                .await?;
        }
        for piece in pieces(&content.text, TEXT_DELTA_CHARS) {
            self.chunk(json!({"content": piece}), Value::Null).await?;
        }
        if ending == Ending::CutBeforeUsage {
            self.sink.cut().await;
            return Ok(());
        }
        if let Some(tool) = &content.tool {
            let call = json!({"index": 0, "id": format!("call_{}", simple_id()),
                "type": "function", "function": {"name": tool.name, "arguments": ""}});
            self.chunk(json!({"tool_calls": [call]}), Value::Null)
                .await?;
            for piece in pieces(&tool.args, ARGS_DELTA_CHARS) {
                let call = json!({"index": 0, "function": {"arguments": piece}});
                self.chunk(json!({"tool_calls": [call]}), Value::Null)
                    .await?;
            }
        }
        if ending == Ending::CutAfterUsage {
            // The usage chunk, without the finish chunk before it nor `[DONE]` after it.
            self.usage().await?;
            self.sink.cut().await;
            return Ok(());
        }
        let finish = if content.tool.is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        self.chunk(json!({}), json!(finish)).await?;
        self.usage().await?;
        self.done().await
    }
}
