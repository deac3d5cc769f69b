//! How a task that ran settles: its scope closed first, then its result sent and recorded (first
//! write wins) and the message acked, a transient failure tried again after a backoff, attempts
//! used up set aside, or the task handed back (its attempt taken back) when it stopped for a reason
//! that is not its fault.

use std::time::{Duration, Instant};

use skein_common::bus::Disposition;
use skein_common::protocol::{CallOutcome, FailureKind, ToolResult, PROTOCOL_VERSION};

use super::admission::{unreadable, Attempt};
use super::marker::RunOwner;
use super::{dead_letter, CallRef, Work, WorkerContext, REDELIVERY_DELAY};
use crate::scope::TaskScope;

/// Closes the task's scope, then decides how the task settles: its result is recorded and sent,
/// a transient failure is tried again after a backoff, or the task is handed back to the broker.
pub(super) async fn conclude(
    ctx: &WorkerContext,
    mut scope: TaskScope,
    work: Work,
    call: CallRef<'_>,
    started: Instant,
    attempt: Attempt,
    run: &RunOwner,
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
            // Tried again by a redelivery, which must not wait for this run's marker.
            run.release(ctx, call).await;
            let delay = retry_backoff(attempt);
            tracing::info!(attempt, ?delay, failure = %outcome.observation(), "transient failure; trying again");
            Disposition::Retry(Some(delay))
        }
        Work::Done(outcome) => {
            if call.retries && worth_retrying(&outcome) {
                let reason = format!(
                    "failed on all {attempt} attempts; last: {}",
                    outcome.observation()
                );
                if !dead_letter(ctx, call.envelope, &reason, attempt).await {
                    run.release(ctx, call).await;
                    return Disposition::Retry(Some(REDELIVERY_DELAY));
                }
            }
            finish(ctx, call, outcome, started).await
        }
        Work::HandBack | Work::Wait(_) => {
            // Shutdown, Redis trouble or a full cap is not the task's fault: the attempt does
            // not count.
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
            run.release(ctx, call).await;
            match work {
                Work::Wait(delay) => Disposition::Retry(Some(delay)),
                _ => Disposition::Retry(Some(REDELIVERY_DELAY)),
            }
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

/// Sends the result and records it (first write wins); the task is then acked. The reply goes out before the
/// store is asked, so the caller does not wait on it; the ack waits for the record, so a result
/// that could not be recorded comes again from a redelivery (the dispatcher takes the first result
/// it hears for a dispatch and drops the rest, and a turn that resumes reads the recorded one).
pub(super) async fn finish(
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
        attempts: call.envelope.delivered().try_into().unwrap_or(u32::MAX),
    };
    reply(ctx, call.reply_to, &result).await;
    match ctx
        .store
        .record_result(&origin.tenant, &origin.session, call.call_key, &result)
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::info!("an earlier delivery recorded this call's result first"),
        Err(e) if e.is_persistent() => return unreadable(ctx, call, e).await,
        Err(e) => {
            tracing::warn!(error = %e, "result not recorded; handing the task back");
            return Disposition::Retry(Some(REDELIVERY_DELAY));
        }
    }
    Disposition::Ack
}

pub(super) async fn reply(ctx: &WorkerContext, reply_to: &str, result: &ToolResult) {
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
