//! Whether a delivered task runs: its names checked before anything is built from them, a task
//! that must not run refused, and admission — the recorded result of an earlier delivery re-sent,
//! a copy of a call whose run is still in progress elsewhere kept waiting for that run's result,
//! the attempt counted (or not, for a first dispatch's first delivery), a task past its deadline
//! or cancelled answered without running, attempts used up set aside.

use std::time::{Duration, Instant};

use skein_common::bus::Disposition;
use skein_common::protocol::{
    validate_token, CallOutcome, Failure, FailureKind, TaskOrigin, ToolResult, MAX_CALL_KEY_LEN,
    PROTOCOL_VERSION,
};
use skein_common::store::{CallAdmission, RunMarker};
use skein_common::subjects;
use tokio_util::sync::CancellationToken;

use super::marker::RunOwner;
use super::settling::{finish, reply};
use super::{dead_letter, CallRef, WorkerContext, REDELIVERY_DELAY};

/// Which attempt a delivery is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attempt {
    pub(super) number: u64,
    /// Whether the store counted it (the first delivery of a first dispatch is not).
    pub(super) counted: bool,
}

/// A task cleared to run: its attempt number, its run's marker, and the token that stops it
/// (shutdown or a cancel request), registered for cancel requests while it runs.
pub(super) struct Admitted {
    pub(super) attempt: Attempt,
    pub(super) run: RunOwner,
    pub(super) stop: CancellationToken,
    /// Under the task, and under every subagent run the work belongs to (a cancel request for
    /// one run stops the work under it).
    pub(super) _registrations: Vec<skein_common::cancel::Registration>,
}

/// Decides whether a valid task runs now. `Err` with how the task settles when it was dealt with
/// here instead: its result was already recorded (re-sent), it must not start (deadline passed
/// or cancelled: answered with a failure), its attempts are used up (dead-lettered), or Redis
/// could not be asked (handed back).
pub(super) async fn admit(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    abort: &CancellationToken,
) -> Result<Admitted, Disposition> {
    let origin = call.origin;
    let first = call.envelope.is_first();
    let counted = !(call.first_dispatch && first);
    let mut run = RunOwner::new(ctx);
    let attempt = if !counted {
        // The first delivery of a first dispatch: no earlier delivery can have recorded a result,
        // counted an attempt or be running, so the store is not asked (this attempt is counted by
        // redeliveries, below; its marker is taken while it runs).
        1
    } else {
        let attempt = admit_counted(ctx, call, &run, abort).await?;
        run.claimed = true;
        attempt
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
    let registrations = std::iter::once(origin.task_id.clone())
        .chain(
            skein_common::protocol::ancestor_calls(&origin.workspace, &origin.session)
                .into_iter()
                .map(|call| subjects::run_cancel_key(&origin.task_id, call)),
        )
        .map(|key| ctx.cancels.register(&origin.tenant, &key, stop.clone()))
        .collect();
    Ok(Admitted {
        attempt: Attempt {
            number: attempt,
            counted,
        },
        run,
        stop,
        _registrations: registrations,
    })
}

/// First wait between two looks at a call whose run is in progress elsewhere.
const FIRST_LOOK_AFTER: Duration = Duration::from_millis(100);

/// Longest wait between two such looks.
const LONGEST_LOOK_AFTER: Duration = Duration::from_secs(1);

/// Asks the store, in one trip, for the recorded result of an earlier delivery (re-sent, and the
/// task done with: `Err(Ack)`) or this attempt's number, the run's marker taken. A first
/// dispatch's first delivery was not counted, so its later deliveries count one more (not a
/// replay: its count starts afresh).
///
/// While another run of the call holds its marker (the broker redelivered the task, but the run
/// it gave up on is still going: its progress acks were lost, or it outlived the ack wait), this
/// copy waits, keeping its own delivery alive, until that run records its result (re-sent) or its
/// marker goes (it was handed back, or its worker died and stopped renewing it): effects are not
/// applied by two runs side by side. The wait ends early only for shutdown (handed back): a
/// passed deadline or a cancel request must not record "not started" over a run that may have
/// applied its effects.
async fn admit_counted(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    run: &RunOwner,
    abort: &CancellationToken,
) -> Result<u64, Disposition> {
    let marker = run.marker(ctx);
    let waiting = async {
        let mut look_after = FIRST_LOOK_AFTER;
        let mut waited = false;
        loop {
            let owner = match admit_once(ctx, call, marker).await? {
                Look::Run(attempt) => {
                    if waited {
                        tracing::info!(
                            "the other run of this call ended without a result; running it"
                        );
                    }
                    return Ok(attempt);
                }
                Look::Wait { owner } => owner,
            };
            if abort.is_cancelled() {
                return Err(Disposition::Retry(Some(REDELIVERY_DELAY)));
            }
            // No deadline or cancel check here: the run in progress may have applied its effects,
            // so only its own result may be recorded. It ends by itself (a cancel request stops
            // it too, its time limit bounds it), or its marker expires with its worker.
            if !waited {
                tracing::info!(%owner, "another run of this call is in progress; waiting for its result");
                ctx.metrics.waited_for_running_call(call.label);
                waited = true;
            }
            tokio::select! {
                _ = abort.cancelled() => {}
                _ = tokio::time::sleep(look_after) => {}
            }
            look_after = (look_after * 2).min(LONGEST_LOOK_AFTER);
        }
    };
    call.envelope
        .with_progress(ctx.progress_every, waiting)
        .await
}

/// What one look at the store found a call to need.
enum Look {
    /// Run it as this attempt.
    Run(u64),
    /// Wait: another run (`owner`) is in progress.
    Wait { owner: String },
}

/// One look at the store; `Err` with how the task settles when it is done with here.
async fn admit_once(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    marker: RunMarker<'_>,
) -> Result<Look, Disposition> {
    let origin = call.origin;
    match ctx
        .store
        .admit_call(&origin.tenant, &origin.session, call.call_key, marker)
        .await
    {
        Ok(CallAdmission::Recorded(recorded)) => {
            tracing::info!("call already has a recorded result; re-sending it");
            reply(ctx, call.reply_to, &recorded).await;
            Err(Disposition::Ack)
        }
        Ok(CallAdmission::Attempt { count, first_count }) => Ok(Look::Run(attempt_number(
            count,
            call.first_dispatch && !call.envelope.is_replayed(),
            first_count,
        ))),
        Ok(CallAdmission::RunningElsewhere { owner }) => Ok(Look::Wait { owner }),
        Err(e) if e.is_persistent() => Err(unreadable(ctx, call, e).await),
        Err(e) => {
            tracing::warn!(error = %e, "cannot admit the call; handing the task back");
            Err(Disposition::Retry(Some(REDELIVERY_DELAY)))
        }
    }
}

/// A call whose stored state cannot be read (corrupt, or a key of the wrong type): every
/// delivery would fail the same way, so its caller gets the failure and the task is set aside
/// with the true reason, not handed back for ever.
pub(super) async fn unreadable(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    error: skein_common::store::StoreError,
) -> Disposition {
    tracing::error!(%error, "the call's stored state cannot be read; setting it aside");
    let reason = format!("stored state this call needs cannot be read: {error}");
    let result = ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call.call_id.to_owned(),
        outcome: CallOutcome::Failed {
            failure: Failure::new(FailureKind::DeadLettered, reason.clone()),
        },
        worker_id: ctx.instance.clone(),
        duration_ms: 0,
        attempts: call.envelope.delivered().try_into().unwrap_or(u32::MAX),
    };
    reply(ctx, call.reply_to, &result).await;
    Disposition::SetAside {
        reason,
        attempts: u64::try_from(call.envelope.delivered()).unwrap_or(1),
    }
}

/// The number of an attempt whose delivery the store counted as the `count`th. A first dispatch's
/// first delivery ran uncounted: when nothing was counted for the call before, it left no trace
/// (its worker crashed), so it was an attempt and counts one more; had it been handed back, it
/// would have noted that (`note_uncounted_hand_back`), and it is no attempt.
fn attempt_number(count: u64, first_dispatch: bool, first_count: bool) -> u64 {
    count.saturating_add(u64::from(first_dispatch && first_count))
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

/// Checks what a task names before anything is built from it (keys, subjects).
pub(super) fn check_task(call: &CallRef<'_>, version: u32) -> Result<(), Failure> {
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

/// Answers a task that must not run (invalid, or not servable here) without recording anything
/// under the names it carries; it is then terminated.
pub(super) async fn refuse(
    ctx: &WorkerContext,
    call: CallRef<'_>,
    failure: Failure,
) -> Disposition {
    tracing::warn!(%failure, "task refused");
    let result = ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call.call_id.to_owned(),
        outcome: CallOutcome::Failed { failure },
        worker_id: ctx.instance.clone(),
        duration_ms: 0,
        attempts: call.envelope.delivered().try_into().unwrap_or(u32::MAX),
    };
    reply(ctx, call.reply_to, &result).await;
    Disposition::Reject
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
