//! The mock provider's OpenAI Responses stream: `event: TYPE` + `data: {...}` with a
//! `sequence_number`, ending with `response.completed` (or `response.incomplete`).

use crate::scenario::{Content, Ending, Plan, Shape, Tokens};
use crate::stored::StoredResponses;
use crate::wire::ENCRYPTED;
use crate::wire::{
    loop_thought, pieces, simple_id, unix_now, Gone, Sink, ARGS_DELTA_CHARS, LOOP_EVENTS_MAX,
    TEXT_DELTA_CHARS,
};
use serde_json::{json, Value};

fn responses_usage(t: &Tokens) -> Value {
    let output = t.output.saturating_add(t.reasoning);
    json!({
        "input_tokens": t.input,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": t.reasoning},
        "total_tokens": t.input.saturating_add(output)
    })
}

/// Writes one Responses stream; events carry `type` and `sequence_number`.
struct Responses<'a> {
    plan: &'a Plan,
    sink: &'a Sink,
    id: String,
    created: u64,
    sequence: u64,
    output_index: u64,
    /// Finished output items, for the final response object.
    items: Vec<Value>,
}

impl<'a> Responses<'a> {
    fn new(plan: &'a Plan, sink: &'a Sink) -> Self {
        Self {
            plan,
            sink,
            id: format!("resp_{}", simple_id()),
            created: unix_now(),
            sequence: 0,
            output_index: 0,
            items: Vec::new(),
        }
    }

    async fn emit(&mut self, kind: &str, mut value: Value) -> Result<(), Gone> {
        value["type"] = json!(kind);
        value["sequence_number"] = json!(self.sequence);
        self.sequence = self.sequence.saturating_add(1);
        self.sink.event(kind, &value).await
    }

    fn response(&self, status: &str, usage: Value, incomplete: Value) -> Value {
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.plan.model,
            "output": self.items,
            "incomplete_details": incomplete,
            "usage": usage
        })
    }

    /// The response as the provider keeps it once it finished (no output: no content is kept).
    fn finished(&self) -> Value {
        let usage = responses_usage(&self.plan.tokens);
        match &self.plan.shape {
            Shape::EmptyRefusal => {
                self.response("incomplete", usage, json!({"reason": "content_filter"}))
            }
            Shape::ReasoningLoop | Shape::Hang => {
                self.response("in_progress", Value::Null, Value::Null)
            }
            Shape::PreStream | Shape::Normal(..) => self.response("completed", usage, Value::Null),
        }
    }

    async fn start(&mut self) -> Result<(), Gone> {
        let response = self.response("in_progress", Value::Null, Value::Null);
        self.emit("response.created", json!({ "response": response }))
            .await?;
        let response = self.response("in_progress", Value::Null, Value::Null);
        self.emit("response.in_progress", json!({ "response": response }))
            .await
    }

    async fn run(mut self) -> Result<(), Gone> {
        let plan = self.plan;
        match &plan.shape {
            Shape::PreStream => {
                let response = self.response("in_progress", Value::Null, Value::Null);
                self.emit("response.created", json!({ "response": response }))
                    .await?;
                let response =
                    self.response("completed", responses_usage(&plan.tokens), Value::Null);
                self.emit("response.completed", json!({ "response": response }))
                    .await
            }
            Shape::EmptyRefusal => {
                self.start().await?;
                let response = self.response(
                    "incomplete",
                    responses_usage(&plan.tokens),
                    json!({"reason": "content_filter"}),
                );
                self.emit("response.incomplete", json!({ "response": response }))
                    .await
            }
            Shape::ReasoningLoop => {
                self.start().await?;
                let item_id = self.reasoning_open().await?;
                for n in 0..LOOP_EVENTS_MAX {
                    self.sink.pace().await?;
                    self.emit(
                        "response.reasoning_summary_text.delta",
                        json!({"item_id": item_id, "output_index": 0, "summary_index": 0,
                            "delta": loop_thought(n)}),
                    )
                    .await?;
                }
                self.sink.cut().await;
                Ok(())
            }
            Shape::Hang => Ok(()),
            Shape::Normal(content, ending) => self.normal(content, *ending).await,
        }
    }

    async fn normal(&mut self, content: &Content, ending: Ending) -> Result<(), Gone> {
        self.start().await?;
        if let Some(reasoning) = &content.reasoning {
            self.reasoning(reasoning).await?;
        }
        if !content.text.is_empty() {
            self.text(&content.text, ending).await?;
            if ending == Ending::CutBeforeUsage {
                self.sink.cut().await;
                return Ok(());
            }
        }
        if let Some(tool) = &content.tool {
            self.function_call(&tool.name, &tool.args).await?;
        }
        let response = self.response("completed", responses_usage(&self.plan.tokens), Value::Null);
        self.emit("response.completed", json!({ "response": response }))
            .await?;
        if ending == Ending::CutAfterUsage {
            // Responses carries usage only in its terminal event: the cut comes after it, in
            // place of the clean end of the body.
            self.sink.cut().await;
        }
        Ok(())
    }

    /// Opens a reasoning item and its summary part; returns the item id.
    async fn reasoning_open(&mut self) -> Result<String, Gone> {
        let item_id = format!("rs_{}", simple_id());
        let index = self.output_index;
        self.emit(
            "response.output_item.added",
            json!({"output_index": index,
                "item": {"id": item_id, "type": "reasoning", "summary": []}}),
        )
        .await?;
        self.emit(
            "response.reasoning_summary_part.added",
            json!({"item_id": item_id, "output_index": index, "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}}),
        )
        .await?;
        Ok(item_id)
    }

    async fn reasoning(&mut self, text: &str) -> Result<(), Gone> {
        let item_id = self.reasoning_open().await?;
        let index = self.output_index;
        for piece in pieces(text, TEXT_DELTA_CHARS) {
            self.emit(
                "response.reasoning_summary_text.delta",
                json!({"item_id": item_id, "output_index": index, "summary_index": 0,
                    "delta": piece}),
            )
            .await?;
        }
        self.emit(
            "response.reasoning_summary_text.done",
            json!({"item_id": item_id, "output_index": index, "summary_index": 0, "text": text}),
        )
        .await?;
        let part = json!({"type": "summary_text", "text": text});
        self.emit(
            "response.reasoning_summary_part.done",
            json!({"item_id": item_id, "output_index": index, "summary_index": 0,
                "part": part}),
        )
        .await?;
        let mut item = json!({"id": item_id, "type": "reasoning", "summary": [part]});
        if self.plan.encrypted_reasoning {
            item["encrypted_content"] = json!(ENCRYPTED);
        }
        self.item_done(item).await
    }

    async fn text(&mut self, text: &str, ending: Ending) -> Result<(), Gone> {
        let item_id = format!("msg_{}", simple_id());
        let index = self.output_index;
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": {"id": item_id, "type": "message",
                "status": "in_progress", "role": "assistant", "content": []}}),
        )
        .await?;
        self.emit(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
        )
        .await?;
        for piece in pieces(text, TEXT_DELTA_CHARS) {
            self.emit(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0,
                    "delta": piece, "logprobs": []}),
            )
            .await?;
        }
        if ending == Ending::CutBeforeUsage {
            return Ok(());
        }
        self.emit(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "text": text, "logprobs": []}),
        )
        .await?;
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.emit(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                "part": part}),
        )
        .await?;
        let item = json!({"id": item_id, "type": "message", "status": "completed",
            "role": "assistant", "content": [part]});
        self.item_done(item).await
    }

    async fn function_call(&mut self, name: &str, args: &str) -> Result<(), Gone> {
        let item_id = format!("fc_{}", simple_id());
        let call_id = format!("call_{}", simple_id());
        let index = self.output_index;
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": {"id": item_id, "type": "function_call",
                "status": "in_progress", "call_id": call_id, "name": name, "arguments": ""}}),
        )
        .await?;
        for piece in pieces(args, ARGS_DELTA_CHARS) {
            self.emit(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": piece}),
            )
            .await?;
        }
        self.emit(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "arguments": args}),
        )
        .await?;
        let item = json!({"id": item_id, "type": "function_call", "status": "completed",
            "call_id": call_id, "name": name, "arguments": args});
        self.item_done(item).await
    }

    async fn item_done(&mut self, item: Value) -> Result<(), Gone> {
        let index = self.output_index;
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        )
        .await?;
        self.items.push(item);
        self.output_index = self.output_index.saturating_add(1);
        Ok(())
    }
}

/// Streams `plan` as an OpenAI Responses stream; with `store`, its final response is kept
/// first, so it can be fetched however the stream ends.
pub(super) async fn render(plan: &Plan, sink: &Sink, stored: &StoredResponses) -> Result<(), Gone> {
    let writer = Responses::new(plan, sink);
    if plan.store {
        stored.put(&writer.id, writer.finished());
    }
    writer.run().await
}
