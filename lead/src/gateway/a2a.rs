//! A2A (protocol 1.0, JSON-RPC binding): the agent card at `/.well-known/agent-card.json` (and
//! the older `/.well-known/agent.json`) lists the agents as skills; `POST /a2a` takes
//! `SendMessage`, `SendStreamingMessage`, `GetTask` and `CancelTask`.
//!
//! A message's `contextId` is the session (a new one when absent), its task is a Skein task
//! (recorded like a response, `store::responses`, so any gateway finds it), and the agent is the
//! skill its `metadata.skill` names, else the catalog's first. `SendMessage` waits for the run
//! (unless `configuration.returnImmediately`) and answers with the task: its state, the answer as
//! an artifact, the two messages as history. `SendStreamingMessage` answers with SSE: the task
//! submitted, `TASK_STATE_WORKING`, the lead's text as artifact updates, the final state.
//! Shapes are protobuf JSON (camelCase, enum names), as the protocol's own libraries write them.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::protocol::{EventKind, FinalResult, TaskSubmission, TurnStatus};
use skein_common::store::responses::ResponseRecord;

use super::keys::Principal;
use super::request::{self, json_response, ApiError};
use super::Gateway;

/// The protocol version the card announces.
const PROTOCOL: &str = "1.0";

// JSON-RPC and A2A error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;

/// `GET /.well-known/agent-card.json`: the gateway as one A2A agent whose skills are the agents.
pub(super) async fn card(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let skills: Vec<Value> = gateway
        .agents
        .names()
        .map(|name| {
            let description = gateway
                .agents
                .resolve(name, None)
                .map(|agent| agent.description.clone())
                .unwrap_or_default();
            json!({ "id": name, "name": name, "description": description, "tags": ["skein"] })
        })
        .collect();
    json_response(json!({
        "name": "Skein",
        "description": "Skein's agents; name one as a message's metadata.skill (else the first skill runs).",
        "supportedInterfaces": [
            { "url": format!("http://{host}/a2a"), "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL }
        ],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": { "streaming": true, "pushNotifications": false },
        "securitySchemes": { "key": { "httpAuthSecurityScheme": { "scheme": "bearer" } } },
        "securityRequirements": [ { "schemes": { "key": { "list": [] } } } ],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    }))
}

/// A JSON-RPC failure: its code and message.
struct RpcError(i64, String);

fn rpc_error(id: &Value, RpcError(code, message): RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// `POST /a2a`: one JSON-RPC request.
pub(super) async fn rpc(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (principal, body) = match request::admitted_body(&gateway, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused.into_response(),
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let error = RpcError(PARSE_ERROR, format!("the body is not JSON: {e}"));
            return json_response(rpc_error(&Value::Null, error));
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let (Some(method), Some(params)) = (
        request.get("method").and_then(Value::as_str),
        request.get("params"),
    ) else {
        let error = RpcError(
            INVALID_REQUEST,
            "a JSON-RPC 2.0 request needs a method and params".into(),
        );
        return json_response(rpc_error(&id, error));
    };
    let answered = match method {
        "SendMessage" => send(&gateway, &principal, params).await,
        "SendStreamingMessage" => match start(&gateway, &principal, params).await {
            Ok((record, submission)) => return stream(gateway, record, submission, id),
            Err(e) => Err(e),
        },
        "GetTask" => get(&gateway, &principal, params).await,
        "CancelTask" => cancel(&gateway, &principal, params).await,
        other => Err(RpcError(
            METHOD_NOT_FOUND,
            format!(
                "{other} is not served: SendMessage, SendStreamingMessage, GetTask, CancelTask"
            ),
        )),
    };
    json_response(match answered {
        Ok(result) => rpc_result(&id, result),
        Err(error) => rpc_error(&id, error),
    })
}

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError(INVALID_PARAMS, message.into())
}

fn unavailable(e: impl std::fmt::Display) -> RpcError {
    RpcError(INTERNAL_ERROR, e.to_string())
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        RpcError(INVALID_PARAMS, e.message().to_owned())
    }
}

/// Reads a `SendMessage` request's message, records its task and names its submission.
async fn start(
    gateway: &Gateway,
    principal: &Principal,
    params: &Value,
) -> Result<(ResponseRecord, TaskSubmission), RpcError> {
    let message = params
        .get("message")
        .ok_or_else(|| invalid("params.message is missing"))?;
    if message.get("role").and_then(Value::as_str) != Some("ROLE_USER") {
        return Err(invalid("the message's role must be ROLE_USER"));
    }
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .filter(|parts| !parts.is_empty())
        .ok_or_else(|| invalid("the message has no parts"))?;
    let mut input = String::new();
    for part in parts {
        match part.get("text").and_then(Value::as_str) {
            Some(text) => input.push_str(text),
            None => return Err(invalid("only text parts are accepted")),
        }
    }
    let agent = match message
        .pointer("/metadata/skill")
        .or_else(|| params.pointer("/metadata/skill"))
        .and_then(Value::as_str)
    {
        Some(skill) => {
            request::check_agent(gateway, skill)?;
            skill.to_owned()
        }
        None => gateway
            .agents
            .names()
            .next()
            .ok_or_else(|| unavailable("the cluster has no agent"))?
            .to_owned(),
    };
    let id = format!("a2a-{}", uuid::Uuid::new_v4().simple());
    let session = match message.get("contextId").and_then(Value::as_str) {
        Some(context) => context.to_owned(),
        None => format!("a2a-ctx-{}", uuid::Uuid::new_v4().simple()),
    };
    let submission = request::submission(
        gateway,
        principal,
        request::RunSpec {
            task_id: id.clone(),
            session: session.clone(),
            agent: agent.clone(),
            input,
        },
    )?;
    let record = ResponseRecord {
        id,
        session,
        agent,
        created_at: skein_common::protocol::now_ms() / 1000,
        previous_response_id: None,
        instructions: None,
        metadata: Default::default(),
        background: params
            .pointer("/configuration/returnImmediately")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    gateway
        .store
        .put_response(&principal.tenant, &record)
        .await
        .map_err(unavailable)?;
    Ok((record, submission))
}

async fn send(gateway: &Gateway, principal: &Principal, params: &Value) -> Result<Value, RpcError> {
    let (record, submission) = start(gateway, principal, params).await?;
    if record.background {
        gateway
            .client
            .submit(&submission)
            .await
            .map_err(unavailable)?;
        return Ok(json!({ "task": task(&record, None, "TASK_STATE_SUBMITTED") }));
    }
    let result = gateway
        .client
        .run(&submission, gateway.run_timeout, |_| {})
        .await
        .map_err(unavailable)?;
    Ok(json!({ "task": ended_task(&record, &result) }))
}

async fn record_of(
    gateway: &Gateway,
    principal: &Principal,
    params: &Value,
) -> Result<ResponseRecord, RpcError> {
    let id = params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("params.id is missing"))?;
    gateway
        .store
        .response(&principal.tenant, id)
        .await
        .map_err(unavailable)?
        .filter(|record| record.id.starts_with("a2a-"))
        .ok_or_else(|| RpcError(TASK_NOT_FOUND, format!("no task {id:?}")))
}

async fn get(gateway: &Gateway, principal: &Principal, params: &Value) -> Result<Value, RpcError> {
    let record = record_of(gateway, principal, params).await?;
    let ended = gateway
        .client
        .stored_final(&principal.tenant, &record.session, &record.id)
        .await
        .map_err(unavailable)?;
    Ok(match ended {
        Some(result) => ended_task(&record, &result),
        None => task(&record, None, "TASK_STATE_WORKING"),
    })
}

async fn cancel(
    gateway: &Gateway,
    principal: &Principal,
    params: &Value,
) -> Result<Value, RpcError> {
    let record = record_of(gateway, principal, params).await?;
    let reason = format!("cancelled over A2A by {}", principal.name);
    gateway
        .client
        .cancel(&principal.tenant, &record.id, &reason)
        .await
        .map_err(unavailable)?;
    // The run stops at its next step; its end is the task's state.
    let started = tokio::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(10) {
        if let Some(result) = gateway
            .client
            .stored_final(&principal.tenant, &record.session, &record.id)
            .await
            .map_err(unavailable)?
        {
            return Ok(ended_task(&record, &result));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(task(&record, None, "TASK_STATE_WORKING"))
}

/// A task in protobuf JSON: state, the answer as an artifact, when there is one.
fn task(record: &ResponseRecord, answer: Option<&str>, state: &str) -> Value {
    let mut task = json!({
        "id": record.id,
        "contextId": record.session,
        "status": { "state": state, "timestamp": now() },
        "metadata": { "skill": record.agent },
    });
    if let Some(answer) = answer {
        task["artifacts"] = json!([ { "artifactId": format!("{}-answer", record.id), "name": "answer", "parts": [ { "text": answer } ] } ]);
        task["status"]["message"] = agent_message(record, answer);
    }
    task
}

fn ended_task(record: &ResponseRecord, result: &FinalResult) -> Value {
    let state = state_of(result);
    match (&result.answer, &result.failure) {
        (Some(answer), _) if !answer.is_empty() => task(record, Some(answer), state),
        (_, Some(failure)) => {
            let mut task = task(record, None, state);
            task["status"]["message"] = agent_message(record, &failure.message);
            task
        }
        _ => task(record, None, state),
    }
}

fn state_of(result: &FinalResult) -> &'static str {
    match result.status {
        TurnStatus::Completed | TurnStatus::BudgetExhausted => "TASK_STATE_COMPLETED",
        TurnStatus::Cancelled => "TASK_STATE_CANCELED",
        TurnStatus::Rejected => "TASK_STATE_REJECTED",
        _ => "TASK_STATE_FAILED",
    }
}

fn agent_message(record: &ResponseRecord, text: &str) -> Value {
    json!({
        "messageId": format!("{}-agent", record.id),
        "contextId": record.session,
        "taskId": record.id,
        "role": "ROLE_AGENT",
        "parts": [ { "text": text } ],
    })
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// `SendStreamingMessage`: the task, then its updates, as JSON-RPC results over SSE.
fn stream(
    gateway: Arc<Gateway>,
    record: ResponseRecord,
    submission: TaskSubmission,
    id: Value,
) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let first = json!({ "task": task(&record, None, "TASK_STATE_SUBMITTED") });
    let _ = sender.send(first);
    tokio::spawn(async move {
        let (task_id, context) = (record.id.clone(), record.session.clone());
        let status = |state: &str| json!({ "statusUpdate": { "taskId": task_id, "contextId": context, "status": { "state": state, "timestamp": now() } } });
        let _ = sender.send(status("TASK_STATE_WORKING"));
        let artifact_id = format!("{}-answer", record.id);
        let mut sent_text = false;
        let updates = sender.clone();
        let (task_id, context) = (record.id.clone(), record.session.clone());
        let result = gateway
            .client
            .run(&submission, gateway.run_timeout, move |event| {
                if let (EventKind::ModelDelta { text }, "lead") = (&event.event, event.source.as_str()) {
                    let _ = updates.send(json!({ "artifactUpdate": {
                        "taskId": task_id, "contextId": context,
                        "artifact": { "artifactId": artifact_id, "name": "answer", "parts": [ { "text": text } ] },
                        "append": sent_text, "lastChunk": false,
                    } }));
                    sent_text = true;
                }
            })
            .await;
        let mut last = status("TASK_STATE_FAILED");
        last["statusUpdate"]["status"] = match result {
            Ok(result) => ended_task(&record, &result)["status"].clone(),
            Err(e) => {
                json!({ "state": "TASK_STATE_FAILED", "message": agent_message(&record, &e.to_string()) })
            }
        };
        let _ = sender.send(last);
    });
    let events = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|value| (value, receiver))
    })
    .map(move |result| {
        Ok::<_, Infallible>(Event::default().data(rpc_result(&id, result).to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
