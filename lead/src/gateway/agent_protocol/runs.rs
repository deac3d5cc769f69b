//! Runs: started ([`super::start`]) in the background (`POST …/runs`), streamed
//! (`…/runs/stream`, SSE parts numbered for `Last-Event-ID`, `on_disconnect=cancel` cancelling a
//! run whose client left) or waited for (`…/runs/wait`, the thread's values at the run's end, its
//! interrupt, or `__error__`), on a thread or stateless; read, listed, joined and rejoined later on
//! any gateway, and cancelled (`action=interrupt` keeps the work done, `rollback` leaves the thread
//! as it was).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::protocol::TurnStatus;
use skein_common::store::threads::RunRecord;

use super::super::approvals;
use super::super::follow::Source;
use super::super::keys::{Principal, Role};
use super::super::request::{self, error, json_response, ApiError};
use super::fold::Modes;
use super::start::{start, Started};
use super::threads::record_of;
use super::wire::{flag, locate, outcome, query_pairs, sse, CancelOnDisconnect};
use super::{accepted, answer, caller, messages, not_found, time};
use crate::gateway::Gateway;

/// How long a cancel with `wait=true` waits for the run to end.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) fn conflict(code: &str, message: String) -> ApiError {
    error(StatusCode::CONFLICT, "invalid_request_error", code, message)
}

pub(super) async fn put_run(
    gateway: &Gateway,
    tenant: &str,
    run: &RunRecord,
) -> Result<(), ApiError> {
    gateway
        .store
        .put_run(tenant, run)
        .await
        .map_err(|e| request::unavailable("the run could not be recorded", e))
}

/// The thread's messages before the run's task began: before its recorded turn, or (a turn not
/// ended yet) the thread's history now.
pub(super) async fn before_of(
    gateway: &Gateway,
    tenant: &str,
    run: &RunRecord,
) -> Result<Vec<Value>, ApiError> {
    let unreadable = |e| request::unavailable("the thread could not be read", e);
    let thread = run.thread_id.as_str();
    let records = gateway
        .store
        .turn_records(tenant, thread)
        .await
        .map_err(unreadable)?;
    let before = match records.iter().find(|r| r.task_id == run.task_id) {
        Some(record) => match gateway
            .store
            .turn_messages(tenant, thread, record.turn)
            .await
        {
            Ok(split) => split.before,
            Err(_) => Vec::new(),
        },
        None => {
            gateway
                .store
                .load(tenant, thread)
                .await
                .map_err(unreadable)?
                .state
                .history
        }
    };
    Ok(messages::thread_messages(thread, &before))
}

/// `pending`, `running`, `interrupted` (waiting for a person, resumed by a later run, or
/// cancelled), `success` or `error`.
async fn status_of(
    gateway: &Gateway,
    tenant: &str,
    run: &RunRecord,
) -> Result<&'static str, ApiError> {
    if run.resumed_by.is_some() {
        return Ok("interrupted");
    }
    let unreadable = |e| request::unavailable("the run could not be read", e);
    if let Some(ended) = gateway
        .store
        .final_result(tenant, &run.thread_id, &run.task_id)
        .await
        .map_err(unreadable)?
    {
        return Ok(match ended.status {
            TurnStatus::Completed | TurnStatus::BudgetExhausted => "success",
            TurnStatus::Cancelled => "interrupted",
            TurnStatus::Failed | TurnStatus::Rejected | TurnStatus::InvalidOutput => "error",
        });
    }
    if !approvals::waiting(gateway, tenant, &run.task_id)
        .await?
        .is_empty()
    {
        return Ok("interrupted");
    }
    let running = gateway
        .store
        .running_turn(tenant, &run.thread_id)
        .await
        .map_err(unreadable)?;
    Ok(match running {
        Some((task, _)) if task == run.task_id => "running",
        _ => "pending",
    })
}

async fn shown(gateway: &Gateway, tenant: &str, run: &RunRecord) -> Result<Value, ApiError> {
    Ok(json!({
        "run_id": run.run_id,
        "thread_id": run.thread_id,
        "assistant_id": run.assistant_id,
        "created_at": time(run.created_at_ms),
        "updated_at": time(run.created_at_ms),
        "status": status_of(gateway, tenant, run).await?,
        "metadata": run.metadata,
        "multitask_strategy": run.multitask_strategy,
        "kwargs": { "input": { "messages": [ { "role": "user", "content": run.input } ] } },
    }))
}

/// Submits a background run's task (a resumed run's task goes on by itself).
async fn submit(gateway: &Gateway, started: &Started) -> Result<(), ApiError> {
    if let Source::Submit(submission, _) = &started.source {
        gateway
            .client_for_name(&submission.user, &[Role::Submit])
            .submit(submission)
            .await
            .map_err(|e| request::unavailable("the run could not be submitted", e))?;
    }
    Ok(())
}

/// Removes a stateless run's thread once its run ended; one that stopped at an interrupt (or did
/// not end in time) is kept, so it can be resumed or read, and expires as sessions do.
async fn remove_finished_thread(gateway: &Gateway, started_tenant: &str, thread: &str, task: &str) {
    match gateway
        .store
        .final_result(started_tenant, thread, task)
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(thread, error = %e, "a stateless run's thread was not removed");
            return;
        }
    }
    match gateway.store.remove_session(started_tenant, thread).await {
        Ok(skein_common::store::Removal::Removed(_)) => {
            gateway.remove_files(started_tenant, thread).await;
            if let Err(e) = gateway.store.forget_thread(started_tenant, thread).await {
                tracing::warn!(thread, error = %e, "a stateless run's thread stays listed");
            }
        }
        Ok(skein_common::store::Removal::Busy) => {
            tracing::debug!(
                thread,
                "a stateless run's thread is busy; it expires as sessions do"
            )
        }
        Err(e) => tracing::warn!(thread, error = %e, "a stateless run's thread was not removed"),
    }
}

async fn create_background(
    gateway: Arc<Gateway>,
    headers: HeaderMap,
    thread: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (principal, body) = request::admitted_body(&gateway, &headers, body).await?;
    let started = start(&gateway, &principal, thread, &headers, &body, true).await?;
    submit(&gateway, &started).await?;
    let mut response = json_response(shown(&gateway, &principal.tenant, &started.run).await?);
    locate(&mut response, &started.run, "stream");
    Ok(response)
}

async fn create_stream(
    gateway: Arc<Gateway>,
    headers: HeaderMap,
    thread: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (principal, body) = request::admitted_body(&gateway, &headers, body).await?;
    let started = start(&gateway, &principal, thread, &headers, &body, false).await?;
    let run = started.run.clone();
    let guard = started
        .cancel_on_disconnect
        .then(|| CancelOnDisconnect::new(&gateway, &principal, &started.run.task_id));
    let remove = started.remove_thread;
    let modes = started.modes;
    let parts = started.followed(gateway.clone(), modes);
    let parts = if remove {
        let (gateway, tenant, thread, task) = (
            gateway.clone(),
            principal.tenant.clone(),
            run.thread_id.clone(),
            run.task_id.clone(),
        );
        let removal = futures::stream::once(async move {
            remove_finished_thread(&gateway, &tenant, &thread, &task).await;
            None
        });
        parts
            .map(Some)
            .chain(removal)
            .filter_map(futures::future::ready)
            .boxed()
    } else {
        parts.boxed()
    };
    let mut response = sse(parts, None, guard);
    locate(&mut response, &run, "stream");
    Ok(response)
}

async fn create_wait(
    gateway: Arc<Gateway>,
    headers: HeaderMap,
    thread: Option<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (principal, body) = request::admitted_body(&gateway, &headers, body).await?;
    let started = start(&gateway, &principal, thread, &headers, &body, false).await?;
    let run = started.run.clone();
    let remove = started.remove_thread;
    // A client that leaves drops this request's future, and with it the guard.
    let guard = started
        .cancel_on_disconnect
        .then(|| CancelOnDisconnect::new(&gateway, &principal, &started.run.task_id));
    let values_only = Modes {
        values: true,
        ..Modes::default()
    };
    let result = outcome(started.followed(gateway.clone(), values_only)).await;
    if let Some(guard) = &guard {
        guard.ended();
    }
    if remove {
        remove_finished_thread(&gateway, &principal.tenant, &run.thread_id, &run.task_id).await;
    }
    let mut response = json_response(result);
    locate(&mut response, &run, "join");
    Ok(response)
}

pub(super) async fn background(
    State(gateway): State<Arc<Gateway>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(create_background(gateway, headers, Some(thread), body).await)
}

pub(super) async fn stream(
    State(gateway): State<Arc<Gateway>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(create_stream(gateway, headers, Some(thread), body).await)
}

pub(super) async fn wait(
    State(gateway): State<Arc<Gateway>>,
    Path(thread): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(create_wait(gateway, headers, Some(thread), body).await)
}

pub(super) async fn stateless_background(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(create_background(gateway, headers, None, body).await)
}

pub(super) async fn stateless_stream(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(create_stream(gateway, headers, None, body).await)
}

pub(super) async fn stateless_wait(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(create_wait(gateway, headers, None, body).await)
}

/// `GET /threads/{id}/runs`: newest first (`limit`, `offset`, `status`).
pub(super) async fn list(
    State(gateway): State<Arc<Gateway>>,
    Path(thread): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let tenant = principal.tenant.as_str();
            record_of(&gateway, tenant, &thread).await?;
            let pairs = query_pairs(query.as_deref());
            let number = |name: &str, default: usize| -> Result<usize, ApiError> {
                match pairs.iter().find(|(k, _)| k == name) {
                    None => Ok(default),
                    Some((_, v)) => v
                        .parse()
                        .map_err(|_| request::invalid(format!("{name} must be a whole number"))),
                }
            };
            let (limit, offset) = (number("limit", 10)?.min(1000), number("offset", 0)?);
            let status = pairs
                .iter()
                .find(|(k, _)| k == "status")
                .map(|(_, v)| v.as_str());
            let runs = gateway
                .store
                .runs(tenant, &thread)
                .await
                .map_err(|e| request::unavailable("runs could not be read", e))?;
            let mut found = Vec::new();
            for run in &runs {
                let run = shown(&gateway, tenant, run).await?;
                if status.is_none_or(|s| run["status"] == s) {
                    found.push(run);
                }
            }
            let found: Vec<Value> = found.into_iter().skip(offset).take(limit).collect();
            Ok(json_response(Value::Array(found)))
        }
        .await,
    )
}

/// The run `run_id` of thread `thread` of the caller's tenant, or 404.
async fn run_of(
    gateway: &Gateway,
    principal: &Principal,
    thread: &str,
    run_id: &str,
) -> Result<RunRecord, ApiError> {
    record_of(gateway, &principal.tenant, thread).await?;
    gateway
        .store
        .run(&principal.tenant, thread, run_id)
        .await
        .map_err(|e| request::unavailable("runs could not be read", e))?
        .ok_or_else(|| not_found("run", run_id))
}

/// A run recorded before, followed from its task's first event.
pub(super) async fn again(
    gateway: &Gateway,
    tenant: &str,
    run: RunRecord,
    modes: Modes,
) -> Result<Started, ApiError> {
    let ended = gateway
        .client
        .stored_final(tenant, &run.thread_id, &run.task_id)
        .await
        .map_err(|e| request::unavailable("the run's result could not be read", e))?;
    let before = before_of(gateway, tenant, &run).await?;
    Ok(Started {
        run,
        tenant: tenant.to_owned(),
        source: Source::Stored(ended.map(Box::new)),
        modes,
        before,
        cancel_on_disconnect: false,
        remove_thread: false,
    })
}

/// `GET /threads/{id}/runs/{run_id}`.
pub(super) async fn read(
    State(gateway): State<Arc<Gateway>>,
    Path((thread, run_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let run = run_of(&gateway, &principal, &thread, &run_id).await?;
            Ok(json_response(
                shown(&gateway, &principal.tenant, &run).await?,
            ))
        }
        .await,
    )
}

/// `GET …/join`: waits for the run to end (or stop at an interrupt); its values.
pub(super) async fn join(
    State(gateway): State<Arc<Gateway>>,
    Path((thread, run_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let run = run_of(&gateway, &principal, &thread, &run_id).await?;
            let values_only = Modes {
                values: true,
                ..Modes::default()
            };
            let started = again(&gateway, &principal.tenant, run, values_only).await?;
            Ok(json_response(
                outcome(started.followed(gateway.clone(), values_only)).await,
            ))
        }
        .await,
    )
}

/// `GET …/stream`: the run's stream again (`stream_mode`; when absent, the modes the run was
/// started with, or every mode but `custom` for a background run that named none), after
/// the part `Last-Event-ID` names; `cancel_on_disconnect=true` cancels the run if the client
/// leaves before its end.
pub(super) async fn rejoin(
    State(gateway): State<Arc<Gateway>>,
    Path((thread, run_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let run = run_of(&gateway, &principal, &thread, &run_id).await?;
            let pairs = query_pairs(query.as_deref());
            let asked: Vec<Value> = pairs
                .iter()
                .filter(|(k, _)| k == "stream_mode")
                .map(|(_, v)| json!(v))
                .collect();
            // The run's own modes when none are named (a client reconnecting to `Location`), so
            // the parts keep the numbers it saw.
            let modes = if asked.is_empty() {
                Modes::of_run(&run.stream_mode)
            } else {
                Modes::parse(Some(&Value::Array(asked))).map_err(request::invalid)?
            };
            let resume_after = headers
                .get("last-event-id")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse().ok());
            let guard = flag(&pairs, "cancel_on_disconnect")
                .then(|| CancelOnDisconnect::new(&gateway, &principal, &run.task_id));
            let started = again(&gateway, &principal.tenant, run, modes).await?;
            Ok(sse(
                started.followed(gateway.clone(), modes),
                resume_after,
                guard,
            ))
        }
        .await,
    )
}

/// `POST …/cancel` (`action=interrupt`, the default: the run stops at its next step keeping its
/// work; `rollback`: it stops and the thread stays as it was; a run waiting for a person is
/// cancelled either way). `wait=true` answers once the run ended (204), else at once (202).
pub(super) async fn cancel(
    State(gateway): State<Arc<Gateway>>,
    Path((thread, run_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = request::admit(&gateway, &headers, super::super::keys::Role::Submit).await?;
            let run = run_of(&gateway, &principal, &thread, &run_id).await?;
            let pairs = query_pairs(query.as_deref());
            let action = pairs
                .iter()
                .find(|(k, _)| k == "action")
                .map_or("interrupt", |(_, v)| v.as_str());
            if !matches!(action, "interrupt" | "rollback") {
                return Err(request::invalid(format!(
                    "action {action:?} is not interrupt or rollback"
                )));
            }
            let tenant = principal.tenant.as_str();
            let status = status_of(&gateway, tenant, &run).await?;
            if matches!(status, "success" | "error") || run.resumed_by.is_some() {
                return Err(conflict(
                    "run_ended",
                    format!("run {run_id} has ended ({status})"),
                ));
            }
            let reason = format!("cancelled over the Agent Protocol by {}", principal.name);
            match action {
                "interrupt" if status != "interrupted" => {
                    gateway
                        .store
                        .request_interrupt(tenant, &thread, &run.task_id, &format!("cancel-{}", run.run_id))
                        .await
                        .map_err(|e| request::unavailable("the interrupt could not be recorded", e))?;
                    if let Err(e) = gateway
                        .client
                        .bus()
                        .client()
                        .publish(skein_common::subjects::wake(tenant, &run.task_id), Bytes::new())
                        .await
                    {
                        tracing::warn!(error = %e, "wake not published; the run reads its interrupt at its next step");
                    }
                }
                "interrupt" | "rollback" => gateway
                    .client_for(&principal)
                    .cancel(tenant, &run.task_id, &reason)
                    .await
                    .map_err(|e| request::unavailable("the cancel could not be sent", e))?,
                other => {
                    return Err(request::invalid(format!(
                        "action {other:?} is not interrupt or rollback"
                    )))
                }
            }
            if !flag(&pairs, "wait") {
                return Ok(accepted());
            }
            let started = tokio::time::Instant::now();
            while started.elapsed() < CANCEL_WAIT {
                if gateway
                    .store
                    .final_result(tenant, &thread, &run.task_id)
                    .await
                    .map_err(|e| request::unavailable("the run could not be read", e))?
                    .is_some()
                {
                    return Ok(StatusCode::NO_CONTENT.into_response());
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Ok(accepted())
        }
        .await,
    )
}
