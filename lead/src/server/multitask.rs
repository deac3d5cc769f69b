//! A submission's `multitask` policy (`TaskSubmission::multitask`): what a task does when its turn
//! order look finds older tasks of its session unfinished (4.2, step 8).
//!
//! - `enqueue` waits for them, as every task did before the policy existed;
//! - `reject` ends the task at once, without running it: status `rejected`, failure
//!   `session_busy` naming the oldest unfinished task (the one that holds the session);
//! - `rollback` publishes a cancel request for each older unfinished task (the durable request of
//!   `skein cancel`: a running turn ends `cancelled` with the session as it was, a queued one ends
//!   `cancelled` when it is taken), then waits for them to end;
//! - `interrupt` records in the store, for each older unfinished task, that this task interrupts
//!   it (`SessionStore::request_interrupt`, one of the task's controls) and wakes it, then waits.
//!   The running turn reads its controls at its next step boundary (`control`) and ends before
//!   its next model call, keeping its work; a queued one ends the same way before its first model
//!   call, keeping its input.
//!
//! Invariants: only the older unfinished submissions of the task's own session are affected (its
//! submit subject, earlier places in the submit streams); cancel and interrupt requests are durable and
//! idempotent, so one made for a task that has not started yet is met when it starts, and a
//! delivery handed back and taken again repeats them harmlessly. A look that fails never ends a
//! task: `reject` hands it back to look again, the other policies wait as `enqueue` does.

use std::time::Duration;

use skein_common::protocol::{
    CancelRequest, Failure, FailureKind, MultitaskPolicy, TaskSubmission, TurnStatus,
    PROTOCOL_VERSION,
};

use skein_common::bus::SubmissionPlace;
use skein_common::subjects;

use super::finals::failed_result;
use super::{Lead, Settled};

/// Most older tasks one submission cancels or interrupts (a session's queue is short; this bounds
/// the looks of a flooded one).
const MAX_AFFECTED: usize = 64;

impl Lead {
    /// Applies the task's policy once its turn order look found older tasks of its session
    /// unfinished: `Some` when the task ended here (rejected, or handed back to look again),
    /// `None` when it goes on waiting for its turn.
    pub(super) async fn apply_multitask(
        &self,
        submission: &TaskSubmission,
        place: SubmissionPlace,
    ) -> Option<Settled> {
        let policy = submission.multitask;
        if policy == MultitaskPolicy::Enqueue {
            return None;
        }
        let (tenant, session) = (submission.tenant.as_str(), submission.session.as_str());
        let older = match self
            .bus
            .unfinished_submissions(tenant, session, place, MAX_AFFECTED)
            .await
        {
            Ok(older) => older,
            Err(e) if policy == MultitaskPolicy::Reject => {
                return Some(Settled::Retry(e.to_failure()))
            }
            Err(e) => {
                tracing::warn!(error = %e, %policy, "older tasks of the session not read; waiting for them");
                return None;
            }
        };
        // Ended meanwhile: the task's turn comes as usual.
        let oldest = older.first()?;
        let me = submission.task_id.as_str();
        match policy {
            MultitaskPolicy::Enqueue => None,
            MultitaskPolicy::Reject => {
                let holder = match &oldest.task_id {
                    Some(task_id) => format!("task {task_id}"),
                    None => format!(
                        "the task at sequence {} of {}",
                        oldest.place.sequence,
                        subjects::submit_stream(oldest.place.partition)
                    ),
                };
                tracing::info!(%holder, "the session is busy; rejecting the task (multitask: reject)");
                let failure = Failure::new(
                    FailureKind::SessionBusy,
                    format!(
                        "session {session} is busy with {holder}; this task asked not to wait \
                         (multitask: reject)"
                    ),
                );
                let mut result = failed_result(submission, failure, 0);
                result.status = TurnStatus::Rejected;
                let settled = self.publish_final(result).await;
                // Counted once: when the result is stored (a later delivery only announces it).
                if matches!(settled, Settled::Done | Settled::Unannounced(_)) {
                    self.metrics.turn_finished("rejected", Duration::ZERO);
                }
                Some(settled)
            }
            MultitaskPolicy::Rollback => {
                for task_id in older.iter().filter_map(|o| o.task_id.as_deref()) {
                    let request = CancelRequest {
                        v: PROTOCOL_VERSION,
                        tenant: tenant.to_owned(),
                        task_id: task_id.to_owned(),
                        reason: format!("rolled back by task {me} (multitask: rollback)"),
                        call_id: None,
                    };
                    match self.bus.request_cancel(&request).await {
                        Ok(()) => tracing::info!(
                            older = task_id,
                            "older task cancelled (multitask: rollback)"
                        ),
                        Err(e) => {
                            tracing::warn!(older = task_id, error = %e, "older task not cancelled")
                        }
                    }
                }
                None
            }
            MultitaskPolicy::Interrupt => {
                for task_id in older.iter().filter_map(|o| o.task_id.as_deref()) {
                    match self
                        .store
                        .request_interrupt(tenant, session, task_id, me)
                        .await
                    {
                        Ok(()) => {
                            tracing::info!(
                                older = task_id,
                                "older task interrupted (multitask: interrupt)"
                            );
                            // Its running turn reads its controls at its next step.
                            self.wake(tenant, task_id).await;
                        }
                        Err(e) => {
                            tracing::warn!(older = task_id, error = %e, "older task not interrupted")
                        }
                    }
                }
                None
            }
        }
    }
}
