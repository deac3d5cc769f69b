//! Turns that wait for a person, on the lead: suspending them, holding them without a slot, and
//! recording the answers that resume them.
//!
//! Suspend: the turn's step was checkpointed before its calls were decided, so all that is left is
//! to store the request (`ApprovalRequest`, keeping the first request's time and expiry), release
//! the lease and uncount the attempt (done by the caller), and *park* the submission: the message
//! stays unacknowledged in the stream — so later turns of the session keep waiting behind it and a
//! lead that dies loses nothing (the broker redelivers it after `ack_wait`) — but it holds no turn
//! slot. The parked task only sends progress acks until something wakes it: an answer (a wake on
//! `skein.wake.{tenant}.{task}`), the request's expiry, a cancel request, the task's deadline, or
//! shutdown. Then it hands the message back (`nak`) and whichever lead takes it resumes the turn
//! from its checkpoint, where the approval gate has the answer.
//!
//! Answer: any lead consumes `ApprovalDecision`s from `SKEIN_APPROVALS` (work queue, so one lead
//! records each), checks who answers (`admission`: the signature, tenant and `approve` role; then
//! the approver rules of `permissions.toml` and self-approval), records them (first answer per
//! call wins, under the verified principal) under the request they answer — the task's own
//! turn's, or a waiting subagent run's (`run`) — adds `--always` rules to the session (the call's
//! tool and primary argument, or the approver's own rule if it matches the call), writes the
//! audit record, and publishes the wake. A refused decision is set aside and audited; the call
//! keeps waiting for someone allowed. A decision for a task with no stored request, or for a call it
//! does not wait on, is logged and dropped: there is nothing to resume.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use skein_common::agent::permissions::{always_rule_for_call, check_always_rule};
use skein_common::agent::runtime::Awaiting;
use skein_common::audit::AuditRecord;
use skein_common::bus::{Bus, BusError, Disposition, Envelope, Received};
use skein_common::principals::{Acting, Operation, Refusal};
use skein_common::protocol::{
    approval_key, now_ms, validate_token, ApprovalAnswer, ApprovalDecision, ApprovalRequest,
    PendingCall, TaskSubmission, PROTOCOL_VERSION,
};
use skein_common::store::approvals::Answered;
use skein_common::subjects;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::by_task::{ByTask, Registered};
use crate::server::{Lead, Settled};

/// Decisions recorded at once by one lead.
pub const DECISION_CONCURRENCY: usize = 8;
/// Delay before a decision that could not be recorded (Redis away) is offered again.
const DECISION_RETRY: Duration = Duration::from_secs(1);

/// What became of a decision.
enum Recorded {
    /// Its answers were recorded.
    Answered,
    /// It answers nothing that waits (dropped, logged).
    Nothing,
    /// Its principal may not answer (an approver rule, self-approval, an `--always` rule that
    /// does not match the call).
    NotAllowed(Refusal),
}

/// A suspended turn, as the lead parks it.
#[derive(Debug, Clone, PartialEq)]
pub struct Suspension {
    pub submission: TaskSubmission,
    /// When unanswered calls are denied.
    pub expires_at_ms: Option<u64>,
    /// What it waits for.
    pub waits_for: Waiting,
}

/// What a parked turn waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Answers to its calls' approval requests.
    Answers,
    /// A resume of its pause.
    Resume,
}

impl Waiting {
    fn as_str(self) -> &'static str {
        match self {
            Waiting::Answers => "answered",
            Waiting::Resume => "resumed",
        }
    }
}

/// The suspended turns this lead holds, by tenant and task, each with the signal that wakes it;
/// and the running turns, whose controls a wake tells them to read.
#[derive(Clone, Default)]
pub struct Parked {
    waiting: ByTask<Arc<Notify>>,
    pub running: crate::control::RunningTurns,
}

impl Parked {
    /// Starts listening for wakes (core NATS, `skein.wake.>`).
    pub async fn listen(
        bus: &Bus,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) -> Result<Self, BusError> {
        let mut wakes = bus.subscribe(subjects::WAKE_ALL).await?;
        let parked = Parked::default();
        let waiting = parked.waiting.clone();
        let running = parked.running.clone();
        tracker.spawn(async move {
            loop {
                let wake = tokio::select! {
                    _ = stop.cancelled() => break,
                    wake = wakes.next() => wake,
                };
                let Some(wake) = wake else { break };
                let Some((tenant, task)) = subjects::parse_wake(&wake.subject) else {
                    continue;
                };
                running.raise(tenant, task);
                if let Some(notify) = waiting.get(tenant, task) {
                    notify.notify_one();
                }
            }
        });
        Ok(parked)
    }

    fn register(&self, tenant: &str, task_id: &str) -> (Arc<Notify>, Registered<Arc<Notify>>) {
        let notify = Arc::new(Notify::new());
        let entry = self.waiting.register(tenant, task_id, notify.clone());
        (notify, entry)
    }

    /// How many suspended turns this lead holds.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Lead {
    /// Stores the request of a turn whose calls wait for a person.
    pub(crate) async fn suspend(&self, submission: &TaskSubmission, awaiting: Awaiting) -> Settled {
        let request = ApprovalRequest {
            v: PROTOCOL_VERSION,
            task_id: submission.task_id.clone(),
            tenant: submission.tenant.clone(),
            session: submission.session.clone(),
            user: submission.user.clone(),
            agent: submission.agent.clone(),
            calls: awaiting.calls,
            run: None,
            lineage: Vec::new(),
            requested_at_ms: now_ms(),
            expires_at_ms: awaiting.expires_at_ms,
            answers: Default::default(),
        };
        match self.store.save_approval_request(&request).await {
            Ok(stored) => {
                tracing::info!(
                    calls = stored.calls.len(),
                    expires_at_ms = ?stored.expires_at_ms,
                    "turn suspended until its calls are answered"
                );
                Settled::Suspended(Box::new(Suspension {
                    submission: submission.clone(),
                    expires_at_ms: stored.expires_at_ms,
                    waits_for: Waiting::Answers,
                }))
            }
            Err(e) => Settled::Retry(e.to_failure()),
        }
    }

    /// Holds a suspended turn's message without a slot until something wakes it, then hands it
    /// back for any lead to resume.
    pub(crate) fn park(self: &Arc<Self>, envelope: Envelope, suspension: Suspension) {
        let lead = self.clone();
        self.running.spawn(async move {
            let Suspension {
                submission,
                expires_at_ms,
                waits_for,
            } = suspension;
            let (tenant, task_id) = (submission.tenant.as_str(), submission.task_id.as_str());
            let _waiting = lead.metrics.in_flight(match waits_for {
                Waiting::Answers => "approval_wait",
                Waiting::Resume => "paused",
            });
            let (woken, _entry) = lead.parked.register(tenant, task_id);
            let cancelled = CancellationToken::new();
            let _registration = lead.cancels.register(tenant, task_id, cancelled.clone());
            // An answer may have come between the turn's look and this registration.
            if !lead.still_waiting(&submission, waits_for).await {
                envelope.settle(Disposition::Retry(None)).await;
                return;
            }
            let until = |at_ms: Option<u64>| {
                let left = at_ms.map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
                async move {
                    match left {
                        Some(left) => tokio::time::sleep(left).await,
                        None => std::future::pending().await,
                    }
                }
            };
            let expiry = until(expires_at_ms);
            let deadline = until(submission.deadline_ms);
            tokio::pin!(expiry, deadline);
            let every = lead.cfg.process.progress_every();
            let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            let why = loop {
                tokio::select! {
                    // A wake may be for something else (a steer of a paused turn, say).
                    _ = woken.notified() => {
                        if !lead.still_waiting(&submission, waits_for).await {
                            break waits_for.as_str();
                        }
                    }
                    _ = cancelled.cancelled() => break "cancelled",
                    _ = lead.shutdown.cancelled() => break "shutdown",
                    _ = &mut expiry => break "expired",
                    _ = &mut deadline => break "deadline",
                    _ = progress.tick() => envelope.progress().await,
                }
            };
            tracing::info!(%task_id, why, "suspended turn handed back");
            envelope.settle(Disposition::Retry(None)).await;
        });
    }

    /// Whether a suspended task still has calls without an answer, or is still paused (a store
    /// error counts as waiting: the wake, expiry or redelivery will bring it back).
    async fn still_waiting(&self, submission: &TaskSubmission, waits_for: Waiting) -> bool {
        let (tenant, task_id) = (submission.tenant.as_str(), submission.task_id.as_str());
        let looked = match waits_for {
            Waiting::Answers => self
                .store
                .approval_request(tenant, task_id)
                .await
                .map(|request| request.is_some_and(|r| r.unanswered().next().is_some())),
            Waiting::Resume => self
                .store
                .controls(tenant, &submission.session, task_id, u32::MAX)
                .await
                .map(|(controls, _)| controls.paused),
        };
        looked.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot look at what the parked turn waits for");
            true
        })
    }

    /// Records one published `ApprovalDecision` and wakes the turn it answers.
    pub(crate) async fn handle_decision(self: Arc<Self>, received: Received<ApprovalDecision>) {
        let (envelope, decision) = match received {
            Received::Decoded(delivery) => delivery.into_parts(),
            Received::Undecodable(undecodable) => {
                let why = undecodable.body().to_string();
                let (envelope, _) = undecodable.into_parts();
                return self.refuse(envelope, "approval", &why).await;
            }
        };
        let on_subject = subjects::parse_approval(envelope.subject());
        let valid = validate_token("tenant", &decision.tenant)
            .and_then(|()| validate_token("task_id", &decision.task_id))
            .and_then(|()| match &decision.run {
                Some(run) => validate_token("run", run),
                None => Ok(()),
            });
        if let Err(failure) = valid {
            return self.refuse(envelope, "approval", &failure.message).await;
        }
        if on_subject != Some((decision.tenant.as_str(), decision.task_id.as_str())) {
            let why = format!(
                "published on {}; an answer for this task goes to {}",
                envelope.subject(),
                subjects::approval(&decision.tenant, &decision.task_id)
            );
            return self.refuse(envelope, "approval", &why).await;
        }
        let acting = match self
            .admit(
                &envelope,
                &decision.tenant,
                &decision.task_id,
                Operation::Approve,
                &decision.by,
            )
            .await
        {
            Admission::Admitted(acting) => acting,
            Admission::Refused(why) => return self.refuse(envelope, "approval", &why).await,
            Admission::Unchecked => {
                envelope
                    .settle(Disposition::Retry(Some(DECISION_RETRY)))
                    .await;
                return;
            }
        };
        let disposition = match self.record_decision(&decision, &acting).await {
            Ok(Recorded::Answered) => {
                let verdict = if decision.approve { "approve" } else { "deny" };
                let record =
                    AuditRecord::done(&acting, &decision.tenant, verdict, &decision.task_id)
                        .with_target(decision.call_id.clone().unwrap_or_default())
                        .with_reason(decision.reason.clone());
                self.bus
                    .audit(&record, &envelope.stream_sequence().to_string())
                    .await;
                Disposition::Ack
            }
            Ok(Recorded::Nothing) => Disposition::Ack,
            Ok(Recorded::NotAllowed(refusal)) => {
                let action = if decision.approve { "approve" } else { "deny" };
                self.refused(
                    &envelope,
                    &refusal,
                    &decision.tenant,
                    action,
                    &decision.task_id,
                )
                .await;
                return self.refuse(envelope, "approval", &refusal.reason).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "approval decision not recorded; retrying");
                Disposition::Retry(Some(DECISION_RETRY))
            }
        };
        envelope.settle(disposition).await;
    }

    async fn record_decision(
        &self,
        decision: &ApprovalDecision,
        acting: &Acting,
    ) -> Result<Recorded, skein_common::store::StoreError> {
        let (tenant, task_id) = (decision.tenant.as_str(), decision.task_id.as_str());
        let key = approval_key(task_id, decision.run.as_deref());
        let Some(request) = self.store.approval_request(tenant, &key).await? else {
            tracing::warn!(%tenant, %key, "approval decision for a task or run that waits for none; dropped");
            return Ok(Recorded::Nothing);
        };
        let answered: Vec<&PendingCall> = request
            .calls
            .iter()
            .filter(|c| decision.call_id.as_ref().is_none_or(|id| *id == c.call_id))
            .collect();
        // Who may answer: the approver rules and self-approval. An unsigned claim (allowed
        // where signatures are not required) has no roles, so only rules naming it admit it.
        let approvers = self.agents.approvers();
        for call in &answered {
            if let Err(reason) = approvers.may_answer(
                tenant,
                &acting.principal,
                &request.user,
                &call.tool,
                &call.arguments,
            ) {
                return Ok(Recorded::NotAllowed(Refusal {
                    reason,
                    principal: Some(acting.name().to_owned()),
                }));
            }
        }
        if decision.approve && decision.always {
            for call in &answered {
                let rule = match &decision.always_rule {
                    Some(text) => match check_always_rule(text, &call.tool, &call.arguments) {
                        Ok(rule) => rule,
                        Err(reason) => {
                            return Ok(Recorded::NotAllowed(Refusal {
                                reason,
                                principal: Some(acting.name().to_owned()),
                            }))
                        }
                    },
                    None => always_rule_for_call(&call.tool, &call.arguments),
                };
                self.store
                    .add_session_rule(tenant, &request.session, &rule)
                    .await?;
            }
        }
        let answer = ApprovalAnswer {
            approve: decision.approve,
            reason: decision.reason.clone(),
            by: acting.name().to_owned(),
            at_ms: now_ms(),
        };
        let answered = self
            .store
            .answer_approval(tenant, &key, decision.call_id.as_deref(), &answer)
            .await?;
        match answered {
            Answered::Recorded(calls) => {
                tracing::info!(%tenant, %key, call_id = ?decision.call_id, approve = decision.approve, by = %acting.name(), calls, "approval decision recorded");
            }
            Answered::NoRequest | Answered::UnknownCall => {
                tracing::warn!(%tenant, %key, call_id = ?decision.call_id, ?answered, "approval decision matches no waiting call; dropped");
                return Ok(Recorded::Nothing);
            }
        }
        // A subagent run that waits looks for its answers itself; the wake tells it sooner.
        self.wake(tenant, task_id).await;
        Ok(Recorded::Answered)
    }

    /// A person's message (an approval decision, a control: `kind`) that cannot be read or
    /// belongs elsewhere: set aside, never retried.
    pub(crate) async fn refuse(&self, envelope: Envelope, kind: &'static str, why: &str) {
        tracing::warn!(subject = %envelope.subject(), kind, why, "message refused");
        let applied = envelope
            .settle(Disposition::SetAside {
                reason: format!("rejected: {why}"),
                attempts: 1,
            })
            .await;
        if matches!(applied, Disposition::SetAside { .. }) {
            self.metrics.dead_lettered(kind);
        }
    }
}
