//! The lead process: pulls submitted tasks, runs each as one agent turn and settles it.
//!
//! Per task: decode and validate (bad input is answered with a failed final result and set aside
//! as a dead letter, never a crash) → resolve the agent → in one round trip, three independent
//! looks: a cancel request, the session's oldest unfinished submission, and the turn's start in
//! Redis (one script: answer from the stored final result if the task already ran — idempotent
//! resubmits — else count the attempt, take the session lease, load the session and any
//! checkpoint) → if the task may not start (cancelled, past its deadline) or an older task of the
//! session is unfinished (submission order), take the start back (release, uncount) and end or
//! wait → run (or resume) the turn, checkpointing the calls of every step before they are
//! dispatched → end it atomically (session, final result, lease released) → publish the final
//! result → ack. While a turn runs, progress acks keep the broker from redelivering it and the
//! lease is renewed.
//!
//! Transient trouble (Redis away, a save that lost a race, a lost lease) hands the task back to the
//! broker (nak) so it runs again, on this or another lead; after `max_attempts` counted attempts it
//! is dead-lettered and ends as a `dead_lettered` failure.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use skein_common::admin::{self, Readiness};
use skein_common::agent::definition::AgentCatalog;
use skein_common::agent::hooks::Listeners;
use skein_common::agent::middleware::Middleware;
use skein_common::agent::model::{ModelError, Provider};
use skein_common::agent::runtime::{Runtime, RuntimeSettings, TurnInput, TurnOutput, TurnStop};
use skein_common::bus::{
    Bus, BusError, ConsumerSettings, Delivery, Disposition, Envelope, Received, Slots,
};
use skein_common::cancel::CancelRegistry;
use skein_common::dispatch::Dispatcher;
use skein_common::metrics::Metrics;
use skein_common::protocol::{
    validate_token, EventKind, Failure, FailureKind, FinalResult, TaskSubmission, TurnStatus,
    PROTOCOL_VERSION,
};
use skein_common::shutdown::Workload;
use skein_common::store::{
    LoadedSession, SessionStore, StoreError, TurnCheckpoint, TurnClaim, TurnLease, TurnStart,
};
use skein_common::subjects;
use skein_common::wiring::approvals::StoredApprovals;
use skein_common::wiring::checkpoints::LeaseCheckpoints;
use skein_common::wiring::events::BusEvents;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::approvals::{Parked, Suspension};
use crate::config::Config;
use crate::turns::SessionWaits;

/// How often the depth of the leads' consumer is reported as metrics.
const QUEUE_DEPTH_EVERY: Duration = Duration::from_secs(5);
/// Delay before a handed-back task is redelivered.
const REDELIVERY_DELAY: Duration = Duration::from_secs(1);
/// Longest a task waits for an older task of its session before it hands its slot back.
const ORDER_WAIT: Duration = Duration::from_secs(5);
/// Delay before a task handed back for ordering is offered again.
const REQUEUE_DELAY: Duration = Duration::from_millis(200);

/// Why a lead could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeadError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("agent definitions: {0}")]
    Definitions(#[from] skein_common::agent::definition::DefinitionError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("model provider: {0}")]
    Model(#[from] ModelError),
    #[error(transparent)]
    Admin(#[from] skein_common::admin::AdminError),
}

pub(crate) struct Lead {
    pub(crate) bus: Bus,
    pub(crate) cancels: CancelRegistry,
    pub(crate) store: SessionStore,
    agents: AgentCatalog,
    runtime: Runtime,
    listeners: Listeners,
    approvals: StoredApprovals,
    /// Suspended turns this lead holds while they wait for an answer.
    pub(crate) parked: Parked,
    /// Submissions this lead holds while they wait for their session's turn.
    turns: SessionWaits,
    pub(crate) metrics: Metrics,
    instance: String,
    pub(crate) cfg: Config,
    /// The process's shutdown: suspended turns are handed back at once when it fires.
    pub(crate) shutdown: CancellationToken,
    pub(crate) running: tokio_util::task::TaskTracker,
}

/// Runs a lead until `shutdown` is cancelled, then drains.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<(), LeadError> {
    LeadBuilder::new(cfg).run(shutdown).await
}

/// A lead with the embedder's own middleware (layers around model and tool calls, hooks around
/// the turn and its steps, prompt transformers) and event listeners.
pub struct LeadBuilder {
    cfg: Config,
    middleware: Middleware,
    listeners: Listeners,
}

impl LeadBuilder {
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            middleware: Middleware::new(),
            listeners: Listeners::default(),
        }
    }

    /// Uses `middleware` for every turn (its layers run outside the built-ins).
    pub fn middleware(mut self, middleware: Middleware) -> Self {
        self.middleware = middleware;
        self
    }

    /// Tells `listener` of every event of every turn.
    pub fn listener(mut self, listener: Arc<dyn skein_common::agent::hooks::TurnListener>) -> Self {
        self.listeners = self.listeners.with(listener);
        self
    }

    /// Runs the lead until `shutdown` is cancelled, then drains.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), LeadError> {
        serve(self, shutdown).await
    }
}

async fn serve(builder: LeadBuilder, shutdown: CancellationToken) -> Result<(), LeadError> {
    let LeadBuilder {
        cfg,
        middleware,
        listeners,
    } = builder;
    cfg.validate().map_err(LeadError::Config)?;
    let instance = cfg.process.instance_id("lead");
    let agents = match &cfg.agents_dir {
        Some(dir) => AgentCatalog::load_dir(dir)?,
        None => AgentCatalog::bundled()?,
    };
    let provider = Provider::from_config(&cfg.model)?;
    let provider_name = provider.label();
    let metrics = Metrics::new();
    let readiness = Readiness::default();
    let bus = Bus::connect(
        &cfg.nats,
        &format!("skein-lead {instance}"),
        cfg.process.max_payload,
    )
    .await?;
    bus.ensure_streams().await?;
    let store = SessionStore::connect(&cfg.redis).await?;

    let work = Workload::default();
    admin::serve_configured(&cfg.admin, metrics.clone(), readiness.clone(), &work).await?;
    let dispatcher = Dispatcher::start(
        bus.clone(),
        store.clone(),
        &instance,
        &work.background,
        work.background_stop.clone(),
    )
    .await?;
    let runtime = skein_common::wiring::assemble(
        provider,
        dispatcher,
        agents.skills().clone(),
        middleware,
        RuntimeSettings {
            default_model: cfg.model.model.clone(),
            provider: provider_name.into(),
            tool_timeout: cfg.process.tool_timeout,
            subagent_timeout: cfg.subagent_timeout,
            ..RuntimeSettings::default()
        },
        metrics.clone(),
        &cfg.model,
    );
    let intake = bus
        .intake(&ConsumerSettings {
            stream: subjects::SUBMIT_STREAM,
            durable: subjects::LEADS_CONSUMER.into(),
            filter: subjects::SUBMIT_ALL.into(),
            ack_wait: cfg.process.ack_wait,
            max_deliver: -1,
            // Suspended turns stay unacknowledged while they wait for a person, without a slot:
            // they must not use up the server's default of 1,000 outstanding deliveries.
            max_ack_pending: Some(-1),
        })
        .await?;
    let decisions = bus
        .intake(&ConsumerSettings {
            stream: subjects::APPROVALS_STREAM,
            durable: subjects::APPROVALS_CONSUMER.into(),
            filter: subjects::APPROVALS_ALL.into(),
            ack_wait: cfg.process.ack_wait,
            max_deliver: -1,
            max_ack_pending: None,
        })
        .await?;
    let parked = Parked::listen(&bus, &work.background, work.background_stop.clone()).await?;
    let turns = SessionWaits::listen(&bus, &work.background, work.background_stop.clone()).await?;
    crate::results::serve_lookups(
        &bus,
        store.clone(),
        &work.background,
        work.background_stop.clone(),
    )
    .await?;
    bus.watch_queue_depth(
        metrics.clone(),
        vec![(subjects::SUBMIT_STREAM, subjects::LEADS_CONSUMER.to_owned())],
        QUEUE_DEPTH_EVERY,
        &work.background,
        work.background_stop.clone(),
    );
    readiness.set_ready(true);
    tracing::info!(lead_id = %instance, model = %cfg.model.provider, "lead ready");
    let (concurrency, grace) = (cfg.concurrency, cfg.process.grace);
    let cancels = CancelRegistry::default();
    cancels
        .listen(&bus, &work.background, work.background_stop.clone())
        .await?;
    let lead = Arc::new(Lead {
        bus,
        cancels,
        approvals: StoredApprovals {
            store: store.clone(),
        },
        store,
        agents,
        runtime,
        listeners,
        parked,
        turns,
        metrics,
        instance: instance.clone(),
        cfg,
        shutdown: shutdown.clone(),
        running: work.running.clone(),
    });

    let handler_lead = lead.clone();
    let handler_abort = work.abort.clone();
    let turns = intake.serve(
        Slots::new(concurrency),
        shutdown.clone(),
        work.running.clone(),
        move |received| {
            handler_lead
                .clone()
                .handle(received, handler_abort.child_token())
        },
    );
    let decision_lead = lead.clone();
    let answers = decisions.serve(
        Slots::new(crate::approvals::DECISION_CONCURRENCY),
        shutdown,
        work.running.clone(),
        move |received| decision_lead.clone().handle_decision(received),
    );
    tokio::join!(turns, answers);
    readiness.set_ready(false);
    work.drain(grace).await;
    tracing::info!(lead_id = %instance, "lead stopped");
    Ok(())
}

/// How handling a submission ended.
pub(crate) enum Settled {
    /// Finished (successfully or not); the final result is stored and published.
    Done,
    /// Finished and stored, but the stream did not take the final event: hand the message back
    /// so a later delivery announces it again (from the stored result; nothing runs again).
    Unannounced(Failure),
    /// Not this task's turn yet (an older task of the session is unfinished): hand it back
    /// without counting an attempt.
    NotYet,
    /// Transient trouble: hand the message back for another attempt.
    Retry(Failure),
    /// The last attempt failed too: dead-letter it and end with a failed final result.
    GiveUp(Failure, u64),
    /// Calls wait for a person: the turn's request is stored, the lease released and the attempt
    /// uncounted; the message is held (unacknowledged, without a slot) until an answer wakes it.
    /// (Boxed: a suspension carries the whole submission, the other outcomes are small.)
    Suspended(Box<Suspension>),
}

/// A turn whose lease is held: its lease, the session as loaded, any checkpoint to resume
/// from, and whether no earlier run can have dispatched its calls.
struct StartedTurn<'a> {
    lease: &'a TurnLease,
    /// This delivery's event epoch (`BusEvents::with_epoch`).
    epoch: u64,
    loaded: LoadedSession,
    resume: Option<TurnCheckpoint>,
    first_run: bool,
}

/// Where a submission sits in its stream, and whether this is its first delivery.
#[derive(Debug, Clone, Copy)]
struct Position {
    sequence: u64,
    first: bool,
}

impl Lead {
    /// Runs one delivered submission; the future owns the lead, so it is spawned as it is.
    async fn handle(self: Arc<Self>, received: Received<TaskSubmission>, abort: CancellationToken) {
        let _in_flight = self.metrics.in_flight("turn");
        let envelope = received.envelope();
        if envelope.delivered() > 1 {
            self.metrics.redelivered("turn");
        }
        let span = envelope.span();
        span.record("skein.kind", "submission");
        match received {
            Received::Decoded(delivery) => {
                self.handle_delivery(delivery, abort).instrument(span).await
            }
            Received::Undecodable(undecodable) => {
                let (task_id, failure) = (
                    undecodable.envelope().message_id(),
                    undecodable.body().to_failure(),
                );
                let (envelope, _) = undecodable.into_parts();
                self.reject(envelope, task_id, failure)
                    .boxed()
                    .instrument(span)
                    .await
            }
        }
    }

    async fn handle_delivery(
        self: &Arc<Self>,
        delivery: Delivery<TaskSubmission>,
        abort: CancellationToken,
    ) {
        let (envelope, submission) = delivery.into_parts();
        let checked = submission
            .validate(self.cfg.process.max_payload)
            .and_then(|()| subject_matches(&envelope, &submission));
        if let Err(failure) = checked {
            let task_id = Some(submission.task_id.clone());
            return self.reject(envelope, task_id, failure).boxed().await;
        }
        let span = tracing::Span::current();
        span.record("skein.task_id", submission.task_id.as_str());
        span.record("gen_ai.conversation.id", submission.session.as_str());
        let position = Position {
            sequence: envelope.stream_sequence(),
            first: envelope.is_first(),
        };
        let every = self.cfg.process.progress_every();
        let outcome = envelope
            .with_progress(every, self.settle_turn(&submission, position, &abort))
            .await;
        // Whatever ended here may free the session for its next turn; a task handed back for
        // turn order freed nothing.
        let freed = !matches!(outcome, Settled::NotYet);
        self.settle_delivery(envelope, &submission, outcome, &abort)
            .await;
        if freed {
            crate::turns::announce(&self.bus, &submission.tenant, &submission.session).await;
        }
    }

    /// Settles a delivered submission by how handling it ended.
    async fn settle_delivery(
        self: &Arc<Self>,
        envelope: Envelope,
        submission: &TaskSubmission,
        outcome: Settled,
        abort: &CancellationToken,
    ) {
        let disposition = match outcome {
            Settled::Done => Disposition::Ack,
            Settled::Unannounced(failure)
                if envelope.delivered() >= self.cfg.process.max_attempts as i64 =>
            {
                // Bounded: the result is stored, and any lead answers a client's lookup of it.
                tracing::error!(%failure, "final event not announced after every attempt; clients read the stored result");
                Disposition::Ack
            }
            Settled::Unannounced(failure) => {
                tracing::warn!(%failure, "final event not announced; handing the task back to announce it again");
                Disposition::Retry(Some(REDELIVERY_DELAY))
            }
            Settled::Suspended(suspension) => return self.park(envelope, *suspension),
            Settled::NotYet => Disposition::Retry(Some(REQUEUE_DELAY)),
            Settled::Retry(failure) if abort.is_cancelled() => {
                tracing::info!(%failure, "turn handed back on shutdown");
                Disposition::Retry(None)
            }
            Settled::Retry(failure) => {
                tracing::warn!(%failure, "turn handed back for another attempt");
                Disposition::Retry(Some(REDELIVERY_DELAY))
            }
            Settled::GiveUp(last, attempts) => {
                let failure = Failure::new(
                    FailureKind::DeadLettered,
                    format!("the turn failed on all {attempts} attempts; last: {last}"),
                );
                if !envelope.set_aside(&failure.message, attempts).boxed().await {
                    Disposition::Retry(Some(REDELIVERY_DELAY))
                } else {
                    self.metrics.dead_lettered("submit");
                    self.metrics
                        .turn_finished("dead_lettered", std::time::Duration::ZERO);
                    // Dead-lettered either way: a final event that did not go out is still
                    // stored, for lookups.
                    self.publish_final(failed_result(submission, failure, 0))
                        .boxed()
                        .await;
                    Disposition::Ack
                }
            }
        };
        envelope.settle(disposition).await;
    }

    async fn settle_turn(
        &self,
        submission: &TaskSubmission,
        delivery: Position,
        abort: &CancellationToken,
    ) -> Settled {
        let (tenant, session) = (submission.tenant.as_str(), submission.session.as_str());
        let agent = match self
            .agents
            .resolve(&submission.agent, submission.overrides.as_ref())
        {
            Ok(agent) => agent,
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
        let lease = self.store.turn(TurnClaim {
            tenant,
            session,
            task_id: &submission.task_id,
            lease_token: &token,
            lease_ttl: self.cfg.lease_ttl,
            max_attempts,
        });
        // Independent looks in one round trip: a cancel request (or a passed deadline), the
        // session's oldest unfinished submission, the start of the turn itself — which answers
        // a task that already ended (a resubmit), or counts the attempt, takes the session's lease
        // and loads the session — and this delivery's event epoch. A start that must not stand is
        // taken back below.
        // Registered before the first look, so an announcement right after it is not missed.
        let waiter = self.turns.wait_for(tenant, session);
        let (unstartable, oldest, start, epoch) = async {
            tokio::join!(
                self.not_startable(submission),
                self.bus.oldest_submission(tenant, session),
                lease.begin(),
                self.store
                    .next_event_epoch(tenant, session, &submission.task_id),
            )
        }
        .boxed()
        .await;
        let epoch = match epoch {
            Ok(epoch) => epoch,
            Err(e) => {
                // Redis answered the start but not the epoch: take the start back, try again.
                lease.take_back(&start).await;
                return Settled::Retry(e.to_failure());
            }
        };
        if let Ok(TurnStart::Finished(done)) = start {
            tracing::info!("task already finished; re-publishing its result");
            return self.emit_final(submission, done, epoch).boxed().await;
        }
        let in_line = oldest.map(|oldest| oldest.is_none_or(|oldest| oldest >= delivery.sequence));
        let mut start = start;
        if unstartable.is_some() || !matches!(in_line, Ok(true)) {
            lease.take_back(&start).await;
        }
        if let Some(failure) = unstartable {
            // A turn that waited for approval asks no more.
            if let Err(e) = self.store.clear_approval(tenant, &submission.task_id).await {
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
            Ok(false) => match self
                .wait_for_turn_order(submission, delivery.sequence, &waiter, &stop)
                .boxed()
                .await
            {
                Ok(true) => start = lease.begin().await,
                Ok(false) if stop.is_cancelled() => {
                    return self.stopped_before_start(submission, abort).boxed().await
                }
                Ok(false) => return Settled::NotYet,
                Err(failure) => return Settled::Retry(failure),
            },
            Err(e) => return Settled::Retry(e.to_failure()),
        }
        // Turns of one session run one at a time: while another lead holds the lease, look again
        // when a lead announces the session free (or after a fallback look), for a bounded time.
        let lease_wait = tokio::time::Instant::now() + self.cfg.lease_ttl * 2;
        let (attempt, loaded, resume) = loop {
            match start {
                Ok(TurnStart::Started {
                    attempt,
                    session,
                    checkpoint,
                }) => break (attempt, session, checkpoint),
                Ok(TurnStart::Finished(done)) => {
                    tracing::info!("task already finished; re-publishing its result");
                    return self.emit_final(submission, done, epoch).boxed().await;
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
                    return Settled::NotYet;
                }
                Ok(TurnStart::Busy) => {}
                Err(e) => return Settled::Retry(e.to_failure()),
            }
            tokio::select! {
                _ = stop.cancelled() => return self.stopped_before_start(submission, abort).boxed().await,
                () = waiter.changed() => {}
            }
            start = lease.begin().await;
        };
        let started = StartedTurn {
            lease: &lease,
            epoch,
            loaded,
            // Only the first delivery's first attempt can be sure that no earlier run dispatched
            // the turn's calls.
            first_run: delivery.first && attempt == 1 && resume.is_none(),
            resume,
        };
        let settled = self
            .turn_under_lease(submission, &agent, started, abort, &stop)
            .boxed()
            .await;
        // A completed turn released the lease as it ended; any other outcome releases it here.
        if !matches!(settled, Settled::Done | Settled::Unannounced(_)) {
            lease.release().await;
        }
        match settled {
            Settled::Suspended(_) => {
                // Waiting for a person is not an attempt.
                lease.uncount().await;
                settled
            }
            Settled::Retry(_) if abort.is_cancelled() => {
                // Shutdown is not this task's fault: the attempt does not count.
                lease.uncount().await;
                settled
            }
            Settled::Retry(failure) if attempt >= max_attempts => Settled::GiveUp(failure, attempt),
            other => other,
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

    /// Why the task must not start, if it must not: it was cancelled, or its deadline passed.
    async fn not_startable(&self, submission: &TaskSubmission) -> Option<Failure> {
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
        match self
            .bus
            .cancel_requested(&submission.tenant, &submission.task_id)
            .await
        {
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
        sequence: u64,
        waiter: &crate::turns::Waiter,
        stop: &CancellationToken,
    ) -> Result<bool, Failure> {
        let deadline = tokio::time::Instant::now() + ORDER_WAIT;
        loop {
            let oldest = self
                .bus
                .oldest_submission(&submission.tenant, &submission.session)
                .await
                .map_err(|e| e.to_failure())?;
            match oldest {
                Some(oldest) if oldest < sequence => {}
                _ => return Ok(true),
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(
                    sequence,
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

    async fn turn_under_lease(
        &self,
        submission: &TaskSubmission,
        agent: &skein_common::protocol::AgentSpec,
        turn: StartedTurn<'_>,
        abort: &CancellationToken,
        stop: &CancellationToken,
    ) -> Settled {
        let started = std::time::Instant::now();
        let (tenant, session) = (submission.tenant.as_str(), submission.session.as_str());
        let StartedTurn {
            lease,
            epoch,
            loaded,
            resume,
            first_run,
        } = turn;
        let origin = submission.origin();
        let events = Arc::new(
            BusEvents::new(
                self.bus.clone(),
                self.listeners.clone(),
                origin.clone(),
                "lead",
            )
            .with_epoch(epoch),
        );
        events
            .emit(EventKind::TurnStarted {
                agent: agent.name.clone(),
                session: session.to_owned(),
                instance: self.instance.clone(),
                resumed_at_step: resume.as_ref().map(|r| r.iterations),
                trace_id: skein_common::telemetry::current_trace_id(),
            })
            .await;
        let checkpoints = LeaseCheckpoints { turn: lease };
        // The turn stops on shutdown (abort), on a cancel request, or at the task's deadline.
        let time_left = origin.time_left();
        let renew = crate::lease::keep_renewed(self.cfg.lease_ttl, || lease.renew());
        let turn = Box::pin(self.runtime.run_turn(TurnInput {
            origin,
            agent,
            history: &loaded.state.history,
            loaded_skills: &loaded.state.skills,
            skills: None,
            input: submission.input.clone(),
            depth: 0,
            events: events.clone(),
            cancel: stop,
            first_run,
            resume,
            checkpoints: Some(&checkpoints),
            approvals: Some(&self.approvals),
        }));
        let deadline = async {
            match time_left {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        let mut deadline_hit = false;
        let output = tokio::select! {
            lost = renew => return Settled::Retry(lost),
            output = async {
                tokio::pin!(turn);
                tokio::select! {
                    output = &mut turn => output,
                    () = deadline => {
                        deadline_hit = true;
                        stop.cancel();
                        turn.await
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
            Err(TurnStop::Interrupted(failure)) if abort.is_cancelled() || !stop.is_cancelled() => {
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
                    failure: Some(failure),
                    iterations: 0,
                    limit_reached: false,
                    usage: Default::default(),
                    new_messages: Vec::new(),
                    loaded_skills: Vec::new(),
                    asked_approval: true,
                }
            }
        };
        let state = (output.status == TurnStatus::Completed).then(|| {
            let mut state = loaded.state;
            state.history.extend(output.new_messages.iter().cloned());
            state.turns += 1;
            for skill in &output.loaded_skills {
                if !state.skills.contains(skill) {
                    state.skills.push(skill.clone());
                }
            }
            state
        });
        let result = FinalResult {
            v: PROTOCOL_VERSION,
            task_id: submission.task_id.clone(),
            tenant: tenant.to_owned(),
            session: session.to_owned(),
            status: output.status,
            answer: output.answer,
            failure: output.failure,
            iterations: output.iterations,
            limit_reached: output.limit_reached,
            usage: output.usage,
            trace_id: skein_common::telemetry::current_trace_id(),
        };
        if let Err(e) = lease
            .complete(loaded.version, state.as_ref(), &result)
            .await
        {
            return Settled::Retry(e.to_failure());
        }
        let outcome = match result.status {
            TurnStatus::Completed => "completed",
            TurnStatus::Failed => "failed",
            TurnStatus::Cancelled => "cancelled",
        };
        self.metrics.turn_finished(outcome, started.elapsed());
        if output.asked_approval {
            if let Err(e) = self.store.clear_approval(tenant, &submission.task_id).await {
                tracing::warn!(error = %e, "approval request not cleared");
            }
        }
        announced(events.announce(EventKind::Final { result }).await)
    }

    /// Stores and publishes the final result of a task that ended without running a turn.
    async fn publish_final(&self, result: FinalResult) -> Settled {
        if let Err(e) = self.store.store_final(&result).await {
            // Announced all the same; a later delivery stores it again.
            tracing::warn!(error = %e, "final result not stored");
            self.announce_final(result).await.ok();
            return Settled::Retry(e.to_failure());
        }
        announced(self.announce_final(result).await)
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
        };
        let events = BusEvents::new(self.bus.clone(), Listeners::default(), origin, "lead");
        events.announce(EventKind::Final { result }).await
    }

    /// Announces the stored final result of a task that already ended (a redelivery).
    async fn emit_final(
        &self,
        submission: &TaskSubmission,
        result: FinalResult,
        epoch: u64,
    ) -> Settled {
        let events = BusEvents::new(
            self.bus.clone(),
            self.listeners.clone(),
            submission.origin(),
            "lead",
        )
        .with_epoch(epoch);
        announced(events.announce(EventKind::Final { result }).await)
    }

    /// Refuses a submission that will not run — it cannot be decoded, breaks a protocol rule, or
    /// travels on another session's subject. The failure is announced on the task's event subject
    /// of the tenant the *subject* names (never one the body claims) and nothing is stored under
    /// the names it carries; the message is set aside as a dead letter and terminated, since it
    /// would fail the same way on every delivery.
    async fn reject(&self, envelope: Envelope, task_id: Option<String>, failure: Failure) {
        tracing::warn!(subject = %envelope.subject(), %failure, "submission rejected");
        let tenant = subjects::parse_submit(envelope.subject()).map(|(tenant, _)| tenant);
        if let (Some(tenant), Some(task_id)) = (tenant, task_id) {
            if validate_token("tenant", tenant).is_ok()
                && validate_token("task_id", &task_id).is_ok()
            {
                let stub = TaskSubmission {
                    v: PROTOCOL_VERSION,
                    task_id,
                    tenant: tenant.to_owned(),
                    user: String::new(),
                    session: String::new(),
                    agent: String::new(),
                    input: String::new(),
                    overrides: None,
                    deadline_ms: None,
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

/// A submission must arrive on its own session's subject: ordering and tenant isolation rely on it.
fn subject_matches(envelope: &Envelope, submission: &TaskSubmission) -> Result<(), Failure> {
    let expected = subjects::submit(&submission.tenant, &submission.session);
    if envelope.subject() == expected {
        Ok(())
    } else {
        Err(Failure::new(
            FailureKind::InvalidInput,
            format!(
                "published on {}; a task of this tenant and session goes to {expected}",
                envelope.subject()
            ),
        ))
    }
}

/// How a task whose final result is stored settles, by whether its final event was announced.
fn announced(announce: Result<(), BusError>) -> Settled {
    match announce {
        Ok(()) => Settled::Done,
        Err(e) => Settled::Unannounced(e.to_failure()),
    }
}

fn failed_result(submission: &TaskSubmission, failure: Failure, iterations: u32) -> FinalResult {
    FinalResult {
        v: PROTOCOL_VERSION,
        task_id: submission.task_id.clone(),
        tenant: submission.tenant.clone(),
        session: submission.session.clone(),
        status: TurnStatus::Failed,
        answer: None,
        failure: Some(failure),
        iterations,
        limit_reached: false,
        usage: Default::default(),
        trace_id: skein_common::telemetry::current_trace_id(),
    }
}
