//! The OpenAI-compatible surface: `GET /v1/models` lists the agents, `POST /v1/chat/completions`
//! runs one turn of the agent its `model` names. Chat Completions is stateless, so each request
//! gets a session of its own, seeded in Redis with the conversation before its last user message
//! (system and developer messages become the caller's instructions at the head of the input);
//! the last user message is the task's input. Streamed (`"stream": true`), the model's text of
//! the turn goes out as `chat.completion.chunk` events, then a chunk with the finish reason, the
//! usage when `stream_options.include_usage` asks for it, and `data: [DONE]`. A client that goes
//! away does not stop its run.
//!
//! Chunks cannot take text back. When a model attempt that streamed text fails and is made again,
//! or a structured answer that does not match its schema is asked to be repaired
//! (`output_discarded`), the stream marks it: a chunk whose content is [`DISCARDED_MARK`], a
//! visible note that the text before it is not kept, carrying `skein_output_discarded` (the
//! failure) for a client that knows to cut its text there; the retried text follows. The
//! non-streamed answer holds the answering attempt's text only (and so does the session, for a
//! retried attempt; a repaired structured answer leaves the one that failed and the repair
//! request in it).
//!
//! `Idempotency-Key` makes a retried request the same task (and session): the run is not started
//! twice, and the retry gets the same answer.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use skein_common::protocol::message::Message;
use skein_common::protocol::{
    EventKind, FinalResult, InputPart, TaskSubmission, TurnEvent, TurnStatus,
};

use super::keys::{Principal, Role};
use super::request::{self, admit, error, invalid, json_response, ApiError, Content};
use super::Gateway;

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    /// `{"type": "json_schema", "json_schema": {...}}` holds the answer to a schema.
    #[serde(default)]
    response_format: Option<Value>,
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

pub(super) async fn models(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(refused) = admit(&gateway, &headers, Role::Submit).await {
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
    let (principal, body) = match request::admitted_body(&gateway, &headers, body).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused.into_response(),
    };
    let planned = match plan(&gateway, &principal, &headers, &body) {
        Ok(planned) => planned,
        Err(refused) => return refused.into_response(),
    };
    let (tenant, session) = (&planned.submission.tenant, &planned.submission.session);
    if let Err(refused) = request::seed(&gateway, tenant, session, &planned.history).await {
        return refused.into_response();
    }
    if planned.stream {
        match resumed_after(&headers) {
            Ok(after) => stream(gateway, planned, after),
            Err(refused) => refused.into_response(),
        }
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
    request::check_agent(gateway, &request.model)?;
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
    let images_of = |message: &ChatMessage| -> Result<Vec<InputPart>, ApiError> {
        message
            .content
            .as_ref()
            .map_or(Ok(Vec::new()), Content::images)
            .map_err(invalid)
    };
    let mut instructions = Vec::new();
    let mut history = Vec::new();
    for message in earlier {
        let text = text_of(message)?;
        if !images_of(message)?.is_empty() {
            return Err(invalid(
                "images are taken in the last user message only (the earlier ones are history)",
            ));
        }
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
    let input = request::with_instructions(text_of(last)?, &instructions);
    let id = request::request_id(principal, headers)?;
    let submission = request::submission(
        gateway,
        principal,
        request::RunSpec {
            task_id: format!("chatcmpl-{id}"),
            session: format!("chat-{id}"),
            agent: request.model,
            input,
            images: images_of(last)?,
            output_schema: request::output_schema(
                request.response_format.as_ref(),
                request::FormatShape::Chat,
            )?,
        },
    )?;
    Ok(Planned {
        submission,
        history,
        stream: request.stream,
        include_usage: request.stream_options.is_some_and(|o| o.include_usage),
    })
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

/// The text a streamed completion shows where a model attempt's streamed text was discarded.
pub(crate) const DISCARDED_MARK: &str =
    "\n[output discarded: the model's answer so far is not kept, and it was asked again]\n";

/// What the running task passes to its stream.
#[derive(Debug, PartialEq)]
enum Streamed {
    Delta(String),
    /// The text since the model call began was a failed attempt's (its failure).
    Discarded(Value),
    /// Boxed: a final result is large, and the deltas before it many.
    Ended(Box<Result<FinalResult, String>>),
}

/// Picks the lead's text out of a task's events, and the discards of text already streamed.
#[derive(Debug, Default)]
struct LeadText {
    /// Whether text of the model call under way was streamed since it began or was discarded.
    streamed: bool,
}

impl LeadText {
    fn pick(&mut self, event: &TurnEvent) -> Option<Streamed> {
        if event.source != "lead" {
            return None;
        }
        match &event.event {
            EventKind::ModelDelta { text } => {
                self.streamed = true;
                Some(Streamed::Delta(text.clone()))
            }
            EventKind::ReasoningDelta { .. } => None,
            EventKind::OutputDiscarded { failure } => std::mem::take(&mut self.streamed)
                .then(|| Streamed::Discarded(json!({ "failure": failure }))),
            _ => {
                self.streamed = false;
                None
            }
        }
    }
}

/// The chunk a retried streamed request resumes after (`Last-Event-ID`), which names a chunk of
/// the same run only with the `Idempotency-Key` of the request that started it.
fn resumed_after(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(last) = headers.get("last-event-id") else {
        return Ok(None);
    };
    if !headers.contains_key("idempotency-key") {
        return Err(request::invalid(
            "Last-Event-ID resumes a stream only with the Idempotency-Key of the request that \
             started it",
        ));
    }
    last.to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| request::invalid("Last-Event-ID names a chunk by its number"))
}

/// Runs the task in the background and streams its text, each chunk numbered (its SSE id) so a
/// retry with the same `Idempotency-Key` and the `Last-Event-ID` it saw resumes after it: the
/// same run's events give the same chunks. The run goes on if the client leaves.
fn stream(gateway: Arc<Gateway>, planned: Planned, resume_after: Option<u64>) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    let submission = planned.submission.clone();
    tokio::spawn(async move {
        let deltas = sender.clone();
        let mut text = LeadText::default();
        let result = gateway
            .client
            .run(&submission, gateway.run_timeout, move |event| {
                if let Some(streamed) = text.pick(event) {
                    let _ = deltas.send(streamed);
                }
            })
            .await
            .map_err(|e| e.to_string());
        let _ = sender.send(Streamed::Ended(Box::new(result)));
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
            Streamed::Discarded(why) => {
                let mut mark = chunk(json!({ "content": DISCARDED_MARK }), None);
                mark["skein_output_discarded"] = why;
                vec![mark]
            }
            Streamed::Ended(ended) => match *ended {
                Ok(result) => match failed(&result) {
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
                Err(e) => vec![json!({ "error": {
                    "message": format!("the run did not end in time ({e}); it keeps running"),
                    "type": "server_error", "param": null, "code": "run_not_finished" } })],
            },
        };
        futures::stream::iter(events)
    });
    let events = first
        .chain(rest)
        .zip(futures::stream::iter(1u64..))
        .filter(move |(_, n)| futures::future::ready(resume_after.is_none_or(|after| *n > after)))
        .map(|(value, n)| {
            Ok::<_, Infallible>(Event::default().id(n.to_string()).data(value.to_string()))
        })
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

#[cfg(test)]
mod tests {
    use skein_common::protocol::{Failure, FailureKind, PROTOCOL_VERSION};

    use super::*;

    fn event(source: &str, kind: EventKind) -> TurnEvent {
        TurnEvent {
            v: PROTOCOL_VERSION,
            task_id: "task".into(),
            source: source.into(),
            seq: 0,
            at_ms: 0,
            event: kind,
        }
    }

    #[test]
    fn a_discard_of_streamed_text_is_marked_once_and_only_after_text() {
        let failure = Failure::new(FailureKind::ModelFailed, "stream broke");
        let discarded = || {
            event(
                "lead",
                EventKind::OutputDiscarded {
                    failure: failure.clone(),
                },
            )
        };
        let delta = |source: &str, text: &str| {
            event(
                source,
                EventKind::ModelDelta {
                    text: text.to_owned(),
                },
            )
        };
        let events = [
            // A discard of reasoning alone: no text of the completion to mark.
            event("lead", EventKind::ReasoningDelta { text: "hmm".into() }),
            discarded(),
            delta("subagent:c1", "not the lead's"),
            delta("lead", "The answer is"),
            discarded(),
            delta("lead", "42."),
        ];
        let mut text = LeadText::default();
        let picked: Vec<Streamed> = events.iter().filter_map(|e| text.pick(e)).collect();
        assert_eq!(
            picked,
            [
                Streamed::Delta("The answer is".into()),
                Streamed::Discarded(json!({ "failure": failure })),
                Streamed::Delta("42.".into()),
            ]
        );
    }
}
