//! A2A over JSON-RPC, protocol 1.0 and 0.3: the agent card at `/.well-known/agent-card.json` (and
//! the older `/.well-known/agent.json`) lists the agents as skills; `POST /a2a` takes 1.0's
//! `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`, `SubscribeToTask` and their 0.3
//! names `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`, `tasks/resubscribe`. A
//! request is answered in its method's version ([`shapes`]: 1.0's protobuf JSON, or 0.3's `kind`ed
//! objects); a message is read in either.
//!
//! A message's `contextId` is the session (a new one when absent), its task is a Skein task
//! (recorded like a response, `store::responses`, ids `a2a-…`, so any gateway finds it), and the
//! agent is the skill its `metadata.skill` names, else the catalog's first. A message runs its
//! task to its next stop ([`stops`]): the run's end, or calls waiting for a person's approval,
//! which is `input-required` with a message naming the calls. A message with the `taskId` of a
//! task that waits is the answer — `approve`/`yes` or `deny`/`no`, a reason may follow — sent as
//! the caller's decision on every waiting call (`approvals::answer`, so the key needs the
//! `approve` role), and the task goes on to its next stop. `SendMessage` answers with the task
//! there (at once, submitted, with `configuration.returnImmediately`, 0.3's `blocking: false`):
//! its state, the answer as an artifact and as the status message. `SendStreamingMessage` answers
//! with SSE: the task, `working`, the lead's text as artifact updates, the stop's status; the text
//! of a model attempt discarded for a retry (`output_discarded`) is taken back by sending the
//! artifact again whole without it (`append: false`).
//! `SubscribeToTask` replays a task's events from its first one the same way, live on to its stop.
//! `GetTask` reads the state: waiting (`input-required`), ended, else working.
//!
//! Errors are JSON-RPC errors: A2A's `TaskNotFound` (-32001) for an id of no A2A task of the
//! caller's tenant, `UnsupportedOperation` (-32004) for a message to a task that waits for
//! nothing, the gateway's refusals (an answer without the `approve` role, say) as invalid params
//! with their message.

mod shapes;
mod stops;

use std::collections::BTreeSet;
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
use skein_common::protocol::{EventKind, TaskSubmission, TurnEvent};
use skein_common::store::responses::ResponseRecord;

use super::approvals::{self, Answer, Verdict};
use super::keys::Principal;
use super::request::{self, json_response, ApiError};
use super::Gateway;
use shapes::{Dialect, Reply, State as TaskState};
use stops::{CallKey, Follower, Since, Step, Stop};

/// The protocol versions the card announces, the current first.
const PROTOCOLS: [&str; 2] = ["1.0", "0.3"];

// JSON-RPC and A2A error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;
const UNSUPPORTED_OPERATION: i64 = -32004;

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
    let interfaces: Vec<Value> = PROTOCOLS
        .iter()
        .map(|version| json!({ "url": format!("http://{host}/a2a"), "protocolBinding": "JSONRPC", "protocolVersion": version }))
        .collect();
    json_response(json!({
        "name": "Skein",
        "description": "Skein's agents; name one as a message's metadata.skill (else the first skill runs).",
        "supportedInterfaces": interfaces,
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": { "streaming": true, "pushNotifications": false },
        "securitySchemes": { "key": { "httpAuthSecurityScheme": { "scheme": "bearer" } } },
        "securityRequirements": [ { "schemes": { "key": { "list": [] } } } ],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    }))
}

/// A JSON-RPC failure.
#[derive(Debug)]
pub(super) struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub(super) fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> Self {
        RpcError::invalid(e.message())
    }
}

fn unavailable(e: impl std::fmt::Display) -> RpcError {
    RpcError::internal(e.to_string())
}

fn rpc_error(id: &Value, error: RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": error.code, "message": error.message } })
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Send,
    Stream,
    Get,
    Cancel,
    Subscribe,
}

/// A method's name, in either version.
fn method(name: &str) -> Option<(Method, Dialect)> {
    Some(match name {
        "SendMessage" => (Method::Send, Dialect::V1),
        "message/send" => (Method::Send, Dialect::V03),
        "SendStreamingMessage" => (Method::Stream, Dialect::V1),
        "message/stream" => (Method::Stream, Dialect::V03),
        "GetTask" => (Method::Get, Dialect::V1),
        "tasks/get" => (Method::Get, Dialect::V03),
        "CancelTask" => (Method::Cancel, Dialect::V1),
        "tasks/cancel" => (Method::Cancel, Dialect::V03),
        "SubscribeToTask" => (Method::Subscribe, Dialect::V1),
        "tasks/resubscribe" => (Method::Subscribe, Dialect::V03),
        _ => return None,
    })
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
            let error = RpcError::new(PARSE_ERROR, format!("the body is not JSON: {e}"));
            return json_response(rpc_error(&Value::Null, error));
        }
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let (Some(name), Some(params)) = (
        request.get("method").and_then(Value::as_str),
        request.get("params"),
    ) else {
        let error = RpcError::new(
            INVALID_REQUEST,
            "a JSON-RPC 2.0 request needs a method and params",
        );
        return json_response(rpc_error(&id, error));
    };
    let Some((method, dialect)) = method(name) else {
        let error = RpcError::new(
            METHOD_NOT_FOUND,
            format!(
                "{name} is not served: SendMessage, SendStreamingMessage, GetTask, CancelTask, \
                 SubscribeToTask (A2A 1.0); message/send, message/stream, tasks/get, tasks/cancel, \
                 tasks/resubscribe (A2A 0.3)"
            ),
        );
        return json_response(rpc_error(&id, error));
    };
    let answered = match method {
        Method::Send => send(&gateway, &principal, params, dialect).await,
        Method::Stream => match begin(&gateway, &principal, params, true).await {
            Ok(Begun::Following(opened)) => return stream(id, dialect, *opened),
            Ok(Begun::Submitted(record)) => Ok(submitted(&record, dialect)),
            Err(e) => Err(e),
        },
        Method::Subscribe => match subscribe(&gateway, &principal, params).await {
            Ok(opened) => return stream(id, dialect, opened),
            Err(e) => Err(e),
        },
        Method::Get => get(&gateway, &principal, params)
            .await
            .map(|task| shapes::reply(dialect, Reply::Task, task)),
        Method::Cancel => cancel(&gateway, &principal, params)
            .await
            .map(|task| shapes::reply(dialect, Reply::Task, task)),
    };
    json_response(match answered {
        Ok(result) => rpc_result(&id, result),
        Err(error) => rpc_error(&id, error),
    })
}

/// A task followed to its next stop, with what a stream of it sends first.
struct Opened {
    record: ResponseRecord,
    opening: Vec<(Reply, Value)>,
    follower: Follower,
}

/// What a message began.
enum Begun {
    /// A new task, submitted and not waited for (`returnImmediately`).
    Submitted(ResponseRecord),
    /// A new task, or one the message answered, followed.
    Following(Box<Opened>),
}

/// Reads a message: the answer to the task it names, or a new task, recorded and submitted.
async fn begin(
    gateway: &Arc<Gateway>,
    principal: &Principal,
    params: &Value,
    streaming: bool,
) -> Result<Begun, RpcError> {
    let incoming = shapes::incoming(params)?;
    let tenant = principal.tenant.as_str();
    if let Some(task_id) = &incoming.task_id {
        let record = record_of(gateway, principal, task_id).await?;
        let answered = answer(gateway, principal, &record, &incoming).await?;
        let follower = Follower::start(
            gateway.clone(),
            tenant,
            &record.session,
            &record.id,
            Since::Now,
            answered,
        )
        .await?;
        let opening = vec![(
            Reply::SentTask,
            shapes::plain_task(&record, TaskState::Working),
        )];
        return Ok(Begun::Following(Box::new(Opened {
            record,
            opening,
            follower,
        })));
    }
    let (record, submission) = start(gateway, principal, &incoming).await?;
    if incoming.return_immediately && !streaming {
        gateway
            .client_for(principal)
            .submit(&submission)
            .await
            .map_err(unavailable)?;
        return Ok(Begun::Submitted(record));
    }
    // Read from the task's first event: none is missed, whenever the run starts.
    let follower = Follower::start(
        gateway.clone(),
        tenant,
        &record.session,
        &record.id,
        Since::Start,
        BTreeSet::new(),
    )
    .await?;
    gateway
        .client_for(principal)
        .submit(&submission)
        .await
        .map_err(unavailable)?;
    let working = shapes::status_update(&record, shapes::status(TaskState::Working, None));
    let opening = vec![
        (
            Reply::SentTask,
            shapes::plain_task(&record, TaskState::Submitted),
        ),
        (Reply::Status { last: false }, working),
    ];
    Ok(Begun::Following(Box::new(Opened {
        record,
        opening,
        follower,
    })))
}

/// Records a new task of `incoming` and names its submission.
async fn start(
    gateway: &Gateway,
    principal: &Principal,
    incoming: &shapes::Incoming,
) -> Result<(ResponseRecord, TaskSubmission), RpcError> {
    let agent = match &incoming.skill {
        Some(skill) => {
            request::check_agent(gateway, skill)?;
            skill.clone()
        }
        None => gateway
            .agents
            .names()
            .next()
            .ok_or_else(|| unavailable("the cluster has no agent"))?
            .to_owned(),
    };
    let id = format!("a2a-{}", uuid::Uuid::new_v4().simple());
    let session = match &incoming.context_id {
        Some(context) => context.clone(),
        None => format!("a2a-ctx-{}", uuid::Uuid::new_v4().simple()),
    };
    let submission = request::submission(
        gateway,
        principal,
        request::RunSpec {
            task_id: id.clone(),
            session: session.clone(),
            agent: agent.clone(),
            input: incoming.text.clone(),
            images: Vec::new(),
            output_schema: None,
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
        background: incoming.return_immediately,
        task_id: None,
        after_events: 0,
    };
    gateway
        .store
        .put_response(&principal.tenant, &record)
        .await
        .map_err(unavailable)?;
    Ok((record, submission))
}

/// Sends `incoming`'s answer to the calls task `record` waits on, as `principal`'s decision on
/// every one; returns the calls answered.
async fn answer(
    gateway: &Gateway,
    principal: &Principal,
    record: &ResponseRecord,
    incoming: &shapes::Incoming,
) -> Result<BTreeSet<CallKey>, RpcError> {
    if incoming
        .context_id
        .as_ref()
        .is_some_and(|context| *context != record.session)
    {
        return Err(RpcError::invalid(format!(
            "task {} is of context {}, not {}",
            record.id,
            record.session,
            incoming.context_id.as_deref().unwrap_or_default()
        )));
    }
    let requests = approvals::waiting(gateway, &principal.tenant, &record.id).await?;
    let waiting = stops::unanswered(&requests);
    if waiting.is_empty() {
        return Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            format!(
                "task {} waits for no input (it is running or has ended); send a message \
                 without a taskId to start a new task in its context {}",
                record.id, record.session
            ),
        ));
    }
    let Some(verdict) = verdict(&incoming.text) else {
        let tools: Vec<&str> = waiting.values().map(|c| c.tool.as_str()).collect();
        return Err(RpcError::invalid(format!(
            "task {} waits for approval of {}: answer \"approve\" or \"deny\" (a reason may \
             follow)",
            record.id,
            tools.join(", ")
        )));
    };
    approvals::answer(gateway, principal, &record.id, &Answer::All(verdict)).await?;
    Ok(waiting.into_keys().collect())
}

/// The verdict of an answer: its first word `approve` (`approved`, `yes`) or `deny` (`denied`,
/// `no`), in any case, with trailing punctuation; the rest is the reason.
fn verdict(text: &str) -> Option<Verdict> {
    let text = text.trim();
    let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let approve = match word
        .trim_end_matches(['.', ',', ':', ';', '!'])
        .to_ascii_lowercase()
        .as_str()
    {
        "approve" | "approved" | "yes" => true,
        "deny" | "denied" | "no" => false,
        _ => return None,
    };
    let reason = rest.trim_start_matches([':', '-', ',', ' ']).trim();
    Some(Verdict {
        approve,
        reason: reason.to_owned(),
    })
}

/// The status a task stopped in: ended, waiting (`input-required`), or still running.
fn stopped_status(record: &ResponseRecord, stop: &Stop) -> Value {
    match stop {
        Stop::Ended(result) => shapes::ended_status(record, result),
        Stop::Waiting(calls) => shapes::input_required(record, calls),
        Stop::Running(why) => {
            let text = format!(
                "The task is still running ({why}); GetTask or SubscribeToTask reads it on."
            );
            let message = shapes::agent_message(record, "running", &text);
            shapes::status(TaskState::Working, Some(message))
        }
    }
}

fn stopped_task(record: &ResponseRecord, stop: &Stop) -> Value {
    match stop {
        Stop::Ended(result) => shapes::ended_task(record, result),
        _ => shapes::task(record, stopped_status(record, stop), None),
    }
}

fn submitted(record: &ResponseRecord, dialect: Dialect) -> Value {
    let task = shapes::plain_task(record, TaskState::Submitted);
    shapes::reply(dialect, Reply::SentTask, task)
}

async fn send(
    gateway: &Arc<Gateway>,
    principal: &Principal,
    params: &Value,
    dialect: Dialect,
) -> Result<Value, RpcError> {
    match begin(gateway, principal, params, false).await? {
        Begun::Submitted(record) => Ok(submitted(&record, dialect)),
        Begun::Following(mut opened) => {
            let stop = opened.follower.stop().await;
            let task = stopped_task(&opened.record, &stop);
            Ok(shapes::reply(dialect, Reply::SentTask, task))
        }
    }
}

/// The A2A task `params.id` names, of the caller's tenant.
async fn task_of(
    gateway: &Gateway,
    principal: &Principal,
    params: &Value,
) -> Result<ResponseRecord, RpcError> {
    let id = params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid("params.id is missing"))?;
    record_of(gateway, principal, id).await
}

async fn record_of(
    gateway: &Gateway,
    principal: &Principal,
    id: &str,
) -> Result<ResponseRecord, RpcError> {
    gateway
        .store
        .response(&principal.tenant, id)
        .await
        .map_err(unavailable)?
        .filter(|record| record.id.starts_with("a2a-"))
        .ok_or_else(|| RpcError::new(TASK_NOT_FOUND, format!("no task {id:?}")))
}

async fn get(gateway: &Gateway, principal: &Principal, params: &Value) -> Result<Value, RpcError> {
    let record = task_of(gateway, principal, params).await?;
    let requests = approvals::waiting(gateway, &principal.tenant, &record.id).await?;
    let waiting: Vec<_> = stops::unanswered(&requests).into_values().collect();
    if !waiting.is_empty() {
        let status = shapes::input_required(&record, &waiting);
        return Ok(shapes::task(&record, status, None));
    }
    let ended = gateway
        .client
        .stored_final(&principal.tenant, &record.session, &record.id)
        .await
        .map_err(unavailable)?;
    Ok(match ended {
        Some(result) => shapes::ended_task(&record, &result),
        None => shapes::plain_task(&record, TaskState::Working),
    })
}

async fn cancel(
    gateway: &Gateway,
    principal: &Principal,
    params: &Value,
) -> Result<Value, RpcError> {
    let record = task_of(gateway, principal, params).await?;
    let reason = format!("cancelled over A2A by {}", principal.name);
    gateway
        .client_for(principal)
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
            return Ok(shapes::ended_task(&record, &result));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(shapes::plain_task(&record, TaskState::Working))
}

/// `SubscribeToTask`: the task, read from its first event.
async fn subscribe(
    gateway: &Arc<Gateway>,
    principal: &Principal,
    params: &Value,
) -> Result<Opened, RpcError> {
    let record = task_of(gateway, principal, params).await?;
    let follower = Follower::start(
        gateway.clone(),
        &principal.tenant,
        &record.session,
        &record.id,
        Since::Start,
        BTreeSet::new(),
    )
    .await?;
    let opening = vec![(
        Reply::SentTask,
        shapes::plain_task(&record, TaskState::Working),
    )];
    Ok(Opened {
        record,
        opening,
        follower,
    })
}

/// The answer artifact as a stream has sent it: the lead's text, appended piece by piece. When a
/// model attempt that streamed text fails and is made again (`output_discarded`), the artifact is
/// sent again whole (`append: false`, which replaces it) without that attempt's text.
#[derive(Debug, Default)]
struct AnswerArtifact {
    text: String,
    /// Where the text of the model call under way begins in `text`.
    call_start: usize,
    /// Whether the artifact was sent (later pieces are appended to it).
    sent: bool,
}

impl AnswerArtifact {
    /// The artifact update `event` makes, if any: its text and whether it is appended.
    fn update(&mut self, event: &TurnEvent) -> Option<(String, bool)> {
        if event.source != "lead" {
            return None;
        }
        match &event.event {
            EventKind::ModelDelta { text } => {
                self.text.push_str(text);
                let append = std::mem::replace(&mut self.sent, true);
                Some((text.clone(), append))
            }
            EventKind::ReasoningDelta { .. } => None,
            EventKind::OutputDiscarded { .. } => {
                if self.text.len() == self.call_start {
                    return None;
                }
                self.text.truncate(self.call_start);
                Some((self.text.clone(), false))
            }
            _ => {
                self.call_start = self.text.len();
                None
            }
        }
    }
}

/// An opened task as SSE, each event a JSON-RPC result: the opening, the lead's text as artifact
/// updates, the stop's status (the last). A client that goes away stops the reading, not the
/// task.
fn stream(id: Value, dialect: Dialect, opened: Opened) -> Response {
    let Opened {
        record,
        opening,
        follower,
    } = opened;
    let opening = futures::stream::iter(
        opening
            .into_iter()
            .map(move |(what, value)| shapes::reply(dialect, what, value)),
    );
    let updates = futures::stream::unfold(
        (follower, record, AnswerArtifact::default()),
        move |(mut follower, record, mut answer)| async move {
            loop {
                let update = match follower.next().await? {
                    Step::Event(event) => match answer.update(&event) {
                        Some((text, append)) => {
                            let update = shapes::answer_update(&record, &text, append);
                            shapes::reply(dialect, Reply::Artifact, update)
                        }
                        None => continue,
                    },
                    Step::Stopped(stop) => {
                        let status = stopped_status(&record, &stop);
                        let update = shapes::status_update(&record, status);
                        shapes::reply(dialect, Reply::Status { last: true }, update)
                    }
                };
                return Some((update, (follower, record, answer)));
            }
        },
    );
    let events = opening.chain(updates).map(move |result| {
        Ok::<_, Infallible>(Event::default().data(rpc_result(&id, result).to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_discarded_attempts_text_is_taken_out_of_the_answer_artifact() {
        use skein_common::protocol::{Failure, PROTOCOL_VERSION};
        let event = |source: &str, kind: EventKind| TurnEvent {
            v: PROTOCOL_VERSION,
            task_id: "task".into(),
            source: source.into(),
            seq: 0,
            at_ms: 0,
            event: kind,
        };
        let delta = |text: &str| {
            event(
                "lead",
                EventKind::ModelDelta {
                    text: text.to_owned(),
                },
            )
        };
        let discarded = || {
            event(
                "lead",
                EventKind::OutputDiscarded {
                    failure: Failure::new(
                        skein_common::protocol::FailureKind::ModelFailed,
                        "stream broke",
                    ),
                },
            )
        };
        let events = [
            delta("Let me look. "),
            event("lead", EventKind::Resumed {}),
            delta("The answer"),
            delta(" is"),
            discarded(),
            // Nothing streamed since: nothing to take back.
            discarded(),
            delta("42."),
        ];
        let mut answer = AnswerArtifact::default();
        let updates: Vec<(String, bool)> = events.iter().filter_map(|e| answer.update(e)).collect();
        let expected = [
            ("Let me look. ", false),
            ("The answer", true),
            (" is", true),
            ("Let me look. ", false),
            ("42.", true),
        ];
        assert_eq!(
            updates,
            expected.map(|(text, append)| (text.to_owned(), append))
        );
    }

    #[test]
    fn both_versions_name_every_method() {
        for (v1, v03, what) in [
            ("SendMessage", "message/send", Method::Send),
            ("SendStreamingMessage", "message/stream", Method::Stream),
            ("GetTask", "tasks/get", Method::Get),
            ("CancelTask", "tasks/cancel", Method::Cancel),
            ("SubscribeToTask", "tasks/resubscribe", Method::Subscribe),
        ] {
            assert_eq!(method(v1), Some((what, Dialect::V1)));
            assert_eq!(method(v03), Some((what, Dialect::V03)));
        }
        assert_eq!(method("tasks/list"), None);
    }

    #[test]
    fn an_answer_reads_its_verdict_and_reason() {
        let read = |text: &str| verdict(text).map(|v| (v.approve, v.reason));
        assert_eq!(read("approve"), Some((true, String::new())));
        assert_eq!(read("  Yes, go ahead "), Some((true, "go ahead".into())));
        assert_eq!(read("Approved."), Some((true, String::new())));
        assert_eq!(
            read("deny: not on a Friday"),
            Some((false, "not on a Friday".into()))
        );
        assert_eq!(read("no - too risky"), Some((false, "too risky".into())));
        assert_eq!(read("DENIED"), Some((false, String::new())));
        assert_eq!(read("maybe later"), None);
        assert_eq!(read("approvement"), None);
        assert_eq!(read(""), None);
    }
}
