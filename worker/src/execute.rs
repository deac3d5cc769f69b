//! Running one task: a tool task through the registry, or a subagent task through the agent
//! runtime. Each gets a `TaskScope` closed on every outcome (a panic in the task becomes a failure,
//! so it closes too), its result sent to the dispatcher and recorded once by call key, and its
//! message settled only after the result is recorded. Every path returns how the message settles
//! (a `Disposition`); [`task`] applies it, once.
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
//! - result could not be recorded, a child session could not be loaded (Redis away), or the task
//!   was aborted by shutdown: nak (the attempt is not counted), so the broker redelivers it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use skein_common::agent::hooks::Listeners;
use skein_common::agent::runtime::{Runtime, TurnInput, TurnStop};
use skein_common::agent::skills::SkillCatalog;
use skein_common::bus::{Bus, Delivery, Disposition, Envelope, Received, Undecodable};
use skein_common::metrics::InFlight;
use skein_common::protocol::{
    validate_token, CallOutcome, EventKind, Failure, FailureKind, SubagentTask, TaskOrigin,
    ToolResult, ToolTask, TurnStatus, MAX_CALL_KEY_LEN, PROTOCOL_VERSION,
};
use skein_common::store::{CallAdmission, SessionState, SessionStore};
use skein_common::wiring::checkpoints::CallCheckpoints;
use skein_common::wiring::events::BusEvents;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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
}

/// How a task's work ended before its result is settled.
enum Work {
    Done(CallOutcome),
    /// Stopped by shutdown, or hit trouble another delivery may not: hand the task back.
    HandBack,
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
        stop,
        _registration,
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
    let run = async {
        let context = ToolContext {
            origin: &task.origin,
            call_id: &task.call_id,
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
        let running = ctx
            .registry
            .call(&task.tool, task.arguments.clone(), context)
            .instrument(span.clone());
        match tokio::time::timeout(timeout, contain_panic(running)).await {
            Ok(Ok(Ok(output))) => CallOutcome::Ok { output },
            Ok(Ok(Err(e))) => {
                let failure = e.to_failure();
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
        _ = stop.cancelled() => stopped(&abort),
        outcome = envelope.with_progress(ctx.progress_every, run) => Work::Done(outcome),
    };
    conclude(ctx, scope, work, call, started, attempt).await
}

async fn subagent_task(
    ctx: &WorkerContext,
    delivery: &Delivery<SubagentTask>,
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
        retries: false,
        label: &task.agent.name,
        first_dispatch: task.first_dispatch,
    };
    let checked = check_task(&call, task.v)
        .and_then(|()| validate_token("child_session", &task.child_session))
        .and_then(|()| check_nesting(task, ctx.max_depth));
    if let Err(failure) = checked {
        return refuse(ctx, call, failure).await;
    }
    let Some(runtime) = &ctx.runtime else {
        let failure = Failure::new(
            FailureKind::Unavailable,
            "this worker does not run subagents",
        );
        return refuse(ctx, call, failure).await;
    };
    let Admitted {
        attempt,
        stop,
        _registration,
    } = match admit(ctx, call, &abort).await {
        Ok(admitted) => admitted,
        Err(settled) => return settled,
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
    // The child's events are numbered after those of every earlier delivery of this call; the
    // first delivery of a first dispatch is the only one that can be first, so it needs no count.
    let first_run = task.first_dispatch && envelope.is_first();
    let epoch = if first_run {
        0
    } else {
        let (tenant, child_session) = (&child_origin.tenant, &child_origin.session);
        match ctx
            .store
            .next_event_epoch(tenant, child_session, &task.call_key)
            .await
        {
            Ok(epoch) => epoch,
            Err(e) => {
                tracing::warn!(error = %e, "event epoch not read; handing the task back");
                return conclude(ctx, scope, Work::HandBack, call, started, attempt).await;
            }
        }
    };
    let events = Arc::new(
        BusEvents::new(
            ctx.bus.clone(),
            Listeners::default(),
            child_origin.clone(),
            format!("subagent:{}", task.call_id),
        )
        .with_epoch(epoch),
    );
    let timeout = Duration::from_millis(task.timeout_ms).min(ctx.max_subagent_timeout);
    let run = async {
        let loaded = match ctx
            .store
            .load(&child_origin.tenant, &child_origin.session)
            .await
        {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::warn!(error = %e, "child session not loaded; handing the task back");
                return Work::HandBack;
            }
        };
        // A delivery that may follow an earlier one resumes that one's progress, if it left any.
        let (tenant, child_session) = (&child_origin.tenant, &child_origin.session);
        let resume = if first_run {
            None
        } else {
            match ctx
                .store
                .call_checkpoint(tenant, child_session, &task.call_key)
                .await
            {
                Ok(resume) => resume,
                Err(e) => {
                    tracing::warn!(error = %e, "child checkpoint not read; handing the task back");
                    return Work::HandBack;
                }
            }
        };
        if let Some(resumed) = &resume {
            tracing::info!(
                steps = resumed.iterations,
                "resuming the child turn from its checkpoint"
            );
        }
        events
            .emit(EventKind::TurnStarted {
                agent: task.agent.name.clone(),
                session: child_session.clone(),
                instance: ctx.instance.clone(),
                resumed_at_step: resume.as_ref().map(|r| r.iterations),
                trace_id: skein_common::telemetry::current_trace_id(),
            })
            .await;
        let checkpoints = CallCheckpoints {
            store: ctx.store.clone(),
            tenant: tenant.clone(),
            child_session: child_session.clone(),
            call_key: task.call_key.clone(),
        };
        let skills = SkillCatalog::from_skills(task.skills.clone());
        let turn = runtime.run_turn(TurnInput {
            origin: child_origin.clone(),
            agent: &task.agent,
            history: &loaded.state.history,
            loaded_skills: &loaded.state.skills,
            // The skills its task carried (the worker has no agents folder of its own).
            skills: Some(&skills),
            input: task.input.clone(),
            depth: task.depth,
            events: events.clone(),
            cancel: &stop,
            resume,
            // The child turn's calls can have run before only if this task ran before.
            first_run,
            checkpoints: Some(&checkpoints),
            // Nobody answers a subagent's approval requests: a call that would ask is denied.
            approvals: None,
        });
        let output = match tokio::time::timeout(timeout, contain_panic(turn)).await {
            Ok(Ok(Ok(output))) => output,
            // Stopped by its cancel request (or shutdown): as any cancelled call.
            Ok(Ok(Err(TurnStop::Interrupted(failure))))
                if failure.kind == FailureKind::Cancelled || stop.is_cancelled() =>
            {
                return stopped(&abort)
            }
            // Trouble that may pass (the registry could not be read): another attempt, not a
            // cancel, which would stop the calling turn.
            Ok(Ok(Err(TurnStop::Interrupted(failure)))) => {
                tracing::warn!(%failure, "subagent turn interrupted; handing the task back");
                return Work::HandBack;
            }
            // A subagent's loop has no approval gate, so it never suspends; should it, the
            // call fails clearly rather than waiting for an answer nobody can give.
            Ok(Ok(Err(TurnStop::AwaitingApproval(_)))) => {
                let failure =
                    Failure::new(FailureKind::Denied, "a subagent cannot wait for approval");
                return Work::Done(CallOutcome::Failed { failure });
            }
            Ok(Err(panicked)) => return Work::Done(CallOutcome::Failed { failure: panicked }),
            Err(_) => {
                let failure = Failure::new(
                    FailureKind::TimedOut,
                    format!("subagent ran longer than {timeout:?}"),
                );
                return Work::Done(CallOutcome::Failed { failure });
            }
        };
        if output.status == TurnStatus::Completed {
            let mut state = loaded.state;
            state.history.extend(output.new_messages);
            state.turns += 1;
            for skill in output.loaded_skills {
                if !state.skills.contains(&skill) {
                    state.skills.push(skill);
                }
            }
            save_child(&ctx.store, &child_origin, loaded.version, &state).await;
        }
        Work::Done(match (output.answer, output.failure) {
            (_, Some(failure)) => CallOutcome::Failed { failure },
            (Some(output), None) => CallOutcome::Ok { output },
            (None, None) => CallOutcome::Failed {
                failure: Failure::new(FailureKind::ModelFailed, "subagent gave no answer"),
            },
        })
    };
    let work = tokio::select! {
        _ = stop.cancelled() => stopped(&abort),
        work = envelope.with_progress(ctx.progress_every, run) => work,
    };
    events.flush().await;
    let ended = matches!(work, Work::Done(_));
    let settled = conclude(ctx, scope, work, call, started, attempt).await;
    if ended && settled == Disposition::Ack {
        // The result is recorded (or the call dead-lettered): its progress is no longer needed.
        let (tenant, child_session) = (&child_origin.tenant, &child_origin.session);
        if let Err(e) = ctx
            .store
            .drop_call_checkpoint(tenant, child_session, &task.call_key)
            .await
        {
            tracing::warn!(error = %e, "child checkpoint not dropped; it expires on its own");
        }
    }
    settled
}

/// Which attempt a delivery is.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    number: u64,
    /// Whether the store counted it (the first delivery of a first dispatch is not).
    counted: bool,
}

/// A task cleared to run: its attempt number, and the token that stops it (shutdown or a cancel
/// request), registered for cancel requests while it runs.
struct Admitted {
    attempt: Attempt,
    stop: CancellationToken,
    _registration: skein_common::cancel::Registration,
}

/// Decides whether a valid task runs now. `Err` with how the task settles when it was dealt with
/// here instead: its result was already recorded (re-sent), it must not start (deadline passed
/// or cancelled: answered with a failure), its attempts are used up (dead-lettered), or Redis
/// could not be asked (handed back).
async fn admit(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    abort: &CancellationToken,
) -> Result<Admitted, Disposition> {
    let origin = call.origin;
    let first = call.envelope.is_first();
    let counted = !(call.first_dispatch && first);
    let attempt = if !counted {
        // The first delivery of a first dispatch: no earlier delivery can have recorded a result
        // or counted an attempt, so the store is not asked (this attempt is counted by
        // redeliveries, below).
        1
    } else {
        admit_counted(ctx, call).await?
    };
    if let Some(failure) = not_startable(ctx, origin, !first).await {
        let outcome = CallOutcome::Failed { failure };
        return Err(finish(ctx, call, outcome, Instant::now()).await);
    }
    if attempt > ctx.max_attempts {
        let tries = attempt - 1;
        let reason =
            format!("no attempt of {tries} finished (its worker crashed or stopped each time)");
        if !dead_letter(ctx, call.envelope, &reason, tries).await {
            return Err(Disposition::Retry(Some(REDELIVERY_DELAY)));
        }
        let failure = Failure::new(FailureKind::DeadLettered, reason);
        let outcome = CallOutcome::Failed { failure };
        return Err(finish(ctx, call, outcome, Instant::now()).await);
    }
    let stop = abort.child_token();
    let registration = ctx
        .cancels
        .register(&origin.tenant, &origin.task_id, stop.clone());
    Ok(Admitted {
        attempt: Attempt {
            number: attempt,
            counted,
        },
        stop,
        _registration: registration,
    })
}

/// Asks the store, in one trip, for the recorded result of an earlier delivery (re-sent, and the
/// task done with: `Err(Ack)`) or this attempt's number. A first dispatch's first delivery was not
/// counted, so its later deliveries count one more (not a replay: its count starts afresh).
async fn admit_counted(ctx: &WorkerContext, call: CallRef<'_>) -> Result<u64, Disposition> {
    let origin = call.origin;
    match ctx
        .store
        .admit_call(&origin.tenant, &origin.session, call.call_key)
        .await
    {
        Ok(CallAdmission::Recorded(recorded)) => {
            tracing::info!("call already has a recorded result; re-sending it");
            reply(ctx, call.reply_to, &recorded).await;
            Err(Disposition::Ack)
        }
        Ok(CallAdmission::Attempt { count, first_count }) => Ok(attempt_number(
            count,
            call.first_dispatch && !call.envelope.is_replayed(),
            first_count,
        )),
        Err(e) => {
            tracing::warn!(error = %e, "cannot admit the call; handing the task back");
            Err(Disposition::Retry(Some(REDELIVERY_DELAY)))
        }
    }
}

/// The number of an attempt whose delivery the store counted as the `count`th. A first dispatch's
/// first delivery ran uncounted: when nothing was counted for the call before, it left no trace
/// (its worker crashed), so it was an attempt and counts one more; had it been handed back, it
/// would have noted that (`note_uncounted_hand_back`), and it is no attempt.
fn attempt_number(count: u64, first_dispatch: bool, first_count: bool) -> u64 {
    count.saturating_add(u64::from(first_dispatch && first_count))
}

/// Work stopped early: by shutdown (handed back to run elsewhere) or by a cancel request (ends
/// as a `cancelled` failure).
fn stopped(abort: &CancellationToken) -> Work {
    if abort.is_cancelled() {
        Work::HandBack
    } else {
        let failure = Failure::new(FailureKind::Cancelled, "the task was cancelled");
        Work::Done(CallOutcome::Failed { failure })
    }
}

/// Why work of this task must not start, if it must not: its deadline passed, or it was
/// cancelled. Cancel requests this worker heard are remembered; the cancel stream is asked only
/// for a redelivered task (the request may have come while this worker was not listening), which
/// keeps a broker round trip off every first delivery.
async fn not_startable(
    ctx: &WorkerContext,
    origin: &TaskOrigin,
    redelivered: bool,
) -> Option<Failure> {
    if origin.time_left().is_some_and(|left| left.is_zero()) {
        return Some(Failure::new(
            FailureKind::TimedOut,
            "the task's deadline passed before the call started",
        ));
    }
    let cancelled = || {
        Some(Failure::new(
            FailureKind::Cancelled,
            "the task was cancelled",
        ))
    };
    if ctx.cancels.heard(&origin.tenant, &origin.task_id) {
        return cancelled();
    }
    if !redelivered {
        return None;
    }
    match ctx
        .bus
        .cancel_requested(&origin.tenant, &origin.task_id)
        .await
    {
        Ok(true) => cancelled(),
        Ok(false) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot look for a cancel request; running the call");
            None
        }
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

/// Closes the task's scope, then decides how the task settles: its result is recorded and sent,
/// a transient failure is tried again after a backoff, or the task is handed back to the broker.
async fn conclude(
    ctx: &WorkerContext,
    mut scope: TaskScope,
    work: Work,
    call: CallRef<'_>,
    started: Instant,
    attempt: Attempt,
) -> Disposition {
    let Attempt {
        number: attempt,
        counted,
    } = attempt;
    if let Err(e) = scope.close().await {
        tracing::warn!(error = %e, "task scope closed with errors");
    }
    match work {
        Work::Done(outcome)
            if call.retries && worth_retrying(&outcome) && attempt < ctx.max_attempts =>
        {
            let delay = retry_backoff(attempt);
            tracing::info!(attempt, ?delay, "transient failure; trying again");
            Disposition::Retry(Some(delay))
        }
        Work::Done(outcome) => {
            if call.retries && worth_retrying(&outcome) {
                let reason = format!(
                    "failed on all {attempt} attempts; last: {}",
                    outcome.observation()
                );
                if !dead_letter(ctx, call.envelope, &reason, attempt).await {
                    return Disposition::Retry(Some(REDELIVERY_DELAY));
                }
            }
            finish(ctx, call, outcome, started).await
        }
        Work::HandBack => {
            // Shutdown or Redis trouble is not the task's fault: the attempt does not count.
            let (origin, store) = (call.origin, &ctx.store);
            let (tenant, session, key) = (&origin.tenant, &origin.session, call.call_key);
            let taken_back = if counted {
                store.uncount_attempt(tenant, session, key).await
            } else {
                store.note_uncounted_hand_back(tenant, session, key).await
            };
            if let Err(e) = taken_back {
                tracing::warn!(error = %e, "attempt not taken back");
            }
            Disposition::Retry(Some(REDELIVERY_DELAY))
        }
    }
}

/// A failure another attempt may cure: an upstream that was unreachable. (A call that used up
/// its time limit is not tried again: that would double its cost; the model decides.)
fn worth_retrying(outcome: &CallOutcome) -> bool {
    matches!(outcome, CallOutcome::Failed { failure } if failure.retryable && failure.kind == FailureKind::Unavailable)
}

/// Delay before attempt `attempt + 1`: 250 ms doubling, at most 4 s.
fn retry_backoff(attempt: u64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(4) as u32;
    Duration::from_millis(250 * 2u64.pow(exponent)).min(Duration::from_secs(4))
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
    delivery.settle(disposition).instrument(span).await;
}

/// Runs one delivered subagent task.
pub(crate) async fn subagent(
    ctx: Arc<WorkerContext>,
    received: Received<SubagentTask>,
    abort: CancellationToken,
) {
    let Some((delivery, span, _in_flight)) = begin(&ctx, "subagent", received).await else {
        return;
    };
    let disposition = subagent_task(&ctx, &delivery, abort)
        .instrument(span.clone())
        .await;
    delivery.settle(disposition).instrument(span).await;
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
            reject(ctx, undecodable).instrument(span).await;
            None
        }
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

/// Checks what a task names before anything is built from it (keys, subjects).
fn check_task(call: &CallRef<'_>, version: u32) -> Result<(), Failure> {
    if version != PROTOCOL_VERSION {
        return Err(Failure::new(
            FailureKind::InvalidInput,
            format!("unsupported protocol version {version}"),
        ));
    }
    let origin = call.origin;
    validate_token("task_id", &origin.task_id)?;
    validate_token("tenant", &origin.tenant)?;
    validate_token("workspace", &origin.workspace)?;
    validate_token("session", &origin.session)?;
    if call.call_key.is_empty() || call.call_key.len() > MAX_CALL_KEY_LEN {
        return Err(Failure::new(
            FailureKind::InvalidInput,
            format!("call_key must be 1-{MAX_CALL_KEY_LEN} bytes"),
        ));
    }
    Ok(())
}

/// A subagent task is trusted no further than its message: its depth must lie within this
/// worker's bound, and its agent spec must pass the checks its definition would have.
fn check_nesting(task: &SubagentTask, max_depth: u32) -> Result<(), Failure> {
    if task.depth == 0 || task.depth > max_depth {
        return Err(Failure::new(
            FailureKind::InvalidInput,
            format!("subagent depth must be 1..={max_depth}, got {}", task.depth),
        ));
    }
    skein_common::agent::definition::check_spec(&task.agent, max_depth - task.depth)
}

/// Answers a task that must not run (invalid, or not servable here) without recording anything
/// under the names it carries; it is then terminated.
async fn refuse(ctx: &WorkerContext, call: CallRef<'_>, failure: Failure) -> Disposition {
    tracing::warn!(%failure, "task refused");
    let result = ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call.call_id.to_owned(),
        outcome: CallOutcome::Failed { failure },
        worker_id: ctx.instance.clone(),
        duration_ms: 0,
    };
    reply(ctx, call.reply_to, &result).await;
    Disposition::Reject
}

/// Sends the result and records it (first write wins); the task is then acked. The reply goes out before the
/// store is asked, so the caller does not wait on it; the ack waits for the record, so a result
/// that could not be recorded comes again from a redelivery (the dispatcher takes the first result
/// it hears for a dispatch and drops the rest, and a turn that resumes reads the recorded one).
async fn finish(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    outcome: CallOutcome,
    started: Instant,
) -> Disposition {
    let origin = call.origin;
    let outcome_label = match &outcome {
        CallOutcome::Ok { .. } => "ok",
        CallOutcome::Failed { failure } => failure.kind.as_str(),
    };
    ctx.metrics
        .tool_task_finished(call.label, outcome_label, started.elapsed());
    let result = ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call.call_id.to_owned(),
        outcome,
        worker_id: ctx.instance.clone(),
        duration_ms: started.elapsed().as_millis() as u64,
    };
    reply(ctx, call.reply_to, &result).await;
    match ctx
        .store
        .record_result(&origin.tenant, &origin.session, call.call_key, &result)
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::info!("an earlier delivery recorded this call's result first"),
        Err(e) => {
            tracing::warn!(error = %e, "result not recorded; handing the task back");
            return Disposition::Retry(Some(REDELIVERY_DELAY));
        }
    }
    Disposition::Ack
}

async fn reply(ctx: &WorkerContext, reply_to: &str, result: &ToolResult) {
    if !reply_to.starts_with(skein_common::subjects::REPLY_PREFIX) {
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

/// Sets aside a message that cannot be decoded: it would fail the same way on every delivery.
async fn reject(ctx: &WorkerContext, undecodable: Undecodable) {
    let reason = format!("undecodable: {}", undecodable.body());
    let kind = task_kind(undecodable.envelope()).to_owned();
    tracing::error!(subject = %undecodable.envelope().subject(), %reason, "undecodable task dead-lettered");
    let applied = undecodable
        .settle(Disposition::SetAside {
            reason,
            attempts: 1,
        })
        .await;
    if matches!(applied, Disposition::SetAside { .. }) {
        ctx.metrics.dead_lettered(&kind);
    }
}

#[cfg(test)]
mod tests {
    use super::attempt_number;

    #[test]
    fn an_uncounted_first_delivery_counts_only_when_it_left_no_trace() {
        // Its worker crashed: the redelivery, counted first, is the second attempt.
        assert_eq!(attempt_number(1, true, true), 2);
        // It was handed back (noted): the redelivery is the first attempt.
        assert_eq!(attempt_number(1, true, false), 1);
        // Not a first dispatch (or a replay): the count is the attempt.
        assert_eq!(attempt_number(1, false, true), 1);
        assert_eq!(attempt_number(3, false, false), 3);
        assert_eq!(attempt_number(u64::MAX, true, true), u64::MAX);
    }
}
