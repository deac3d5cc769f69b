//! OpenAI's Responses API: `POST /v1/responses` runs one turn of the agent its `model` names,
//! `GET /v1/responses/{id}` reads a response (streamed again from any point with
//! `stream=true&starting_after=N`, or `Last-Event-ID`), `POST /v1/responses/{id}/cancel` cancels
//! its run.
//!
//! A response is a task whose id is the response id, in a session of its own or, with
//! `previous_response_id`, in that response's session, so the agent remembers the conversation.
//! Its record (`store::responses`) keeps which session, agent and metadata it has, so any gateway
//! serves any response. Streams, live or read again, are the task's events folded by
//! [`fold::ResponseFold`]: the same events give the same sequence numbers. `background: true`
//! answers at once with the queued response; a client that goes away never stops its run (only
//! `cancel` does). A call waiting for a person ends a response at an `mcp_approval_request` item;
//! a response whose input answers it (`mcp_approval_response`) goes on with the same task
//! ([`approvals`]).

mod approvals;
mod fold;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use skein_common::protocol::message::Message;
use skein_common::protocol::{InputPart, TaskSubmission};
use skein_common::store::responses::ResponseRecord;

use self::fold::ResponseFold;
use super::follow::{self, last_of, Followed, Source};
use super::keys::{Principal, Role};
use super::request::{self, admit, error, invalid, json_response, ApiError, Content};
use super::Gateway;

/// Most metadata pairs, and the longest key and value, as OpenAI takes them.
const MAX_METADATA: usize = 16;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 512;

/// How long a cancel waits for the run to end before it answers with the response as it stands.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Deserialize)]
struct CreateRequest {
    model: String,
    input: Input,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    /// `{"format": {"type": "json_schema", "name", "schema", ...}}` holds the answer to a schema.
    #[serde(default)]
    text: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

#[derive(Debug, Deserialize)]
struct InputItem {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Content>,
    /// An `mcp_approval_response`'s answer: the request it answers, and the verdict.
    #[serde(default)]
    approval_request_id: Option<String>,
    #[serde(default)]
    approve: Option<bool>,
    #[serde(default)]
    reason: Option<String>,
}

/// What a create request asks Skein to run.
struct Planned {
    record: ResponseRecord,
    submission: TaskSubmission,
    /// The conversation before the input, for a new session.
    history: Vec<Message>,
    stream: bool,
}

pub(super) async fn create(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match create_response(gateway, headers, body).await {
        Ok(response) => response,
        Err(refused) => refused.into_response(),
    }
}

async fn create_response(
    gateway: Arc<Gateway>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (principal, body) = request::admitted_body(&gateway, &headers, body).await?;
    let request: CreateRequest = serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("the request is not a response request: {e}")))?;
    if let Some(answers) = approvals::answers_in(&request)? {
        return approvals::resume(gateway, principal, &headers, request, answers).await;
    }
    let planned = plan(&gateway, &principal, &headers, request).await?;
    // A followed run with a new id (no Idempotency-Key) cannot meet an earlier record: it is
    // recorded while the run starts, and its stream waits for the record before it names the
    // response. Otherwise the record that stands decides first.
    let waited_for_or_streamed = planned.stream || !planned.record.background;
    let followed_fresh = waited_for_or_streamed && !headers.contains_key("idempotency-key");
    let (record, recording) = if followed_fresh {
        let (store, tenant, record) = (
            gateway.store.clone(),
            principal.tenant.clone(),
            planned.record.clone(),
        );
        let recording = tokio::spawn(async move {
            store
                .put_response(&tenant, &record)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        });
        (planned.record.clone(), Some(recording))
    } else {
        let record = gateway
            .store
            .put_response(&principal.tenant, &planned.record)
            .await
            .map_err(|e| request::unavailable("the response could not be recorded", e))?;
        if record.session != planned.record.session || record.agent != planned.record.agent {
            return Err(error(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "idempotency_key_reused",
                "this Idempotency-Key was used for another request",
            ));
        }
        (record, None)
    };
    request::seed(
        &gateway,
        &principal.tenant,
        &record.session,
        &planned.history,
    )
    .await?;
    if record.background && !planned.stream {
        gateway
            .client_for(&principal)
            .submit(&planned.submission)
            .await
            .map_err(|e| request::unavailable("the run could not be submitted", e))?;
        return Ok(json_response(ResponseFold::new(record).response(None)));
    }
    // Submitted by the run itself, which listens before it submits: the events come live.
    let source = Source::Submit(Box::new(planned.submission), recording);
    if planned.stream {
        return Ok(sse(gateway, principal.tenant, record, source, None));
    }
    let last = last_of(followed(gateway, principal.tenant, record.clone(), source)).await;
    if let Some(failed) = last.as_ref().filter(|e| e["code"] == "unavailable") {
        return Err(request::unavailable(
            "the run could not be submitted",
            failed["message"].as_str().unwrap_or_default(),
        ));
    }
    Ok(json_response(response_of(last, record)))
}

/// Reads and checks a create request; names its response, task and session.
async fn plan(
    gateway: &Gateway,
    principal: &Principal,
    headers: &HeaderMap,
    request: CreateRequest,
) -> Result<Planned, ApiError> {
    request::check_agent(gateway, &request.model)?;
    if request
        .tools
        .as_ref()
        .is_some_and(|tools| !tools.is_empty())
    {
        return Err(invalid(
            "tools are not accepted: the agent runs its own tools (they appear as skein_tool_call \
             output items)",
        ));
    }
    let metadata = checked_metadata(request.metadata)?;
    let (input, images, earlier) = match request.input {
        Input::Text(text) => (text, Vec::new(), Vec::new()),
        Input::Items(items) => split_items(items)?,
    };
    let id = format!("resp_{}", request::request_id(principal, headers)?);
    let session = match &request.previous_response_id {
        Some(previous) => {
            if !earlier.is_empty() {
                return Err(invalid(
                    "with previous_response_id, send only the new user message: the earlier \
                     ones are in its session",
                ));
            }
            let found = gateway
                .store
                .response(&principal.tenant, previous)
                .await
                .map_err(|e| request::unavailable("responses could not be read", e))?;
            match found {
                Some(previous) => previous.session,
                None => return Err(no_such_response(previous)),
            }
        }
        None => id.replace('_', "-"),
    };
    let mut instructions: Vec<String> = request.instructions.clone().into_iter().collect();
    let mut history = Vec::new();
    for (role, text) in earlier {
        match role.as_str() {
            "system" | "developer" => instructions.push(text),
            "user" => history.push(Message::user(text)),
            _ => history.push(Message::assistant(text)),
        }
    }
    let input = request::with_instructions(input, &instructions);
    let submission = request::submission(
        gateway,
        principal,
        request::RunSpec {
            task_id: id.clone(),
            session: session.clone(),
            agent: request.model.clone(),
            input,
            images,
            output_schema: request::output_schema(
                request.text.as_ref().and_then(|text| text.get("format")),
                request::FormatShape::Responses,
            )?,
        },
    )?;
    let record = ResponseRecord {
        id,
        session,
        agent: request.model,
        created_at: skein_common::protocol::now_ms() / 1000,
        previous_response_id: request.previous_response_id,
        instructions: request.instructions,
        metadata,
        background: request.background,
        task_id: None,
        after_events: 0,
    };
    Ok(Planned {
        record,
        submission,
        history,
        stream: request.stream,
    })
}

/// The request's metadata, within OpenAI's limits.
fn checked_metadata(
    metadata: Option<BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let metadata = metadata.unwrap_or_default();
    if metadata.len() > MAX_METADATA
        || metadata
            .iter()
            .any(|(k, v)| k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE)
    {
        return Err(invalid(format!(
            "metadata takes at most {MAX_METADATA} pairs, keys of at most {MAX_METADATA_KEY} \
             characters and values of at most {MAX_METADATA_VALUE}"
        )));
    }
    Ok(metadata)
}

/// The `(role, text)` of the messages before the user's last.
type Earlier = Vec<(String, String)>;

/// The last user message's text and images, and the messages before it (which may show no
/// images).
fn split_items(items: Vec<InputItem>) -> Result<(String, Vec<InputPart>, Earlier), ApiError> {
    let mut messages = Vec::new();
    for item in items {
        if item.kind.as_deref().is_some_and(|kind| kind != "message") {
            return Err(invalid(format!(
                "input items of type {} are not accepted: send messages (the agent runs its own \
                 tools)",
                item.kind.unwrap_or_default()
            )));
        }
        let role = item
            .role
            .ok_or_else(|| invalid("every input message needs a role"))?;
        if !matches!(role.as_str(), "user" | "assistant" | "system" | "developer") {
            return Err(invalid(format!("unknown message role {role:?}")));
        }
        let text = item
            .content
            .as_ref()
            .map_or(Ok(String::new()), Content::text)
            .map_err(invalid)?;
        let images = item
            .content
            .as_ref()
            .map_or(Ok(Vec::new()), Content::images)
            .map_err(invalid)?;
        messages.push((role, text, images));
    }
    let last = messages.pop();
    if messages.iter().any(|(_, _, images)| !images.is_empty()) {
        return Err(invalid(
            "images are taken in the last user message only (the earlier ones are history)",
        ));
    }
    let messages = messages
        .into_iter()
        .map(|(role, text, _)| (role, text))
        .collect();
    match last {
        Some((role, text, images)) if role == "user" => Ok((text, images, messages)),
        Some(_) => Err(invalid("the last input message must be the user's")),
        None => Err(invalid("input is empty")),
    }
}

fn no_such_response(id: &str) -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "response_not_found",
        format!("no response {id:?} in this tenant"),
    )
}

#[derive(Debug, Deserialize)]
pub(super) struct ReadQuery {
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    starting_after: Option<u64>,
}

pub(super) async fn read(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    query: Result<Query<ReadQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let found = async {
        let principal = admit(&gateway, &headers, Role::Submit).await?;
        let Query(query) = query.map_err(|e| invalid(e.body_text()))?;
        let record = record_of(&gateway, &principal, &id).await?;
        Ok::<_, ApiError>((principal, record, query))
    };
    let (principal, record, query) = match found.await {
        Ok(found) => found,
        Err(refused) => return refused.into_response(),
    };
    let resume_after = query.starting_after.or_else(|| {
        headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
    });
    let ended = gateway
        .client
        .stored_final(&principal.tenant, &record.session, record.task())
        .await;
    match ended {
        Ok(ended) if query.stream => {
            // A run known to be over is read to the end of what the stream holds.
            let source = Source::Stored(ended.map(Box::new));
            sse(gateway, principal.tenant, record, source, resume_after)
        }
        // Ended: its events give its output (a stream that no longer holds them, the answer).
        Ok(Some(result)) => {
            let source = Source::Stored(Some(Box::new(result)));
            let last = last_of(followed(gateway, principal.tenant, record.clone(), source)).await;
            json_response(response_of(last, record))
        }
        Ok(None) => {
            // Stopped at a call waiting for approval: the response as it ended there.
            match crate::gateway::approvals::waiting(&gateway, &principal.tenant, record.task())
                .await
            {
                Ok(waiting) if !waiting.is_empty() => {
                    let source = Source::Stored(None);
                    let events = followed(gateway, principal.tenant, record.clone(), source);
                    json_response(response_of(last_of(events).await, record))
                }
                Ok(_) => {
                    let mut fold = ResponseFold::new(record);
                    fold.opening();
                    json_response(fold.response(None))
                }
                Err(refused) => refused.into_response(),
            }
        }
        Err(e) => request::unavailable("the run's result could not be read", e).into_response(),
    }
}

pub(super) async fn cancel(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let cancelled = async {
        let principal = admit(&gateway, &headers, Role::Submit).await?;
        let record = record_of(&gateway, &principal, &id).await?;
        let ended = gateway
            .client
            .stored_final(&principal.tenant, &record.session, record.task())
            .await
            .map_err(|e| request::unavailable("the run's result could not be read", e))?;
        if ended.is_none() {
            gateway
                .client_for(&principal)
                .cancel(
                    &principal.tenant,
                    record.task(),
                    &format!("cancelled over the Responses API by {}", principal.name),
                )
                .await
                .map_err(|e| request::unavailable("the cancel could not be sent", e))?;
        }
        let source = Source::Stored(ended.map(Box::new));
        let events = followed(gateway.clone(), principal.tenant, record.clone(), source);
        let last = tokio::time::timeout(CANCEL_WAIT, last_of(events))
            .await
            .ok()
            .flatten();
        Ok::<_, ApiError>(json_response(response_of(last, record)))
    };
    match cancelled.await {
        Ok(response) => response,
        Err(refused) => refused.into_response(),
    }
}

async fn record_of(
    gateway: &Gateway,
    principal: &Principal,
    id: &str,
) -> Result<ResponseRecord, ApiError> {
    gateway
        .store
        .response(&principal.tenant, id)
        .await
        .map_err(|e| request::unavailable("responses could not be read", e))?
        .ok_or_else(|| no_such_response(id))
}

/// The response the last stream event carries, or the record's as it stands.
fn response_of(last: Option<Value>, record: ResponseRecord) -> Value {
    match last {
        Some(mut event) if event.get("response").is_some() => event["response"].take(),
        _ => {
            let mut fold = ResponseFold::new(record);
            fold.opening();
            fold.response(None)
        }
    }
}

/// The response's stream events from its task's events ([`follow::followed`] with a
/// [`ResponseFold`]), ending with its end — or, when the run does not end within the gateway's run
/// timeout, an `error` event (the run goes on); when it could not be submitted, an `error` event
/// with code `unavailable`.
fn followed(
    gateway: Arc<Gateway>,
    tenant: String,
    record: ResponseRecord,
    source: Source,
) -> impl futures::Stream<Item = Value> + Send + 'static {
    let run = Followed {
        tenant,
        session: record.session.clone(),
        task_id: record.task().to_owned(),
    };
    follow::followed(gateway, run, source, ResponseFold::new(record))
}

/// The response's stream as SSE, each event named by its type, its id its sequence number;
/// events up to `resume_after` are left out.
fn sse(
    gateway: Arc<Gateway>,
    tenant: String,
    record: ResponseRecord,
    source: Source,
    resume_after: Option<u64>,
) -> Response {
    let events = followed(gateway, tenant, record, source)
        .filter(move |value| {
            let seen = match (resume_after, value["sequence_number"].as_u64()) {
                (Some(after), Some(n)) => n <= after,
                _ => false,
            };
            futures::future::ready(!seen)
        })
        .map(|value| {
            let mut event = Event::default()
                .event(value["type"].as_str().unwrap_or("message"))
                .data(value.to_string());
            if let Some(n) = value["sequence_number"].as_u64() {
                event = event.id(n.to_string());
            }
            Ok::<_, Infallible>(event)
        });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
