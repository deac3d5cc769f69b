"""Drives Skein's gateway with the official `langgraph-sdk` Python client and prints what it saw as
one JSON object: the assistants, a thread made, a streamed run (values, messages-tuple, updates)
and the same stream rejoined after a Last-Event-ID, a waited run stopped at an interrupt (a call
waiting for approval), its resume refused to a key that may not approve and accepted with a
`Command` from one that may, the runs listed, a background run joined and cancelled, a stateless
streamed run, the thread's history, a copy, search and removal. The Rust test that runs it
asserts on the figures.

The agent's script answers a thread's first message and, from its second on, calls a tool its
permission rules ask a person about.

usage: langgraph_check.py BASE_URL API_KEY APPROVER_KEY
"""

import json
import sys

from langgraph_sdk import get_sync_client


def said(text):
    return {"messages": [{"role": "user", "content": text}]}


def contents(values):
    return [m["content"] for m in values.get("messages", [])]


def error_name(call):
    try:
        call()
        return "no error"
    except Exception as e:  # the SDK's own error for the status, or httpx's
        response = getattr(e, "response", None)
        return f"{type(e).__name__} {getattr(response, 'status_code', '')}".strip()


def main() -> None:
    base_url, key, approver_key = sys.argv[1:4]
    client = get_sync_client(url=base_url, api_key=key)
    approver = get_sync_client(url=base_url, api_key=approver_key)
    seen = {}

    seen["assistants"] = [a["assistant_id"] for a in client.assistants.search()]
    seen["assistant"] = client.assistants.get("assistant")["graph_id"]

    thread = client.threads.create(metadata={"sdk": "langgraph"})
    thread_id = thread["thread_id"]
    seen["thread"] = {"status": thread["status"], "metadata": thread["metadata"]}

    parts = list(
        client.runs.stream(
            thread_id,
            "assistant",
            input=said("hello"),
            stream_mode=["values", "messages-tuple", "updates"],
        )
    )
    values = [p.data for p in parts if p.event == "values"]
    run_id = parts[0].data["run_id"]
    seen["stream"] = {
        "events": [p.event for p in parts],
        "ids": [p.id for p in parts],
        "text": "".join(p.data[0]["content"] for p in parts if p.event == "messages"),
        "last_values": contents(values[-1]) if values else None,
    }
    rejoined = list(
        client.runs.join_stream(
            thread_id,
            run_id,
            stream_mode=["values", "messages-tuple", "updates"],
            last_event_id="2",
        )
    )
    seen["rejoined"] = {
        "events": [p.event for p in rejoined],
        "ids": [p.id for p in rejoined],
    }

    waited = client.runs.wait(thread_id, "assistant", input=said("deploy"))
    interrupts = waited.get("__interrupt__") or []
    seen["interrupt"] = {
        "tool": interrupts[0]["value"]["tool"] if interrupts else None,
        "key": interrupts[0]["value"]["arguments"].get("key") if interrupts else None,
        "thread_status": client.threads.get(thread_id)["status"],
    }
    resume = {"resume": {"approve": True}}
    seen["resume_without_approve_role"] = error_name(
        lambda: client.runs.wait(thread_id, "assistant", command=resume)
    )
    resumed = approver.runs.wait(thread_id, "assistant", command=resume)
    seen["resumed"] = {
        "last": contents(resumed)[-1] if contents(resumed) else None,
        "thread_status": client.threads.get(thread_id)["status"],
        "runs": [r["status"] for r in client.runs.list(thread_id)],
    }

    run = client.runs.create(thread_id, "assistant", input=said("later"))
    joined = client.runs.join(thread_id, run["run_id"])
    client.runs.cancel(thread_id, run["run_id"], wait=True, action="rollback")
    seen["cancelled"] = {
        "joined_interrupted": bool(joined.get("__interrupt__")),
        "status": client.runs.get(thread_id, run["run_id"])["status"],
    }

    stateless = list(client.runs.stream(None, "assistant", input=said("alone")))
    seen["stateless"] = {
        "events": [p.event for p in stateless],
        "last_values": contents([p.data for p in stateless if p.event == "values"][-1]),
    }

    history = client.threads.get_history(thread_id)
    seen["history"] = [
        (s["checkpoint"]["checkpoint_id"], len(contents(s["values"]))) for s in history
    ]
    copy = client.threads.copy(thread_id)
    seen["copy"] = {
        "new_id": copy["thread_id"] != thread_id,
        "messages": len(contents(copy["values"])),
    }
    seen["search"] = [
        t["thread_id"] == thread_id for t in client.threads.search(metadata={"sdk": "langgraph"})
    ]
    client.threads.delete(thread_id)
    seen["deleted"] = error_name(lambda: client.threads.get(thread_id))
    seen["wrong_key"] = error_name(
        lambda: get_sync_client(url=base_url, api_key="sk-wrong").threads.search()
    )
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
