"""Drives Skein's gateway with the official `a2a-sdk` Python library and prints what it saw as one
JSON object: the agent card resolved, a message sent and answered (the task completed with its
answer), the next message in the same context, a streamed message's events, GetTask, a finished
task subscribed to again, and the errors for an unknown task, an unknown method and a wrong key.
Then A2A 0.3, which the gateway also speaks: raw JSON-RPC requests under 0.3's names
(`message/send`, `tasks/get`, `tasks/resubscribe`) and what 0.3's shapes say, and the library's
own 0.3 transport (`CompatJsonRpcTransport`) sending, streaming and reading tasks. The Rust test
that runs it asserts on the figures.

usage: a2a_check.py BASE_URL API_KEY
"""

import asyncio
import json
import sys

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)


def message(text, context_id=None):
    m = Message(message_id=f"m-{abs(hash(text))}", role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        m.context_id = context_id
    return SendMessageRequest(message=m)


def read_stream(events):
    """The kinds of a stream's events, its text and its last state (1.0 client objects)."""
    kinds, text, last_state = [], "", None
    for event in events:
        kind = event.WhichOneof("payload")
        kinds.append(kind)
        if kind == "artifact_update":
            text += "".join(p.text for p in event.artifact_update.artifact.parts)
        if kind == "status_update":
            last_state = TaskState.Name(event.status_update.status.state)
    return {"kinds": kinds, "text": text, "last_state": last_state}


async def rpc(http, url, method, params):
    """One raw JSON-RPC request; its whole answer."""
    body = {"jsonrpc": "2.0", "id": f"raw-{method}", "method": method, "params": params}
    return (await http.post(url, json=body)).json()


async def rpc_stream(http, url, method, params):
    """One raw JSON-RPC request answered with SSE; the results of its events."""
    body = {"jsonrpc": "2.0", "id": f"raw-{method}", "method": method, "params": params}
    results = []
    async with http.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                results.append(json.loads(line[len("data:"):])["result"])
    return results


async def main() -> None:
    base_url, api_key = sys.argv[1:3]
    seen = {}
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        seen["card"] = {
            "name": card.name,
            "skills": [skill.id for skill in card.skills],
            "streaming": card.capabilities.streaming,
            "versions": [i.protocol_version for i in card.supported_interfaces],
        }
        url = card.supported_interfaces[0].url

        # Not streamed: the task comes back ended.
        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        answers = [event async for event in client.send_message(message("hello"))]
        task = answers[-1].task
        seen["sent"] = {
            "state": TaskState.Name(task.status.state),
            "answer": task.artifacts[0].parts[0].text if task.artifacts else None,
            "context_id": task.context_id,
            "task_id": task.id,
        }
        again = [e async for e in client.send_message(message("and again", task.context_id))]
        seen["same_context"] = {
            "answer": again[-1].task.artifacts[0].parts[0].text,
            "context_id": again[-1].task.context_id,
        }
        fetched = await client.get_task(GetTaskRequest(id=task.id))
        seen["get_task"] = {
            "state": TaskState.Name(fetched.status.state),
            "answer": fetched.artifacts[0].parts[0].text if fetched.artifacts else None,
        }
        try:
            await client.get_task(GetTaskRequest(id="a2a-nothing"))
            seen["missing"] = "no error"
        except Exception as e:  # the library's own error for TaskNotFound
            seen["missing"] = type(e).__name__

        # Streamed: the task, then its updates, to the final state.
        streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        seen["streamed"] = read_stream(
            [event async for event in streaming.send_message(message("streamed"))]
        )
        # Subscribed to again once finished: its events replayed from the first, to its end.
        seen["resubscribed"] = read_stream(
            [event async for event in streaming.subscribe(SubscribeToTaskRequest(id=task.id))]
        )

        # A2A 0.3, raw: the task itself (`kind: task`), states and roles in 0.3's words.
        old = {
            "kind": "message",
            "messageId": "m-old",
            "role": "user",
            "parts": [{"kind": "text", "text": "old style"}],
        }
        sent = await rpc(http, url, "message/send", {"message": old})
        result = sent.get("result", {})
        seen["v03_send"] = {
            "kind": result.get("kind"),
            "state": result.get("status", {}).get("state"),
            "message_role": result.get("status", {}).get("message", {}).get("role"),
            "message_kind": result.get("status", {}).get("message", {}).get("kind"),
            "part": (result.get("artifacts") or [{}])[0].get("parts", [None])[0],
            "wrapped_as_1_0": "task" in result,
            "error": sent.get("error"),
        }
        got = (await rpc(http, url, "tasks/get", {"id": result.get("id")})).get("result", {})
        seen["v03_get"] = {"kind": got.get("kind"), "state": got.get("status", {}).get("state")}
        replayed = await rpc_stream(http, url, "tasks/resubscribe", {"id": result.get("id")})
        seen["v03_resubscribe"] = {
            "kinds": [r.get("kind") for r in replayed],
            "finals": [r.get("final") for r in replayed if r.get("kind") == "status-update"],
            "last_state": replayed[-1].get("status", {}).get("state") if replayed else None,
            "text": "".join(
                p.get("text", "") for r in replayed if r.get("kind") == "artifact-update"
                for p in r["artifact"]["parts"]
            ),
        }
        missing = await rpc(http, url, "tasks/get", {"id": "a2a-nothing"})
        seen["v03_missing"] = missing.get("error", {}).get("code")
        unknown = await rpc(http, url, "tasks/list", {})
        seen["unknown_method"] = unknown.get("error", {}).get("code")

        # A2A 0.3 through the library's own 0.3 transport: it parses 0.3's shapes.
        compat = CompatJsonRpcTransport(http, card, url)
        answered = (await compat.send_message(message("through 0.3"))).task
        fetched_v03 = await compat.get_task(GetTaskRequest(id=answered.id))
        seen["v03_library"] = {
            "state": TaskState.Name(answered.status.state),
            "answer": answered.artifacts[0].parts[0].text if answered.artifacts else None,
            "get_state": TaskState.Name(fetched_v03.status.state),
            "streamed": read_stream(
                [e async for e in compat.send_message_streaming(message("streamed 0.3"))]
            ),
            "resubscribed": read_stream(
                [e async for e in compat.subscribe(SubscribeToTaskRequest(id=answered.id))]
            ),
        }

    async with httpx.AsyncClient(headers={"Authorization": "Bearer sk-wrong"}) as wrong:
        try:
            client = ClientFactory(ClientConfig(streaming=False, httpx_client=wrong)).create(card)
            [e async for e in client.send_message(message("x"))]
            seen["wrong_key"] = "no error"
        except Exception as e:
            seen["wrong_key"] = str(e)[:200]
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main())
