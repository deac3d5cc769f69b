"""Drives the gateway's Responses API with the official `openai` Python library where the agent asks
a person before its tool, and prints what it saw as one JSON object: a response that stops at an
`mcp_approval_request`, the same read back, an `mcp_approval_response` refused to a key that may
not approve and accepted from one that may (the run goes on to its answer), and a refusal with a
reason answered in a stream. The Rust test that runs it asserts on the figures.

usage: openai_approval_check.py BASE_URL API_KEY APPROVER_KEY
"""

import json
import sys

from openai import OpenAI


def approval_request(response):
    return next(item for item in response.output if item.type == "mcp_approval_request")


def main() -> None:
    base_url, key, approver_key = sys.argv[1:4]
    client = OpenAI(base_url=base_url, api_key=key)
    approver = OpenAI(base_url=base_url, api_key=approver_key)
    seen = {}

    asked = client.responses.create(model="assistant", input="deploy-x")
    request = approval_request(asked)
    seen["asked"] = {
        "status": asked.status,
        "types": [item.type for item in asked.output],
        "name": request.name,
        "arguments": json.loads(request.arguments),
        "server_label": request.server_label,
    }
    again = client.responses.retrieve(asked.id)
    seen["retrieved"] = {
        "status": again.status,
        "types": [item.type for item in again.output],
    }

    answer = [{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}]
    try:
        client.responses.create(model="assistant", previous_response_id=asked.id, input=answer)
        seen["without_approve_role"] = "no error"
    except Exception as e:  # the library's own error for the status
        seen["without_approve_role"] = f"{type(e).__name__} {getattr(e, 'status_code', '')}"
    approved = approver.responses.create(
        model="assistant", previous_response_id=asked.id, input=answer
    )
    seen["approved"] = {
        "status": approved.status,
        "text": approved.output_text,
        "previous": approved.previous_response_id == asked.id,
    }

    asked = client.responses.create(model="assistant", input="deploy-y")
    refusal = [
        {
            "type": "mcp_approval_response",
            "approval_request_id": approval_request(asked).id,
            "approve": False,
            "reason": "not today",
        }
    ]
    events = list(
        approver.responses.create(
            model="assistant", previous_response_id=asked.id, input=refusal, stream=True
        )
    )
    seen["refused"] = {
        "first": events[0].type,
        "last": events[-1].type,
        "text": events[-1].response.output_text,
    }
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
