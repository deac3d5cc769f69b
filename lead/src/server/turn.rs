//! One turn of a delivered submission: its start (cancel and deadline looks, turn order in the
//! session, the lease and the attempt through a `TurnLease`, which also keeps the trace of a task
//! submitted without one, a start taken back when it must not stand), the wait for the session's
//! lease or its older tasks, the run under the lease (renewed, checkpointed, stopped at the
//! deadline or on a cancel request), and its atomic end.

use std::sync::Arc;

use futures::FutureExt;
use skein_common::agent::definition::with_output_schema;
use skein_common::agent::replay::RecordedCalls;
use skein_common::agent::runtime::{TurnInput, TurnOutput, TurnStop};
use skein_common::bus::SubmissionPlace;
use skein_common::protocol::{EventKind, Failure, FailureKind, TaskSubmission, TurnStatus};
use skein_common::store::control::Controls;
use skein_common::store::history::ForkError;
use skein_common::store::{
    LoadedSession, StoreError, TurnCheckpoint, TurnClaim, TurnLease, TurnStart,
};
use skein_common::telemetry::propagation;
use skein_common::wiring::checkpoints::LeaseCheckpoints;
use skein_common::wiring::events::BusEvents;
use tokio_util::sync::CancellationToken;

use super::ending::RanTurn;
use super::finals::failed_result;
use super::{Lead, Settled, ORDER_WAIT};

/// A turn whose lease is held: its lease, the session as loaded, any checkpoint to resume
/// from, and whether no earlier run can have dispatched its calls.
pub(super) struct StartedTurn<'a> {
    lease: &'a TurnLease,
    /// This delivery's event epoch (`BusEvents::with_epoch`).
    epoch: u64,
    loaded: LoadedSession,
    resume: Option<Box<TurnCheckpoint>>,
    first_run: bool,
    /// What was asked of the task before this start (pause, steer, interrupt).
    controls: Controls,
}

/// Where a submission sits in its stream, whether this is its first delivery, and whether its
/// sender sent a trace context with it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Position {
    pub(super) place: SubmissionPlace,
    pub(super) first: bool,
    pub(super) sender_traced: bool,
}

impl Lead {
    pub(super) async fn settle_turn(
        &self,
        submission: &TaskSubmission,
        delivery: Position,
        abort: &CancellationToken,
    ) -> Settled {
        let (tenant, session) = (submission.tenant.as_str(), submission.session.as_str());
        let agent = match self
            .agents
            .resolve(&submission.agent, submission.overrides.as_deref())
        {
            // A submission's own output schema replaces the agent's.
            Ok(agent) => with_output_schema(agent, submission.output_schema.as_deref()),
            Err(failure) => {
                return self
                    .publish_final(failed_result(submission, failure, 0))
                    .boxed()
                    .await;
            }
        };
        // From here on a cancel request reaches this task: `stop` fires on it (and on shutdown).
        let stop = abort.child_token();
        let _registration = self
            .cancels
            .register(tenant, &submission.task_id, stop.clone());
        let token = format!("{}:{}", self.instance, submission.task_id);
        let max_attempts = self.cfg.process.max_attempts;
        // A task its sender did not trace keeps the trace of this delivery's span (the first
        // delivery's, kept once): every later delivery continues it.
        let trace = (!delivery.sender_traced)
            .then(|| propagation::traceparent(&tracing::Span::current()))
            .flatten();
        let lease = self.store.turn(TurnClaim {
            tenant,
            session,
            task_id: &submission.task_id,
            lease_token: &token,
            lease_ttl: self.cfg.lease_ttl,
            max_attempts,
            trace: trace.as_deref(),
        });
        // Independent looks in one round trip: a cancel request (or a passed deadline), whether
        // an older submission of the session is unfinished, and the start of the turn itself,
        // which takes this delivery's event epoch and answers a task that already ended (a
        // resubmit), or counts the attempt, takes the session's lease and loads the session. A
        // start that must not stand is taken back below.
        // Registered before the first look, so an announcement right after it is not missed.
        let waiter = self.turns.wait_for(tenant, session);
        let (unstartable, in_line, start) = async {
            tokio::join!(
                self.not_startable(submission, delivery.place),
                self.bus.first_in_line(tenant, session, delivery.place),
                lease.begin(),
            )
        }
        .boxed()
        .await;
        if let Ok(TurnStart::Finished(done)) = start {
            tracing::info!("task already finished; re-publishing its result");
            // Boxed (here and below): a task found finished is rare, and inline its final's
            // publish would be the largest part of this future, which every turn keeps.
            return Box::pin(self.emit_final_of_lease(submission, done, &lease)).await;
        }
        let mut start = start;
        if unstartable.is_some() || !matches!(in_line, Ok(true)) {
            Box::pin(lease.take_back(&start)).await;
        }
        if let Some(failure) = unstartable {
            // A turn that waited for approval asks no more.
            if let Err(e) = Box::pin(self.store.clear_approval(tenant, &submission.task_id)).await {
                tracing::warn!(error = %e, "approval request not cleared");
            }
            let status = if failure.kind == FailureKind::Cancelled {
                TurnStatus::Cancelled
            } else {
                TurnStatus::Failed
            };
            let mut result = failed_result(submission, failure, 0);
            result.status = status;
            return self.publish_final(result).boxed().await;
        }
        match in_line {
            Ok(true) => {}
            Ok(false) => {
                // Older tasks of the session are unfinished: the task's policy says whether it
                // waits for them (and what it asks of them first) or ends here.
                if let Some(settled) = self
                    .apply_multitask(submission, delivery.place)
                    .boxed()
                    .await
                {
                    return settled;
                }
                match self
                    .wait_for_turn_order(submission, delivery.place, &waiter, &stop)
                    .boxed()
                    .await
                {
                    Ok(true) => start = Box::pin(lease.begin()).await,
                    Ok(false) if stop.is_cancelled() => {
                        return self.stopped_before_start(submission, abort).boxed().await
                    }
                    Ok(false) => return Settled::NotYet,
                    Err(failure) => return Settled::Retry(failure),
                }
            }
            Err(e) => return Settled::Retry(e.to_failure()),
        }
        // Turns of one session run one at a time: while another lead holds the lease, look again
        // when a lead announces the session free (or after a fallback look), for a bounded time.
        let lease_wait = tokio::time::Instant::now() + self.cfg.lease_ttl * 2;
        let (attempt, loaded, resume, controls, epoch) = loop {
            match start {
                Ok(TurnStart::Started {
                    attempt,
                    session,
                    checkpoint,
                    controls,
                }) => match epoch_of(&lease) {
                    Ok(epoch) => break (attempt, session, checkpoint, controls, epoch),
                    Err(e) => {
                        Box::pin(lease.release()).await;
                        return Settled::store_trouble(e);
                    }
                },
                Ok(TurnStart::Finished(done)) => {
                    tracing::info!("task already finished; re-publishing its result");
                    return Box::pin(self.emit_final_of_lease(submission, done, &lease)).await;
                }
                Ok(TurnStart::Exhausted(attempt)) => {
                    let failure = Failure::new(
                        FailureKind::Unavailable,
                        format!(
                            "gave up after {max_attempts} attempts (the lead running it stopped each time)"
                        ),
                    );
                    return Settled::GiveUp(failure, attempt - 1);
                }
                Ok(TurnStart::Busy) if tokio::time::Instant::now() >= lease_wait => {
                    // Held longer than a lease can live unrenewed: its holder is alive and busy.
                    // Free the slot; the broker offers the task again.
                    tracing::info!("the session is busy; handing the task back");
                    self.metrics.lease_conflict("busy");
                    return Settled::NotYet;
                }
                Ok(TurnStart::Busy) => {}
                Err(e) => return Settled::store_trouble(e),
            }
            tokio::select! {
                _ = stop.cancelled() => return self.stopped_before_start(submission, abort).boxed().await,
                () = waiter.changed() => {}
            }
            start = Box::pin(lease.begin()).await;
        };
        let started = StartedTurn {
            lease: &lease,
            epoch,
            loaded,
            // Only the first delivery's first attempt can be sure that no earlier run dispatched
            // the turn's calls.
            first_run: delivery.first && attempt == 1 && resume.is_none(),
            resume,
            controls,
        };
        let settled = self
            .turn_under_lease(submission, &agent, started, abort, &stop)
            .boxed()
            .await;
        // A completed turn released the lease as it ended; any other outcome releases it here.
        if !matches!(settled, Settled::Done | Settled::Unannounced(_)) {
            Box::pin(lease.release()).await;
        }
        match settled {
            Settled::Suspended(_) => {
                // Waiting for a person is not an attempt.
                Box::pin(lease.uncount()).await;
                settled
            }
            Settled::Retry(_) if abort.is_cancelled() => {
                // Shutdown is not this task's fault: the attempt does not count.
                Box::pin(lease.uncount()).await;
                settled
            }
            Settled::Retry(failure) if attempt >= max_attempts => Settled::GiveUp(failure, attempt),
            other => other,
        }
    }

    /// Publishes the final result of a task that had ended already (its start found it), with
    /// the event epoch its start took.
    async fn emit_final_of_lease(
        &self,
        submission: &TaskSubmission,
        done: skein_common::protocol::FinalResult,
        lease: &TurnLease,
    ) -> Settled {
        match epoch_of(lease) {
            Ok(epoch) => self.emit_final(submission, done, epoch).boxed().await,
            Err(e) => Settled::store_trouble(e),
        }
    }

    /// The task was stopped while it waited for its turn: by shutdown (hand it back) or by a cancel
    /// request (it ends cancelled).
    async fn stopped_before_start(
        &self,
        submission: &TaskSubmission,
        abort: &CancellationToken,
    ) -> Settled {
        if abort.is_cancelled() {
            return Settled::Retry(Failure::new(FailureKind::Unavailable, "lead shutting down"));
        }
        let mut result = failed_result(
            submission,
            Failure::new(FailureKind::Cancelled, "cancelled before it started"),
            0,
        );
        result.status = TurnStatus::Cancelled;
        self.publish_final(result).await
    }

    /// Why the task must not start, if it must not: it was cancelled, or its deadline passed. A
    /// cancel request is looked for in what this lead heard when that holds every request since
    /// the submission was stored at `place` (`CancelRegistry::heard_since`), else in
    /// `SKEIN_CANCEL`.
    async fn not_startable(
        &self,
        submission: &TaskSubmission,
        place: SubmissionPlace,
    ) -> Option<Failure> {
        if submission
            .origin()
            .time_left()
            .is_some_and(|left| left.is_zero())
        {
            return Some(Failure::new(
                FailureKind::TimedOut,
                "the task's deadline passed before it started",
            ));
        }
        let (tenant, task_id) = (&submission.tenant, &submission.task_id);
        let requested = match self.cancels.heard_since(tenant, task_id, place) {
            Some(heard) => Ok(heard),
            None => self.bus.cancel_requested(tenant, task_id).await,
        };
        match requested {
            Ok(true) => Some(Failure::new(
                FailureKind::Cancelled,
                "cancelled before it started",
            )),
            Ok(false) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for a cancel request; running the task");
                None
            }
        }
    }

    /// Waits until no older task of the session is unfinished, so turns run in submission order
    /// across leads. False if that takes too long (the caller hands the task back, freeing its
    /// slot for the older task).
    async fn wait_for_turn_order(
        &self,
        submission: &TaskSubmission,
        place: SubmissionPlace,
        waiter: &crate::turns::Waiter,
        stop: &CancellationToken,
    ) -> Result<bool, Failure> {
        let deadline = tokio::time::Instant::now() + ORDER_WAIT;
        loop {
            let in_line = self
                .bus
                .first_in_line(&submission.tenant, &submission.session, place)
                .await
                .map_err(|e| e.to_failure())?;
            if in_line {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(
                    partition = place.partition,
                    sequence = place.sequence,
                    "an older task of the session is unfinished; handing this one back"
                );
                return Ok(false);
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(false),
                () = waiter.changed() => {}
            }
        }
    }

    /// The turn, run under its lease. A plain function: an `async fn` would keep `turn` twice in
    /// its future (this future is kept for the whole turn, for every turn in flight), and `turn`
    /// is used in place rather than taken apart into locals for the same reason.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would store the started turn twice in its future"
    )]
    fn turn_under_lease<'a>(
        &'a self,
        submission: &'a TaskSubmission,
        agent: &'a skein_common::protocol::AgentSpec,
        turn: StartedTurn<'a>,
        abort: &'a CancellationToken,
        stop: &'a CancellationToken,
    ) -> impl std::future::Future<Output = Settled> + Send + 'a {
        async move {
            let started = std::time::Instant::now();
            let (tenant, session) = (submission.tenant.as_str(), submission.session.as_str());
            let lease = turn.lease;
            // The task's origin goes into its event sink, in a block: a local kept to the end
            // would hold its bytes in this future while the turn runs. The turn takes a copy of
            // the sink's.
            let (events, budget) = {
                let mut origin = submission.origin();
                // The task's budget, each limit held to its agent's; its subagents draw from it
                // too.
                origin.budget = submission.budget_scope(self.agents.budget(&submission.agent));
                let budget = origin.budget.clone();
                let events = BusEvents::new(
                    self.bus.clone(),
                    &self.payloads,
                    self.listeners.clone(),
                    origin,
                    "lead",
                );
                (Arc::new(events.with_epoch(turn.epoch)), budget)
            };
            events
                .emit(EventKind::TurnStarted {
                    agent: agent.name.clone(),
                    session: session.to_owned(),
                    instance: self.instance.clone(),
                    resumed_at_step: turn.resume.as_ref().map(|r| r.iterations),
                    trace_id: skein_common::telemetry::current_trace_id(),
                })
                .await;
            let controls = turn.controls;
            let (paused_at_start, resumed) = (controls.paused, turn.resume.is_some());
            if controls.was_paused && !controls.paused {
                // The first turn to run after a pause says so (once: the mark goes with it).
                events.emit(EventKind::Resumed {}).await;
                if let Err(e) = Box::pin(self.store.clear_was_paused(
                    tenant,
                    session,
                    &submission.task_id,
                ))
                .await
                {
                    tracing::warn!(error = %e, "resume not noted");
                }
            }
            // A wake for this task (a control recorded) raises the flag; the turn then reads its
            // controls at its next step boundary.
            let (raised, _running) = self.parked.running.register(tenant, &submission.task_id);
            let controlled = crate::control::LeadControls::new(
                &self.store,
                (tenant, session, &submission.task_id),
                raised,
                controls,
            );
            let checkpoints = LeaseCheckpoints { turn: lease };
            // A replay answers the calls its recorded turn made from the record; a record that
            // cannot be read fails the turn rather than run them again.
            let recorded = match &submission.replay_of {
                Some(of) => {
                    match Box::pin(self.store.turn_messages(tenant, &of.session, of.turn)).await {
                        Ok(turn) => Some(RecordedCalls::from_messages(&turn.messages)),
                        Err(ForkError::Store(e)) => return Settled::store_trouble(e),
                        Err(unrecorded) => {
                            let failure = Failure::new(
                                FailureKind::InvalidInput,
                                format!("nothing to replay: {unrecorded}"),
                            );
                            return Settled::Poisoned(failure);
                        }
                    }
                }
                None => None,
            };
            let limits = self.cfg.model.image_limits();
            let input_images =
                match super::input::session_images(&self.payloads, submission, &limits).await {
                    Ok(images) => images,
                    Err(failure) if failure.retryable => return Settled::Retry(failure),
                    Err(failure) => return Settled::Poisoned(failure),
                };
            // The turn stops on shutdown (abort), on a cancel request, or at the task's deadline.
            let time_left = events.origin().time_left();
            let renew = crate::lease::keep_renewed(self.cfg.lease_ttl, || lease.renew());
            let loaded = &turn.loaded;
            let run = Box::pin(self.runtime.run_turn(TurnInput {
                origin: events.origin().clone(),
                agent,
                history: &loaded.state.history,
                summary: loaded.state.summary.as_ref(),
                loaded_skills: &loaded.state.skills,
                plan: loaded.state.plan.as_ref(),
                skills: None,
                input: submission.input.text(),
                input_images,
                depth: 0,
                events: events.clone(),
                cancel: stop,
                first_run: turn.first_run,
                resume: turn.resume,
                checkpoints: Some(&checkpoints),
                approvals: Some(&self.approvals),
                controls: Some(&controlled),
                recorded: recorded.as_ref(),
            }));
            // Boxed, and only for a task with a deadline: a timer inline would be kept (twice,
            // by the `select!` below) in this future, which every turn in flight keeps.
            let deadline = time_left.map(|left| Box::pin(tokio::time::sleep(left)));
            let mut deadline_hit = false;
            let output = tokio::select! {
                lost = renew => {
                    self.metrics.lease_conflict("lost");
                    return Settled::Retry(lost);
                }
                output = async {
                    let Some(deadline) = deadline else {
                        return run.await;
                    };
                    let mut run = run;
                    tokio::select! {
                        output = &mut run => output,
                        () = deadline => {
                            deadline_hit = true;
                            stop.cancel();
                            run.await
                        }
                    }
                } => output,
            };
            let output = match output {
                Ok(output) => output,
                Err(TurnStop::AwaitingApproval(awaiting)) => {
                    events.flush().await;
                    return self.suspend(submission, awaiting).boxed().await;
                }
                Err(TurnStop::Paused) => {
                    tracing::info!("turn paused at a step boundary; parked until resumed");
                    // Said once: a turn resumed from its checkpoint while still paused parks again
                    // quietly.
                    if !(paused_at_start && resumed) {
                        events.emit(EventKind::Paused { by: String::new() }).await;
                    }
                    events.flush().await;
                    return Settled::Suspended(Box::new(crate::approvals::Suspension {
                        submission: submission.clone(),
                        expires_at_ms: None,
                        waits_for: crate::approvals::Waiting::Resume,
                    }));
                }
                Err(TurnStop::Interrupted(failure))
                    if abort.is_cancelled() || !stop.is_cancelled() =>
                {
                    return Settled::Retry(failure)
                }
                Err(TurnStop::Interrupted(_)) => {
                    let (status, failure) = if deadline_hit {
                        (
                            TurnStatus::Failed,
                            Failure::new(
                                FailureKind::TimedOut,
                                "the task's deadline passed while it ran",
                            ),
                        )
                    } else {
                        (
                            TurnStatus::Cancelled,
                            Failure::new(FailureKind::Cancelled, "cancelled while running"),
                        )
                    };
                    TurnOutput {
                        status,
                        answer: None,
                        output: None,
                        failure: Some(failure),
                        iterations: 0,
                        limit_reached: false,
                        usage: Default::default(),
                        new_messages: Vec::new(),
                        loaded_skills: Vec::new(),
                        asked_approval: true,
                        compaction: None,
                        plan: None,
                        steered: 0,
                        step_ends: Vec::new(),
                    }
                }
            };
            self.end_turn(RanTurn {
                submission,
                agent,
                lease,
                loaded: turn.loaded,
                output,
                budget,
                events,
                started,
            })
            .await
        }
    }
}

/// The event epoch a start that Redis answered took (`TurnLease::begin` takes it with the first
/// one); an answered start without it is a reply the store cannot read.
fn epoch_of(lease: &TurnLease) -> Result<u64, StoreError> {
    lease.event_epoch().ok_or(StoreError::UnexpectedReply(
        "the turn-start script (no event epoch)",
    ))
}
