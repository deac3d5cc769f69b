"""Drives Skein's gateway with the official `openai` Python library and prints what it saw as
one JSON object: the Responses API (created streamed and not, in the background and retrieved,
continued with previous_response_id, its stream read again from a sequence number, errors)
and Chat Completions (streamed). The Rust test that runs it asserts on the figures.

usage: openai_check.py BASE_URL API_KEY MODEL
"""

import json
import sys
import time

import openai


def main() -> None:
    base_url, api_key, model = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    seen = {}

    # Created and waited for.
    first = client.responses.create(model=model, input="hello", metadata={"case": "plain"})
    seen["plain"] = {
        "id": first.id,
        "status": first.status,
        "output_text": first.output_text,
        "metadata": first.metadata,
        "total_tokens": first.usage.total_tokens if first.usage else None,
        "item_types": [item.type for item in first.output],
    }

    # Continued: the same session, so the agent sees the earlier input.
    second = client.responses.create(
        model=model, input="and again", previous_response_id=first.id
    )
    seen["continued"] = {"status": second.status, "output_text": second.output_text}

    # Streamed.
    events = list(client.responses.create(model=model, input="streamed", stream=True))
    seen["streamed"] = {
        "types": [event.type for event in events],
        "sequence_numbers": [event.sequence_number for event in events],
        "final_status": events[-1].response.status,
        "final_text": events[-1].response.output_text,
        "deltas": "".join(e.delta for e in events if e.type == "response.output_text.delta"),
    }

    # Its stream read again after its third event.
    streamed_id = events[0].response.id
    again = list(
        client.responses.retrieve(streamed_id, stream=True, starting_after=2)
    )
    seen["resumed"] = {
        "first_sequence_number": again[0].sequence_number,
        "count": len(again),
        "same_as_live": [e.type for e in again] == [e.type for e in events[3:]],
    }

    # In the background, then retrieved until it ends.
    queued = client.responses.create(model=model, input="later", background=True)
    statuses = [queued.status]
    retrieved = queued
    deadline = time.time() + 60
    while retrieved.status in ("queued", "in_progress") and time.time() < deadline:
        time.sleep(0.2)
        retrieved = client.responses.retrieve(queued.id)
        statuses.append(retrieved.status)
    seen["background"] = {
        "statuses": statuses,
        "output_text": retrieved.output_text,
        "background": retrieved.background,
    }

    # Errors the library raises as its own exceptions.
    try:
        client.responses.retrieve("resp_nothing")
        seen["missing"] = "no error"
    except openai.NotFoundError as e:
        seen["missing"] = e.status_code
    try:
        client.responses.create(model="no-such-agent", input="x")
        seen["unknown_model"] = "no error"
    except openai.NotFoundError as e:
        seen["unknown_model"] = e.body.get("code") if isinstance(e.body, dict) else str(e.body)
    try:
        openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0).responses.create(
            model=model, input="x"
        )
        seen["wrong_key"] = "no error"
    except openai.AuthenticationError as e:
        seen["wrong_key"] = e.status_code

    # Chat Completions, streamed, with usage.
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "chat"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    seen["chat"] = {
        "text": "".join(
            c.choices[0].delta.content or "" for c in chunks if c.choices
        ),
        "finish_reason": next(
            (c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason),
            None,
        ),
        "usage": chunks[-1].usage.total_tokens if chunks[-1].usage else None,
    }

    print(json.dumps(seen))


if __name__ == "__main__":
    main()
