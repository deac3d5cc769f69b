//! The gateway's OpenAPI document (`GET /openapi.json`, no key needed): every route with its
//! method, what it does, whether it needs a key, and the error shape. [`ENDPOINTS`] is the list
//! the document is made from; the router serves each of them (a test asks every documented route
//! and checks none is unknown to the router).

use serde_json::{json, Map, Value};

/// One documented route.
pub(crate) struct Endpoint {
    pub method: &'static str,
    /// In OpenAPI's form (`{id}`), which is also axum's.
    pub path: &'static str,
    pub summary: &'static str,
    /// Whether it needs a key (`Authorization: Bearer <key>` or `x-api-key: <key>`).
    pub keyed: bool,
}

pub(crate) const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        method: "get",
        path: "/healthz",
        summary: "Whether the gateway serves (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/openapi.json",
        summary: "This document (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/v1/models",
        summary: "The agents, as models",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/v1/chat/completions",
        summary: "OpenAI Chat Completions: one turn of the agent `model` names, in a session of its own; streamed as SSE with `stream`",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/v1/responses",
        summary: "OpenAI Responses: one turn of the agent `model` names; `previous_response_id` continues its session; `stream`, `background`, `metadata`",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/v1/responses/{id}",
        summary: "A response; with `stream=true` its events again, after `starting_after` (or `Last-Event-ID`)",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/v1/responses/{id}/cancel",
        summary: "Cancels a response's run; answers with the response once it ended",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/.well-known/agent-card.json",
        summary: "The A2A agent card: the agents as skills (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/.well-known/agent.json",
        summary: "The A2A agent card, at its older address (no key)",
        keyed: false,
    },
    Endpoint {
        method: "post",
        path: "/a2a",
        summary: "A2A over JSON-RPC: 1.0's SendMessage, SendStreamingMessage (SSE), GetTask, CancelTask, SubscribeToTask (SSE) and 0.3's message/send, message/stream, tasks/get, tasks/cancel, tasks/resubscribe",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/assistants/search",
        summary: "Agent Protocol: the agents as assistants, by `graph_id`, `name`, `metadata`",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/assistants/{id}",
        summary: "Agent Protocol: an assistant (an agent)",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads",
        summary: "Agent Protocol: makes a thread (a session): `thread_id`, `metadata`, `if_exists`",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/search",
        summary: "Agent Protocol: the tenant's threads by `metadata`, `status`, `ids`; newest first, paged",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/threads/{id}",
        summary: "Agent Protocol: a thread with its status, values and interrupts",
        keyed: true,
    },
    Endpoint {
        method: "patch",
        path: "/threads/{id}",
        summary: "Agent Protocol: merges `metadata` into a thread's",
        keyed: true,
    },
    Endpoint {
        method: "delete",
        path: "/threads/{id}",
        summary: "Agent Protocol: removes a thread (its session) unless a run goes on",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/{id}/copy",
        summary: "Agent Protocol: a new thread forked after this one's last turn, with its workspace's files",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/threads/{id}/state",
        summary: "Agent Protocol: the thread's values now, with the calls it waits on as interrupts",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/{id}/history",
        summary: "Agent Protocol: the state after each recorded turn, newest first (`limit`, `before`)",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/{id}/runs",
        summary: "Agent Protocol: starts a run in the background (`input`, or `command.resume` to answer an interrupt; `multitask_strategy`)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/threads/{id}/runs",
        summary: "Agent Protocol: a thread's runs, newest first (`limit`, `offset`, `status`)",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/{id}/runs/stream",
        summary: "Agent Protocol: starts a run and streams it (SSE; `stream_mode` values, updates, messages-tuple, custom; `on_disconnect`)",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/{id}/runs/wait",
        summary: "Agent Protocol: starts a run and answers with the thread's values at its end or interrupt",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/threads/{id}/runs/{run_id}",
        summary: "Agent Protocol: a run and its status",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/threads/{id}/runs/{run_id}/join",
        summary: "Agent Protocol: waits for a run's end; its values",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/threads/{id}/runs/{run_id}/stream",
        summary: "Agent Protocol: a run's stream again, after `Last-Event-ID`",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/threads/{id}/runs/{run_id}/cancel",
        summary: "Agent Protocol: cancels a run (`action` interrupt or rollback, `wait`)",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/runs",
        summary: "Agent Protocol: a stateless run in the background, on a thread of its own",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/runs/stream",
        summary: "Agent Protocol: a stateless run, streamed; its thread removed at its end unless `on_completion: keep`",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/runs/wait",
        summary: "Agent Protocol: a stateless run, waited for; its thread removed at its end unless `on_completion: keep`",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console",
        summary: "The web console's page (no key; it asks for one)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/console/app.js",
        summary: "The web console's script: sign-in, views, the live feed (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/console/run.js",
        summary: "The web console's run view (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/console/sessions.js",
        summary: "The web console's sessions views (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/console/dead-letters.js",
        summary: "The web console's dead-letters view (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/console/app.css",
        summary: "The web console's styles (no key)",
        keyed: false,
    },
    Endpoint {
        method: "get",
        path: "/console/api/approvals",
        summary: "Console: the tenant's calls waiting for a person, with their arguments and rule",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/console/api/approvals/{task_id}/answer",
        summary: "Console: approves or denies a waiting call (`approve`, `reason`, `call_id`) as the key's principal (`approve` role)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/workers",
        summary: "Console: the live workers, their pools, tools, agent types, capacity and last heartbeat",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/runs",
        summary: "Console: the tenant's runs the events stream holds, newest first, filtered by `status`, `agent`, `session`, paged with `before`",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/console/api/runs",
        summary: "Console: starts a run (`agent`, `input`, `session` optional) as the key's principal (`submit` role)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/runs/{task_id}",
        summary: "Console: a run as it stands: agent, session, status, the tree of its runs, its final result (tokens, cost), its turn in the session, its trace and what the key may do",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/console/api/runs/{task_id}/{action}",
        summary: "Console: `cancel` (`reason`), `pause`, `resume` (`operate` role); `steer` (`text`), `fork` (`at`: T or T.S), `replay` (a new run in a fork before the turn, its calls answered from the record; `submit` role)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/runs/{task_id}/events",
        summary: "Console: a run's events from its first, live to its end (SSE numbered for `Last-Event-ID`)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/sessions",
        summary: "Console: the tenant's sessions, the latest active first: turns, messages, last turn's end, time left before an idle one expires, the turn running in it",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/sessions/{session}",
        summary: "Console: a session's last messages (role, text, calls; long texts cut with a note) after its summary, where it was forked from, and its checkpoints (recorded turns, with the fork points `T` and `T.S`)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/sessions/{session}/files",
        summary: "Console: the files of a session's workspace (path, size, digest)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/sessions/{session}/files/{path}",
        summary: "Console: a workspace file (`path` may hold `/`): as `text/plain` when it is UTF-8, else 415; with `download=1` as an `application/octet-stream` attachment",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/dead-letters",
        summary: "Console: the tenant's dead letters (number, original subject, reason, attempts, size, cut, task), and `may_operate`",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/dead-letters/{seq}",
        summary: "Console: one of the tenant's dead letters with its body (`payload` as JSON, else a text `preview`); another tenant's is not found",
        keyed: true,
    },
    Endpoint {
        method: "post",
        path: "/console/api/dead-letters/{seq}/replay",
        summary: "Console: forgets the letter's outcome and attempts, publishes its message again and removes it (`operate` role; 409 for a cut or undecodable letter)",
        keyed: true,
    },
    Endpoint {
        method: "delete",
        path: "/console/api/dead-letters/{seq}",
        summary: "Console: removes a dead letter without replaying it (`operate` role)",
        keyed: true,
    },
    Endpoint {
        method: "get",
        path: "/console/api/live",
        summary: "Console: a note per change of the tenant's tasks (SSE), so the page reads again rather than polls",
        keyed: true,
    },
];

/// The document.
pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for endpoint in ENDPOINTS {
        let mut operation = json!({
            "summary": endpoint.summary,
            "responses": {
                "200": { "description": "OK" },
                "default": {
                    "description": "An error: in OpenAI's shape under /v1, as `{\"detail\"}` on the Agent Protocol's routes, as a JSON-RPC error on /a2a",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
                }
            }
        });
        if endpoint.keyed {
            operation["security"] = json!([{ "key": [] }, { "apiKey": [] }]);
        } else {
            operation["security"] = json!([]);
        }
        let named: Vec<Value> = endpoint
            .path
            .split('/')
            .filter_map(|part| part.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        if !named.is_empty() {
            operation["parameters"] = Value::Array(named);
        }
        if endpoint.method == "post" {
            operation["parameters"] = {
                let mut parameters = operation["parameters"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                parameters.push(json!({
                    "name": "Idempotency-Key", "in": "header", "required": false,
                    "schema": { "type": "string", "maxLength": 255 },
                    "description": "A retry with the same key is the same run"
                }));
                Value::Array(parameters)
            };
        }
        let path = paths
            .entry(endpoint.path.to_owned())
            .or_insert_with(|| json!({}));
        path[endpoint.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Skein gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Skein's agents over HTTP for clients that speak OpenAI's APIs, LangGraph's Agent Protocol and A2A. Every keyed request acts for the tenant its key names."
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "key": { "type": "http", "scheme": "bearer" },
                "apiKey": { "type": "apiKey", "in": "header", "name": "x-api-key" }
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": { "error": {
                        "type": "object",
                        "properties": {
                            "message": { "type": "string" },
                            "type": { "type": "string" },
                            "param": { "type": ["string", "null"] },
                            "code": { "type": "string" }
                        },
                        "required": ["message", "type", "code"]
                    } },
                    "required": ["error"]
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint_is_in_the_document_once() {
        let document = document();
        let mut count = 0;
        for endpoint in ENDPOINTS {
            let operation = &document["paths"][endpoint.path][endpoint.method];
            assert!(
                operation.is_object(),
                "{} {}",
                endpoint.method,
                endpoint.path
            );
            assert_eq!(
                operation["security"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty()),
                endpoint.keyed
            );
            count += 1;
        }
        let documented: usize = document["paths"]
            .as_object()
            .expect("paths")
            .values()
            .map(|p| p.as_object().map_or(0, Map::len))
            .sum();
        assert_eq!(documented, count);
    }
}
