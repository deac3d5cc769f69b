//! Running one task: a tool task through the registry, or a subagent task through the agent
//! runtime. Each gets a `TaskScope` closed on every outcome, its result recorded once by call id
//! and sent to the dispatcher, and its message settled only after the result is recorded.
//!
//! Outcomes and how the message is settled:
//! - result recorded (success or a failure as data): ack;
//! - already recorded by an earlier delivery: the recorded result is re-sent, ack;
//! - undecodable message: logged and terminated (it would fail the same way every time);
//! - result could not be recorded (Redis away) or the task was aborted by shutdown: nak, so the
//!   broker redelivers it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use skein_common::agent::events::EventSink;
use skein_common::agent::model::Provider;
use skein_common::agent::runtime::{Runtime, TurnInput};
use skein_common::bus::{settle, with_progress, Bus};
use skein_common::protocol::{
    call_key, validate_token, CallOutcome, Failure, FailureKind, SubagentTask, TaskOrigin,
    ToolResult, ToolTask, TurnStatus, PROTOCOL_VERSION,
};
use skein_common::store::{SessionState, SessionStore};
use tokio_util::sync::CancellationToken;

use crate::scope::{ScopeStats, TaskScope};
use crate::tools::{ToolContext, ToolRegistry};

/// Delay before a handed-back task is redelivered.
const REDELIVERY_DELAY: Duration = Duration::from_secs(1);

/// What every task of this worker shares (borrowed by tasks, never owned by them).
pub(crate) struct WorkerContext {
    pub bus: Bus,
    pub store: SessionStore,
    pub registry: ToolRegistry,
    pub runtime: Option<Runtime<Provider>>,
    pub stats: Arc<ScopeStats>,
    pub instance: String,
    pub scratch_dir: PathBuf,
    pub max_tool_timeout: Duration,
    pub progress_every: Duration,
}

/// How a task's work ended before its result is settled.
enum Work {
    Done(CallOutcome),
    Aborted,
}

async fn tool_task(ctx: Arc<WorkerContext>, message: jetstream::Message, abort: CancellationToken) {
    let task: ToolTask = match ctx.bus.decode(&message.payload) {
        Ok(task) => task,
        Err(e) => return reject(&message, &e.to_string()).await,
    };
    let span = tracing::info_span!("tool_task", task_id = %task.origin.task_id, call_id = %task.call_id, tool = %task.tool);
    let _enter = span.enter();
    if let Err(failure) = check_origin(&task.origin, task.v) {
        return finish(
            &ctx,
            &message,
            task_call(&task.origin, &task.call_id, &task.reply_to),
            CallOutcome::Failed { failure },
            Instant::now(),
        )
        .await;
    }
    if resend_recorded(&ctx, &message, &task.origin, &task.call_id, &task.reply_to).await {
        return;
    }
    let started = Instant::now();
    let timeout = Duration::from_millis(task.timeout_ms).min(ctx.max_tool_timeout);
    let mut scope = TaskScope::new(
        ctx.stats.clone(),
        ctx.scratch_dir.clone(),
        format!("tool {} {}", task.tool, task.call_id),
    );
    let run = async {
        let call = ctx.registry.call(
            &task.tool,
            task.arguments.clone(),
            ToolContext {
                origin: &task.origin,
                call_id: &task.call_id,
                scope: &mut scope,
            },
        );
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(output)) => CallOutcome::Ok { output },
            Ok(Err(e)) => CallOutcome::Failed {
                failure: e.to_failure(),
            },
            Err(_) => CallOutcome::Failed {
                failure: Failure::new(
                    FailureKind::TimedOut,
                    format!("tool {} ran longer than {timeout:?}", task.tool),
                ),
            },
        }
    };
    let work = tokio::select! {
        _ = abort.cancelled() => Work::Aborted,
        outcome = with_progress(&message, ctx.progress_every, run) => Work::Done(outcome),
    };
    let call = task_call(&task.origin, &task.call_id, &task.reply_to);
    conclude(&ctx, &message, scope, work, call, started).await;
}

async fn subagent_task(
    ctx: Arc<WorkerContext>,
    message: jetstream::Message,
    abort: CancellationToken,
) {
    let task: SubagentTask = match ctx.bus.decode(&message.payload) {
        Ok(task) => task,
        Err(e) => return reject(&message, &e.to_string()).await,
    };
    let span = tracing::info_span!("subagent_task", task_id = %task.origin.task_id, call_id = %task.call_id, agent = %task.agent.name);
    let _enter = span.enter();
    let checked = check_origin(&task.origin, task.v)
        .and_then(|()| validate_token("child_session", &task.child_session));
    if let Err(failure) = checked {
        return finish(
            &ctx,
            &message,
            task_call(&task.origin, &task.call_id, &task.reply_to),
            CallOutcome::Failed { failure },
            Instant::now(),
        )
        .await;
    }
    if resend_recorded(&ctx, &message, &task.origin, &task.call_id, &task.reply_to).await {
        return;
    }
    let Some(runtime) = &ctx.runtime else {
        let failure = Failure::new(
            FailureKind::Unavailable,
            "this worker does not run subagents",
        );
        return finish(
            &ctx,
            &message,
            task_call(&task.origin, &task.call_id, &task.reply_to),
            CallOutcome::Failed { failure },
            Instant::now(),
        )
        .await;
    };
    let started = Instant::now();
    let scope = TaskScope::new(
        ctx.stats.clone(),
        ctx.scratch_dir.clone(),
        format!("subagent {} {}", task.agent.name, task.call_id),
    );
    let child_origin = TaskOrigin {
        session: task.child_session.clone(),
        ..task.origin.clone()
    };
    let events = EventSink::new(
        ctx.bus.clone(),
        runtime.hooks().clone(),
        child_origin.clone(),
        format!("subagent:{}", task.call_id),
    );
    let timeout = Duration::from_millis(task.timeout_ms);
    let run = async {
        let loaded = ctx
            .store
            .load(&child_origin.tenant, &child_origin.session)
            .await
            .map_err(|e| e.to_failure())?;
        let output = runtime
            .run_turn(TurnInput {
                origin: child_origin.clone(),
                agent: &task.agent,
                history: &loaded.state.history,
                input: task.input.clone(),
                depth: task.depth,
                events: &events,
                cancel: &abort,
            })
            .await;
        if output.status == TurnStatus::Completed {
            let mut state = loaded.state;
            state.history.extend(output.new_messages);
            state.turns += 1;
            save_child(&ctx.store, &child_origin, loaded.version, &state).await;
        }
        match (output.answer, output.failure) {
            (_, Some(failure)) => Err(failure),
            (Some(answer), None) => Ok(answer),
            (None, None) => Err(Failure::new(
                FailureKind::ModelFailed,
                "subagent gave no answer",
            )),
        }
    };
    let work = tokio::select! {
        _ = abort.cancelled() => Work::Aborted,
        outcome = with_progress(&message, ctx.progress_every, tokio::time::timeout(timeout, run)) => Work::Done(match outcome {
            Ok(Ok(output)) => CallOutcome::Ok { output },
            Ok(Err(failure)) => CallOutcome::Failed { failure },
            Err(_) => CallOutcome::Failed { failure: Failure::new(FailureKind::TimedOut, format!("subagent ran longer than {timeout:?}")) },
        }),
    };
    let call = task_call(&task.origin, &task.call_id, &task.reply_to);
    conclude(&ctx, &message, scope, work, call, started).await;
}

/// Closes the task's scope, then settles: a result is recorded and sent, aborted work is handed
/// back to the broker.
async fn conclude(
    ctx: &WorkerContext,
    message: &jetstream::Message,
    mut scope: TaskScope,
    work: Work,
    call: CallRef<'_>,
    started: Instant,
) {
    if let Err(e) = scope.close().await {
        tracing::warn!(error = %e, "task scope closed with errors");
    }
    match work {
        Work::Done(outcome) => finish(ctx, message, call, outcome, started).await,
        Work::Aborted => settle(message, AckKind::Nak(Some(REDELIVERY_DELAY))).await,
    }
}

/// Which call a result belongs to and where it goes.
#[derive(Clone, Copy)]
struct CallRef<'a> {
    origin: &'a TaskOrigin,
    call_id: &'a str,
    reply_to: &'a str,
}

fn task_call<'a>(origin: &'a TaskOrigin, call_id: &'a str, reply_to: &'a str) -> CallRef<'a> {
    CallRef {
        origin,
        call_id,
        reply_to,
    }
}

/// Kinds of task a worker serves, one consumer each.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TaskKind {
    Tool,
    Subagent,
}

/// Runs one delivered task of `kind`.
pub(crate) async fn task(
    kind: TaskKind,
    ctx: Arc<WorkerContext>,
    message: jetstream::Message,
    abort: CancellationToken,
) {
    match kind {
        TaskKind::Tool => tool_task(ctx, message, abort).await,
        TaskKind::Subagent => subagent_task(ctx, message, abort).await,
    }
}

async fn save_child(store: &SessionStore, origin: &TaskOrigin, version: u64, state: &SessionState) {
    if let Err(e) = store
        .save(&origin.tenant, &origin.session, version, state)
        .await
    {
        tracing::warn!(error = %e, session = %origin.session, "child session not saved");
    }
}

fn check_origin(origin: &TaskOrigin, version: u32) -> Result<(), Failure> {
    if version != PROTOCOL_VERSION {
        return Err(Failure::new(
            FailureKind::InvalidInput,
            format!("unsupported protocol version {version}"),
        ));
    }
    validate_token("task_id", &origin.task_id)?;
    validate_token("tenant", &origin.tenant)?;
    validate_token("workspace", &origin.workspace)?;
    validate_token("session", &origin.session)
}

/// If an earlier delivery already recorded this call's result, re-sends it and acks.
async fn resend_recorded(
    ctx: &WorkerContext,
    message: &jetstream::Message,
    origin: &TaskOrigin,
    call_id: &str,
    reply_to: &str,
) -> bool {
    match ctx
        .store
        .recorded_result(
            &origin.tenant,
            &origin.session,
            &call_key(&origin.task_id, call_id),
        )
        .await
    {
        Ok(Some(recorded)) => {
            tracing::info!("call already has a recorded result; re-sending it");
            reply(ctx, reply_to, &recorded).await;
            settle(message, AckKind::Ack).await;
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %e, "cannot check recorded results; handing the task back");
            settle(message, AckKind::Nak(Some(REDELIVERY_DELAY))).await;
            true
        }
    }
}

/// Records the result (first write wins), sends it, then acks.
async fn finish(
    ctx: &WorkerContext,
    message: &jetstream::Message,
    call: CallRef<'_>,
    outcome: CallOutcome,
    started: Instant,
) {
    let CallRef {
        origin,
        call_id,
        reply_to,
    } = call;
    let result = ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call_id.to_owned(),
        outcome,
        worker_id: ctx.instance.clone(),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    let key = call_key(&origin.task_id, call_id);
    let result = match ctx
        .store
        .record_result(&origin.tenant, &origin.session, &key, &result)
        .await
    {
        Ok(true) => result,
        Ok(false) => match ctx
            .store
            .recorded_result(&origin.tenant, &origin.session, &key)
            .await
        {
            Ok(Some(first)) => first,
            _ => result,
        },
        Err(e) => {
            tracing::warn!(error = %e, "result not recorded; handing the task back");
            return settle(message, AckKind::Nak(Some(REDELIVERY_DELAY))).await;
        }
    };
    reply(ctx, reply_to, &result).await;
    settle(message, AckKind::Ack).await;
}

async fn reply(ctx: &WorkerContext, reply_to: &str, result: &ToolResult) {
    if !reply_to.starts_with("skein.reply.") {
        tracing::warn!(
            reply_to,
            "refusing to reply outside skein.reply.*; result is recorded only"
        );
        return;
    }
    if let Err(e) = ctx.bus.publish_reply(reply_to, result).await {
        tracing::warn!(error = %e, "result not sent; the dispatcher will find it recorded");
    }
}

/// Terminates a message that cannot be decoded: it would fail the same way on every delivery.
async fn reject(message: &jetstream::Message, reason: &str) {
    tracing::error!(subject = %message.subject, reason, "undecodable task terminated");
    settle(message, AckKind::Term).await;
}
