//! Threads: sessions with a record of their own (`store::threads`), shown with their status
//! (`interrupted` while a call of theirs waits for a person, `busy` while a run goes on, `error`
//! when the last one failed, else `idle`), their messages as `values`, their interrupts, the
//! state after each recorded turn as their history, and copied as forks.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use skein_common::protocol::{now_ms, validate_token, ApprovalRequest, TurnStatus};
use skein_common::store::history::{ForkError, ForkPoint};
use skein_common::store::threads::{RunRecord, ThreadRecord};
use skein_common::store::Removal;

use super::super::approvals::{self, CallRef};
use super::super::keys::Principal;
use super::super::request::{self, error, json_response, ApiError};
use super::{answer, caller, matches_metadata, messages, not_found, object_body, page, time};
use crate::gateway::Gateway;

/// A thread as it stands: its record, status, history and what it waits on.
pub(super) struct Seen {
    pub record: ThreadRecord,
    pub status: &'static str,
    pub history: Vec<skein_common::protocol::message::Message>,
    /// The unanswered calls it waits on, by task: LangGraph interrupts.
    pub interrupts: Vec<(String, Vec<Value>)>,
    pub runs: Vec<RunRecord>,
}

impl Seen {
    pub fn values(&self) -> Value {
        json!({ "messages": messages::thread_messages(&self.record.thread_id, &self.history) })
    }

    fn interrupts_by_task(&self) -> Value {
        let by_task: serde_json::Map<String, Value> = self
            .interrupts
            .iter()
            .map(|(task, list)| (task.clone(), Value::Array(list.clone())))
            .collect();
        Value::Object(by_task)
    }

    pub fn shown(&self) -> Value {
        json!({
            "thread_id": self.record.thread_id,
            "created_at": time(self.record.created_at_ms),
            "updated_at": time(self.record.updated_at_ms),
            "metadata": self.record.metadata,
            "status": self.status,
            "values": self.values(),
            "interrupts": self.interrupts_by_task(),
        })
    }
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    request::unavailable("threads could not be read", e)
}

/// The thread `id` of the caller's tenant, or 404.
pub(super) async fn record_of(
    gateway: &Gateway,
    tenant: &str,
    id: &str,
) -> Result<ThreadRecord, ApiError> {
    if validate_token("thread_id", id).is_err() {
        return Err(not_found("thread", id));
    }
    gateway
        .store
        .thread(tenant, id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| not_found("thread", id))
}

/// The unanswered calls of a request as LangGraph interrupts.
pub(super) fn interrupts_of(request: &ApprovalRequest) -> Vec<Value> {
    let source = approvals::source_of(request);
    request
        .unanswered()
        .map(|call| {
            let call_ref = CallRef {
                source: source.clone(),
                call_id: call.call_id.clone(),
            };
            messages::interrupt(
                &call_ref,
                &call.tool,
                &call.arguments,
                &call.rule,
                request.expires_at_ms,
            )
        })
        .collect()
}

/// How thread `record` stands now.
pub(super) async fn seen(
    gateway: &Gateway,
    tenant: &str,
    record: ThreadRecord,
) -> Result<Seen, ApiError> {
    let thread = record.thread_id.as_str();
    let runs = gateway
        .store
        .runs(tenant, thread)
        .await
        .map_err(unavailable)?;
    let tasks: std::collections::HashSet<&str> = runs.iter().map(|r| r.task_id.as_str()).collect();
    let requests = gateway
        .store
        .approval_requests(tenant)
        .await
        .map_err(unavailable)?;
    let mut interrupts = Vec::new();
    for listed in requests
        .iter()
        .filter(|r| (r.session == thread && r.run.is_none()) || tasks.contains(r.task_id.as_str()))
    {
        let Some(full) = gateway
            .store
            .approval_request(tenant, &listed.key())
            .await
            .map_err(unavailable)?
        else {
            continue;
        };
        let waiting = interrupts_of(&full);
        if !waiting.is_empty() {
            interrupts.push((full.task_id.clone(), waiting));
        }
    }
    let loaded = gateway
        .store
        .load(tenant, thread)
        .await
        .map_err(unavailable)?;
    let status = if !interrupts.is_empty() {
        "interrupted"
    } else if gateway
        .store
        .running_turn(tenant, thread)
        .await
        .map_err(unavailable)?
        .is_some()
    {
        "busy"
    } else {
        match runs.first() {
            Some(latest) => match gateway
                .store
                .final_result(tenant, thread, &latest.task_id)
                .await
                .map_err(unavailable)?
            {
                Some(ended)
                    if matches!(ended.status, TurnStatus::Failed | TurnStatus::InvalidOutput) =>
                {
                    "error"
                }
                Some(_) => "idle",
                // Submitted and not started yet, unless so long ago it is not coming.
                None if now_ms().saturating_sub(latest.created_at_ms)
                    < gateway.run_timeout.as_millis() as u64 =>
                {
                    "busy"
                }
                None => "idle",
            },
            None => "idle",
        }
    };
    Ok(Seen {
        record,
        status,
        history: loaded.state.history,
        interrupts,
        runs,
    })
}

/// `POST /threads`: `thread_id` (else a new UUID), `metadata`, `if_exists` (`raise`, the
/// default: 409; `do_nothing`: the thread as it is).
pub(in crate::gateway) async fn create(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let fields = object_body(&request::body(body)?)?;
            let id = match fields.get("thread_id") {
                None | Some(Value::Null) => uuid::Uuid::new_v4().to_string(),
                Some(Value::String(id)) => {
                    validate_token("thread_id", id).map_err(|f| request::invalid(f.message))?;
                    id.clone()
                }
                Some(_) => return Err(request::invalid("thread_id must be a string")),
            };
            let metadata = metadata_of(&fields)?;
            let (record, created) = make(&gateway, &principal, &id, metadata).await?;
            if !created && fields.get("if_exists").and_then(Value::as_str) != Some("do_nothing") {
                return Err(error(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    "thread_exists",
                    format!("thread {id:?} exists (if_exists: do_nothing returns it)"),
                ));
            }
            Ok(json_response(
                seen(&gateway, &principal.tenant, record).await?.shown(),
            ))
        }
        .await,
    )
}

fn metadata_of(fields: &serde_json::Map<String, Value>) -> Result<Value, ApiError> {
    match fields.get("metadata") {
        None | Some(Value::Null) => Ok(json!({})),
        Some(metadata @ Value::Object(_)) => Ok(metadata.clone()),
        Some(_) => Err(request::invalid("metadata must be an object")),
    }
}

/// Makes thread `id` unless it exists; the record that stands and whether it is new.
pub(super) async fn make(
    gateway: &Gateway,
    principal: &Principal,
    id: &str,
    metadata: Value,
) -> Result<(ThreadRecord, bool), ApiError> {
    let now = now_ms();
    let record = ThreadRecord {
        thread_id: id.to_owned(),
        created_at_ms: now,
        updated_at_ms: now,
        metadata,
    };
    gateway
        .store
        .create_thread(&principal.tenant, &record)
        .await
        .map_err(|e| request::unavailable("the thread could not be made", e))
}

/// `POST /threads/search`: by `metadata`, `status` and `ids`, newest first, paged.
pub(in crate::gateway) async fn search(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let fields = object_body(&request::body(body)?)?;
            let (limit, offset) = page(&fields)?;
            let status = fields.get("status").and_then(Value::as_str);
            let ids: Option<Vec<&str>> = fields
                .get("ids")
                .and_then(Value::as_array)
                .map(|ids| ids.iter().filter_map(Value::as_str).collect());
            let records = gateway
                .store
                .threads(&principal.tenant)
                .await
                .map_err(unavailable)?;
            let mut found = Vec::new();
            let mut skipped = 0;
            for record in records {
                if found.len() == limit {
                    break;
                }
                if ids
                    .as_ref()
                    .is_some_and(|ids| !ids.contains(&record.thread_id.as_str()))
                    || !matches_metadata(&record.metadata, fields.get("metadata"))
                {
                    continue;
                }
                let seen = seen(&gateway, &principal.tenant, record).await?;
                if status.is_some_and(|s| s != seen.status) {
                    continue;
                }
                if skipped < offset {
                    skipped += 1;
                    continue;
                }
                found.push(seen.shown());
            }
            Ok(json_response(Value::Array(found)))
        }
        .await,
    )
}

/// `GET /threads/{id}`.
pub(in crate::gateway) async fn read(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let record = record_of(&gateway, &principal.tenant, &id).await?;
            Ok(json_response(
                seen(&gateway, &principal.tenant, record).await?.shown(),
            ))
        }
        .await,
    )
}

/// `PATCH /threads/{id}`: `metadata` merged into the thread's.
pub(in crate::gateway) async fn update(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let fields = object_body(&request::body(body)?)?;
            let mut record = record_of(&gateway, &principal.tenant, &id).await?;
            if let (Some(merged), Value::Object(added)) =
                (record.metadata.as_object_mut(), metadata_of(&fields)?)
            {
                merged.extend(added);
            }
            record.updated_at_ms = now_ms();
            if !gateway
                .store
                .update_thread(&principal.tenant, &record)
                .await
                .map_err(unavailable)?
            {
                return Err(not_found("thread", &id));
            }
            Ok(json_response(
                seen(&gateway, &principal.tenant, record).await?.shown(),
            ))
        }
        .await,
    )
}

/// `DELETE /threads/{id}`: the session and everything of it, unless a run goes on (409).
pub(in crate::gateway) async fn remove(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            record_of(&gateway, &principal.tenant, &id).await?;
            match gateway
                .store
                .remove_session(&principal.tenant, &id)
                .await
                .map_err(unavailable)?
            {
                Removal::Busy => Err(error(
                    StatusCode::CONFLICT,
                    "invalid_request_error",
                    "thread_busy",
                    format!("a run goes on in thread {id}; cancel it first"),
                )),
                Removal::Removed(_) => {
                    gateway.remove_files(&principal.tenant, &id).await;
                    gateway
                        .store
                        .forget_thread(&principal.tenant, &id)
                        .await
                        .map_err(unavailable)?;
                    gateway.audit(&principal, "session_remove", "", &id).await;
                    Ok(StatusCode::NO_CONTENT.into_response())
                }
            }
        }
        .await,
    )
}

/// `POST /threads/{id}/copy`: a new thread forked from this one after its last turn, with its
/// metadata and its workspace's files.
pub(in crate::gateway) async fn copy(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let tenant = principal.tenant.as_str();
            let source = record_of(&gateway, tenant, &id).await?;
            let records = gateway
                .store
                .turn_records(tenant, &id)
                .await
                .map_err(unavailable)?;
            let at = ForkPoint {
                turn: records.last().map_or(0, |r| r.turn),
                step: None,
            };
            let to = uuid::Uuid::new_v4().to_string();
            gateway
                .store
                .fork_session(tenant, &id, at, &to)
                .await
                .map_err(|e| match e {
                    ForkError::Store(e) => unavailable(e),
                    other => error(
                        StatusCode::CONFLICT,
                        "invalid_request_error",
                        "not_copied",
                        other.to_string(),
                    ),
                })?;
            let copied = gateway.copy_files(tenant, &id, &to).await;
            if let Err(why) = copied {
                if let Err(e) = gateway.store.remove_session(tenant, &to).await {
                    tracing::warn!(error = %e, fork = %to, "a copy whose files failed was not removed");
                }
                return Err(request::unavailable("the thread's files could not be copied", why));
            }
            let (record, _) = make(&gateway, &principal, &to, source.metadata).await?;
            Ok(json_response(seen(&gateway, tenant, record).await?.shown()))
        }
        .await,
    )
}

/// A checkpoint of the thread: the state after turn `turn`.
fn checkpoint(thread: &str, turn: u64) -> Value {
    json!({
        "thread_id": thread,
        "checkpoint_ns": "",
        "checkpoint_id": format!("turn-{turn}"),
        "checkpoint_map": null,
    })
}

/// A thread state: `messages` after turn `turn`, ended at `at_ms`, with the interrupts when it
/// is the current state of an interrupted thread.
fn state_of(thread: &str, turn: u64, messages: Value, at_ms: u64, interrupts: &[Value]) -> Value {
    let tasks: Vec<Value> = if interrupts.is_empty() {
        Vec::new()
    } else {
        vec![json!({
            "id": format!("{thread}-turn-{}", turn + 1),
            "name": "agent",
            "error": null,
            "interrupts": interrupts,
            "checkpoint": null,
            "state": null,
            "result": null,
        })]
    };
    json!({
        "values": { "messages": messages },
        "next": if interrupts.is_empty() { json!([]) } else { json!(["agent"]) },
        "checkpoint": checkpoint(thread, turn),
        "metadata": { "step": turn, "source": "loop" },
        "created_at": time(at_ms),
        "parent_checkpoint": if turn > 0 { checkpoint(thread, turn - 1) } else { Value::Null },
        "tasks": tasks,
        "interrupts": interrupts,
    })
}

/// `GET /threads/{id}/state`: the thread's messages now, with what it waits on.
pub(in crate::gateway) async fn state(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let record = record_of(&gateway, &principal.tenant, &id).await?;
            let seen = seen(&gateway, &principal.tenant, record).await?;
            let records = gateway
                .store
                .turn_records(&principal.tenant, &id)
                .await
                .map_err(unavailable)?;
            let (turn, at) = records
                .last()
                .map_or((0, seen.record.created_at_ms), |r| (r.turn, r.ended_at_ms));
            let waiting: Vec<Value> = seen
                .interrupts
                .iter()
                .flat_map(|(_, i)| i.clone())
                .collect();
            Ok(json_response(state_of(
                &id,
                turn,
                seen.values()["messages"].take(),
                at,
                &waiting,
            )))
        }
        .await,
    )
}

/// `POST /threads/{id}/history`: the state after each recorded turn, newest first (`limit`,
/// `before`: a checkpoint whose older states are wanted), ending with the empty state before
/// the first turn.
pub(in crate::gateway) async fn history(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(
        async {
            let principal = caller(&gateway, &headers).await?;
            let fields = object_body(&request::body(body)?)?;
            let (limit, _) = page(&fields)?;
            let named = fields
                .get("before")
                .map(|b| b.get("checkpoint_id").unwrap_or(b));
            let before = match named {
                None | Some(Value::Null) => None,
                Some(Value::String(id)) => Some(turn_of(id)?),
                Some(_) => return Err(request::invalid("before names a checkpoint")),
            };
            let tenant = principal.tenant.as_str();
            let record = record_of(&gateway, tenant, &id).await?;
            let records = gateway
                .store
                .turn_records(tenant, &id)
                .await
                .map_err(unavailable)?;
            let history = gateway
                .store
                .load(tenant, &id)
                .await
                .map_err(unavailable)?
                .state
                .history;
            let shown = messages::thread_messages(&id, &history);
            // Each turn ends where the turns after it begin, counted from the history's end.
            let mut end = shown.len();
            let mut states = Vec::new();
            for turn in records.iter().rev() {
                if before.is_none_or(|b| turn.turn < b) {
                    states.push(state_of(
                        &id,
                        turn.turn,
                        json!(shown[..end]),
                        turn.ended_at_ms,
                        &[],
                    ));
                }
                match end.checked_sub(turn.messages as usize) {
                    Some(earlier) => end = earlier,
                    // Older messages were trimmed from the history: no older state is known.
                    None => break,
                }
            }
            let oldest = records.first().map_or(0, |r| r.turn.saturating_sub(1));
            if oldest == 0 && before.is_none_or(|b| b > 0) {
                states.push(state_of(&id, 0, json!([]), record.created_at_ms, &[]));
            }
            states.truncate(limit);
            Ok(json_response(Value::Array(states)))
        }
        .await,
    )
}

fn turn_of(checkpoint_id: &str) -> Result<u64, ApiError> {
    checkpoint_id
        .strip_prefix("turn-")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            request::invalid(format!(
                "no checkpoint {checkpoint_id:?}: checkpoints are named turn-N"
            ))
        })
}
