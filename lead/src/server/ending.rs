//! The end of a turn that ran: the session as the turn leaves it, the final result, the turn's
//! record, all stored in one atomic step under the lease, then the final event. Its own boxed
//! future, allocated only while the turn ends: inline, its state set the size of the future a
//! turn keeps for as long as it runs.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use skein_common::agent::runtime::TurnOutput;
use skein_common::protocol::{
    AgentSpec, BudgetScope, EventKind, FinalResult, TaskSubmission, TurnStatus, PROTOCOL_VERSION,
};
use skein_common::store::history::{calls_of, TurnRecord};
use skein_common::store::{Ended, LoadedSession, TurnLease};
use skein_common::wiring::events::BusEvents;

use super::finals::announced;
use super::{Lead, Settled};

/// What a turn that ran leaves to its end.
pub(super) struct RanTurn<'a> {
    pub(super) submission: &'a TaskSubmission,
    pub(super) agent: &'a AgentSpec,
    pub(super) lease: &'a TurnLease,
    pub(super) loaded: LoadedSession,
    pub(super) output: TurnOutput,
    /// The task's budget, when it has one.
    pub(super) budget: Option<BudgetScope>,
    pub(super) events: Arc<BusEvents>,
    /// When the turn started under its lease.
    pub(super) started: Instant,
}

impl Lead {
    /// Ends a turn that ran (see the module docs).
    /// (Taken apart before the future is made: taken apart inside it, the turn's parts would
    /// be kept twice, as captured and as locals.)
    pub(super) fn end_turn<'a>(&'a self, ran: RanTurn<'a>) -> BoxFuture<'a, Settled> {
        let RanTurn {
            submission,
            agent,
            lease,
            loaded,
            output,
            budget,
            events,
            started,
        } = ran;
        Box::pin(async move {
            let (tenant, session) = (submission.tenant.as_str(), submission.session.as_str());
            // A turn stopped by its budget keeps its work: the session saves it as a completed one's.
            let keeps_messages = matches!(
                output.status,
                TurnStatus::Completed | TurnStatus::BudgetExhausted
            );
            // Counted before the messages move into the session.
            let calls = calls_of(&output.new_messages).count() as u32;
            let messages = output.new_messages.len() as u32;
            let state = keeps_messages.then(|| {
                let mut state = loaded.state;
                if let Some(compaction) = &output.compaction {
                    state.compact(compaction);
                }
                state.history.extend(output.new_messages);
                state.turns += 1;
                for skill in &output.loaded_skills {
                    if !state.skills.contains(skill) {
                        state.skills.push(skill.clone());
                    }
                }
                if output.plan.is_some() {
                    state.plan.clone_from(&output.plan);
                }
                state
            });
            let spent = match &budget {
                // Boxed, as the approval's clearing below: only some turns wait on them, and
                // inline they would size every turn's end.
                Some(scope) => match Box::pin(self.store.budget_spent(tenant, scope)).await {
                    Ok(spent) => Some(spent),
                    Err(e) => {
                        tracing::warn!(error = %e, "the task's spending could not be read");
                        None
                    }
                },
                None => None,
            };
            let result = FinalResult {
                v: PROTOCOL_VERSION,
                task_id: submission.task_id.clone(),
                tenant: tenant.to_owned(),
                session: session.to_owned(),
                status: output.status,
                answer: output.answer,
                answer_ref: None,
                output: output.output,
                output_ref: false,
                failure: output.failure,
                iterations: output.iterations,
                limit_reached: output.limit_reached,
                usage: output.usage,
                trace_id: skein_common::telemetry::current_trace_id(),
                spent,
            };
            // A turn that keeps its messages is recorded: a point to fork or replay from.
            let record = state.as_ref().map(|state| TurnRecord {
                turn: state.turns,
                task_id: submission.task_id.clone(),
                agent: agent.name.clone(),
                model: if agent.model.is_empty() {
                    self.cfg.model.model.clone()
                } else {
                    agent.model.clone()
                },
                status: result.status,
                ended_at_ms: skein_common::protocol::now_ms(),
                duration_ms: started.elapsed().as_millis() as u64,
                steps: result.iterations,
                calls,
                tokens: result
                    .usage
                    .prompt_tokens
                    .saturating_add(result.usage.completion_tokens),
                messages,
                plan: state.plan.clone(),
                step_ends: output.step_ends,
            });
            // The session and the record move into the write, which drops them once they are
            // in its command: only the result is kept while Redis answers.
            match lease.complete(loaded.version, state, &result, record).await {
                Ok(Ended::Stored) => {}
                Ok(Ended::Earlier(earlier)) => {
                    // Ended on another path meanwhile (a cancel before its start, on a redelivery):
                    // that result stands, and this turn's history is not saved.
                    tracing::warn!(status = ?earlier.status, "the task had ended already; its stored result stands");
                    return announced(events.announce(EventKind::Final { result: *earlier }).await);
                }
                Err(e) => return Settled::store_trouble(e),
            }
            self.metrics
                .turn_finished(result.status.as_str(), started.elapsed());
            if output.asked_approval {
                let clearing = Box::pin(self.store.clear_approval(tenant, &submission.task_id));
                if let Err(e) = clearing.await {
                    tracing::warn!(error = %e, "approval request not cleared");
                }
            }
            announced(events.announce(EventKind::Final { result }).await)
        })
    }
}
