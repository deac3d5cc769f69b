"""Drives Skein's gateway with the official `a2a-sdk` Python library and prints what it saw as one
JSON object: the agent card resolved, a message sent and answered (the task completed with its
answer), the next message in the same context, a streamed message's events, GetTask, and the
errors for an unknown task and a wrong key. The Rust test that runs it asserts on the figures.

usage: a2a_check.py BASE_URL API_KEY
"""

import asyncio
import json
import sys

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState


def message(text, context_id=None):
    m = Message(message_id=f"m-{abs(hash(text))}", role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        m.context_id = context_id
    return SendMessageRequest(message=m)


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
        }

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
        kinds, text, last_state = [], "", None
        async for event in streaming.send_message(message("streamed")):
            kind = event.WhichOneof("payload")
            kinds.append(kind)
            if kind == "artifact_update":
                text += "".join(p.text for p in event.artifact_update.artifact.parts)
            if kind == "status_update":
                last_state = TaskState.Name(event.status_update.status.state)
        seen["streamed"] = {"kinds": kinds, "text": text, "last_state": last_state}

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
