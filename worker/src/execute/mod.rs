//! Running one task: a tool task through the registry, or a subagent task through the agent
//! runtime. Each gets a `TaskScope` closed on every outcome (a panic in the task becomes a failure,
//! so it closes too), its result sent to the dispatcher and recorded once by call key, and its
//! message settled only after the result is recorded. Every path returns how the message settles
//! (a `Disposition`); `tool` and `subagent` apply it, once.
//!
//! This module owns the entry points, the tool task and what tasks share; `admission` decides
//! whether a task runs, `subagent` runs a child turn, `settling` decides how a task that ran
//! settles.
//!
//! The store is asked before a task runs unless this is the first delivery of a first dispatch
//! (`first_dispatch`): nothing can be recorded for it yet, so it runs at once as attempt 1, and
//! its redeliveries count that attempt too.
//!
//! Outcomes and how the message is settled:
//! - result sent and recorded (success or a failure as data): ack;
//! - already recorded by an earlier delivery: the recorded result is re-sent, ack;
//! - not to be started (deadline passed, task cancelled): a failure is recorded and sent, ack;
//! - cancelled while running: the work stops, a `cancelled` failure is recorded and sent, ack;
//! - a tool call that failed transiently (`unavailable`): tried again after a backoff (nak with a
//!   delay) until `max_attempts`, then dead-lettered with its last failure, which is recorded;
//! - attempts used up before one finished (its worker crashed each time): dead-lettered, a
//!   `dead_lettered` failure recorded and sent, ack;
//! - invalid task (bad ids, version, call key): a failure is sent back, nothing is recorded under
//!   the names it carries, terminated;
//! - undecodable message: dead-lettered and terminated (it would fail the same way every time);
//! - another run of the call is still in progress (its marker held, see `marker`): the copy
//!   waits for that run's result and re-sends it, ack; or runs once the marker is gone;
//! - result could not be recorded, a child session could not be loaded (Redis away), or the task
//!   was aborted by shutdown: nak (the attempt is not counted), so the broker redelivers it;
//! - a subagent task whose type runs at its cluster-wide cap (`max_concurrency`, see
//!   `agent_cap`): nak with a short, growing delay (the attempt is not counted), so it waits in
//!   the stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use skein_common::agent::runtime::Runtime;
use skein_common::bus::{Bus, Delivery, Disposition, Envelope, Received, Slots, Undecodable};
use skein_common::metrics::InFlight;
use skein_common::protocol::{
    CallOutcome, Failure, FailureKind, SubagentTask, TaskOrigin, ToolTask,
};
use skein_common::store::SessionStore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod admission;
mod agent_cap;
mod child_approval;
mod images;
mod marker;
mod settling;
mod spill;
mod subagent;

use admission::{admit, check_task, refuse, Admitted};
use settling::conclude;
use subagent::subagent_task;

use crate::scope::{ScopeStats, TaskScope};
use crate::tools::{ToolContext, ToolRegistry};

/// Delay before a handed-back task is redelivered.
const REDELIVERY_DELAY: Duration = Duration::from_secs(1);

/// What every task of this worker shares (borrowed by tasks, never owned by them).
pub(crate) struct WorkerContext {
    pub metrics: skein_common::metrics::Metrics,
    pub bus: Bus,
    pub store: SessionStore,
    pub registry: ToolRegistry,
    /// Where output over the cap is kept whole (`spill`).
    pub workspace: Arc<dyn crate::workspace::WorkspaceStore>,
    /// Where arguments and inputs that travel by reference are read.
    pub payloads: skein_common::payloads::PayloadStore,
    pub runtime: Option<Runtime>,
    pub stats: Arc<ScopeStats>,
    pub instance: String,
    pub scratch_dir: PathBuf,
    pub max_tool_timeout: Duration,
    /// Cap on a subagent task's own timeout.
    pub max_subagent_timeout: Duration,
    /// Deepest nesting of subagent loops this worker runs.
    pub max_depth: u32,
    pub progress_every: Duration,
    pub max_attempts: u64,
    pub cancels: skein_common::cancel::CancelRegistry,
    /// Where a subagent turn running here registers the slots its subagent calls lend.
    pub lending: crate::lending::LendSlotsLayer,
}

/// The agent consumer a subagent task came from: its slots, and its type when it serves one
/// type only (`SKEIN_SUBAGENTS` lists types).
#[derive(Clone)]
pub(crate) struct AgentIntake {
    pub slots: Slots,
    pub agent: Option<String>,
}

/// How a task's work ended before its result is settled.
enum Work {
    Done(CallOutcome),
    /// Stopped by shutdown, or hit trouble another delivery may not: hand the task back.
    HandBack,
    /// Not started: its agent type runs at its cap. Hand it back to be delivered after the delay.
    Wait(Duration),
}

async fn tool_task(
    ctx: &WorkerContext,
    delivery: &Delivery<ToolTask>,
    abort: CancellationToken,
) -> Disposition {
    let (task, envelope) = (delivery.body(), delivery.envelope());
    tracing::Span::current().record("skein.task_id", task.origin.task_id.as_str());
    let call = CallRef {
        envelope,
        origin: &task.origin,
        call_id: &task.call_id,
        call_key: &task.call_key,
        reply_to: &task.reply_to,
        retries: true,
        label: &task.tool,
        first_dispatch: task.first_dispatch,
    };
    if let Err(failure) = check_task(&call, task.v) {
        return refuse(ctx, call, failure).await;
    }
    let Admitted {
        attempt,
        run: marker,
        stop,
        _registrations,
    } = match admit(ctx, call, &abort).await {
        Ok(admitted) => admitted,
        Err(settled) => return settled,
    };
    let started = Instant::now();
    let timeout = Duration::from_millis(task.timeout_ms).min(ctx.max_tool_timeout);
    let mut scope = TaskScope::new(
        ctx.stats.clone(),
        ctx.scratch_dir.clone(),
        format!("tool {} {}", task.tool, task.call_id),
    );
    let idempotency_key = crate::tools::idempotency_key(&task.origin, &task.call_key);
    let run = async {
        let context = ToolContext {
            origin: &task.origin,
            call_id: &task.call_id,
            idempotency_key: &idempotency_key,
            time_limit: timeout,
            scope: &mut scope,
        };
        let span = tracing::info_span!(
            "execute_tool",
            "otel.name" = format!("execute_tool {}", task.tool),
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %task.tool,
            "gen_ai.tool.call.id" = %task.call_id,
            "skein.attempt" = attempt.number,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let running = async {
            let arguments = arguments(ctx, task).await?;
            let output = ctx
                .registry
                .call_whole(&task.tool, arguments, context)
                .await?;
            let cap = ctx.registry.max_output_bytes();
            let images = images::store_images(&ctx.payloads, &task.origin, output.images).await?;
            let fitted = spill::fit_output(
                ctx.workspace.as_ref(),
                &task.origin,
                &task.tool,
                &idempotency_key,
                output.text,
                cap,
            );
            Ok::<_, Failure>((fitted.await, images))
        }
        .instrument(span.clone());
        match tokio::time::timeout(timeout, contain_panic(running)).await {
            Ok(Ok(Ok((output, images)))) => CallOutcome::Ok { output, images },
            Ok(Ok(Err(failure))) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", failure.kind.as_str());
                CallOutcome::Failed { failure }
            }
            Ok(Err(panicked)) => CallOutcome::Failed { failure: panicked },
            Err(_) => CallOutcome::Failed {
                failure: Failure::new(
                    FailureKind::TimedOut,
                    format!("tool {} ran longer than {timeout:?}", task.tool),
                ),
            },
        }
    };
    let work = tokio::select! {
        // A stop that came before the work started wins: the tool is not polled at all.
        biased;
        _ = stop.cancelled() => stopped(ctx, &task.origin, &abort),
        outcome = marker.hold(ctx, call, envelope.with_progress(ctx.progress_every, run)) => Work::Done(outcome),
    };
    conclude(ctx, scope, work, call, started, attempt, &marker).await
}

/// The task's arguments: carried inline, or read from the payload store by their reference (a
/// store that cannot be reached is `unavailable`, so the call is tried again).
async fn arguments(ctx: &WorkerContext, task: &ToolTask) -> Result<serde_json::Value, Failure> {
    match &task.arguments_ref {
        None => Ok(task.arguments.clone()),
        Some(reference) => ctx.payloads.load_arguments(&task.origin, reference).await,
    }
}

/// Work stopped early: by shutdown (handed back to run elsewhere) or by a cancel request (ends
/// as a `cancelled` failure).
fn stopped(ctx: &WorkerContext, origin: &TaskOrigin, abort: &CancellationToken) -> Work {
    if abort.is_cancelled() {
        Work::HandBack
    } else if ctx.cancels.heard(&origin.tenant, &origin.task_id) {
        let failure = Failure::new(FailureKind::Cancelled, "the task was cancelled");
        Work::Done(CallOutcome::Failed { failure })
    } else {
        // A cancel request for the subagent run this work belongs to, not for its task: the
        // caller observes it and goes on.
        let failure = Failure::new(
            FailureKind::Stopped,
            "stopped by a cancel request for this subagent run (the task goes on)",
        );
        Work::Done(CallOutcome::Failed { failure })
    }
}

/// Runs `work`, turning a panic into a failure so the task still closes its scope and settles.
async fn contain_panic<T>(work: impl std::future::Future<Output = T>) -> Result<T, Failure> {
    std::panic::AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(panic = %what, "task panicked");
            Failure::new(FailureKind::Internal, format!("the task panicked: {what}"))
        })
}

/// Copies the task to the dead-letter stream; false if that failed (the task must then be handed
/// back, so nothing disappears).
async fn dead_letter(
    ctx: &WorkerContext,
    envelope: &Envelope,
    reason: &str,
    attempts: u64,
) -> bool {
    let set_aside = envelope.set_aside(reason, attempts).await;
    if set_aside {
        ctx.metrics.dead_lettered(task_kind(envelope));
    }
    set_aside
}

/// The kind of task a message carries, from its subject (`skein.{kind}.…`), for metrics.
fn task_kind(envelope: &Envelope) -> &str {
    envelope.subject().split('.').nth(1).unwrap_or("other")
}

/// Which call a result belongs to and where it goes.
#[derive(Clone, Copy)]
struct CallRef<'a> {
    /// The delivery of the task.
    envelope: &'a Envelope,
    origin: &'a TaskOrigin,
    call_id: &'a str,
    call_key: &'a str,
    reply_to: &'a str,
    /// Whether transient failures are tried again here: for tool calls, which fail fast; not for
    /// subagent turns, whose retries could outlast the caller's wait.
    retries: bool,
    /// What ran, for metrics: the tool's name, or the subagent's.
    label: &'a str,
    /// The dispatcher knows of no earlier dispatch of this call (see `ToolTask::first_dispatch`).
    first_dispatch: bool,
}

/// Runs one delivered tool task.
pub(crate) async fn tool(
    ctx: Arc<WorkerContext>,
    received: Received<ToolTask>,
    abort: CancellationToken,
) {
    let Some((delivery, span, _in_flight)) = begin(&ctx, "tool", received).await else {
        return;
    };
    // Every path decides how the task settles; it is settled here, once.
    let disposition = tool_task(&ctx, &delivery, abort)
        .instrument(span.clone())
        .await;
    settle(&ctx, delivery, disposition).instrument(span).await;
}

/// Runs one delivered subagent task, from the agent consumer `intake`.
pub(crate) async fn subagent(
    ctx: Arc<WorkerContext>,
    received: Received<SubagentTask>,
    intake: AgentIntake,
    abort: CancellationToken,
) {
    let Some((delivery, span, _in_flight)) = begin(&ctx, "subagent", received).await else {
        return;
    };
    let disposition = subagent_task(&ctx, &delivery, intake, abort)
        .instrument(span.clone())
        .await;
    settle(&ctx, delivery, disposition).instrument(span).await;
}

/// Settles a task's message, once, counting it when it was set aside. (The body is dropped
/// before the wait, and an `async move` block keeps the envelope once where an `async fn` would
/// keep it twice.)
fn settle<T>(
    ctx: &WorkerContext,
    delivery: Delivery<T>,
    disposition: Disposition,
) -> impl std::future::Future<Output = ()> + '_ {
    let (envelope, _) = delivery.into_parts();
    async move {
        let kind = task_kind(&envelope).to_owned();
        if let Disposition::SetAside { .. } = envelope.settle(disposition).await {
            ctx.metrics.dead_lettered(&kind);
        }
    }
}

/// Counts a delivered task of `kind` and opens its `process` span; an undecodable one is set
/// aside here (it would fail the same way on every delivery) and `None` returned.
async fn begin<T>(
    ctx: &WorkerContext,
    kind: &'static str,
    received: Received<T>,
) -> Option<(Delivery<T>, tracing::Span, InFlight)> {
    let in_flight = ctx.metrics.in_flight(kind);
    let envelope = received.envelope();
    if envelope.delivered() > 1 {
        ctx.metrics.redelivered(kind);
    }
    let span = envelope.span();
    span.record("skein.kind", kind);
    match received {
        Received::Decoded(delivery) => Some((delivery, span, in_flight)),
        Received::Undecodable(undecodable) => {
            // Boxed: a rare path whose future would otherwise make every task's future larger
            // (and every move of it longer) by about 9 KiB.
            Box::pin(reject(ctx, undecodable)).instrument(span).await;
            None
        }
    }
}

/// Sets aside a message that cannot be decoded: it would fail the same way on every delivery.
async fn reject(ctx: &WorkerContext, undecodable: Undecodable) {
    let reason = format!("undecodable: {}", undecodable.body());
    tracing::error!(subject = %undecodable.envelope().subject(), %reason, "undecodable task dead-lettered");
    let set_aside = Disposition::SetAside {
        reason,
        attempts: 1,
    };
    settle(ctx, undecodable, set_aside).await;
}
