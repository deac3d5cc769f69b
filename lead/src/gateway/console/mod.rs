//! The web console at `/console`: one page and its script and styles, built into the binary (no
//! front-end build step, no request outside the gateway: a `Content-Security-Policy` of `'self'`
//! holds the page to it), and the JSON it reads under `/console/api/`, with the gateway's keys
//! and roles.
//!
//! Served: the tenant's runs and one run's events ([`runs`]); a run as it stands, runs started
//! and a run's actions ([`run`]); sessions with their history, checkpoints and files
//! ([`sessions`]); the tenant's dead letters ([`dead_letters`]); here, the calls of the key's
//! tenant waiting for a person, with their arguments and the rule that asked, answered in place
//! (`approve` role, a reason optional); the live workers with their pools, tools, agent types,
//! capacity and last heartbeat, and the backlog of each work consumer they read; and a live feed
//! of the tenant's task events (`GET /console/api/live`, SSE from a core subscription on
//! `skein.events.{tenant}.>`) that tells the page when to read again, so nothing polls.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use skein_common::protocol::{EventKind, TurnEvent, WorkerAnnouncement};

mod dead_letters;
mod run;
mod runs;
mod sessions;

use super::approvals::{self, Answer, Verdict};
use super::keys::Role;
use super::request::{self, json_response, ApiError};
use super::Gateway;

const INDEX: &str = include_str!("assets/index.html");

/// The page's scripts and styles by name, each with its content type.
const ASSETS: [(&str, &str, &str); 5] = [
    ("app.js", include_str!("assets/app.js"), JAVASCRIPT),
    ("run.js", include_str!("assets/run.js"), JAVASCRIPT),
    (
        "sessions.js",
        include_str!("assets/sessions.js"),
        JAVASCRIPT,
    ),
    (
        "dead-letters.js",
        include_str!("assets/dead-letters.js"),
        JAVASCRIPT,
    ),
    (
        "app.css",
        include_str!("assets/app.css"),
        "text/css; charset=utf-8",
    ),
];
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// Nothing but the gateway itself: no script, style, image or connection from elsewhere.
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The console's routes.
pub(super) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route(
            "/console",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/console/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route("/console/{asset}", get(named_asset))
        .route("/console/api/approvals", get(waiting_calls))
        .route("/console/api/approvals/{task_id}/answer", post(answer))
        .route("/console/api/workers", get(workers))
        .route("/console/api/runs", get(runs::list).post(run::submit))
        .route("/console/api/runs/{task_id}", get(run::show))
        .route("/console/api/runs/{task_id}/events", get(runs::events))
        .route("/console/api/runs/{task_id}/{action}", post(run::action))
        .route("/console/api/live", get(live))
        .merge(sessions::routes())
        .merge(dead_letters::routes())
}

/// `GET /console/{asset}`: one of the page's scripts or styles.
async fn named_asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(asset, ..)| *asset == name) {
        Some((_, body, kind)) => asset(body, kind),
        None => request::not_found(format!("the console has no {name}")).into_response(),
    }
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, kind)], body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub(super) fn outcome(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /console/api/approvals`: every call of the tenant waiting for a person, oldest first.
async fn waiting_calls(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let tenant = principal.tenant.as_str();
            let unreadable = |e| request::unavailable("approval requests could not be read", e);
            let listed = gateway
                .store
                .approval_requests(tenant)
                .await
                .map_err(unreadable)?;
            let mut calls = Vec::new();
            for listed in listed {
                let Some(request) = gateway
                    .store
                    .approval_request(tenant, &listed.key())
                    .await
                    .map_err(unreadable)?
                else {
                    continue;
                };
                let source = approvals::source_of(&request);
                for call in request.unanswered() {
                    calls.push(json!({
                        "source": source,
                        "task_id": request.task_id,
                        "session": request.session,
                        "agent": request.agent,
                        "user": request.user,
                        "run": request.run,
                        "call_id": call.call_id,
                        "tool": call.tool,
                        "arguments": call.arguments,
                        "rule": call.rule,
                        "requested_at_ms": request.requested_at_ms,
                        "expires_at_ms": request.expires_at_ms,
                    }));
                }
            }
            Ok(json_response(json!({
                "calls": calls,
                "may_answer": principal.may(Role::Approve),
                "principal": principal.name,
                "tenant": principal.tenant,
            })))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
struct AnswerRequest {
    approve: bool,
    #[serde(default)]
    reason: String,
    /// One call; every call of the task that waits when absent.
    #[serde(default)]
    call_id: Option<String>,
    /// The source of the events of the run that asked (`lead`, the default, or the subagent
    /// run's `subagent:…`), as the list names it: call ids are unique only within a run.
    #[serde(default)]
    source: Option<String>,
}

/// `POST /console/api/approvals/{task_id}/answer`: approves or denies a waiting call (or every
/// call of the task) as the key's principal.
async fn answer(
    State(gateway): State<Arc<Gateway>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let body = request::body(body)?;
            let asked: AnswerRequest = serde_json::from_slice(&body).map_err(|e| {
                request::invalid(format!(
                    "an answer is {{\"approve\": bool, \"reason\": text, \"call_id\": id}}: {e}"
                ))
            })?;
            let verdict = Verdict {
                approve: asked.approve,
                reason: asked.reason,
            };
            let answer = match asked.call_id {
                Some(call_id) => {
                    let source = asked.source.unwrap_or_else(|| approvals::LEAD.to_owned());
                    Answer::Calls(vec![(approvals::CallRef { source, call_id }, verdict)])
                }
                None => Answer::All(verdict),
            };
            let answered = approvals::answer(&gateway, &principal, &task_id, &answer).await?;
            Ok(json_response(json!({ "answered": answered })))
        }
        .await,
    )
}

/// `GET /console/api/workers`: the live workers.
async fn workers(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    outcome(
        async {
            request::admit_any(&gateway, &headers).await?;
            let workers = gateway
                .store
                .live_workers()
                .await
                .map_err(|e| request::unavailable("the workers could not be read", e))?;
            let shown: Vec<Value> = workers
                .iter()
                .map(|w| {
                    json!({
                        "worker_id": w.worker_id,
                        "pool": w.pool,
                        "version": w.version,
                        "tools": w.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                        "runs_subagents": w.runs_subagents,
                        "agent_types": w.agent_types,
                        "capacity": w.capacity,
                        "heartbeat_ms": w.heartbeat_ms,
                    })
                })
                .collect();
            let backlog = backlog(&gateway, &workers).await;
            Ok(json_response(
                json!({ "workers": shown, "backlog": backlog }),
            ))
        }
        .await,
    )
}

/// The backlog of each work consumer the live workers read: calls not yet delivered, and
/// delivered ones not yet answered. A consumer whose depth cannot be read is shown without it.
async fn backlog(gateway: &Gateway, workers: &[WorkerAnnouncement]) -> Vec<Value> {
    use skein_common::subjects;
    let mut consumers = std::collections::BTreeSet::new();
    for worker in workers {
        consumers.insert((worker.pool.clone(), subjects::tool_consumer(&worker.pool)));
        match &worker.agent_types {
            Some(agents) => {
                for agent in agents {
                    let consumer = subjects::agent_type_consumer(&worker.pool, agent);
                    consumers.insert((worker.pool.clone(), consumer));
                }
            }
            None if worker.runs_subagents => {
                consumers.insert((worker.pool.clone(), subjects::agent_consumer(&worker.pool)));
            }
            None => {}
        }
    }
    let mut shown = Vec::with_capacity(consumers.len());
    let bus = gateway.client.bus();
    let partitions = bus.work_partitions().await.unwrap_or_else(|_| vec![0]);
    for (pool, consumer) in consumers {
        let depth = bus.work_depth(&consumer, &partitions).await;
        shown.push(match depth {
            Ok((pending, ack_pending)) => json!({
                "pool": pool, "consumer": consumer, "pending": pending, "ack_pending": ack_pending,
            }),
            Err(e) => json!({ "pool": pool, "consumer": consumer, "error": e.to_string() }),
        });
    }
    shown
}

/// `GET /console/api/live`: a note for each task event of the tenant that changes what the
/// console shows (a turn started or ended, a call asked for or answered), as SSE.
async fn live(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    outcome(
        async {
            let principal = request::admit_any(&gateway, &headers).await?;
            let subject = skein_common::subjects::tenant_events(&principal.tenant);
            let subscription = gateway
                .client
                .bus()
                .subscribe(&subject)
                .await
                .map_err(|e| request::unavailable("the live feed could not start", e))?;
            let notes = subscription.filter_map(|message| async move {
                let event: TurnEvent = serde_json::from_slice(&message.payload).ok()?;
                let kind = match event.event {
                    EventKind::TurnStarted { .. } => "turn_started",
                    EventKind::ApprovalRequested { .. } => "approval_requested",
                    EventKind::ApprovalResolved { .. } => "approval_resolved",
                    EventKind::Final { .. } => "final",
                    _ => return None,
                };
                let note =
                    json!({ "type": kind, "task_id": event.task_id, "source": event.source });
                Some(Ok::<_, Infallible>(
                    Event::default().event(kind).data(note.to_string()),
                ))
            });
            Ok(Sse::new(notes)
                .keep_alive(KeepAlive::default())
                .into_response())
        }
        .await,
    )
}
