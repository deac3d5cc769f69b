//! Final results that do not come from a turn's end: a task that ended without running (stored,
//! then announced), a redelivered task that already ended (announced again from its stored
//! result), and a refused submission (announced to the tenant its subject names, set aside).

use skein_common::agent::hooks::Listeners;
use skein_common::bus::{BusError, Disposition, Envelope};
use skein_common::protocol::{
    validate_token, EventKind, Failure, FinalResult, TaskSubmission, TurnStatus, PROTOCOL_VERSION,
};
use skein_common::store::Ended;
use skein_common::subjects;
use skein_common::wiring::events::BusEvents;

use super::{Lead, Settled};

impl Lead {
    /// Stores and publishes the final result of a task that ended without running a turn. A
    /// final result is written once: if the task had ended already (a resubmit, say), the stored
    /// one is announced instead and stands.
    pub(super) async fn publish_final(&self, result: FinalResult) -> Settled {
        match self.store.store_final(&result).await {
            Ok(Ended::Stored) => announced(self.announce_final(result).await),
            Ok(Ended::Earlier(earlier)) => {
                tracing::info!("task already ended; announcing its stored result");
                announced(self.announce_final(*earlier).await)
            }
            Err(e) => {
                // Announced all the same; a later delivery stores it again.
                tracing::warn!(error = %e, "final result not stored");
                self.announce_final(result).await.ok();
                Settled::Retry(e.to_failure())
            }
        }
    }

    /// Publishes a final result on its task's event subject (stores nothing).
    async fn announce_final(&self, result: FinalResult) -> Result<(), BusError> {
        let origin = skein_common::protocol::TaskOrigin {
            task_id: result.task_id.clone(),
            tenant: result.tenant.clone(),
            user: String::new(),
            session: result.session.clone(),
            workspace: result.session.clone(),
            deadline_ms: None,
            budget: None,
            run_budget: None,
        };
        let events = BusEvents::new(
            self.bus.clone(),
            &self.payloads,
            Listeners::default(),
            origin,
            "lead",
        );
        events.announce(EventKind::Final { result }).await
    }

    /// Announces the stored final result of a task that already ended (a redelivery).
    pub(super) async fn emit_final(
        &self,
        submission: &TaskSubmission,
        result: FinalResult,
        epoch: u64,
    ) -> Settled {
        let events = BusEvents::new(
            self.bus.clone(),
            &self.payloads,
            self.listeners.clone(),
            submission.origin(),
            "lead",
        )
        .with_epoch(epoch);
        announced(events.announce(EventKind::Final { result }).await)
    }

    /// Refuses a submission that will not run — it cannot be decoded, breaks a protocol rule, or
    /// travels on another session's subject. The failure is announced on the task's event subject
    /// of the tenant the *subject* names (never one the body claims), and only for a task id that
    /// has no events yet: a refusal never speaks for a task that runs or ran (a client's first
    /// final would be the refusal). Nothing is stored under the names it carries; the message is
    /// set aside as a dead letter and terminated, since it would fail the same way on every
    /// delivery.
    pub(super) async fn reject(
        &self,
        envelope: Envelope,
        task_id: Option<String>,
        failure: Failure,
    ) {
        tracing::warn!(subject = %envelope.subject(), %failure, "submission rejected");
        let tenant = subjects::parse_submit(envelope.subject()).map(|(tenant, _)| tenant);
        if let (Some(tenant), Some(task_id)) = (tenant, task_id) {
            // A submission's message id is scoped by its tenant (`bus::submission_id`).
            let task_id = task_id
                .strip_prefix(tenant)
                .and_then(|rest| rest.strip_prefix(':'))
                .map_or(task_id.clone(), str::to_owned);
            let valid = validate_token("tenant", tenant).is_ok()
                && validate_token("task_id", &task_id).is_ok();
            if valid && !self.task_has_events(tenant, &task_id).await {
                let stub = TaskSubmission {
                    replay_of: None,
                    v: PROTOCOL_VERSION,
                    task_id,
                    tenant: tenant.to_owned(),
                    user: String::new(),
                    session: String::new(),
                    agent: String::new(),
                    input: Default::default(),
                    overrides: None,
                    deadline_ms: None,
                    budget: None,
                    multitask: Default::default(),
                    output_schema: None,
                };
                // Best effort: the dead letter below keeps the record of the refusal.
                if let Err(e) = self
                    .announce_final(failed_result(&stub, failure.clone(), 0))
                    .await
                {
                    tracing::warn!(error = %e, "refusal not announced");
                }
            }
        }
        let reason = format!("rejected: {failure}");
        let applied = envelope
            .settle(Disposition::SetAside {
                reason,
                attempts: 1,
            })
            .await;
        if matches!(applied, Disposition::SetAside { .. }) {
            self.metrics.dead_lettered("submit");
        }
    }
}

impl Lead {
    /// Whether a task id already has events (it runs or ran); an unanswered look counts as yes,
    /// so a refusal is never announced over a real task.
    async fn task_has_events(&self, tenant: &str, task_id: &str) -> bool {
        match self.bus.last_event(tenant, task_id).await {
            Ok(None) => false,
            Ok(Some(_)) => {
                tracing::warn!(%task_id, "a refused submission names a task that has events; not announced");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for the task's events; refusal not announced");
                true
            }
        }
    }
}

/// How a task whose final result is stored settles, by whether its final event was announced.
pub(super) fn announced(announce: Result<(), BusError>) -> Settled {
    match announce {
        Ok(()) => Settled::Done,
        Err(e) => Settled::Unannounced(e.to_failure()),
    }
}

pub(super) fn failed_result(
    submission: &TaskSubmission,
    failure: Failure,
    iterations: u32,
) -> FinalResult {
    FinalResult {
        v: PROTOCOL_VERSION,
        task_id: submission.task_id.clone(),
        tenant: submission.tenant.clone(),
        session: submission.session.clone(),
        status: TurnStatus::Failed,
        answer: None,
        answer_ref: None,
        output: None,
        output_ref: false,
        failure: Some(failure),
        iterations,
        limit_reached: false,
        usage: Default::default(),
        trace_id: skein_common::telemetry::current_trace_id(),
        spent: None,
    }
}
