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
    /// Whether it needs `Authorization: Bearer <key>`.
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
        summary: "A2A 1.0 over JSON-RPC: SendMessage, SendStreamingMessage (SSE), GetTask, CancelTask",
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
                    "description": "An error in OpenAI's shape",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } }
                }
            }
        });
        if endpoint.keyed {
            operation["security"] = json!([{ "key": [] }]);
        } else {
            operation["security"] = json!([]);
        }
        if endpoint.path.contains("{id}") {
            operation["parameters"] = json!([{
                "name": "id", "in": "path", "required": true, "schema": { "type": "string" }
            }]);
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
            "description": "Skein's agents over HTTP for clients that speak OpenAI's APIs. Every keyed request acts for the tenant its key names."
        },
        "paths": paths,
        "components": {
            "securitySchemes": { "key": { "type": "http", "scheme": "bearer" } },
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
