"""Drives a task that waits for a person's approval through Skein's gateway with the official
`a2a-sdk` Python library, and prints what it saw as one JSON object. The agent asks before every
`slow_effect` call (its key: the message's text). Seen: a message's task stopping in
`input-required` with the call named; GetTask saying the same; a key without the `approve` role
refused as the answer (the task still waiting); a message that is no answer refused; "approve"
with the task's id going on to the task's end (the tool's observation in the answer); a message
to the ended task refused; "deny" with a reason reaching the model; the same in a stream (the
stream ends at `input-required`, the answer streams the rest); the same in A2A 0.3 over raw
JSON-RPC (`message/send`, `tasks/get`); and the approved task subscribed to again. The Rust test
that runs it asserts on the figures (and on the effects the calls left).

usage: a2a_approval_check.py BASE_URL APPROVER_KEY SUBMIT_ONLY_KEY
"""

import asyncio
import json
import sys

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)

COUNTER = iter(range(1_000_000))


def message(text, context_id=None, task_id=None):
    m = Message(message_id=f"m-{next(COUNTER)}", role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        m.context_id = context_id
    if task_id:
        m.task_id = task_id
    return SendMessageRequest(message=m)


async def sent(client, request):
    """The task a non-streamed message answers with."""
    return [event async for event in client.send_message(request)][-1].task


def described(task):
    """A task's state, its status message and the calls it names, its answer."""
    status = task.status
    text = "".join(p.text for p in status.message.parts) if status.HasField("message") else None
    approvals = []
    if status.HasField("message") and "approvals" in status.message.metadata:
        approvals = [call["tool"] for call in status.message.metadata["approvals"]]
    return {
        "id": task.id,
        "context_id": task.context_id,
        "state": TaskState.Name(status.state),
        "message": text,
        "approval_tools": approvals,
        "answer": task.artifacts[0].parts[0].text if task.artifacts else None,
    }


async def refused(call):
    """The library's error for a refused request: its class and message."""
    try:
        await call
        return "no error"
    except Exception as e:  # the library's own error for the JSON-RPC error code
        return f"{type(e).__name__}: {e}"


def read_stream(events):
    """The kinds of a stream's events, its task ids, text and last state and message."""
    kinds, task_ids, text, last_state, last_message = [], set(), "", None, None
    for event in events:
        kind = event.WhichOneof("payload")
        kinds.append(kind)
        if kind == "task":
            task_ids.add(event.task.id)
        if kind == "artifact_update":
            task_ids.add(event.artifact_update.task_id)
            text += "".join(p.text for p in event.artifact_update.artifact.parts)
        if kind == "status_update":
            task_ids.add(event.status_update.task_id)
            last_state = TaskState.Name(event.status_update.status.state)
            parts = event.status_update.status.message.parts
            last_message = "".join(p.text for p in parts)
    return {
        "kinds": kinds,
        "task_ids": sorted(task_ids),
        "text": text,
        "last_state": last_state,
        "last_message": last_message,
    }


async def rpc(http, url, method, params):
    """One raw JSON-RPC request; its result (or error)."""
    body = {"jsonrpc": "2.0", "id": f"raw-{method}", "method": method, "params": params}
    answer = (await http.post(url, json=body)).json()
    return answer.get("result") or {"error": answer.get("error")}


def v03_message(text, context_id=None, task_id=None):
    m = {
        "kind": "message",
        "messageId": f"m-{next(COUNTER)}",
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
    }
    if context_id:
        m["contextId"] = context_id
    if task_id:
        m["taskId"] = task_id
    return {"message": m}


def v03_described(task):
    status = task.get("status", {})
    return {
        "kind": task.get("kind"),
        "state": status.get("state"),
        "message_part": (status.get("message", {}).get("parts") or [None])[0],
        "answer": (task.get("artifacts") or [{}])[0].get("parts", [{}])[0].get("text"),
        "error": task.get("error"),
    }


async def main() -> None:
    base_url, approver_key, submitter_key = sys.argv[1:4]
    seen = {}
    approver = httpx.AsyncClient(headers={"Authorization": f"Bearer {approver_key}"}, timeout=60)
    submitter = httpx.AsyncClient(headers={"Authorization": f"Bearer {submitter_key}"}, timeout=60)
    async with approver as http, submitter as other:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        url = card.supported_interfaces[0].url
        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        not_approver = ClientFactory(ClientConfig(streaming=False, httpx_client=other)).create(card)

        # The call waits: the task stops in input-required, the call named.
        asked = await sent(client, message("deploy-a"))
        seen["asked"] = described(asked)
        seen["get_waiting"] = described(await client.get_task(GetTaskRequest(id=asked.id)))
        answer_to_a = message("approve", asked.context_id, asked.id)
        seen["not_approver"] = await refused(sent(not_approver, answer_to_a))
        still = await client.get_task(GetTaskRequest(id=asked.id))
        seen["still_waiting"] = TaskState.Name(still.status.state)
        seen["not_an_answer"] = await refused(
            sent(client, message("perhaps later", asked.context_id, asked.id))
        )
        # The answer: the same task goes on to its end.
        seen["approved"] = described(
            await sent(client, message("approve", asked.context_id, asked.id))
        )
        seen["after_end"] = await refused(
            sent(client, message("approve", asked.context_id, asked.id))
        )
        seen["unknown_task"] = await refused(
            sent(client, message("approve", None, "a2a-nothing"))
        )

        # Denied, with a reason the model hears.
        asked_c = await sent(client, message("deploy-c"))
        seen["denied"] = described(
            await sent(
                client, message("deny not on a Friday", asked_c.context_id, asked_c.id)
            )
        )

        # Streamed: the stream ends where the task waits; the answer streams the rest.
        streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        first = read_stream([e async for e in streaming.send_message(message("deploy-b"))])
        seen["streamed_ask"] = first
        task_b = first["task_ids"][0] if first["task_ids"] else None
        seen["streamed_answer"] = read_stream(
            [e async for e in streaming.send_message(message("yes", None, task_b))]
        )

        # A2A 0.3 over raw JSON-RPC: input-required in 0.3's words, answered with message/send.
        asked_d = await rpc(http, url, "message/send", v03_message("deploy-d"))
        seen["v03_asked"] = v03_described(asked_d)
        seen["v03_get"] = v03_described(await rpc(http, url, "tasks/get", {"id": asked_d.get("id")}))
        answer_d = v03_message("approve", asked_d.get("contextId"), asked_d.get("id"))
        seen["v03_approved"] = v03_described(await rpc(http, url, "message/send", answer_d))

        # The approved task read again from its first event: to its end.
        seen["resubscribed"] = read_stream(
            [e async for e in streaming.subscribe(SubscribeToTaskRequest(id=asked.id))]
        )
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main())
