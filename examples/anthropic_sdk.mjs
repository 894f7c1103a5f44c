// The official Anthropic TypeScript SDK (@anthropic-ai/sdk) against tollgate's Anthropic
// Messages door.
//
// Usage: npm ci --prefix examples
//        TOLLGATE_BASE_URL=http://127.0.0.1:8080 TOLLGATE_API_KEY=tg_... \
//        node examples/anthropic_sdk.mjs [TEXT [SLOW [STEP]]]
//
// TEXT is a text profile (default "summarize"), SLOW a text profile whose calls take longer than
// half a second (default "slow"), STEP a step profile with tools (default "agent-step"). The
// script runs a call, replays it, retries a slow call under the SDK's own timeout and retries,
// shows a conflict, streams a call, runs a step that calls a tool, authenticates with
// `x-api-key`, and shows a missing Idempotency-Key and a missing key; it exits non-zero on any
// surprise. It prints one JSON line per step (no keys, no content beyond the echoed demo text).
//
// The SDK sends no idempotency key of its own, so every call passes `Idempotency-Key` (the
// operation key) in the request options' `headers`; the SDK's retries resend the same headers.

import { randomUUID } from "node:crypto";
import Anthropic from "@anthropic-ai/sdk";

function check(condition, what) {
  if (!condition) {
    throw new Error(`unexpected: ${JSON.stringify(what)}`);
  }
}

async function main() {
  const base = process.env.TOLLGATE_BASE_URL.replace(/\/+$/, "");
  const key = process.env.TOLLGATE_API_KEY;
  const [text = "summarize", slow = "slow", step = "agent-step"] = process.argv.slice(2);
  const run = randomUUID().replaceAll("-", "").slice(0, 8);
  // A plain request to tollgate's own API (profiles, roots).
  const tollgate = async (method, path, body) => {
    const response = await fetch(`${base}${path}`, {
      method,
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    check(response.ok, [method, path, response.status]);
    return response.json();
  };
  const profiles = Object.fromEntries((await tollgate("GET", "/v1/profiles")).profiles.map((p) => [p.name, p]));
  // The base URL is tollgate's: the SDK adds /v1/messages. No retries here: each step shows what
  // one answer is; the retry step below uses the SDK's defaults.
  const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
  const headers = (op, more = {}) => ({ headers: { "Idempotency-Key": op, "Tollgate-Session": `sdk-${run}`, ...more } });
  const hello = [{ role: "user", content: "hello from the sdk" }];
  const maxTokens = profiles[text].max_tokens;
  // What ordinary SDK code passes narrows the profile's call: a lower max_tokens (a lower hold),
  // a temperature the profile leaves open and the end user (recorded with the call). All are
  // part of what the key is bound to.
  const call = {
    model: text,
    max_tokens: Math.min(32, maxTokens),
    temperature: 0.5,
    metadata: { user_id: `sdk-user-${run}` },
    messages: hello,
  };

  // 1. A governed call: model names a profile, Idempotency-Key is the operation key.
  const first = await client.messages.create(call, headers(`sdk-${run}-1`));
  const ext = first.tollgate;
  const usage = ext.receipt.usage;
  check(first.type === "message" && first.role === "assistant", first);
  check(first.content[0].type === "text" && first.content[0].text === "hello from the sdk", first);
  check(first.stop_reason === "end_turn" && first.stop_sequence === null, first);
  check(first.usage.input_tokens === usage.input && usage.input > 0, [first.usage, usage]);
  check(first.usage.output_tokens === usage.output + usage.reasoning && usage.output > 0, first.usage);
  check(first.usage.cache_read_input_tokens === usage.cache_read, first.usage);
  check(first.usage.cache_creation_input_tokens === usage.cache_write, first.usage);
  check(ext.state === "completed" && ext.outcome === "success", ext);
  check(ext.replayed === false && ext.receipt.amount, ext);
  console.log(JSON.stringify({ step: "call", id: first.id, receipt: ext.receipt.amount }));

  // 2. The same key and body: the stored message, replayed (nothing is sent again).
  const again = await client.messages.create(call, headers(`sdk-${run}-1`));
  check(again.id === first.id, [again.id, first.id]);
  check(JSON.stringify(again.content) === JSON.stringify(first.content), again);
  check(again.tollgate.replayed === true, again);
  console.log(JSON.stringify({ step: "replay", id: again.id }));

  // 3. A call slower than the SDK's timeout, with the SDK's default retries: its retry carries
  //    the same Idempotency-Key, finds the call still running (409 in_progress, Retry-After),
  //    waits, and gets the stored message. The provider is sent the call once.
  const statuses = [];
  const patient = new Anthropic({
    baseURL: base,
    apiKey: key,
    timeout: 500,
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      statuses.push(response.status);
      return response;
    },
  });
  const answered = await patient.messages.create(
    { model: slow, max_tokens: profiles[slow].max_tokens, messages: [{ role: "user", content: "slow words" }] },
    headers(`sdk-${run}-slow`),
  );
  check(answered.tollgate.state === "completed" && answered.tollgate.replayed === true, answered.tollgate);
  check(answered.content[0].text === "slow words", answered);
  console.log(JSON.stringify({ step: "retry", statuses, replayed: answered.tollgate.replayed }));

  // 4. The same key with other messages: refused in Anthropic's shape, and marked not to be
  //    retried (x-should-retry: false), so the SDK's default retries do not resend it.
  const retrying = new Anthropic({ baseURL: base, apiKey: key });
  try {
    await retrying.messages.create({ ...call, messages: [{ role: "user", content: "something else" }] }, headers(`sdk-${run}-1`));
    throw new Error("a conflicting call was accepted");
  } catch (e) {
    if (!(e instanceof Anthropic.APIError) || e.status === undefined) throw e;
    check(e.headers.get("x-should-retry") === "false", [...e.headers]);
    check(e.error.type === "error" && e.error.error.message, e.error);
    console.log(JSON.stringify({ step: "conflict", status: e.status, type: e.error.error.type, code: e.error.error.code }));
  }

  // 5. Streaming: Anthropic's events, emitted after settlement, with the real usage.
  const streamedCall = { model: text, max_tokens: maxTokens, messages: [{ role: "user", content: "streamed words" }] };
  const events = await client.messages.create({ ...streamedCall, stream: true }, headers(`sdk-${run}-2`));
  const kinds = [];
  let streamed = "";
  let startUsage = null;
  let deltaUsage = null;
  let stopReason = null;
  let receipt = null;
  for await (const event of events) {
    kinds.push(event.type);
    if (event.type === "message_start") startUsage = event.message.usage;
    if (event.type === "content_block_delta") streamed += event.delta.text;
    if (event.type === "message_delta") {
      deltaUsage = event.usage;
      stopReason = event.delta.stop_reason;
      receipt = event.tollgate.receipt;
    }
  }
  check(kinds[0] === "message_start" && kinds[kinds.length - 1] === "message_stop", kinds);
  check(streamed === "streamed words" && stopReason === "end_turn", [streamed, stopReason]);
  // The SDK's stream helper accumulates the same events into the message (here the stored
  // stream, replayed).
  const final = await client.messages.stream(streamedCall, headers(`sdk-${run}-2`)).finalMessage();
  check(final.content[0].text === "streamed words" && final.stop_reason === "end_turn", final);
  check(final.usage.input_tokens === startUsage.input_tokens, final.usage);
  check(final.usage.output_tokens === deltaUsage.output_tokens, final.usage);
  console.log(
    JSON.stringify({
      step: "stream",
      events: kinds,
      input_tokens: startUsage.input_tokens,
      output_tokens: deltaUsage.output_tokens,
      receipt_input: receipt.usage.input,
      receipt_output: receipt.usage.output + receipt.usage.reasoning,
    }),
  );

  // 6. A step profile's tool call is a tool_use block; its result goes back as a tool_result.
  //    The tools sent are exactly the profile's (the profile fixes them).
  const root = `sdk-${run}-root`;
  await tollgate("POST", "/v1/roots", {
    root_key: root,
    profile: step,
    session_id: `sdk-${run}`,
    intent: "agent",
    input_revision: "r-1",
    deadline_ms: 60000,
  });
  const tools = profiles[step].tools.map((t) => ({
    name: t.name,
    input_schema: t.input_schema,
    ...(t.description ? { description: t.description } : {}),
  }));
  const asked = [{ role: "user", content: "Paris" }];
  const stepMax = profiles[step].max_tokens;
  const called = await client.messages.create(
    { model: step, max_tokens: stepMax, tools, messages: asked },
    headers(`sdk-${run}-step-1`, { "Tollgate-Root": root }),
  );
  const use = called.content.filter((b) => b.type === "tool_use");
  check(called.stop_reason === "tool_use" && use.length === 1, called);
  check(typeof use[0].input === "object", use);
  const next = await client.messages.create(
    {
      model: step,
      max_tokens: stepMax,
      tools,
      messages: [
        ...asked,
        { role: "assistant", content: use.map((b) => ({ type: "tool_use", id: b.id, name: b.name, input: b.input })) },
        { role: "user", content: [{ type: "tool_result", tool_use_id: use[0].id, content: "stored" }] },
      ],
    },
    headers(`sdk-${run}-step-2`, { "Tollgate-Root": root }),
  );
  check(next.tollgate.state === "completed", next);
  console.log(JSON.stringify({ step: "tools", name: use[0].name, stop_reason: called.stop_reason }));

  // 7. The key in x-api-key (the header Anthropic's API takes) instead of Authorization (which
  //    this SDK sends the key in, and is left out here).
  const keyed = new Anthropic({
    baseURL: base,
    apiKey: key,
    maxRetries: 0,
    defaultHeaders: { Authorization: null, "x-api-key": key },
  });
  const byHeader = await keyed.messages.create(call, headers(`sdk-${run}-1`));
  check(byHeader.id === first.id && byHeader.tollgate.replayed === true, byHeader);
  console.log(JSON.stringify({ step: "x_api_key", id: byHeader.id }));

  // 8. No Idempotency-Key: 400 before anything is written.
  try {
    await client.messages.create(call);
    throw new Error("a call without an Idempotency-Key was accepted");
  } catch (e) {
    if (!(e instanceof Anthropic.BadRequestError)) throw e;
    check(e.error.error.type === "invalid_request_error", e.error);
    console.log(JSON.stringify({ step: "no_idempotency_key", code: e.error.error.code }));
  }

  // 9. No API key: 401 in Anthropic's shape, before the body is read.
  const keyless = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, defaultHeaders: { Authorization: null } });
  try {
    await keyless.messages.create(call, headers(`sdk-${run}-3`));
    throw new Error("a call without a key was accepted");
  } catch (e) {
    if (!(e instanceof Anthropic.AuthenticationError)) throw e;
    check(e.error.error.type === "authentication_error", e.error);
    console.log(JSON.stringify({ step: "no_key", status: e.status, code: e.error.error.code }));
  }
}

main().catch((e) => {
  console.error(e instanceof Error ? e.message : String(e));
  process.exit(1);
});
