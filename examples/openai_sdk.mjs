// The official OpenAI Node SDK against tollgate's OpenAI-compatible front door.
//
// Usage: npm ci --prefix examples
//        TOLLGATE_BASE_URL=http://127.0.0.1:8080 TOLLGATE_API_KEY=tg_... \
//        node examples/openai_sdk.mjs [PROFILE]
//
// PROFILE is a text profile (default "summarize"); TOLLGATE_SLOW_PROFILE names a text profile
// whose provider answers after TOLLGATE_SLOW_MS milliseconds (default "slow" and 1500). The SDK
// keeps its default retry settings throughout. The script runs a call, replays it, passes the
// common fields, lets the SDK's own timeout and retries meet a call still being processed, shows
// a reused key with another body and a missing Idempotency-Key, streams a call, and exits
// non-zero on any surprise. It prints one JSON line per step (no keys, no content beyond the
// echoed demo text).

import { randomUUID } from "node:crypto";
import OpenAI from "openai";

// Milliseconds the slow call outlasts the client's timeout: the SDK's first retry (after 375 to
// 500 ms of backoff) then arrives while the call runs, and its next one (after the 1 s
// Retry-After of the 409) once the call is over.
const OUTLASTS_TIMEOUT_MS = 940;

function check(condition, what) {
  if (!condition) {
    throw new Error(`unexpected: ${JSON.stringify(what)}`);
  }
}

async function main() {
  const base = process.env.TOLLGATE_BASE_URL.replace(/\/+$/, "");
  const profile = process.argv[2] ?? "summarize";
  const slowProfile = process.env.TOLLGATE_SLOW_PROFILE ?? "slow";
  const slowMs = Number(process.env.TOLLGATE_SLOW_MS ?? "1500");
  const run = randomUUID().replaceAll("-", "").slice(0, 8);
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: process.env.TOLLGATE_API_KEY });
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

  // 3. The fields SDK code passes: within the profile, they narrow the call.
  const fields = await client.chat.completions.create(
    {
      model: profile,
      messages: [{ role: "user", content: "common fields" }],
      max_tokens: 32,
      temperature: 0.2,
      user: `sdk-user-${run}`,
    },
    headers(`sdk-${run}-fields`),
  );
  check(fields.choices[0].message.content === "common fields", fields);
  check(fields.tollgate.state === "completed", fields);
  console.log(JSON.stringify({ step: "fields", id: fields.id }));

  // 4. A call that outlasts the client's timeout: the SDK times out, retries with the same body
  //    and key while the call runs (409 in_progress, Retry-After), then gets the stored
  //    completion. The provider is sent the call once.
  let attempts = 0;
  const statuses = [];
  const watched = new OpenAI({
    baseURL: `${base}/v1`,
    apiKey: process.env.TOLLGATE_API_KEY,
    timeout: slowMs - OUTLASTS_TIMEOUT_MS,
    fetch: async (url, init) => {
      attempts += 1;
      const response = await fetch(url, init);
      statuses.push(response.status);
      return response;
    },
  });
  const retried = await watched.chat.completions.create(
    { model: slowProfile, messages: [{ role: "user", content: "retried words" }] },
    headers(`sdk-${run}-retry`),
  );
  check(retried.choices[0].message.content === "retried words", retried);
  check(retried.tollgate.replayed === true, retried);
  console.log(JSON.stringify({ step: "retry", attempts, statuses }));

  // 5. The same key with other messages: 422 conflict naming what differs; not retried.
  try {
    await client.chat.completions.create(
      { model: profile, messages: [{ role: "user", content: "something else" }] },
      headers(`sdk-${run}-1`),
    );
    throw new Error("a conflicting call was accepted");
  } catch (e) {
    if (!(e instanceof OpenAI.UnprocessableEntityError)) throw e;
    check(e.status === 422 && e.code === "conflict", e.error);
    check(JSON.stringify(e.error.fields) === JSON.stringify(["input_revision"]), e.error);
    console.log(JSON.stringify({ step: "conflict", code: e.code }));
  }

  // 6. Streaming: chat.completion.chunk events emitted after settlement, then [DONE].
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

  // 7. No Idempotency-Key: 400 before anything is written.
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
