//! The Agent Protocol as LangGraph Platform serves it (the surface of LangGraph's SDKs and UIs):
//! assistants are Skein's agents, threads are sessions, runs are tasks.
//!
//! Served: `POST /assistants/search`, `GET /assistants/{id}`; threads ([`threads`]): `POST
//! /threads`, `POST /threads/search`, `GET|PATCH|DELETE /threads/{id}`, `POST
//! /threads/{id}/copy` (a fork of the session with its workspace files), `GET
//! /threads/{id}/state`, `POST /threads/{id}/history` (a state per recorded turn); runs
//! ([`runs`]): `POST /threads/{id}/runs` (background), `/runs/stream`, `/runs/wait`, `GET
//! /threads/{id}/runs`, `GET /threads/{id}/runs/{run_id}`, `/join`, `GET …/stream` (rejoin,
//! `Last-Event-ID`), `POST …/cancel` (`action=interrupt|rollback`), stateless `POST /runs`,
//! `/runs/stream` and `/runs/wait`. Stream modes `values`, `updates`, `messages-tuple` and
//! `custom` ([`fold`]).
//!
//! A call waiting for a person is an interrupt: its run ends `interrupted`, its thread is
//! `interrupted`, and a run with `command: {"resume": …}` answers it and goes on with the same
//! task. `multitask_strategy` is the submission's mid-run policy. Errors come as
//! `{"detail": …}` with their status, as LangGraph's server writes them.

mod fold;
mod messages;
mod resume;
mod runs;
mod start;
mod threads;
mod wire;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::keys::{Principal, Role};
use super::request::{self, admit, error, json_response, ApiError};
use super::Gateway;

/// The routes of the Agent Protocol.
pub(super) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/assistants/search", post(search_assistants))
        .route("/assistants/{id}", get(assistant))
        .route("/threads", post(threads::create))
        .route("/threads/search", post(threads::search))
        .route(
            "/threads/{id}",
            get(threads::read)
                .patch(threads::update)
                .delete(threads::remove),
        )
        .route("/threads/{id}/copy", post(threads::copy))
        .route("/threads/{id}/state", get(threads::state))
        .route("/threads/{id}/history", post(threads::history))
        .route("/threads/{id}/runs", post(runs::background).get(runs::list))
        .route("/threads/{id}/runs/stream", post(runs::stream))
        .route("/threads/{id}/runs/wait", post(runs::wait))
        .route("/threads/{id}/runs/{run_id}", get(runs::read))
        .route("/threads/{id}/runs/{run_id}/join", get(runs::join))
        .route("/threads/{id}/runs/{run_id}/stream", get(runs::rejoin))
        .route("/threads/{id}/runs/{run_id}/cancel", post(runs::cancel))
        .route("/runs", post(runs::stateless_background))
        .route("/runs/stream", post(runs::stateless_stream))
        .route("/runs/wait", post(runs::stateless_wait))
}

/// A handler's outcome as the protocol answers it.
fn answer(outcome: Result<Response, ApiError>) -> Response {
    outcome.unwrap_or_else(ApiError::into_detail)
}

/// An instant (milliseconds since the Unix epoch) as RFC 3339.
fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

fn not_found(what: &str, id: &str) -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        format!("no {what} {id:?} in this tenant"),
    )
}

/// A JSON body, `{}` when empty; 400 when it is not a JSON object.
fn object_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Default::default());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(request::invalid("the body must be a JSON object")),
        Err(e) => Err(request::invalid(format!("the body is not JSON: {e}"))),
    }
}

/// `limit` and `offset` of a search (10 and 0 when absent; at most 1000).
fn page(fields: &serde_json::Map<String, Value>) -> Result<(usize, usize), ApiError> {
    let read = |name: &str, default: u64| match fields.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_u64()
            .ok_or_else(|| request::invalid(format!("{name} must be a whole number"))),
    };
    let limit = read("limit", 10)?;
    if limit > 1000 {
        return Err(request::invalid("limit is at most 1000"));
    }
    Ok((limit as usize, read("offset", 0)? as usize))
}

/// True when `metadata` holds every pair of `filter` (a JSON object).
fn matches_metadata(metadata: &Value, filter: Option<&Value>) -> bool {
    match filter.and_then(Value::as_object) {
        None => true,
        Some(filter) => filter.iter().all(|(k, v)| metadata.get(k) == Some(v)),
    }
}

/// An agent as an assistant.
fn assistant_of(gateway: &Gateway, name: &str) -> Value {
    let description = gateway
        .agents
        .resolve(name, None)
        .map(|agent| agent.description.clone())
        .unwrap_or_default();
    json!({
        "assistant_id": name,
        "graph_id": name,
        "name": name,
        "description": description,
        "config": {},
        "context": {},
        "metadata": { "created_by": "skein" },
        "version": 1,
        "created_at": time(0),
        "updated_at": time(0),
    })
}

async fn caller(gateway: &Gateway, headers: &HeaderMap) -> Result<Principal, ApiError> {
    admit(gateway, headers, Role::Submit).await
}

/// `POST /assistants/search`: the agents, filtered by `graph_id`, `name` and `metadata`.
async fn search_assistants(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    answer(
        async {
            caller(&gateway, &headers).await?;
            let fields = object_body(&request::body(body)?)?;
            let (limit, offset) = page(&fields)?;
            let wanted = |field: &str| fields.get(field).and_then(Value::as_str);
            let found: Vec<Value> = gateway
                .agents
                .names()
                .filter(|name| wanted("graph_id").is_none_or(|g| g == *name))
                .filter(|name| wanted("name").is_none_or(|n| name.contains(n)))
                .map(|name| assistant_of(&gateway, name))
                .filter(|a| matches_metadata(&a["metadata"], fields.get("metadata")))
                .skip(offset)
                .take(limit)
                .collect();
            Ok(json_response(Value::Array(found)))
        }
        .await,
    )
}

/// `GET /assistants/{id}`.
async fn assistant(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            caller(&gateway, &headers).await?;
            if !gateway.agents.names().any(|name| name == id) {
                return Err(not_found("assistant", &id));
            }
            Ok(json_response(assistant_of(&gateway, &id)))
        }
        .await,
    )
}

/// 202 with no body.
fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}
