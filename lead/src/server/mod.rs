//! The lead process: pulls submitted tasks, runs each as one agent turn and settles it.
//!
//! Per task: decode and validate (bad input is answered with a failed final result and set aside
//! as a dead letter, never a crash) → resolve the agent → in one round trip, three independent
//! looks: a cancel request, whether an older submission of the session is unfinished, and the
//! turn's start in Redis (one script: take the delivery's event epoch, answer from the stored
//! final result if the task already ran — idempotent resubmits — else count the attempt, take the
//! session lease, load the session and any checkpoint) → if the task may not start (cancelled,
//! past its deadline) or an older task of the session is unfinished (submission order), take the
//! start back (release, uncount) and end or wait → run (or resume) the turn, checkpointing the
//! calls of every step before they are dispatched → end it atomically (session, final result,
//! lease released) → publish the final result → ack. While a turn runs, progress acks keep the broker from redelivering it and the
//! lease is renewed.
//!
//! A submission its client sent without trace context stays in one trace across its deliveries:
//! the turn start keeps the first delivery's `traceparent` with the task (in the same script), and
//! a later delivery reads it before it opens its `process` span (`kept_trace`).
//!
//! Transient trouble (Redis away, a save that lost a race, a lost lease) hands the task back to the
//! broker (nak) so it runs again, on this or another lead; after `max_attempts` counted attempts it
//! is dead-lettered and ends as a `dead_lettered` failure.
//!
//! This module owns the process and each delivery (decode, validate, settle); `turn` owns a turn
//! from its start to its atomic end, `finals` the final results that do not come from a turn's end
//! (a task that ended before it ran, a redelivery of one that finished, a refused submission),
//! `multitask` what a task does when older tasks of its session are unfinished (wait, end as
//! rejected, cancel them, interrupt them) and the hook that ends an interrupted turn,
//! `submit_intakes` the submit partitions the lead takes submissions from.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use skein_common::admin::{self, Readiness};
use skein_common::agent::context::ContextLimits;
use skein_common::agent::definition::AgentCatalog;
use skein_common::agent::hooks::Listeners;
use skein_common::agent::middleware::Middleware;
use skein_common::agent::model::{ModelError, Providers};
use skein_common::agent::runtime::{Runtime, RuntimeSettings};
use skein_common::audit::AuditRecord;
use skein_common::bus::{
    Bus, BusError, ConsumerSettings, Delivery, Disposition, Envelope, Received, Slots,
};
use skein_common::cancel::CancelRegistry;
use skein_common::dispatch::Dispatcher;
use skein_common::metrics::Metrics;
use skein_common::principals::Operation;
use skein_common::protocol::{validate_token, Failure, FailureKind, TaskSubmission};
use skein_common::shutdown::Workload;
use skein_common::store::{SessionStore, StoreError};
use skein_common::subjects;
use skein_common::wiring::approvals::StoredApprovals;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod ending;
mod finals;
mod input;
mod multitask;
mod submit_intakes;
mod turn;

use finals::failed_result;
use submit_intakes::SubmitIntakes;
use turn::Position;

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
    pub(crate) agents: AgentCatalog,
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
    /// Where large input images are kept (by reference).
    payloads: skein_common::payloads::PayloadStore,
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
    let provider = Providers::from_config(&cfg.model)?;
    let metrics = Metrics::new();
    let readiness = Readiness::default();
    // Health answers (and readiness says no) while start-up waits for NATS and Redis.
    let work = Workload::default();
    admin::serve_configured(&cfg.admin, metrics.clone(), readiness.clone(), &work).await?;
    skein_common::telemetry::export_metrics(
        &metrics,
        &work.background,
        work.background_stop.clone(),
    );
    // Boxed: the wait's nested retry futures would otherwise sit inline in this function's
    // future, deepening every caller's type past the compiler's layout limit.
    let connected = Box::pin(skein_common::startup::connect::<LeadError>(
        &cfg.nats,
        &cfg.redis,
        &format!("skein-lead {instance}"),
        cfg.process.max_payload,
        cfg.process.startup_timeout,
        &shutdown,
    ))
    .await;
    let (bus, store) = match connected {
        Ok(Some(connected)) => connected,
        // Stopped (`None`) or failed while waiting: nothing else has started.
        ended => {
            work.drain(cfg.process.grace).await;
            return ended.map(|_| ());
        }
    };
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
            tool_timeout: cfg.process.tool_timeout,
            subagent_timeout: cfg.subagent_timeout,
            context: ContextLimits {
                default_context_tokens: cfg.model.context_tokens,
                ..ContextLimits::default()
            },
            ..RuntimeSettings::default()
        },
        metrics.clone(),
        &cfg.model,
    );
    let intake = SubmitIntakes::bind(&bus, cfg.process.ack_wait).await?;
    let decisions = bus
        .intake(&ConsumerSettings {
            stream: subjects::APPROVALS_STREAM.into(),
            durable: subjects::APPROVALS_CONSUMER.into(),
            filter: subjects::APPROVALS_ALL.into(),
            ack_wait: cfg.process.ack_wait,
            max_deliver: -1,
            max_ack_pending: None,
        })
        .await?;
    let controls = bus
        .intake(&ConsumerSettings {
            stream: subjects::APPROVALS_STREAM.into(),
            durable: subjects::CONTROL_CONSUMER.into(),
            filter: subjects::CONTROL_ALL.into(),
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
    if let Some(ttl) = cfg.redis.session_ttl {
        crate::expiry::start(
            &bus,
            store.clone(),
            ttl,
            instance.clone(),
            &work.background,
            work.background_stop.clone(),
        );
    }
    readiness.set_ready(true);
    tracing::info!(lead_id = %instance, model = %cfg.model.provider, "lead ready");
    let (concurrency, grace) = (cfg.concurrency, cfg.process.grace);
    let cancels = CancelRegistry::default();
    let cancel_audit = skein_common::audit::cancel_audit(bus.clone());
    cancels
        .listen(
            &bus,
            &work.background,
            work.background_stop.clone(),
            Some(cancel_audit),
        )
        .await?;
    cancels.cover_submissions(&bus, &work.background, work.background_stop.clone());
    let lead = Arc::new(Lead {
        payloads: skein_common::payloads::PayloadStore::new(&bus),
        bus,
        cancels,
        approvals: StoredApprovals {
            run: None,
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
        shutdown.clone(),
        work.running.clone(),
        move |received| decision_lead.clone().handle_decision(received),
    );
    let control_lead = lead.clone();
    let controlled = controls.serve(
        Slots::new(crate::control::CONTROL_CONCURRENCY),
        shutdown,
        work.running.clone(),
        move |received| control_lead.clone().handle_control(received),
    );
    tokio::join!(turns, answers, controlled);
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
    /// State the task needs cannot be read (corrupt, out of range, of the wrong type): every
    /// attempt would fail the same way, so it is dead-lettered at once with this reason and ends
    /// with a failed final result; the session's later turns run.
    Poisoned(Failure),
    /// Calls wait for a person: the turn's request is stored, the lease released and the attempt
    /// uncounted; the message is held (unacknowledged, without a slot) until an answer wakes it.
    /// (Boxed: a suspension carries the whole submission, the other outcomes are small.)
    Suspended(Box<Suspension>),
}

impl Settled {
    /// How trouble with the store ends a delivery: handed back when it may pass, set aside when
    /// it cannot ([`StoreError::is_persistent`]).
    pub(crate) fn store_trouble(e: StoreError) -> Settled {
        if e.is_persistent() {
            Settled::Poisoned(e.to_failure())
        } else {
            Settled::Retry(e.to_failure())
        }
    }
}

impl Lead {
    /// Runs one delivered submission; the future owns the lead, so it is spawned as it is. A
    /// plain function: an `async fn` would keep the delivery twice in its future.
    fn handle(
        self: Arc<Self>,
        received: Received<TaskSubmission>,
        abort: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Boxed until it is taken apart: the future then keeps a pointer, not a second copy of
        // the delivery beside the parts the turn holds.
        let received = Box::new(received);
        async move {
            let _in_flight = self.metrics.in_flight("turn");
            let envelope = received.envelope();
            if envelope.delivered() > 1 {
                self.metrics.redelivered("turn");
            }
            let recorded = match &*received {
                Received::Decoded(delivery) => self.kept_trace(delivery).await,
                Received::Undecodable(_) => None,
            };
            let span = envelope.span_continuing(recorded.as_deref());
            span.record("skein.kind", "submission");
            self.received_work(received, abort).instrument(span).await
        }
    }

    /// What a delivery asks, taken out of its box: the box is freed here, before the turn. (A box
    /// whose contents are moved out in an `async` block is freed only when the block ends: the
    /// delivery's room would stay allocated for the whole turn.)
    fn received_work(
        self: &Arc<Self>,
        received: Box<Received<TaskSubmission>>,
        abort: CancellationToken,
    ) -> futures::future::Either<
        impl Future<Output = ()> + Send + '_,
        futures::future::BoxFuture<'_, ()>,
    > {
        match *received {
            Received::Decoded(delivery) => {
                futures::future::Either::Left(self.handle_delivery(delivery, abort))
            }
            Received::Undecodable(undecodable) => {
                let (task_id, failure) = (
                    undecodable.envelope().message_id(),
                    undecodable.body().to_failure(),
                );
                let (envelope, _) = undecodable.into_parts();
                futures::future::Either::Right(self.reject(envelope, task_id, failure).boxed())
            }
        }
    }

    /// Checks and runs a decoded submission, then settles it. A plain function taking the
    /// delivery apart before its future starts: an `async fn` would keep the delivery and its
    /// parts both, for the whole turn.
    fn handle_delivery(
        self: &Arc<Self>,
        delivery: Delivery<TaskSubmission>,
        abort: CancellationToken,
    ) -> impl Future<Output = ()> + Send + '_ {
        let (envelope, mut submission) = delivery.into_parts();
        async move {
            let checked = submission
                .validate(self.cfg.process.max_payload)
                .and_then(|()| submission.images(&self.cfg.model.image_limits()).map(drop))
                .and_then(|()| subject_matches(&envelope, &submission))
                .and_then(|()| self.submitter(&envelope, &mut submission));
            if let Err(failure) = checked {
                let task_id = Some(submission.task_id.clone());
                return self.reject(envelope, task_id, failure).boxed().await;
            }
            let span = tracing::Span::current();
            span.record("skein.task_id", submission.task_id.as_str());
            span.record("gen_ai.conversation.id", submission.session.as_str());
            let position = Position {
                place: envelope.submission_place(),
                first: envelope.is_first(),
                sender_traced: envelope.carries_trace_context(),
            };
            let every = self.cfg.process.progress_every();
            let outcome = envelope
                .with_progress(every, self.settle_turn(&submission, position, &abort))
                .await;
            // Whatever ended here may free the session for its next turn; a task handed back for
            // turn order freed nothing.
            let freed = !matches!(outcome, Settled::NotYet);
            // Boxed: settling is brief, and inline it would grow the future the whole turn keeps.
            Box::pin(self.settle_delivery(envelope, &submission, outcome, &abort)).await;
            if freed {
                // Boxed, as settling is: inline it would grow the future the whole turn keeps.
                Box::pin(crate::turns::announce(
                    &self.bus,
                    &submission.tenant,
                    &submission.session,
                ))
                .await;
            }
        }
    }

    /// The trace a later delivery of a submission sent without trace context continues: the
    /// `traceparent` its first delivery kept with the task (see `turn`). Asked of Redis before the
    /// delivery's span opens, since a span's parent is fixed once it starts; only for such later
    /// deliveries (a hand-back, a resume after an approval or a pause, another lead's takeover),
    /// so a first delivery costs no extra trip. A look that fails starts a new trace.
    async fn kept_trace(&self, delivery: &Delivery<TaskSubmission>) -> Option<String> {
        let envelope = delivery.envelope();
        let submission = delivery.body();
        let valid = || {
            subject_matches(envelope, submission).is_ok()
                && [
                    ("tenant", &submission.tenant),
                    ("session", &submission.session),
                    ("task_id", &submission.task_id),
                ]
                .iter()
                .all(|(field, value)| validate_token(field, value).is_ok())
        };
        if envelope.is_first() || envelope.carries_trace_context() || !valid() {
            return None;
        }
        self.store
            .task_trace(&submission.tenant, &submission.session, &submission.task_id)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, task_id = %submission.task_id, "the task's trace not read; this delivery starts a new one");
                None
            })
    }

    /// Checks who submitted (see `principals`): a signed submission's `user` becomes its
    /// verified principal; a refused one is recorded in the audit trail.
    fn submitter(
        self: &Arc<Self>,
        envelope: &Envelope,
        submission: &mut TaskSubmission,
    ) -> Result<(), Failure> {
        match envelope.acting(&submission.tenant, Operation::Submit, &submission.user) {
            Ok(acting) => {
                if acting.is_verified() && acting.name() != submission.user {
                    submission.user = acting.name().to_owned();
                }
                Ok(())
            }
            Err(refusal) => {
                let record = AuditRecord::refused(
                    &refusal,
                    &submission.tenant,
                    "submit",
                    &submission.task_id,
                );
                let (bus, what) = (self.bus.clone(), envelope.stream_sequence().to_string());
                tokio::spawn(async move { bus.audit(&record, &what).await });
                Err(Failure::new(FailureKind::Denied, refusal.reason))
            }
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
                self.set_aside_and_end(&envelope, submission, failure, attempts)
                    .boxed()
                    .await
            }
            Settled::Poisoned(cause) => {
                tracing::error!(%cause, "the task's stored state cannot be read; setting it aside");
                let failure = Failure::new(
                    FailureKind::DeadLettered,
                    format!("stored state this task needs cannot be read: {cause}"),
                );
                let attempts = u64::try_from(envelope.delivered()).unwrap_or(1);
                self.set_aside_and_end(&envelope, submission, failure, attempts)
                    .boxed()
                    .await
            }
        };
        envelope.settle(disposition).await;
    }
}

impl Lead {
    /// Dead-letters a submission that will not run, then ends it with a failed final result
    /// (dead-lettered either way: a final event that did not go out is still stored, for
    /// lookups); a letter the broker refused hands it back instead.
    async fn set_aside_and_end(
        &self,
        envelope: &Envelope,
        submission: &TaskSubmission,
        failure: Failure,
        attempts: u64,
    ) -> Disposition {
        if !envelope.set_aside(&failure.message, attempts).await {
            return Disposition::Retry(Some(REDELIVERY_DELAY));
        }
        self.metrics.dead_lettered("submit");
        self.metrics
            .turn_finished("dead_lettered", std::time::Duration::ZERO);
        self.publish_final(failed_result(submission, failure, 0))
            .boxed()
            .await;
        Disposition::Ack
    }
}

/// A submission must arrive on its own session's subject (of any submit partition): ordering and
/// tenant isolation rely on it.
fn subject_matches(envelope: &Envelope, submission: &TaskSubmission) -> Result<(), Failure> {
    let expected = subjects::submit(&submission.tenant, &submission.session);
    let named = subjects::parse_submit(envelope.subject());
    if named == Some((submission.tenant.as_str(), submission.session.as_str())) {
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
