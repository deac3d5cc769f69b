//! One run in the console, and what a person does to it: starting a run (`submit` role); a run
//! as it stands — its agent, session and status, the tree of its runs (the turn and every
//! subagent under it, with the process that ran each and its tokens), its final result with
//! tokens and cost, its turn's place in its session (the fork points) and a link to its trace
//! in Jaeger (`SKEIN_JAEGER_URL`); and its actions by role: cancel, pause and resume (`operate`),
//! steer, fork from a step and replay (`submit`). A replay runs the turn's input again in a fork
//! made just before it, its calls answered from the record (no side effect repeated).
//!
//! Everything is read from the task's events and the session's records; a run's events up to
//! now are read once per request with an ordered consumer bounded by their count.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use skein_common::protocol::{
    now_ms, validate_token, ControlAction, EventKind, ReplayOf, RunControl, TurnEvent,
    PROTOCOL_VERSION,
};
use skein_common::store::history::{ForkError, ForkPoint, TurnRecord};
use skein_common::workspace::SessionRef;

use super::super::keys::{Principal, Role};
use super::super::request::{self, json_response, ApiError, RunSpec};
use super::super::Gateway;
use super::outcome;

/// Longest a run's events so far take to read.
const READ_EVENTS: Duration = Duration::from_secs(10);

/// How a run is named in its session: its agent, session and first event's instant.
struct Started {
    agent: String,
    session: String,
    at_ms: u64,
}

/// Reads a JSON body of type `T`, `{}` when empty; `shape` says what it should be.
fn json_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    shape: &str,
) -> Result<T, ApiError> {
    let body = request::body(body)?;
    let body: &[u8] = if body.is_empty() { b"{}" } else { &body };
    serde_json::from_slice(body).map_err(|e| request::invalid(format!("{shape}: {e}")))
}

/// The run's first event (its start), or 404 when the events stream holds none.
async fn started(gateway: &Gateway, tenant: &str, task_id: &str) -> Result<Started, ApiError> {
    validate_token("task_id", task_id).map_err(|f| request::invalid(f.message))?;
    let first = gateway
        .client
        .bus()
        .first_event(tenant, task_id)
        .await
        .map_err(|e| request::unavailable("the run could not be read", e))?;
    match first {
        Some((
            _,
            TurnEvent {
                at_ms,
                event: EventKind::TurnStarted { agent, session, .. },
                ..
            },
        )) => Ok(Started {
            agent,
            session,
            at_ms,
        }),
        Some((_, TurnEvent { at_ms, event, .. })) => match event {
            EventKind::Final { result } => Ok(Started {
                agent: String::new(),
                session: result.session,
                at_ms,
            }),
            _ => Err(request::not_found(format!(
                "run {task_id} has not started its turn"
            ))),
        },
        None => Err(request::not_found(format!(
            "no run {task_id} (not started yet, unknown, or older than the events stream keeps)"
        ))),
    }
}

/// The run's events so far, in order.
async fn events_so_far(
    gateway: &Gateway,
    tenant: &str,
    task_id: &str,
) -> Result<Vec<TurnEvent>, ApiError> {
    fn unreadable(e: impl std::fmt::Display) -> ApiError {
        request::unavailable("the run's events could not be read", e)
    }
    let bus = gateway.client.bus();
    let count = bus.event_count(tenant, task_id).await.map_err(unreadable)?;
    let messages = bus.replay(tenant, task_id).await.map_err(unreadable)?;
    let read = messages
        .take(count as usize)
        .map(|message| {
            let message = message.map_err(|e| e.to_string())?;
            bus.decode::<TurnEvent>(&message.payload)
                .map_err(|e| e.to_string())
        })
        .collect::<Vec<_>>();
    let read = tokio::time::timeout(READ_EVENTS, read)
        .await
        .map_err(|_| unreadable(format!("not read within {READ_EVENTS:?}")))?;
    read.into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)
}

/// The record of the run's turn in its session, once the turn ended and kept its messages.
async fn turn_of(
    gateway: &Gateway,
    tenant: &str,
    session: &str,
    task_id: &str,
) -> Result<Option<TurnRecord>, ApiError> {
    if validate_token("session", session).is_err() {
        return Ok(None);
    }
    let records = gateway
        .store
        .turn_records(tenant, session)
        .await
        .map_err(|e| request::unavailable("the session's records could not be read", e))?;
    Ok(records.into_iter().find(|r| r.task_id == task_id))
}

/// `GET /console/api/runs/{task_id}`: the run as it stands.
pub(super) async fn show(
    State(gateway): State<Arc<Gateway>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let tenant = principal.tenant.as_str();
            let started = started(&gateway, tenant, &task_id).await?;
            // The status first: a final result it finds is then in the events or the store.
            let status =
                super::runs::status_of(&gateway, tenant, &started.session, &task_id).await?;
            let events = events_so_far(&gateway, tenant, &task_id).await?;
            let tree = skein_common::runs::tree(&events);
            let ended = match events.iter().rev().find_map(|e| match &e.event {
                EventKind::Final { result } => Some(result.clone()),
                _ => None,
            }) {
                Some(ended) => Some(ended),
                // Stored just before its event is published.
                None if validate_token("session", &started.session).is_ok() => gateway
                    .store
                    .final_result(tenant, &started.session, &task_id)
                    .await
                    .map_err(|e| request::unavailable("the run could not be read", e))?,
                None => None,
            };
            let trace_id = ended.as_ref().and_then(|r| r.trace_id.clone()).or_else(|| {
                events.iter().find_map(|e| match &e.event {
                    EventKind::TurnStarted { trace_id, .. } => trace_id.clone(),
                    _ => None,
                })
            });
            let trace_url = match (&gateway.jaeger_url, &trace_id) {
                (Some(base), Some(id)) => {
                    Some(format!("{}/trace/{id}", base.trim_end_matches('/')))
                }
                _ => None,
            };
            let turn = turn_of(&gateway, tenant, &started.session, &task_id).await?;
            Ok(json_response(json!({
                "task_id": task_id,
                "agent": started.agent,
                "session": started.session,
                "started_at_ms": started.at_ms,
                "status": status,
                "events": events.len(),
                "tree": tree,
                "final": ended,
                "trace_id": trace_id,
                "trace_url": trace_url,
                "turn": turn.as_ref().map(|r| json!({
                    "turn": r.turn, "steps": r.steps, "calls": r.calls, "tokens": r.tokens,
                    "model": r.model, "duration_ms": r.duration_ms,
                })),
                "may": may(&principal),
            })))
        }
        .await,
    )
}

/// What the key may do, for the page to offer only that.
fn may(principal: &Principal) -> Value {
    json!({
        "submit": principal.may(Role::Submit),
        "approve": principal.may(Role::Approve),
        "operate": principal.may(Role::Operate),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRun {
    agent: String,
    input: String,
    /// A new session when absent.
    #[serde(default)]
    session: Option<String>,
}

/// `POST /console/api/runs`: starts a run as the key's principal (`submit` role); with an
/// `Idempotency-Key`, a retry is the same run.
pub(super) async fn submit(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    outcome(
        async {
            let principal = request::admit(&gateway, &headers, Role::Submit).await?;
            let asked: NewRun = json_body(
                body,
                "a run is {\"agent\": name, \"input\": text, \"session\": name (optional)}",
            )?;
            request::check_agent(&gateway, &asked.agent)?;
            let id = request::request_id(&principal, &headers)?;
            let session = asked
                .session
                .filter(|s| !s.trim().is_empty())
                .unwrap_or_else(|| format!("console-{id}"));
            let submission = request::submission(
                &gateway,
                &principal,
                RunSpec {
                    task_id: format!("console-{id}"),
                    session,
                    agent: asked.agent,
                    input: asked.input,
                    images: Vec::new(),
                    output_schema: None,
                },
            )?;
            gateway
                .client_for(&principal)
                .submit(&submission)
                .await
                .map_err(|e| request::unavailable("the run could not be submitted", e))?;
            Ok(json_response(json!({
                "task_id": submission.task_id,
                "session": submission.session,
            })))
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// A cancel's reason, or the message a steer adds.
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    text: Option<String>,
    /// Where a fork starts: `T` or `T.S`; after this run's turn when absent.
    #[serde(default)]
    at: Option<String>,
}

/// `POST /console/api/runs/{task_id}/{action}`: cancel, pause, resume, steer, fork, replay.
pub(super) async fn action(
    State(gateway): State<Arc<Gateway>>,
    Path((task_id, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    outcome(
        async {
            let role = match action.as_str() {
                "cancel" | "pause" | "resume" => Role::Operate,
                "steer" | "fork" | "replay" => Role::Submit,
                other => {
                    // A caller without a key learns nothing, not even which actions there are.
                    request::admit_any(&gateway, &headers).await?;
                    return Err(request::not_found(format!(
                        "a run has no action {other:?}: cancel, pause, resume, steer, fork, replay"
                    )));
                }
            };
            let principal = request::admit(&gateway, &headers, role).await?;
            let asked: ActionBody = json_body(
                body,
                "an action's body is {\"reason\": text, \"text\": text, \"at\": \"T\" or \"T.S\"}",
            )?;
            let tenant = principal.tenant.as_str();
            let started = started(&gateway, tenant, &task_id).await?;
            let done = match action.as_str() {
                "cancel" => {
                    let reason = asked.reason.unwrap_or_else(|| {
                        format!("cancelled in the console by {}", principal.name)
                    });
                    gateway
                        .client_for(&principal)
                        .cancel(tenant, &task_id, &reason)
                        .await
                        .map_err(|e| request::unavailable("the cancel could not be sent", e))?;
                    json!({ "cancel": "requested" })
                }
                "pause" => {
                    control(
                        &gateway,
                        &principal,
                        &task_id,
                        &started,
                        ControlAction::Pause,
                        String::new(),
                    )
                    .await?
                }
                "resume" => {
                    control(
                        &gateway,
                        &principal,
                        &task_id,
                        &started,
                        ControlAction::Resume,
                        String::new(),
                    )
                    .await?
                }
                "steer" => {
                    let text = asked
                        .text
                        .filter(|t| !t.trim().is_empty())
                        .ok_or_else(|| request::invalid("a steer needs its \"text\""))?;
                    control(
                        &gateway,
                        &principal,
                        &task_id,
                        &started,
                        ControlAction::Steer,
                        text,
                    )
                    .await?
                }
                "fork" => {
                    let at = match asked.at {
                        Some(at) => ForkPoint::parse(&at).map_err(request::invalid)?,
                        None => ForkPoint {
                            turn: recorded_turn(&gateway, tenant, &started.session, &task_id)
                                .await?
                                .turn,
                            step: None,
                        },
                    };
                    let (session, files) = fork(&gateway, tenant, &started.session, at).await?;
                    json!({ "session": session, "at": at.to_string(), "files": files })
                }
                _ => replay(&gateway, &principal, &task_id, &started, &headers).await?,
            };
            Ok(json_response(done))
        }
        .await,
    )
}

/// Publishes a pause, resume or steer of the run, by the key's principal.
async fn control(
    gateway: &Gateway,
    principal: &Principal,
    task_id: &str,
    started: &Started,
    action: ControlAction,
    text: String,
) -> Result<Value, ApiError> {
    let control = RunControl {
        v: PROTOCOL_VERSION,
        tenant: principal.tenant.clone(),
        session: started.session.clone(),
        task_id: task_id.to_owned(),
        action,
        text,
        by: principal.name.clone(),
    };
    control
        .validate()
        .map_err(|f| request::invalid(f.message))?;
    gateway
        .client_for(principal)
        .bus()
        .publish_control(&control)
        .await
        .map_err(|e| request::unavailable("the control could not be sent", e))?;
    Ok(json!({ "control": action, "by": principal.name }))
}

/// The run's turn record, or 409 while it has none (running, or its messages not kept).
async fn recorded_turn(
    gateway: &Gateway,
    tenant: &str,
    session: &str,
    task_id: &str,
) -> Result<TurnRecord, ApiError> {
    turn_of(gateway, tenant, session, task_id)
        .await?
        .ok_or_else(|| {
            request::error(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "not_recorded",
                format!("run {task_id} has no record in session {session} yet: it has not ended, or its turn kept no messages"),
            )
        })
}

/// Makes a new session from `source` as it was at `at`, with its workspace's files as they were
/// then (as they are now, and said so, when the workspace's history no longer reaches back).
async fn fork(
    gateway: &Gateway,
    tenant: &str,
    source: &str,
    at: ForkPoint,
) -> Result<(String, &'static str), ApiError> {
    let not_forked = |e: ForkError| match e {
        ForkError::Store(e) => request::unavailable("the session could not be forked", e),
        other => request::error(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "not_forked",
            other.to_string(),
        ),
    };
    let named = format!("{source}-fork-{}-{}", at, now_ms() % 1_000_000).replace('.', "_");
    // A long source name would make a name no session may have.
    let to = if validate_token("session", &named).is_ok() {
        named
    } else {
        format!("fork-{}", uuid::Uuid::new_v4().simple())
    };
    let files_then = match gateway.store.fork_instant(tenant, source, at).await {
        Ok(then) => Some(then),
        Err(ForkError::NoInstant(_)) => None,
        Err(e) => return Err(not_forked(e)),
    };
    gateway
        .store
        .fork_session(tenant, source, at, &to)
        .await
        .map_err(not_forked)?;
    let session = |name: &str| SessionRef::new(tenant, name).map_err(|e| e.to_string());
    let copied = match &files_then {
        Some((from, at_ms)) => match (session(from), session(&to)) {
            (Ok(from), Ok(fork)) => gateway
                .workspaces
                .copy_session_as_of(&from, &fork, *at_ms)
                .await
                .map_err(|e| e.describe()),
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        None => gateway.copy_files(tenant, source, &to).await,
    };
    if let Err(why) = copied {
        if let Err(e) = gateway.store.remove_session(tenant, &to).await {
            tracing::warn!(error = %e, fork = %to, "a fork whose files failed was not removed");
        }
        return Err(request::unavailable(
            "the session's files could not be copied",
            why,
        ));
    }
    Ok((to, if files_then.is_some() { "then" } else { "now" }))
}

/// Runs the run's turn again in a fork made just before it, as a new run whose calls are
/// answered from the record.
async fn replay(
    gateway: &Gateway,
    principal: &Principal,
    task_id: &str,
    started: &Started,
    headers: &HeaderMap,
) -> Result<Value, ApiError> {
    let tenant = principal.tenant.as_str();
    let record = recorded_turn(gateway, tenant, &started.session, task_id).await?;
    let turn = gateway
        .store
        .turn_messages(tenant, &started.session, record.turn)
        .await
        .map_err(|e| match e {
            ForkError::Store(e) => request::unavailable("the turn could not be read", e),
            other => request::error(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "not_recorded",
                other.to_string(),
            ),
        })?;
    let input = turn
        .messages
        .first()
        .filter(|m| m.role == skein_common::protocol::message::Role::User)
        .map(|m| m.content.clone())
        .ok_or_else(|| {
            request::error(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "not_recorded",
                format!("turn {} has no user input on record", record.turn),
            )
        })?;
    let before = ForkPoint {
        turn: record.turn.saturating_sub(1),
        step: None,
    };
    let (session, files) = fork(gateway, tenant, &started.session, before).await?;
    let id = request::request_id(principal, headers)?;
    let mut submission = request::submission(
        gateway,
        principal,
        RunSpec {
            task_id: format!("replay-{id}"),
            session: session.clone(),
            agent: record.agent.clone(),
            input,
            images: Vec::new(),
            output_schema: None,
        },
    )?;
    submission.replay_of = Some(ReplayOf {
        session: started.session.clone(),
        turn: record.turn,
    });
    gateway
        .client_for(principal)
        .submit(&submission)
        .await
        .map_err(|e| request::unavailable("the replay could not be submitted", e))?;
    Ok(json!({
        "task_id": submission.task_id,
        "session": session,
        "replay_of": { "task_id": task_id, "session": started.session, "turn": record.turn },
        "files": files,
    }))
}
