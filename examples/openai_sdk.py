"""The official OpenAI Python SDK against tollgate's OpenAI-compatible front door.

Usage: TOLLGATE_BASE_URL=http://127.0.0.1:8080 TOLLGATE_API_KEY=tg_... \
       target/pyenv/bin/python examples/openai_sdk.py [PROFILE]

PROFILE is a text profile (default "summarize"). The script runs a call, replays it, streams a
second call, shows a conflict and a missing Idempotency-Key, and exits non-zero on any surprise.
It prints one JSON line per step (no keys, no content beyond the echoed demo text).
"""

import json
import os
import sys
import uuid

import openai
from openai import OpenAI


def main() -> int:
    base = os.environ["TOLLGATE_BASE_URL"].rstrip("/")
    profile = sys.argv[1] if len(sys.argv) > 1 else "summarize"
    run = uuid.uuid4().hex[:8]
    client = OpenAI(base_url=f"{base}/v1", api_key=os.environ["TOLLGATE_API_KEY"], max_retries=0)

    def headers(key: str) -> dict:
        return {"Idempotency-Key": key, "Tollgate-Session": f"sdk-{run}"}

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

    # 3. The same key with other messages: a conflict (409), in OpenAI's error shape.
    try:
        client.chat.completions.create(
            model=profile,
            messages=[{"role": "user", "content": "something else"}],
            extra_headers=headers(f"sdk-{run}-1"),
        )
        raise AssertionError("a conflicting call was accepted")
    except openai.ConflictError as e:
        assert e.status_code == 409
        assert e.code == "conflict", e.body
        print(json.dumps({"step": "conflict", "code": e.code}))

    # 4. Streaming: chat.completion.chunk events emitted after settlement, then [DONE].
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

    # 5. No Idempotency-Key: 400 before anything is written.
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
