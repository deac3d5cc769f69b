//! The OpenAI-compatible surface: `GET /v1/models` lists the agents, `POST /v1/chat/completions`
//! runs one turn of the agent its `model` names. Chat Completions is stateless, so each request
//! gets a session of its own, seeded in Redis with the conversation before its last user message
//! (system and developer messages become the caller's instructions at the head of the input);
//! the last user message is the task's input. Streamed (`"stream": true`), the model's text of
//! the turn goes out as `chat.completion.chunk` events, then a chunk with the finish reason, the
//! usage when `stream_options.include_usage` asks for it, and `data: [DONE]`. A client that goes
//! away does not stop its run.
//!
//! `Idempotency-Key` makes a retried request the same task (and session): the run is not started
//! twice, and the retry gets the same answer.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use skein_common::protocol::message::Message;
use skein_common::protocol::{
    EventKind, FinalResult, MultitaskPolicy, TaskSubmission, TurnStatus, PROTOCOL_VERSION,
};
use skein_common::store::SessionState;

use super::keys::{Principal, Role};
use super::Gateway;

/// Longest `Idempotency-Key` taken.
const MAX_IDEMPOTENCY_KEY: usize = 255;

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// A message's content: a string, or parts of which the text ones are read.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Value>),
}

impl Content {
    fn text(&self) -> Result<String, String> {
        match self {
            Content::Text(text) => Ok(text.clone()),
            Content::Parts(parts) => {
                let mut text = String::new();
                for part in parts {
                    match part.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                        }
                        other => {
                            return Err(format!(
                                "content parts of type {} are not accepted; send text",
                                other.unwrap_or("(none)")
                            ))
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with its status.
pub(super) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: String,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": Value::Null,
            "code": self.code,
        } });
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

pub(super) fn error(
    status: StatusCode,
    kind: &'static str,
    code: &str,
    message: impl Into<String>,
) -> ApiError {
    ApiError {
        status,
        kind,
        code: code.to_owned(),
        message: message.into(),
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        message,
    )
}

fn json_response(body: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The caller a request's key proves, with `role`; or the 401/403 that says why not.
fn authenticate(gateway: &Gateway, headers: &HeaderMap, role: Role) -> Result<Principal, ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(key) = presented.filter(|k| !k.is_empty()) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing_api_key",
            "no API key: send Authorization: Bearer <key>",
        ));
    };
    let Some(principal) = gateway.keys.verify(key) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "the API key is not known",
        ));
    };
    if !principal.may(role) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            format!(
                "principal {} may not {role:?} in tenant {}",
                principal.name, principal.tenant
            ),
        ));
    }
    Ok(principal.clone())
}

pub(super) async fn models(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authenticate(&gateway, &headers, Role::Submit) {
        return refused.into_response();
    }
    let data: Vec<Value> = gateway
        .agents
        .names()
        .map(|name| json!({ "id": name, "object": "model", "created": 0, "owned_by": "skein" }))
        .collect();
    json_response(json!({ "object": "list", "data": data }))
}

pub(super) async fn not_found() -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such route",
    )
}

/// What a chat request asks Skein to run.
struct Planned {
    submission: TaskSubmission,
    history: Vec<Message>,
    stream: bool,
    include_usage: bool,
}

pub(super) async fn chat_completions(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let principal = match authenticate(&gateway, &headers, Role::Submit) {
        Ok(principal) => principal,
        Err(refused) => return refused.into_response(),
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                "the request body is larger than the gateway takes",
            )
            .into_response()
        }
        Err(rejection) => return invalid(rejection.body_text()).into_response(),
    };
    let planned = match plan(&gateway, &principal, &headers, &body) {
        Ok(planned) => planned,
        Err(refused) => return refused.into_response(),
    };
    if let Err(refused) = seed(&gateway, &planned).await {
        return refused.into_response();
    }
    if planned.stream {
        stream(gateway, planned)
    } else {
        let result = gateway
            .client
            .run(&planned.submission, gateway.run_timeout, |_| {})
            .await;
        match result {
            Ok(result) => completion(&planned.submission, &result),
            Err(e) => error(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                "run_not_finished",
                format!(
                    "task {} did not end in time ({e}); it keeps running",
                    planned.submission.task_id
                ),
            )
            .into_response(),
        }
    }
}

/// Reads and checks a chat request; names its task and session.
fn plan(
    gateway: &Gateway,
    principal: &Principal,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Planned, ApiError> {
    let request: ChatRequest = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("the request is not a chat completion request: {e}")))?;
    if !gateway.agents.names().any(|name| name == request.model) {
        let known: Vec<&str> = gateway.agents.names().collect();
        return Err(error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!(
                "the model {:?} is no agent of this cluster; models: {}",
                request.model,
                known.join(", ")
            ),
        ));
    }
    let Some((last, earlier)) = request.messages.split_last() else {
        return Err(invalid("messages is empty"));
    };
    if last.role != "user" {
        return Err(invalid("the last message must be the user's"));
    }
    let text_of = |message: &ChatMessage| -> Result<String, ApiError> {
        message
            .content
            .as_ref()
            .map_or(Ok(String::new()), Content::text)
            .map_err(invalid)
    };
    let mut instructions = Vec::new();
    let mut history = Vec::new();
    for message in earlier {
        let text = text_of(message)?;
        match message.role.as_str() {
            "system" | "developer" => instructions.push(text),
            "user" => history.push(Message::user(text)),
            "assistant" => history.push(Message::assistant(text)),
            "tool" | "function" => {
                return Err(invalid(
                    "tool messages are not accepted: the agent runs its own tools",
                ))
            }
            other => return Err(invalid(format!("unknown message role {other:?}"))),
        }
    }
    let mut input = text_of(last)?;
    if !instructions.is_empty() {
        input = format!(
            "The caller's instructions:\n{}\n\n{input}",
            instructions.join("\n\n")
        );
    }
    let id = match headers.get("idempotency-key") {
        Some(key) => {
            let key = key
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY)
                .ok_or_else(|| invalid("Idempotency-Key must be 1 to 255 visible characters"))?;
            let hash = Sha256::digest(format!("{}\n{key}", principal.tenant).as_bytes());
            hash.iter().take(16).map(|b| format!("{b:02x}")).collect()
        }
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let submission = TaskSubmission {
        v: PROTOCOL_VERSION,
        task_id: format!("chatcmpl-{id}"),
        tenant: principal.tenant.clone(),
        user: principal.name.clone(),
        session: format!("chat-{id}"),
        agent: request.model,
        input,
        overrides: None,
        deadline_ms: None,
        budget: None,
        multitask: MultitaskPolicy::default(),
    };
    submission
        .validate(gateway.client.bus().max_payload())
        .map_err(|failure| {
            if failure.kind == skein_common::protocol::FailureKind::TooLarge {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "request_too_large",
                    failure.message,
                )
            } else {
                invalid(failure.message)
            }
        })?;
    Ok(Planned {
        submission,
        history,
        stream: request.stream,
        include_usage: request.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// Writes the conversation before the last message into the request's new session. A retry with
/// the same `Idempotency-Key` finds it written and leaves it.
async fn seed(gateway: &Gateway, planned: &Planned) -> Result<(), ApiError> {
    if planned.history.is_empty() {
        return Ok(());
    }
    let state = SessionState {
        history: planned.history.clone(),
        ..SessionState::default()
    };
    let (tenant, session) = (&planned.submission.tenant, &planned.submission.session);
    match gateway.store.save(tenant, session, 0, &state).await {
        Ok(_) | Err(skein_common::store::StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "unavailable",
            format!("the conversation could not be stored: {e}"),
        )),
    }
}

fn created() -> u64 {
    skein_common::protocol::now_ms() / 1000
}

fn usage(result: &FinalResult) -> Value {
    let (prompt, completion) = (result.usage.prompt_tokens, result.usage.completion_tokens);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt.saturating_add(completion),
    })
}

/// Why the turn stopped, as OpenAI names it.
fn finish_reason(result: &FinalResult) -> &'static str {
    if result.status == TurnStatus::BudgetExhausted || result.limit_reached {
        "length"
    } else {
        "stop"
    }
}

/// A failed, cancelled or rejected turn as an error; `None` for an answer.
fn failed(result: &FinalResult) -> Option<ApiError> {
    if matches!(
        result.status,
        TurnStatus::Completed | TurnStatus::BudgetExhausted
    ) {
        return None;
    }
    let (code, message) = match &result.failure {
        Some(failure) => (failure.kind.as_str().to_owned(), failure.message.clone()),
        None => (
            result.status.as_str().to_owned(),
            format!("the run ended {}", result.status.as_str()),
        ),
    };
    let status = match result.status {
        TurnStatus::Rejected => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Some(error(status, "server_error", &code, message))
}

fn completion(submission: &TaskSubmission, result: &FinalResult) -> Response {
    if let Some(failed) = failed(result) {
        return failed.into_response();
    }
    json_response(json!({
        "id": submission.task_id,
        "object": "chat.completion",
        "created": created(),
        "model": submission.agent,
        "choices": [ {
            "index": 0,
            "message": { "role": "assistant", "content": result.answer.clone().unwrap_or_default() },
            "finish_reason": finish_reason(result),
        } ],
        "usage": usage(result),
    }))
}

/// What the running task passes to its stream.
enum Streamed {
    Delta(String),
    Ended(Result<FinalResult, String>),
}

/// Runs the task in the background and streams its text; the run goes on if the client leaves.
fn stream(gateway: Arc<Gateway>, planned: Planned) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    let submission = planned.submission.clone();
    tokio::spawn(async move {
        let deltas = sender.clone();
        let result = gateway
            .client
            .run(&submission, gateway.run_timeout, move |event| {
                if let (EventKind::ModelDelta { text }, "lead") =
                    (&event.event, event.source.as_str())
                {
                    let _ = deltas.send(Streamed::Delta(text.clone()));
                }
            })
            .await
            .map_err(|e| e.to_string());
        let _ = sender.send(Streamed::Ended(result));
    });
    let Planned {
        submission,
        include_usage,
        ..
    } = planned;
    let chunk = move |delta: Value, finish: Option<&str>| {
        json!({
            "id": submission.task_id,
            "object": "chat.completion.chunk",
            "created": created(),
            "model": submission.agent,
            "choices": [ { "index": 0, "delta": delta, "finish_reason": finish } ],
        })
    };
    let first = futures::stream::once({
        let opening = chunk(json!({ "role": "assistant", "content": "" }), None);
        async move { opening }
    });
    let rest = tokio_stream_of(receiver).flat_map(move |item| {
        let events: Vec<Value> = match item {
            Streamed::Delta(text) => vec![chunk(json!({ "content": text }), None)],
            Streamed::Ended(Ok(result)) => match failed(&result) {
                None => {
                    let mut last = vec![chunk(json!({}), Some(finish_reason(&result)))];
                    if include_usage {
                        let mut with_usage = chunk(json!({}), None);
                        with_usage["choices"] = json!([]);
                        with_usage["usage"] = usage(&result);
                        last.push(with_usage);
                    }
                    last
                }
                Some(_) => {
                    let (code, message) = match &result.failure {
                        Some(f) => (f.kind.as_str().to_owned(), f.message.clone()),
                        None => (result.status.as_str().to_owned(), "the run ended".to_owned()),
                    };
                    vec![json!({ "error": { "message": message, "type": "server_error", "param": null, "code": code } })]
                }
            },
            Streamed::Ended(Err(e)) => vec![json!({ "error": {
                "message": format!("the run did not end in time ({e}); it keeps running"),
                "type": "server_error", "param": null, "code": "run_not_finished" } })],
        };
        futures::stream::iter(events)
    });
    let events = first
        .chain(rest)
        .map(|value| Ok::<_, Infallible>(Event::default().data(value.to_string())))
        .chain(futures::stream::once(async {
            Ok(Event::default().data("[DONE]"))
        }));
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The receiver as a stream that ends after the run's end.
fn tokio_stream_of(
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<Streamed>,
) -> impl futures::Stream<Item = Streamed> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx)).scan(false, |ended, item| {
        if *ended {
            return futures::future::ready(None);
        }
        *ended = matches!(item, Streamed::Ended(_));
        futures::future::ready(Some(item))
    })
}
