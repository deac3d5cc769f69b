//! Runs: a run starts a task on its thread (the thread's session) or, with `command: {"resume":
//! …}`, answers the calls its thread's interrupted run waits on and goes on with that run's task.
//! Background (`POST …/runs`), streamed (`…/runs/stream`, SSE parts numbered for
//! `Last-Event-ID`, `on_disconnect=cancel` cancelling a run whose client left) or waited for
//! (`…/runs/wait`, the thread's values at the run's end, its interrupt, or `__error__`); read,
//! joined and rejoined later on any gateway, and cancelled (`action=interrupt` keeps the work done,
//! `rollback` leaves the thread as it was).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;
use skein_common::protocol::{now_ms, MultitaskPolicy, TurnStatus};
use skein_common::store::threads::{RunRecord, ThreadRecord};

use super::super::approvals::{self, CallRef};
use super::super::follow::{followed, Followed, Source};
use super::super::keys::Principal;
use super::super::request::{self, error, json_response, ApiError};
use super::fold::{Modes, RunFold, RunShape};
use super::resume::{interrupted_run, read_resume};
use super::threads::{self, record_of};
use super::wire::{flag, locate, outcome, query_pairs, sse, CancelOnDisconnect};
use super::{accepted, answer, caller, messages, not_found, time};
use crate::gateway::Gateway;

/// How long a cancel with `wait=true` waits for the run to end.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Deserialize)]
struct RunRequest {
    assistant_id: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    command: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    stream_mode: Option<Value>,
    #[serde(default)]
    multitask_strategy: Option<String>,
    #[serde(default)]
    if_not_exists: Option<String>,
    #[serde(default)]
    on_disconnect: Option<String>,
    #[serde(default)]
    on_completion: Option<String>,
    #[serde(default)]
    interrupt_before: Option<Value>,
    #[serde(default)]
    interrupt_after: Option<Value>,
    #[serde(default)]
    webhook: Option<Value>,
    #[serde(default)]
    after_seconds: Option<Value>,
    #[serde(default)]
    checkpoint: Option<Value>,
    #[serde(default)]
    checkpoint_id: Option<Value>,
}

/// A run this request started (or resumed), and how to follow it.
pub(super) struct Started {
    run: RunRecord,
    tenant: String,
    /// Its task submitted by the follower (`Submit`), or running already (`Stored`).
    source: Source,
    modes: Modes,
    before: Vec<Value>,
    cancel_on_disconnect: bool,
    /// A stateless run's thread, removed once the run ends.
    remove_thread: bool,
}

impl Started {
    fn fold(&self, modes: Modes) -> RunFold {
        RunFold::new(RunShape {
            run_id: self.run.run_id.clone(),
            thread_id: self.run.thread_id.clone(),
            modes,
            before: self.before.clone(),
            input: self.run.input.clone(),
            after_events: self.run.after_events,
            ends_at_interrupt: self.run.resumed_by.is_some(),
        })
    }

    fn followed(self, gateway: Arc<Gateway>, modes: Modes) -> impl futures::Stream<Item = Value> {
        let fold = self.fold(modes);
        let run = Followed {
            tenant: self.tenant,
            session: self.run.thread_id.clone(),
            task_id: self.run.task_id.clone(),
        };
        followed(gateway, run, self.source, fold)
    }
}

fn refuse_unless_absent(value: &Option<Value>, what: &str, why: &str) -> Result<(), ApiError> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(list)) if list.is_empty() => Ok(()),
        Some(Value::Number(n)) if n.as_u64() == Some(0) => Ok(()),
        Some(_) => Err(request::invalid(format!("{what} is not served: {why}"))),
    }
}

fn policy_of(strategy: Option<&str>) -> Result<MultitaskPolicy, ApiError> {
    match strategy.unwrap_or("reject") {
        "reject" => Ok(MultitaskPolicy::Reject),
        "enqueue" => Ok(MultitaskPolicy::Enqueue),
        "interrupt" => Ok(MultitaskPolicy::Interrupt),
        "rollback" => Ok(MultitaskPolicy::Rollback),
        other => Err(request::invalid(format!(
            "multitask_strategy {other:?} is not one of reject, enqueue, interrupt, rollback"
        ))),
    }
}

fn conflict(code: &str, message: String) -> ApiError {
    error(StatusCode::CONFLICT, "invalid_request_error", code, message)
}

/// Reads a run request, checks it, records the run and answers a resume; the task is not
/// submitted yet.
async fn start(
    gateway: &Gateway,
    principal: &Principal,
    thread: Option<String>,
    headers: &HeaderMap,
    body: &[u8],
    background: bool,
) -> Result<Started, ApiError> {
    let request: RunRequest = serde_json::from_slice(body)
        .map_err(|e| request::invalid(format!("the request is not a run request: {e}")))?;
    let skein_interrupts =
        "a run stops where the agent's permission rules ask a person about a call";
    refuse_unless_absent(
        &request.interrupt_before,
        "interrupt_before",
        skein_interrupts,
    )?;
    refuse_unless_absent(
        &request.interrupt_after,
        "interrupt_after",
        skein_interrupts,
    )?;
    refuse_unless_absent(
        &request.webhook,
        "webhook",
        "follow the run's stream or join it",
    )?;
    refuse_unless_absent(
        &request.after_seconds,
        "after_seconds",
        "submit the run when it is due",
    )?;
    let fork =
        "copy the thread (POST /threads/{id}/copy) or fork it at a turn (skein sessions fork)";
    refuse_unless_absent(&request.checkpoint, "checkpoint", fork)?;
    refuse_unless_absent(&request.checkpoint_id, "checkpoint_id", fork)?;
    request::check_agent(gateway, &request.assistant_id)?;
    let modes = Modes::parse(request.stream_mode.as_ref()).map_err(request::invalid)?;
    // A background run that names no modes is read in all of them.
    let recorded_modes = if background && request.stream_mode.is_none() {
        Vec::new()
    } else {
        modes.names()
    };
    let policy = policy_of(request.multitask_strategy.as_deref())?;
    let cancel_on_disconnect = match request.on_disconnect.as_deref() {
        None | Some("continue") => false,
        Some("cancel") => true,
        Some(other) => {
            return Err(request::invalid(format!(
                "on_disconnect {other:?} is not cancel or continue"
            )))
        }
    };
    let metadata = match request.metadata {
        None | Some(Value::Null) => json!({}),
        Some(metadata @ Value::Object(_)) => metadata,
        Some(_) => return Err(request::invalid("metadata must be an object")),
    };
    let tenant = principal.tenant.as_str();
    let stateless = thread.is_none();
    if stateless && request.command.is_some() {
        return Err(request::invalid(
            "a stateless run has no interrupt to resume: resume on the run's thread",
        ));
    }
    // Checked before a stateless run's thread is made, so a refused request leaves none.
    let input = match &request.input {
        Some(input) if !input.is_null() => {
            Some(messages::read_input(input).map_err(request::invalid)?)
        }
        _ => None,
    };
    let record: ThreadRecord = match thread {
        Some(id) => match record_of(gateway, tenant, &id).await {
            Err(_) if request.if_not_exists.as_deref() == Some("create") => {
                if skein_common::protocol::validate_token("thread_id", &id).is_err() {
                    return Err(request::invalid(format!("{id:?} cannot name a thread")));
                }
                threads::make(gateway, principal, &id, json!({})).await?.0
            }
            found => found?,
        },
        None => {
            // A retry with the same Idempotency-Key finds the same thread, and in it its run.
            let id = keyed_id(principal, headers, "stateless")?
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            threads::make(gateway, principal, &id, json!({})).await?.0
        }
    };
    let seen = threads::seen(gateway, tenant, record).await?;
    let thread_id = seen.record.thread_id.clone();
    let remove_thread = stateless && request.on_completion.as_deref() != Some("keep");
    if let Some(command) = &request.command {
        if request.input.as_ref().is_some_and(|i| !i.is_null()) {
            return Err(request::invalid("send input or command, not both"));
        }
        let resume = command.get("resume").ok_or_else(|| {
            request::invalid("command needs resume (goto and update are not served)")
        })?;
        let Some((mut interrupted, waiting)) = interrupted_run(gateway, tenant, &seen.runs).await?
        else {
            return Err(conflict(
                "not_interrupted",
                format!("thread {thread_id} waits on no interrupt to resume"),
            ));
        };
        let calls = approvals::unanswered(&waiting);
        let answer = read_resume(resume, &calls)?;
        answer.check_complete(&calls, CallRef::id)?;
        // The resumed stretch starts after what the task holds now (it waits: nothing comes
        // until it is answered).
        let subject = skein_common::subjects::events(tenant, &interrupted.task_id);
        let after_events = gateway
            .client
            .bus()
            .event_count(&subject)
            .await
            .map_err(|e| request::unavailable("the run's events could not be counted", e))?;
        approvals::answer(gateway, principal, &interrupted.task_id, &answer).await?;
        let run = RunRecord {
            run_id: run_id(principal, headers, &thread_id)?,
            thread_id: thread_id.clone(),
            assistant_id: interrupted.assistant_id.clone(),
            task_id: interrupted.task_id.clone(),
            created_at_ms: now_ms(),
            metadata,
            multitask_strategy: policy.as_str().to_owned(),
            input: interrupted.input.clone(),
            after_events,
            resumed_by: None,
            stream_mode: recorded_modes.clone(),
        };
        put_run(gateway, tenant, &run).await?;
        interrupted.resumed_by = Some(run.run_id.clone());
        put_run(gateway, tenant, &interrupted).await?;
        let before = before_of(gateway, tenant, &run).await?;
        return Ok(Started {
            run,
            tenant: tenant.to_owned(),
            source: Source::Stored(None),
            modes,
            before,
            cancel_on_disconnect,
            remove_thread,
        });
    }
    let (text, earlier) = input
        .ok_or_else(|| request::invalid("a run needs input (or command to resume an interrupt)"))?;
    let run_id = run_id(principal, headers, &thread_id)?;
    if let Some(retried) = gateway
        .store
        .run(tenant, &thread_id, &run_id)
        .await
        .map_err(|e| request::unavailable("runs could not be read", e))?
    {
        // A retry with the same Idempotency-Key: the run it started, followed again.
        if retried.input != text || retried.assistant_id != request.assistant_id {
            return Err(conflict(
                "idempotency_key_reused",
                "this Idempotency-Key was used for another run".to_owned(),
            ));
        }
        let mut again = again(gateway, tenant, retried, modes).await?;
        again.cancel_on_disconnect = cancel_on_disconnect;
        return Ok(again);
    }
    if policy == MultitaskPolicy::Reject && matches!(seen.status, "busy" | "interrupted") {
        return Err(conflict(
            "thread_busy",
            format!(
                "thread {thread_id} is {}; multitask_strategy enqueue, interrupt or rollback \
                 runs beside it{}",
                seen.status,
                if seen.status == "interrupted" {
                    ", or resume its interrupt with command.resume"
                } else {
                    ""
                }
            ),
        ));
    }
    if !earlier.is_empty() {
        if !seen.history.is_empty() {
            return Err(request::invalid(
                "the thread has messages: send only the new user message",
            ));
        }
        request::seed(gateway, tenant, &thread_id, &earlier).await?;
    }
    let run = RunRecord {
        run_id,
        thread_id: thread_id.clone(),
        assistant_id: request.assistant_id.clone(),
        task_id: String::new(),
        created_at_ms: now_ms(),
        metadata,
        multitask_strategy: policy.as_str().to_owned(),
        input: text,
        after_events: 0,
        resumed_by: None,
        stream_mode: recorded_modes.clone(),
    };
    let run = RunRecord {
        task_id: run.run_id.clone(),
        ..run
    };
    let mut submission = request::submission(
        gateway,
        principal,
        request::RunSpec {
            task_id: run.task_id.clone(),
            session: thread_id.clone(),
            agent: run.assistant_id.clone(),
            input: run.input.clone(),
        },
    )?;
    submission.multitask = policy;
    put_run(gateway, tenant, &run).await?;
    let before = messages::thread_messages(
        &thread_id,
        &if earlier.is_empty() {
            seen.history
        } else {
            earlier
        },
    );
    Ok(Started {
        run,
        tenant: tenant.to_owned(),
        source: Source::Submit(Box::new(submission), None),
        modes,
        before,
        cancel_on_disconnect,
        remove_thread,
    })
}

/// A run's id: from the request's `Idempotency-Key` within its thread (a retry is the same run;
/// the same key on another thread another run), else new.
fn run_id(principal: &Principal, headers: &HeaderMap, thread: &str) -> Result<String, ApiError> {
    Ok(keyed_id(principal, headers, thread)?.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()))
}

/// A UUID named by the request's `Idempotency-Key` within the tenant and `scope`; none without a
/// key.
fn keyed_id(
    principal: &Principal,
    headers: &HeaderMap,
    scope: &str,
) -> Result<Option<String>, ApiError> {
    if !headers.contains_key("idempotency-key") {
        return Ok(None);
    }
    let keyed = request::request_id(principal, headers)?;
    let hash = sha2::Sha256::digest(format!("{keyed}\n{scope}").as_bytes());
    let bytes: [u8; 16] = hash[..16]
        .try_into()
        .map_err(|_| request::invalid("the Idempotency-Key could not name a run"))?;
    Ok(Some(uuid::Uuid::from_bytes(bytes).to_string()))
}

async fn put_run(gateway: &Gateway, tenant: &str, run: &RunRecord) -> Result<(), ApiError> {
    gateway
        .store
        .put_run(tenant, run)
        .await
        .map_err(|e| request::unavailable("the run could not be recorded", e))
}

/// The thread's messages before the run's task began: before its recorded turn, or (a turn not
/// ended yet) the thread's history now.
async fn before_of(
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
            TurnStatus::Failed | TurnStatus::Rejected => "error",
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
            .client
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
async fn again(
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
                    .client
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
