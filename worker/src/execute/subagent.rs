//! A subagent task: the child turn run on this worker's runtime in the child session, numbered
//! after every earlier delivery's events, resumed from the call's checkpoint when an earlier
//! delivery left one, bounded by the worker's subagent timeout, and saved to the child session
//! together with the call's outcome when it completes (a later delivery records that outcome
//! and does not run the turn again). Its input may travel by reference (read from the payload store first);
//! its answer is fitted to the output cap like a tool's output (`spill`). A type with a
//! cluster-wide cap runs only in a slot of the cap (`agent_cap`), or waits in the stream; the
//! turn lends its consumer's slot while it waits for its own subagents (`lending`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use skein_common::agent::hooks::Listeners;
use skein_common::agent::runtime::{TurnInput, TurnStop};
use skein_common::agent::skills::SkillCatalog;
use skein_common::bus::{Delivery, Disposition};
use skein_common::protocol::{
    approval_key, validate_token, BudgetScope, CallOutcome, EventKind, Failure, FailureKind,
    SubagentTask, TaskOrigin, TurnStatus,
};
use skein_common::store::ChildProgress;
use skein_common::wiring::approvals::StoredApprovals;
use skein_common::wiring::checkpoints::CallCheckpoints;
use skein_common::wiring::events::BusEvents;
use tokio_util::sync::CancellationToken;

use super::admission::{admit, check_task, refuse, Admitted};
use super::agent_cap;
use super::child_approval::{self, Waited};
use super::settling::conclude;
use super::spill;
use super::{contain_panic, stopped, AgentIntake, CallRef, Work, WorkerContext};
use crate::scope::TaskScope;

pub(super) async fn subagent_task(
    ctx: &WorkerContext,
    delivery: &Delivery<SubagentTask>,
    intake: AgentIntake,
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
        .and_then(|()| check_nesting(task, ctx.max_depth))
        .and_then(|()| check_type(task, intake.agent.as_deref()));
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
        run: marker,
        stop,
        _registrations,
    } = match admit(ctx, call, &abort).await {
        Ok(admitted) => admitted,
        Err(settled) => return settled,
    };
    // A cancel request for this run alone (its call) stops it and the runs under it.
    let _own = ctx.cancels.register(
        &task.origin.tenant,
        &skein_common::subjects::run_cancel_key(&task.origin.task_id, &task.call_id),
        stop.clone(),
    );
    let started = Instant::now();
    let scope = TaskScope::new(
        ctx.stats.clone(),
        ctx.scratch_dir.clone(),
        format!("subagent {} {}", task.agent.name, task.call_id),
    );
    // A type with a cluster-wide cap runs in a slot of it, or waits in the stream for one.
    let slot = match task.agent.max_concurrency {
        None => None,
        Some(limit) => match agent_cap::take(ctx, &task.agent.name, limit).await {
            Ok(Some(slot)) => Some(slot),
            Ok(None) => {
                ctx.metrics.waited_for_agent_slot(&task.agent.name);
                let delay = agent_cap::wait_delay(envelope.delivered());
                tracing::debug!(agent = %task.agent.name, limit, ?delay, "every slot of the agent's cap is taken; waiting in the stream");
                let work = Work::Wait(delay);
                return conclude(ctx, scope, work, call, started, attempt, &marker).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the agent's cap not read; handing the task back");
                return conclude(ctx, scope, Work::HandBack, call, started, attempt, &marker).await;
            }
        },
    };
    let child_origin = Arc::new(TaskOrigin {
        session: task.child_session.clone(),
        // A subagent with a budget of its own spends from a ledger of its run (in its child
        // session) as well as its root task's: the lower of the two holds it. Without one, it
        // draws from its caller's run budget, if any.
        run_budget: task
            .agent
            .budget
            .map(|limits| BudgetScope {
                task_id: task.origin.task_id.clone(),
                session: task.child_session.clone(),
                limits,
            })
            .or_else(|| task.origin.run_budget.clone()),
        ..TaskOrigin::clone(&task.origin)
    });
    // While it waits for its own subagents, the child turn lends its slot of this consumer.
    let _lender = ctx.lending.lender(&child_origin, intake.slots);
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
                return conclude(ctx, scope, Work::HandBack, call, started, attempt, &marker).await;
            }
        }
    };
    let events = Arc::new(
        BusEvents::new(
            ctx.bus.clone(),
            &ctx.payloads,
            Listeners::default(),
            child_origin.clone(),
            skein_common::protocol::child_event_source(
                &task.origin.workspace,
                &task.child_session,
                &task.call_id,
            ),
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
        // A delivery that may follow an earlier one resumes that one's progress, if it left any;
        // when that one's child turn ended and was saved, only its outcome is left to record.
        let (tenant, child_session) = (&child_origin.tenant, &child_origin.session);
        let resume = if first_run {
            None
        } else {
            match ctx
                .store
                .child_progress(tenant, child_session, &task.call_key)
                .await
            {
                Ok(ChildProgress::Fresh) => None,
                Ok(ChildProgress::Resume(checkpoint)) => Some(checkpoint),
                Ok(ChildProgress::Ended(outcome)) => {
                    tracing::info!(
                        "the child turn ended and was saved before; recording its outcome"
                    );
                    return Work::Done(outcome);
                }
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
        // An input too large for the task travels by reference (stored by the dispatcher under
        // the parent's session).
        let input = match &task.input_ref {
            None => task.input.clone(),
            Some(reference) => match ctx.payloads.load_text(&task.origin, reference).await {
                Ok(input) => input,
                Err(failure) if failure.kind == FailureKind::Unavailable => {
                    tracing::warn!(%failure, "subagent input not read; handing the task back");
                    return Work::HandBack;
                }
                Err(failure) => return Work::Done(CallOutcome::Failed { failure }),
            },
        };
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
        // A call an `ask` rule holds waits for a person: the run's request is stored and answered
        // like a lead turn's, keyed by its child session.
        let approvals = StoredApprovals {
            store: ctx.store.clone(),
            run: Some(child_session.clone()),
        };
        // The run's time counts from its start, also while it waits for a person.
        let deadline = tokio::time::Instant::now() + timeout;
        let (mut resume, mut first_run) = (resume, first_run);
        let output = loop {
            // Boxed: a turn's future is large, and inline it would sit in every caller's frame.
            let turn = Box::pin(runtime.run_turn(TurnInput {
                origin: child_origin.clone(),
                agent: &task.agent,
                history: &loaded.state.history,
                summary: loaded.state.summary.as_ref(),
                loaded_skills: &loaded.state.skills,
                plan: loaded.state.plan.as_ref(),
                // The skills its task carried (the worker has no agents folder of its own).
                skills: Some(&skills),
                input: input.clone(),
                input_images: Vec::new(),
                depth: task.depth,
                events: events.clone(),
                cancel: &stop,
                resume: resume.take().map(Box::new),
                // The child turn's calls can have run before only if this task ran before.
                first_run,
                checkpoints: Some(&checkpoints),
                approvals: Some(&approvals),
                controls: None,
                recorded: None,
            }));
            match tokio::time::timeout_at(deadline, contain_panic(turn)).await {
                Ok(Ok(Ok(output))) => break output,
                // Stopped by its cancel request (or shutdown): as any cancelled call.
                Ok(Ok(Err(TurnStop::Interrupted(failure))))
                    if failure.kind == FailureKind::Cancelled || stop.is_cancelled() =>
                {
                    return stopped(ctx, &task.origin, &abort)
                }
                // Trouble that may pass (the registry could not be read): another attempt, not a
                // cancel, which would stop the calling turn.
                Ok(Ok(Err(TurnStop::Interrupted(failure)))) => {
                    tracing::warn!(%failure, "subagent turn interrupted; handing the task back");
                    return Work::HandBack;
                }
                Ok(Ok(Err(TurnStop::AwaitingApproval(awaiting)))) => {
                    let waited = child_approval::wait_for_answers(
                        ctx,
                        task,
                        &child_origin,
                        awaiting,
                        &stop,
                        deadline,
                    )
                    .await;
                    match waited {
                        Waited::Settled => {}
                        Waited::Stopped => {
                            clear_request(ctx, &child_origin).await;
                            return stopped(ctx, &task.origin, &abort);
                        }
                        Waited::TimedOut => {
                            clear_request(ctx, &child_origin).await;
                            return timed_out(timeout);
                        }
                        Waited::Trouble => return Work::HandBack,
                    }
                    // The step that asked was checkpointed before its calls were decided: the
                    // turn goes on from it, and its calls are settled from the answers.
                    match ctx
                        .store
                        .child_progress(tenant, child_session, &task.call_key)
                        .await
                    {
                        Ok(ChildProgress::Resume(checkpoint)) => resume = Some(checkpoint),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "child checkpoint not read; handing the task back");
                            return Work::HandBack;
                        }
                    }
                    first_run = false;
                }
                // A subagent's loop has no controls, so it never pauses; should it, the call
                // fails clearly rather than waiting for what nobody can give.
                Ok(Ok(Err(TurnStop::Paused))) => {
                    let failure = Failure::new(FailureKind::Internal, "a subagent cannot pause");
                    return Work::Done(CallOutcome::Failed { failure });
                }
                Ok(Err(panicked)) => return Work::Done(CallOutcome::Failed { failure: panicked }),
                Err(_) => return timed_out(timeout),
            }
        };
        if output.asked_approval {
            // Its request (and answers) served their turn.
            clear_request(ctx, &child_origin).await;
        }
        events
            .emit(EventKind::RunEnded {
                status: output.status,
                usage: output.usage,
            })
            .await;
        let outcome = match (output.answer, output.failure) {
            (_, Some(failure)) => CallOutcome::Failed { failure },
            // An answer over the output cap is kept whole in the workspace, as a tool's output
            // is: the caller's model gets its head and tail and where the rest is, and the
            // result never outgrows a broker message.
            (Some(answer), None) => CallOutcome::Ok {
                output: spill::fit_output(
                    ctx.workspace.as_ref(),
                    &task.origin,
                    &format!("subagent-{}", task.agent.name),
                    &crate::tools::idempotency_key(&task.origin, &task.call_key),
                    answer,
                    ctx.registry.max_output_bytes(),
                )
                .await,
                images: Vec::new(),
            },
            (None, None) => CallOutcome::Failed {
                failure: Failure::new(FailureKind::ModelFailed, "subagent gave no answer"),
            },
        };
        // A child stopped by its budget keeps its work, as the lead's turns do. Its session is
        // saved with the call's outcome in one write.
        if matches!(
            output.status,
            TurnStatus::Completed | TurnStatus::BudgetExhausted
        ) {
            let mut state = loaded.state;
            if let Some(compaction) = &output.compaction {
                state.compact(compaction);
            }
            state.history.extend(output.new_messages);
            state.turns += 1;
            for skill in output.loaded_skills {
                if !state.skills.contains(&skill) {
                    state.skills.push(skill);
                }
            }
            if output.plan.is_some() {
                state.plan = output.plan;
            }
            let saved = ctx
                .store
                .save_child_turn(
                    tenant,
                    child_session,
                    loaded.version,
                    &state,
                    &task.call_key,
                    &outcome,
                )
                .await;
            if let Err(e) = saved {
                tracing::warn!(error = %e, session = %child_session, "child session not saved");
            }
        }
        Work::Done(outcome)
    };
    // Boxed: the child run's future is large; the cap, progress and marker layers move it.
    let run = agent_cap::holding(slot.as_ref(), Box::pin(run));
    let work = tokio::select! {
        // A stop that came before the work started wins: the tool is not polled at all.
        biased;
        _ = stop.cancelled() => stopped(ctx, &task.origin, &abort),
        work = marker.hold(ctx, call, envelope.with_progress(ctx.progress_every, run)) => work,
    };
    // The next run of the type may start as soon as this one's work is over.
    if let Some(slot) = slot {
        slot.release().await;
    }
    events.flush().await;
    let ended = matches!(work, Work::Done(_));
    let settled = conclude(ctx, scope, work, call, started, attempt, &marker).await;
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

/// Forgets a subagent run's approval request and its answers (the run ended or stopped).
async fn clear_request(ctx: &WorkerContext, child: &TaskOrigin) {
    let key = approval_key(&child.task_id, Some(&child.session));
    if let Err(e) = ctx.store.clear_approval(&child.tenant, &key).await {
        tracing::warn!(error = %e, "the run's approval request not cleared");
    }
}

fn timed_out(timeout: Duration) -> Work {
    let failure = Failure::new(
        FailureKind::TimedOut,
        format!("subagent ran longer than {timeout:?}"),
    );
    Work::Done(CallOutcome::Failed { failure })
}

/// A worker that runs a list of types takes each from its own consumer: a task there must be of
/// that type (a message on `skein.agent.{pool}.{agent}` carries `agent`'s spec).
fn check_type(task: &SubagentTask, consumer_type: Option<&str>) -> Result<(), Failure> {
    match consumer_type {
        Some(agent) if agent != task.agent.name => Err(Failure::new(
            FailureKind::InvalidInput,
            format!(
                "a task for subagent {agent:?} carries the spec of {:?}",
                task.agent.name
            ),
        )),
        _ => Ok(()),
    }
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
