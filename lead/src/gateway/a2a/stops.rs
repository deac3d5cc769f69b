//! A task's events read to its next stop, where an A2A exchange ends: the run's end, or calls of
//! it (its own turn's or a subagent run's) waiting for a person — A2A's `input-required`.
//!
//! The events are read from the events stream from the task's first one, then live
//! (`Bus::replay`), so a task submitted before, or answered and resumed, is read the same way.
//! Invariants:
//! - A task waits when, with every event the stream holds read, a call asked for approval
//!   (`approval_requested`) has no `approval_resolved` yet; calls the caller has just answered
//!   ([`Follower::start`]'s `answered`) do not count, their resolution being on its way.
//! - A wait is reported only once the lead has stored its request (it publishes the events
//!   first), so the answer it asks for is taken; the calls reported are the stored ones (every
//!   call of the step, arguments whole).
//! - Read from [`Since::Now`], the events already in the stream are history: they shape the state,
//!   only later ones are passed on.
//! - A task that neither ends nor waits within the gateway's run timeout, or whose events cannot
//!   be read, is reported still running; a final result stored but never announced is found by
//!   asking for it now and then, and once more before giving up.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use skein_common::protocol::{ApprovalRequest, EventKind, FinalResult, PendingCall, TurnEvent};
use tokio::time::{Instant, Interval};

use super::super::{approvals, Gateway};
use super::RpcError;

/// How often a follower asks whether the task's final result was stored without being announced.
const FINAL_LOOKUP_EVERY: Duration = Duration::from_secs(10);
/// Longest a follower waits for the lead to store the request of calls it saw asked.
const STORED_WITHIN: Duration = Duration::from_secs(10);
/// Pause between two looks for a stored request.
const STORE_POLL: Duration = Duration::from_millis(50);

/// The events' `source` of the task's own turn.
const LEAD: &str = "lead";

/// A call that waits, by the run that asked (the events' `source`) and its call id: call ids are
/// only unique within a run.
pub(super) type CallKey = (String, String);

/// Where a follower starts passing events on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Since {
    /// The task's first event.
    Start,
    /// The first event after those the stream holds now.
    Now,
}

/// What a follower reads next.
pub(super) enum Step {
    Event(Box<TurnEvent>),
    Stopped(Stop),
}

/// Where a task stopped.
pub(super) enum Stop {
    Ended(Box<FinalResult>),
    /// Calls wait for a person.
    Waiting(Vec<PendingCall>),
    /// Still running when the follower gave up, and why.
    Running(String),
}

type Messages =
    Pin<Box<dyn Stream<Item = Result<async_nats::jetstream::Message, String>> + Send + 'static>>;

/// Reads one task's events to its next stop.
pub(super) struct Follower {
    gateway: Arc<Gateway>,
    tenant: String,
    session: String,
    task_id: String,
    messages: Messages,
    /// Calls asked and not yet resolved.
    asked: BTreeMap<CallKey, PendingCall>,
    /// Calls the caller answered just before reading.
    answered: BTreeSet<CallKey>,
    /// Events are passed on.
    live: bool,
    /// The event just passed on left the task waiting: the next step is the stop.
    stop_due: bool,
    stopped: bool,
    deadline: Instant,
    look_up: Interval,
}

impl Follower {
    /// Starts reading task `task_id` (of `tenant`'s `session`).
    pub(super) async fn start(
        gateway: Arc<Gateway>,
        tenant: &str,
        session: &str,
        task_id: &str,
        since: Since,
        answered: BTreeSet<CallKey>,
    ) -> Result<Self, RpcError> {
        let messages = gateway
            .client
            .bus()
            .replay(tenant, task_id)
            .await
            .map_err(|e| RpcError::internal(format!("the task's events cannot be read: {e}")))?
            .map(|message| message.map_err(|e| e.to_string()));
        let deadline = Instant::now() + gateway.run_timeout;
        Ok(Self {
            gateway,
            tenant: tenant.to_owned(),
            session: session.to_owned(),
            task_id: task_id.to_owned(),
            messages: Box::pin(messages),
            asked: BTreeMap::new(),
            answered,
            live: since == Since::Start,
            stop_due: false,
            stopped: false,
            deadline,
            look_up: tokio::time::interval_at(
                Instant::now() + FINAL_LOOKUP_EVERY,
                FINAL_LOOKUP_EVERY,
            ),
        })
    }

    /// The next event passed on, or the stop; `None` after the stop.
    pub(super) async fn next(&mut self) -> Option<Step> {
        if self.stopped {
            return None;
        }
        let step = self.step().await;
        self.stopped = matches!(step, Step::Stopped(_));
        Some(step)
    }

    /// Reads to the stop, passing over the events.
    pub(super) async fn stop(&mut self) -> Stop {
        while let Some(step) = self.next().await {
            if let Step::Stopped(stop) = step {
                return stop;
            }
        }
        Stop::Running("the task was read to its stop before".into())
    }

    async fn step(&mut self) -> Step {
        if self.stop_due {
            return Step::Stopped(Stop::Waiting(self.stored_calls().await));
        }
        loop {
            let message = tokio::select! {
                message = tokio::time::timeout_at(self.deadline, self.messages.next()) => message,
                _ = self.look_up.tick() => match self.stored_final().await {
                    Some(result) => return Step::Stopped(Stop::Ended(Box::new(result))),
                    None => continue,
                },
            };
            let message = match message {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(e))) => {
                    return self
                        .gave_up(format!("its events could not be read: {e}"))
                        .await
                }
                Ok(None) => return self.gave_up("its events ended early".into()).await,
                Err(_) => {
                    let waited = humantime::format_duration(self.gateway.run_timeout);
                    return self
                        .gave_up(format!("it did not end or stop within {waited}"))
                        .await;
                }
            };
            // Nothing more in the stream for now: what is known is the task's state.
            let caught_up = message.info().map_or(true, |info| info.pending == 0);
            let event: TurnEvent = match self.gateway.client.bus().decode(&message.payload) {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(task_id = %self.task_id, error = %e, "an event of the task could not be read; skipped");
                    continue;
                }
            };
            let passed_on = self.live;
            self.live |= caught_up;
            match &event.event {
                EventKind::Final { result } => {
                    let result = match self.gateway.client.whole_answer(result.clone()).await {
                        Ok(whole) => whole,
                        Err(e) => {
                            tracing::warn!(task_id = %self.task_id, error = %e, "the whole answer could not be read; keeping its preview");
                            result.clone()
                        }
                    };
                    return Step::Stopped(Stop::Ended(Box::new(result)));
                }
                EventKind::ApprovalRequested {
                    call_id,
                    tool,
                    arguments,
                    rule,
                    ..
                } => {
                    let call = PendingCall {
                        call_id: call_id.clone(),
                        tool: tool.clone(),
                        arguments: arguments.clone(),
                        rule: rule.clone(),
                    };
                    self.asked
                        .insert((event.source.clone(), call_id.clone()), call);
                }
                EventKind::ApprovalResolved { call_id, .. } => {
                    let key = (event.source.clone(), call_id.clone());
                    self.asked.remove(&key);
                    self.answered.remove(&key);
                }
                _ => {}
            }
            let waits = caught_up && self.asked.keys().any(|k| !self.answered.contains(k));
            if passed_on {
                self.stop_due = waits;
                return Step::Event(Box::new(event));
            }
            if waits {
                return Step::Stopped(Stop::Waiting(self.stored_calls().await));
            }
        }
    }

    /// The calls the task waits on as the lead stored them, once it has stored every call seen
    /// asked (it stores its request just after it publishes the events); the events' calls if
    /// it has not within [`STORED_WITHIN`].
    async fn stored_calls(&mut self) -> Vec<PendingCall> {
        let seen: Vec<&CallKey> = self
            .asked
            .keys()
            .filter(|k| !self.answered.contains(*k))
            .collect();
        let give_up = Instant::now() + STORED_WITHIN;
        loop {
            match approvals::waiting(&self.gateway, &self.tenant, &self.task_id).await {
                Ok(requests) => {
                    let stored: BTreeMap<CallKey, PendingCall> = unanswered(&requests)
                        .into_iter()
                        .filter(|(k, _)| !self.answered.contains(k))
                        .collect();
                    if seen.iter().all(|k| stored.contains_key(*k)) {
                        return stored.into_values().collect();
                    }
                }
                Err(e) => {
                    tracing::debug!(task_id = %self.task_id, error = e.message(), "approval requests not read")
                }
            }
            if Instant::now() >= give_up {
                return seen
                    .into_iter()
                    .filter_map(|k| self.asked.get(k).cloned())
                    .collect();
            }
            tokio::time::sleep(STORE_POLL).await;
        }
    }

    async fn stored_final(&mut self) -> Option<FinalResult> {
        self.gateway
            .client
            .stored_final(&self.tenant, &self.session, &self.task_id)
            .await
            .ok()
            .flatten()
    }

    /// The task's end if it was stored after all, else still running for `why`.
    async fn gave_up(&mut self, why: String) -> Step {
        Step::Stopped(match self.stored_final().await {
            Some(result) => Stop::Ended(Box::new(result)),
            None => Stop::Running(why),
        })
    }
}

/// The calls of `requests` without an answer, by the run that asked.
pub(super) fn unanswered(requests: &[ApprovalRequest]) -> BTreeMap<CallKey, PendingCall> {
    let mut calls = BTreeMap::new();
    for request in requests {
        // The events of a subagent run name it by the calls that led to it.
        let source = match request.lineage.is_empty() {
            true => LEAD.to_owned(),
            false => format!("subagent:{}", request.lineage.join("/")),
        };
        for call in request.unanswered() {
            calls.insert((source.clone(), call.call_id.clone()), call.clone());
        }
    }
    calls
}
