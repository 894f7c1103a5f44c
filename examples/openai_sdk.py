"""The official OpenAI Python SDK against tollgate's OpenAI-compatible front door.

Usage: TOLLGATE_BASE_URL=http://127.0.0.1:8080 TOLLGATE_API_KEY=tg_... \
       target/pyenv/bin/python examples/openai_sdk.py [PROFILE]

PROFILE is a text profile (default "summarize"); TOLLGATE_SLOW_PROFILE names a text profile
whose provider answers after TOLLGATE_SLOW_MS milliseconds (default "slow" and 1500). The SDK
keeps its default retry settings throughout. The script runs a call, replays it, passes the
common fields, lets the SDK's own timeout and retries meet a call still being processed, shows
a reused key with another body and a missing Idempotency-Key, streams a call, and exits
non-zero on any surprise. It prints one JSON line per step (no keys, no content beyond the
echoed demo text).
"""

import json
import os
import sys
import uuid

import openai
from openai import DefaultHttpxClient, OpenAI

# Seconds the slow call outlasts the client's timeout: the SDK's first retry (after 0.375 to
# 0.5 s of backoff) then arrives while the call runs, and its next one (after the 1 s
# Retry-After of the 409) once the call is over.
OUTLASTS_TIMEOUT_S = 0.94


def main() -> int:
    base = os.environ["TOLLGATE_BASE_URL"].rstrip("/")
    key = os.environ["TOLLGATE_API_KEY"]
    profile = sys.argv[1] if len(sys.argv) > 1 else "summarize"
    slow_profile = os.environ.get("TOLLGATE_SLOW_PROFILE", "slow")
    slow_s = int(os.environ.get("TOLLGATE_SLOW_MS", "1500")) / 1000
    run = uuid.uuid4().hex[:8]
    client = OpenAI(base_url=f"{base}/v1", api_key=key)

    def headers(idempotency_key: str) -> dict:
        return {"Idempotency-Key": idempotency_key, "Tollgate-Session": f"sdk-{run}"}

    # 1. A governed call: model names a profile, the Idempotency-Key header is the operation key.
    first = client.chat.completions.create(
        model=profile,
        messages=[{"role": "user", "content": "hello from the sdk"}],
        extra_headers=headers(f"sdk-{run}-1"),
    )
    ext = first.model_extra["tollgate"]
    assert first.object == "chat.completion", first
    assert first.choices[0].message.content == "hello from the sdk", first
    assert first.choices[0].finish_reason == "stop", first
    assert first.usage is not None and first.usage.total_tokens > 0, first
    assert ext["state"] == "completed" and ext["outcome"] == "success", ext
    assert ext["replayed"] is False and ext["receipt"]["amount"], ext
    print(json.dumps({"step": "call", "id": first.id, "receipt": ext["receipt"]["amount"]}))

    # 2. The same key and messages: the stored completion, replayed (nothing is sent again).
    again = client.chat.completions.create(
        model=profile,
        messages=[{"role": "user", "content": "hello from the sdk"}],
        extra_headers=headers(f"sdk-{run}-1"),
    )
    assert again.id == first.id, (again.id, first.id)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.model_extra["tollgate"]["replayed"] is True, again
    print(json.dumps({"step": "replay", "id": again.id}))

    # 3. The fields SDK code passes: within the profile, they narrow the call.
    fields = client.chat.completions.create(
        model=profile,
        messages=[{"role": "user", "content": "common fields"}],
        max_tokens=32,
        temperature=0.2,
        user=f"sdk-user-{run}",
        extra_headers=headers(f"sdk-{run}-fields"),
    )
    assert fields.choices[0].message.content == "common fields", fields
    assert fields.model_extra["tollgate"]["state"] == "completed", fields
    print(json.dumps({"step": "fields", "id": fields.id}))

    # 4. A call that outlasts the client's timeout: the SDK times out, retries with the same
    #    body and key while the call runs (409 in_progress, Retry-After), then gets the stored
    #    completion. The provider is sent the call once.
    attempts, statuses = [], []
    watched = OpenAI(
        base_url=f"{base}/v1",
        api_key=key,
        timeout=slow_s - OUTLASTS_TIMEOUT_S,
        http_client=DefaultHttpxClient(
            event_hooks={
                "request": [lambda request: attempts.append(1)],
                "response": [lambda response: statuses.append(response.status_code)],
            }
        ),
    )
    retried = watched.chat.completions.create(
        model=slow_profile,
        messages=[{"role": "user", "content": "retried words"}],
        extra_headers=headers(f"sdk-{run}-retry"),
    )
    assert retried.choices[0].message.content == "retried words", retried
    assert retried.model_extra["tollgate"]["replayed"] is True, retried
    print(json.dumps({"step": "retry", "attempts": len(attempts), "statuses": statuses}))

    # 5. The same key with other messages: 422 conflict naming what differs; not retried.
    try:
        client.chat.completions.create(
            model=profile,
            messages=[{"role": "user", "content": "something else"}],
            extra_headers=headers(f"sdk-{run}-1"),
        )
        raise AssertionError("a conflicting call was accepted")
    except openai.UnprocessableEntityError as e:
        assert e.status_code == 422
        assert e.code == "conflict", e.body
        assert e.body["fields"] == ["input_revision"], e.body
        print(json.dumps({"step": "conflict", "code": e.code}))

    # 6. Streaming: chat.completion.chunk events emitted after settlement, then [DONE].
    stream = client.chat.completions.create(
        model=profile,
        messages=[{"role": "user", "content": "streamed words"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers(f"sdk-{run}-2"),
    )
    text, finish, usage, state = "", None, None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk", chunk
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
        extra = chunk.model_extra or {}
        if "tollgate" in extra:
            state = extra["tollgate"]["state"]
    assert text == "streamed words", text
    assert finish == "stop" and state == "completed", (finish, state)
    assert usage is not None and usage.total_tokens > 0
    print(json.dumps({"step": "stream", "finish_reason": finish}))

    # 7. No Idempotency-Key: 400 before anything is written.
    try:
        client.chat.completions.create(
            model=profile, messages=[{"role": "user", "content": "no key"}]
        )
        raise AssertionError("a call without an Idempotency-Key was accepted")
    except openai.BadRequestError as e:
        assert e.code == "invalid_request", e.body
        print(json.dumps({"step": "no_key", "code": e.code}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
