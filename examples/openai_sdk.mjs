// The official OpenAI Node SDK against tollgate's OpenAI-compatible front door.
//
// Usage: npm ci --prefix examples
//        TOLLGATE_BASE_URL=http://127.0.0.1:8080 TOLLGATE_API_KEY=tg_... \
//        node examples/openai_sdk.mjs [PROFILE]
//
// PROFILE is a text profile (default "summarize"). The script runs a call, replays it, streams a
// second call, shows a conflict and a missing Idempotency-Key, and exits non-zero on any
// surprise. It prints one JSON line per step (no keys, no content beyond the echoed demo text).

import { randomUUID } from "node:crypto";
import OpenAI from "openai";

function check(condition, what) {
  if (!condition) {
    throw new Error(`unexpected: ${JSON.stringify(what)}`);
  }
}

async function main() {
  const base = process.env.TOLLGATE_BASE_URL.replace(/\/+$/, "");
  const profile = process.argv[2] ?? "summarize";
  const run = randomUUID().replaceAll("-", "").slice(0, 8);
  const client = new OpenAI({
    baseURL: `${base}/v1`,
    apiKey: process.env.TOLLGATE_API_KEY,
    maxRetries: 0,
  });
  const headers = (key) => ({ headers: { "Idempotency-Key": key, "Tollgate-Session": `sdk-${run}` } });
  const hello = [{ role: "user", content: "hello from the sdk" }];

  // 1. A governed call: model names a profile, the Idempotency-Key header is the operation key.
  const first = await client.chat.completions.create({ model: profile, messages: hello }, headers(`sdk-${run}-1`));
  const ext = first.tollgate;
  check(first.object === "chat.completion", first);
  check(first.choices[0].message.content === "hello from the sdk", first);
  check(first.choices[0].finish_reason === "stop", first);
  check(first.usage && first.usage.total_tokens > 0, first);
  check(ext.state === "completed" && ext.outcome === "success", ext);
  check(ext.replayed === false && ext.receipt.amount, ext);
  console.log(JSON.stringify({ step: "call", id: first.id, receipt: ext.receipt.amount }));

  // 2. The same key and messages: the stored completion, replayed (nothing is sent again).
  const again = await client.chat.completions.create({ model: profile, messages: hello }, headers(`sdk-${run}-1`));
  check(again.id === first.id, [again.id, first.id]);
  check(again.choices[0].message.content === first.choices[0].message.content, again);
  check(again.tollgate.replayed === true, again);
  console.log(JSON.stringify({ step: "replay", id: again.id }));

  // 3. The same key with other messages: a conflict (409), in OpenAI's error shape.
  try {
    await client.chat.completions.create(
      { model: profile, messages: [{ role: "user", content: "something else" }] },
      headers(`sdk-${run}-1`),
    );
    throw new Error("a conflicting call was accepted");
  } catch (e) {
    if (!(e instanceof OpenAI.ConflictError)) throw e;
    check(e.status === 409 && e.code === "conflict", e.error);
    console.log(JSON.stringify({ step: "conflict", code: e.code }));
  }

  // 4. Streaming: chat.completion.chunk events emitted after settlement, then [DONE].
  const stream = await client.chat.completions.create(
    {
      model: profile,
      messages: [{ role: "user", content: "streamed words" }],
      stream: true,
      stream_options: { include_usage: true },
    },
    headers(`sdk-${run}-2`),
  );
  let text = "";
  let finish = null;
  let usage = null;
  let state = null;
  for await (const chunk of stream) {
    check(chunk.object === "chat.completion.chunk", chunk);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? "";
      finish = choice.finish_reason ?? finish;
    }
    if (chunk.tollgate) state = chunk.tollgate.state;
  }
  check(text === "streamed words", text);
  check(finish === "stop" && state === "completed", [finish, state]);
  check(usage && usage.total_tokens > 0, usage);
  console.log(JSON.stringify({ step: "stream", finish_reason: finish }));

  // 5. No Idempotency-Key: 400 before anything is written.
  try {
    await client.chat.completions.create({ model: profile, messages: [{ role: "user", content: "no key" }] });
    throw new Error("a call without an Idempotency-Key was accepted");
  } catch (e) {
    if (!(e instanceof OpenAI.BadRequestError)) throw e;
    check(e.code === "invalid_request", e.error);
    console.log(JSON.stringify({ step: "no_key", code: e.code }));
  }
}

main().catch((e) => {
  console.error(e instanceof Error ? e.message : String(e));
  process.exit(1);
});
