//! Starting a run: a run request read and checked (what is not served refused with what to do
//! instead), its thread found or made, and either its task's submission made ready or, with
//! `command.resume`, the calls its thread's interrupted run waits on answered; the run recorded.

use std::sync::Arc;

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;
use skein_common::protocol::{now_ms, MultitaskPolicy};
use skein_common::store::threads::{RunRecord, ThreadRecord};

use super::super::approvals::{self, CallRef};
use super::super::follow::{followed, Followed, Source};
use super::super::keys::Principal;
use super::super::request::{self, ApiError};
use super::fold::{Modes, RunFold, RunShape};
use super::messages;
use super::resume::{interrupted_run, read_resume};
use super::runs::{again, before_of, conflict, put_run};
use super::threads::{self, record_of};
use crate::gateway::Gateway;

#[derive(Debug, Deserialize)]
pub(super) struct RunRequest {
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
    pub(super) run: RunRecord,
    pub(super) tenant: String,
    /// Its task submitted by the follower (`Submit`), or running already (`Stored`).
    pub(super) source: Source,
    pub(super) modes: Modes,
    pub(super) before: Vec<Value>,
    pub(super) cancel_on_disconnect: bool,
    /// A stateless run's thread, removed once the run ends.
    pub(super) remove_thread: bool,
}
impl Started {
    pub(super) fn fold(&self, modes: Modes) -> RunFold {
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

    pub(super) fn followed(
        self,
        gateway: Arc<Gateway>,
        modes: Modes,
    ) -> impl futures::Stream<Item = Value> {
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
/// Reads a run request, checks it, records the run and answers a resume; the task is not
/// submitted yet.
pub(super) async fn start(
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
        let after_events = gateway
            .client
            .bus()
            .event_count(tenant, &interrupted.task_id)
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
    let (text, images, earlier) = input
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
            images,
            output_schema: None,
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
