"""The official Anthropic Python SDK against tollgate's Anthropic Messages door.

Usage: TOLLGATE_BASE_URL=http://127.0.0.1:8080 TOLLGATE_API_KEY=tg_... \
       target/pyenv/bin/python examples/anthropic_sdk.py [TEXT [SLOW [STEP]]]

TEXT is a text profile (default "summarize"), SLOW a text profile whose calls take longer than
half a second (default "slow"), STEP a step profile with tools (default "agent-step"). The script
runs a call, replays it, retries a slow call under the SDK's own timeout and retries, shows a
conflict, streams a call, runs a step that calls a tool, authenticates with `x-api-key`, and
shows a missing Idempotency-Key and a missing key; it exits non-zero on any surprise. It prints
one JSON line per step (no keys, no content beyond the echoed demo text).

The SDK sends no idempotency key of its own, so every call passes `Idempotency-Key` (the
operation key) through `extra_headers`; the SDK's retries resend the same headers.
"""

import json
import os
import sys
import urllib.request
import uuid

import anthropic
from anthropic import Anthropic


def tollgate(base: str, key: str, method: str, path: str, body=None):
    """A plain request to tollgate's own API (profiles, roots)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read())


def main() -> int:
    base = os.environ["TOLLGATE_BASE_URL"].rstrip("/")
    key = os.environ["TOLLGATE_API_KEY"]
    args = sys.argv[1:]
    text, slow, step = (args + ["summarize", "slow", "agent-step"][len(args):])[:3]
    run = uuid.uuid4().hex[:8]
    profiles = {p["name"]: p for p in tollgate(base, key, "GET", "/v1/profiles")["profiles"]}
    # The base URL is tollgate's: the SDK adds /v1/messages. No retries here: each step shows
    # what one answer is; the retry step below uses the SDK's defaults.
    client = Anthropic(base_url=base, api_key=key, max_retries=0)

    def headers(op: str, **more: str) -> dict:
        return {"Idempotency-Key": op, "Tollgate-Session": f"sdk-{run}", **more}

    hello = [{"role": "user", "content": "hello from the sdk"}]
    max_tokens = profiles[text]["max_tokens"]
    # What ordinary SDK code passes narrows the profile's call: a lower max_tokens (a lower
    # hold), a temperature the profile leaves open (this SDK's create() takes it as an extra
    # body field) and the end user (recorded with the call). All are part of what the key is
    # bound to.
    call = {
        "model": text,
        "max_tokens": min(32, max_tokens),
        "metadata": {"user_id": f"sdk-user-{run}"},
        "extra_body": {"temperature": 0.5},
        "messages": hello,
    }

    # 1. A governed call: model names a profile, Idempotency-Key is the operation key.
    first = client.messages.create(**call, extra_headers=headers(f"sdk-{run}-1"))
    ext = first.model_extra["tollgate"]
    usage = ext["receipt"]["usage"]
    assert first.type == "message" and first.role == "assistant", first
    assert first.content[0].type == "text", first
    assert first.content[0].text == "hello from the sdk", first
    assert first.stop_reason == "end_turn" and first.stop_sequence is None, first
    assert first.usage.input_tokens == usage["input"] > 0, (first.usage, usage)
    assert first.usage.output_tokens == usage["output"] + usage["reasoning"] > 0, first.usage
    assert first.usage.cache_read_input_tokens == usage["cache_read"], first.usage
    assert first.usage.cache_creation_input_tokens == usage["cache_write"], first.usage
    assert ext["state"] == "completed" and ext["outcome"] == "success", ext
    assert ext["replayed"] is False and ext["receipt"]["amount"], ext
    print(json.dumps({"step": "call", "id": first.id, "receipt": ext["receipt"]["amount"]}))

    # 2. The same key and messages: the stored message, replayed (nothing is sent again).
    again = client.messages.create(**call, extra_headers=headers(f"sdk-{run}-1"))
    assert again.id == first.id, (again.id, first.id)
    assert again.content == first.content
    assert again.model_extra["tollgate"]["replayed"] is True, again
    print(json.dumps({"step": "replay", "id": again.id}))

    # 3. A call slower than the SDK's timeout, with the SDK's default retries: its retry carries
    #    the same Idempotency-Key, finds the call still running (409 in_progress, Retry-After),
    #    waits, and gets the stored message. The provider is sent the call once.
    statuses = []
    watched = anthropic.DefaultHttpxClient(
        event_hooks={"response": [lambda response: statuses.append(response.status_code)]}
    )
    patient = Anthropic(base_url=base, api_key=key, timeout=0.5, http_client=watched)
    slow_op = f"sdk-{run}-slow"
    slow_words = [{"role": "user", "content": "slow words"}]
    answered = patient.messages.create(
        model=slow,
        max_tokens=profiles[slow]["max_tokens"],
        messages=slow_words,
        extra_headers=headers(slow_op),
    )
    sdk = answered.model_extra["tollgate"]
    assert sdk["state"] == "completed" and sdk["replayed"] is True, sdk
    assert answered.content[0].text == "slow words", answered
    print(json.dumps({"step": "retry", "statuses": statuses, "replayed": sdk["replayed"]}))

    # 4. The same key with other messages: refused in Anthropic's shape, and marked not to be
    #    retried (x-should-retry: false), so the SDK's default retries do not resend it.
    retrying = Anthropic(base_url=base, api_key=key)
    try:
        retrying.messages.create(
            **(call | {"messages": [{"role": "user", "content": "something else"}]}),
            extra_headers=headers(f"sdk-{run}-1"),
        )
        raise AssertionError("a conflicting call was accepted")
    except anthropic.APIStatusError as e:
        assert e.response.headers.get("x-should-retry") == "false", e.response.headers
        error = e.body["error"]
        assert e.body["type"] == "error" and error["message"], e.body
        print(
            json.dumps(
                {"step": "conflict", "status": e.status_code, "type": e.type, "code": error["code"]}
            )
        )

    # 5. Streaming: Anthropic's events, emitted after settlement, with the real usage.
    streamed_call = {
        "model": text,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "streamed words"}],
    }
    events = client.messages.create(**streamed_call, stream=True, extra_headers=headers(f"sdk-{run}-2"))
    kinds, streamed, start_usage, delta_usage, stop_reason, receipt = [], "", None, None, None, None
    for event in events:
        kinds.append(event.type)
        if event.type == "message_start":
            start_usage = event.message.usage
        elif event.type == "content_block_delta":
            streamed += event.delta.text
        elif event.type == "message_delta":
            delta_usage, stop_reason = event.usage, event.delta.stop_reason
            receipt = event.model_extra["tollgate"]["receipt"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert streamed == "streamed words" and stop_reason == "end_turn", (streamed, stop_reason)
    # The SDK's stream helper accumulates the same events into the message (here the stored
    # stream, replayed).
    with client.messages.stream(**streamed_call, extra_headers=headers(f"sdk-{run}-2")) as helper:
        final = helper.get_final_message()
    assert final.content[0].text == "streamed words" and final.stop_reason == "end_turn", final
    assert final.usage.input_tokens == start_usage.input_tokens, final.usage
    assert final.usage.output_tokens == delta_usage.output_tokens, final.usage
    print(
        json.dumps(
            {
                "step": "stream",
                "events": kinds,
                "input_tokens": start_usage.input_tokens,
                "output_tokens": delta_usage.output_tokens,
                "receipt_input": receipt["usage"]["input"],
                "receipt_output": receipt["usage"]["output"] + receipt["usage"]["reasoning"],
            }
        )
    )

    # 6. A step profile's tool call is a tool_use block; its result goes back as a tool_result.
    #    The tools sent are exactly the profile's (the profile fixes them).
    root = f"sdk-{run}-root"
    tollgate(
        base,
        key,
        "POST",
        "/v1/roots",
        {"root_key": root, "profile": step, "session_id": f"sdk-{run}", "intent": "agent",
         "input_revision": "r-1", "deadline_ms": 60000},
    )
    tools = [
        {"name": t["name"], "input_schema": t["input_schema"]}
        | ({"description": t["description"]} if t["description"] else {})
        for t in profiles[step]["tools"]
    ]
    asked = [{"role": "user", "content": "Paris"}]
    called = client.messages.create(
        model=step,
        max_tokens=profiles[step]["max_tokens"],
        tools=tools,
        messages=asked,
        extra_headers=headers(f"sdk-{run}-step-1", **{"Tollgate-Root": root}),
    )
    use = [b for b in called.content if b.type == "tool_use"]
    assert called.stop_reason == "tool_use" and len(use) == 1, called
    assert isinstance(use[0].input, dict), use
    answered_tool = client.messages.create(
        model=step,
        max_tokens=profiles[step]["max_tokens"],
        tools=tools,
        messages=asked
        + [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in use]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use[0].id, "content": "stored"}]},
        ],
        extra_headers=headers(f"sdk-{run}-step-2", **{"Tollgate-Root": root}),
    )
    assert answered_tool.model_extra["tollgate"]["state"] == "completed", answered_tool
    print(json.dumps({"step": "tools", "name": use[0].name, "stop_reason": called.stop_reason}))

    # 7. The key in x-api-key (the header Anthropic's API takes) instead of Authorization (which
    #    this SDK sends the key in, and is left out here).
    keyed = Anthropic(base_url=base, api_key=key, max_retries=0,
                      default_headers={"Authorization": anthropic.omit, "x-api-key": key})
    by_header = keyed.messages.create(**call, extra_headers=headers(f"sdk-{run}-1"))
    assert by_header.id == first.id and by_header.model_extra["tollgate"]["replayed"] is True
    print(json.dumps({"step": "x_api_key", "id": by_header.id}))

    # 8. No Idempotency-Key: 400 before anything is written.
    try:
        client.messages.create(model=text, max_tokens=max_tokens, messages=hello)
        raise AssertionError("a call without an Idempotency-Key was accepted")
    except anthropic.BadRequestError as e:
        assert e.type == "invalid_request_error", e.body
        print(json.dumps({"step": "no_idempotency_key", "code": e.body["error"]["code"]}))

    # 9. No API key: 401 in Anthropic's shape, before the body is read.
    keyless = Anthropic(base_url=base, api_key=key, max_retries=0,
                        default_headers={"Authorization": anthropic.omit})
    try:
        keyless.messages.create(
            model=text, max_tokens=max_tokens, messages=hello, extra_headers=headers(f"sdk-{run}-3")
        )
        raise AssertionError("a call without a key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.type == "authentication_error", e.body
        print(json.dumps({"step": "no_key", "status": e.status_code, "code": e.body["error"]["code"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
