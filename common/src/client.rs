//! `SkeinClient`: submit tasks and watch them, for the `skein` CLI and any Rust program. (Clients in
//! other languages do the same with a plain NATS client: publish a `TaskSubmission` JSON to
//! `skein.submit.{tenant}.{session}` with header `Nats-Msg-Id: <task_id>`, then read
//! `skein.events.{tenant}.{task_id}` from the `SKEIN_EVENTS` stream.)
//!
//! A final answer too large for one message arrives as a preview with `answer_ref`: [`run`] and
//! [`stored_final`] fetch the whole answer from the object store and return it whole (with
//! `answer_ref` unset), also to `run`'s event callback; a client reading [`watch`] does it with
//! [`SkeinClient::whole_answer`], and reads other references (the arguments of a
//! `tool_started` event) with [`SkeinClient::fetch_payload`].
//!
//! A structured answer: set the submission's `output_schema` (an [`OutputSchema`], e.g.
//! `OutputSchema::new(schema)`); it is checked before it is published ([`SkeinClient::submit`]
//! refuses a schema the validator cannot check), and a turn that ends `completed` carries the
//! parsed answer as the final result's `output` — also when the answer traveled by reference.
//!
//! [`OutputSchema`]: crate::protocol::OutputSchema
//!
//! [`run`]: SkeinClient::run
//! [`stored_final`]: SkeinClient::stored_final
//! [`watch`]: SkeinClient::watch

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::bus::{Bus, BusError, Stored};
use crate::config::NatsConfig;
use crate::payloads::PayloadStore;
use crate::protocol::{EventKind, FinalResult, PayloadRef, StoredFinal, TaskSubmission, TurnEvent};
use crate::subjects;
use crate::workspace::WorkspaceError;

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("task rejected before submission: {0}")]
    Rejected(crate::protocol::Failure),
    #[error("no final result within {0:?}")]
    TimedOut(Duration),
    #[error("event stream ended before the final result")]
    StreamEnded,
    #[error("the final result could not be looked up: {0}")]
    Lookup(crate::protocol::Failure),
    /// A value stored by reference could not be read (gone after its retention, not readable
    /// with these credentials, the store away).
    #[error("a stored value could not be read: {}", .0.describe())]
    Payload(#[source] WorkspaceError),
}

/// A connection for submitting and watching tasks.
#[derive(Clone)]
pub struct SkeinClient {
    bus: Bus,
    /// Where values too large for a message are read.
    payloads: PayloadStore,
}

impl SkeinClient {
    pub async fn connect(nats: &NatsConfig) -> Result<Self, ClientError> {
        let bus = Bus::connect(nats, "skein-client", crate::bus::DEFAULT_MAX_PAYLOAD).await?;
        // A tenant's user may read the streams but not change them: the cluster's processes
        // create and bound them, so a client that cannot only says so.
        if let Err(e) = bus.ensure_streams().await {
            tracing::debug!(error = %e, "streams not checked; the cluster's processes create them");
        }
        Ok(Self::from_bus(bus))
    }

    pub fn from_bus(bus: Bus) -> Self {
        Self {
            payloads: PayloadStore::new(&bus),
            bus,
        }
    }

    /// This client, its operations signed as acting for `name` with `roles` (for a delegate such
    /// as the gateway; see `Bus::acting_for`).
    pub fn acting_for(&self, name: &str, roles: &[crate::principals::Role]) -> Self {
        Self {
            payloads: self.payloads.clone(),
            bus: self.bus.acting_for(name, roles),
        }
    }

    /// The value a reference of `tenant`'s events or results names (any of its sessions).
    pub async fn fetch_payload(
        &self,
        tenant: &str,
        reference: &PayloadRef,
    ) -> Result<Bytes, ClientError> {
        self.payloads
            .load(tenant, None, reference)
            .await
            .map_err(ClientError::Payload)
    }

    /// Stores `value` (an image too large for a submission message, say) in `tenant`'s payload
    /// bucket for task `task_id` of `session`; its reference goes in the submission (an
    /// `{"type": "image", "payload": …}` input part).
    pub async fn store_payload(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        value: Bytes,
    ) -> Result<PayloadRef, ClientError> {
        self.payloads
            .store(tenant, session, task_id, value)
            .await
            .map_err(ClientError::Payload)
    }

    /// `result` with its whole answer: fetched when only a preview of it traveled
    /// (`answer_ref`), which is then unset, with the structured answer's `output` parsed back
    /// from it (`output_ref`); unchanged otherwise.
    pub async fn whole_answer(&self, mut result: FinalResult) -> Result<FinalResult, ClientError> {
        let Some(reference) = result.answer_ref.clone() else {
            return Ok(result);
        };
        let bytes = self.fetch_payload(&result.tenant, &reference).await?;
        let answer = String::from_utf8(bytes.to_vec()).map_err(|_| {
            ClientError::Payload(WorkspaceError::Invalid(format!(
                "{} is not UTF-8 text",
                reference.name
            )))
        })?;
        if result.output_ref {
            // The whole answer is the output's JSON (it matched the schema when the turn ended).
            result.output = serde_json::from_str(&answer).ok();
            result.output_ref = false;
        }
        result.answer = Some(answer);
        result.answer_ref = None;
        Ok(result)
    }

    /// [`Self::whole_answer`], keeping the preview (and `answer_ref`) when the whole cannot be
    /// read: the caller still gets the result, and where the answer is.
    async fn completed(&self, result: FinalResult) -> FinalResult {
        if result.answer_ref.is_none() {
            return result;
        }
        match self.whole_answer(result.clone()).await {
            Ok(whole) => whole,
            Err(e) => {
                tracing::warn!(task_id = %result.task_id, error = %e, "the whole answer could not be read; keeping its preview");
                result
            }
        }
    }

    /// Checks and publishes a task; resubmitting the same task id is deduplicated.
    pub async fn submit(&self, submission: &TaskSubmission) -> Result<(), ClientError> {
        self.submit_stored(submission).await.map(|_| ())
    }

    /// [`Self::submit`], telling whether the task was new or a resubmission.
    async fn submit_stored(&self, submission: &TaskSubmission) -> Result<Stored, ClientError> {
        submission
            .validate(self.bus.max_payload())
            .map_err(ClientError::Rejected)?;
        Ok(self.bus.submit(submission).await?)
    }

    /// Asks every lead and worker to stop a task. Kept for a day, so work of the task that starts
    /// later is not started.
    pub async fn cancel(
        &self,
        tenant: &str,
        task_id: &str,
        reason: &str,
    ) -> Result<(), ClientError> {
        self.cancel_run(tenant, task_id, None, reason).await
    }

    /// Cancels one subagent run of a task (`call_id`: the call that started it) and the runs
    /// under it, or, without a call, the whole task.
    pub async fn cancel_run(
        &self,
        tenant: &str,
        task_id: &str,
        call_id: Option<&str>,
        reason: &str,
    ) -> Result<(), ClientError> {
        crate::protocol::validate_token("tenant", tenant).map_err(ClientError::Rejected)?;
        crate::protocol::validate_token("task_id", task_id).map_err(ClientError::Rejected)?;
        if let Some(call) = call_id {
            crate::protocol::validate_token("call_id", call).map_err(ClientError::Rejected)?;
        }
        let request = crate::protocol::CancelRequest {
            v: crate::protocol::PROTOCOL_VERSION,
            tenant: tenant.to_owned(),
            task_id: task_id.to_owned(),
            reason: reason.to_owned(),
            call_id: call_id.map(str::to_owned),
        };
        self.bus.request_cancel(&request).await?;
        Ok(())
    }

    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The task's events from the first one, live, ending after the final result.
    pub async fn watch(
        &self,
        tenant: &str,
        task_id: &str,
    ) -> Result<impl Stream<Item = Result<TurnEvent, ClientError>> + Send + 'static, ClientError>
    {
        let messages = self.bus.replay(tenant, task_id).await?;
        let bus = self.bus.clone();
        let events = messages.map(move |message| {
            let message = message.map_err(|e| BusError::Pull(e.to_string()))?;
            Ok::<_, ClientError>(bus.decode::<TurnEvent>(&message.payload)?)
        });
        // Ends as soon as the final event is passed on, without waiting for a message after it.
        let events =
            futures::stream::unfold((events, false), |(mut events, finished)| async move {
                if finished {
                    return None;
                }
                let event = events.next().await?;
                let finished = matches!(
                    &event,
                    Ok(TurnEvent {
                        event: EventKind::Final { .. },
                        ..
                    })
                );
                Some((event, (events, finished)))
            });
        Ok(events.boxed())
    }

    /// Asks any lead for a task's stored final result, with its whole answer: `None` while the
    /// task has not ended (or no lead answered within `LOOKUP_TIMEOUT`).
    pub async fn stored_final(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<Option<FinalResult>, ClientError> {
        match self.look_up_final(tenant, session, task_id).await? {
            Some(result) => Ok(Some(self.completed(result).await)),
            None => Ok(None),
        }
    }

    /// [`Self::stored_final`] as the lead answered it (a large answer by reference).
    async fn look_up_final(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<Option<FinalResult>, ClientError> {
        for (name, token) in [
            ("tenant", tenant),
            ("session", session),
            ("task_id", task_id),
        ] {
            crate::protocol::validate_token(name, token).map_err(ClientError::Rejected)?;
        }
        let subject = subjects::result(tenant, session, task_id);
        let request = self.bus.client().request(subject.clone(), Bytes::new());
        let reply = match tokio::time::timeout(LOOKUP_TIMEOUT, request).await {
            Ok(Ok(reply)) => reply,
            // No lead answers (none runs, or none can reach the broker): nothing known.
            Ok(Err(_)) | Err(_) => return Ok(None),
        };
        let stored: StoredFinal = self.bus.decode(&reply.payload)?;
        match (stored.result, stored.failure) {
            (Some(result), _) => Ok(Some(result)),
            (None, Some(failure)) => Err(ClientError::Lookup(failure)),
            (None, None) => Ok(None),
        }
    }

    /// Submits a task and waits for its final result, passing every event to `on_event`.
    ///
    /// It listens on the task's event subject before it submits, so the events of a new task
    /// arrive live, without a stream consumer per task. When that cannot be trusted to be
    /// complete — the task was submitted before (its events may be older than the subscription),
    /// or the connection dropped (a core subscription misses what is published meanwhile) — it
    /// reads the event stream instead, past the events already passed on. A task that has ended
    /// but whose final event is not in the stream (its publish failed, or the stream no longer
    /// holds it) is answered from the stored final result, which any lead looks up; that lookup
    /// is also the last look before `timeout` gives up.
    pub async fn run(
        &self,
        submission: &TaskSubmission,
        timeout: Duration,
        mut on_event: impl FnMut(&TurnEvent) + Send,
    ) -> Result<FinalResult, ClientError> {
        let (tenant, session, task_id) = (
            submission.tenant.as_str(),
            submission.session.as_str(),
            submission.task_id.as_str(),
        );
        // Checked before any subject is built from its ids.
        submission
            .validate(self.bus.max_payload())
            .map_err(ClientError::Rejected)?;
        let subject = self.bus.events_subject(tenant, task_id);
        let mut gaps = self.bus.core_gaps();
        gaps.mark_unchanged();
        let mut live = self.bus.subscribe(&subject).await?;
        let stored = self.submit_stored(submission).await?;
        let mut passed_on = 0usize;
        let wait = async {
            if stored == Stored::New {
                // A final result stored but never announced (the events stream lost its leader
                // as the turn ended) is looked up now and then rather than at the timeout.
                let mut look_up = tokio::time::interval_at(
                    tokio::time::Instant::now() + FINAL_LOOKUP_EVERY,
                    FINAL_LOOKUP_EVERY,
                );
                loop {
                    let message = tokio::select! {
                        biased;
                        // A gap: what was published meanwhile is only in the stream.
                        _ = gaps.changed() => break,
                        message = live.next() => message,
                        _ = look_up.tick() => {
                            if let Ok(Some(result)) =
                                self.look_up_final(tenant, session, task_id).await
                            {
                                return Ok(self.announce_stored(&mut on_event, result).await);
                            }
                            continue;
                        }
                    };
                    let Some(message) = message else { break };
                    let event: TurnEvent = self.bus.decode(&message.payload)?;
                    passed_on += 1;
                    if let Some(result) = self.pass_on(&mut on_event, event).await {
                        return Ok(result);
                    }
                }
            }
            drop(live);
            loop {
                // A stream's leader being elected again (a NATS node lost) or a reconnect makes
                // reading the stream fail for a moment: read it again, past what was passed on.
                match self
                    .catch_up(submission, &mut passed_on, &mut on_event)
                    .await
                {
                    Err(ClientError::Bus(e)) if e.is_transient() => {
                        tracing::debug!(task_id, error = %e, "reading the task's events failed; reading them again");
                        tokio::time::sleep(CATCH_UP_RETRY).await;
                    }
                    outcome => break outcome,
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(outcome) => outcome,
            Err(_) => match self.look_up_final(tenant, session, task_id).await {
                Ok(Some(result)) => Ok(self.announce_stored(&mut on_event, result).await),
                _ => Err(ClientError::TimedOut(timeout)),
            },
        }
    }

    /// Reads a task's events from the stream, skipping the first `passed_on`, until its final
    /// result; a task that has ended is answered from its stored result once the stream holds
    /// nothing more.
    async fn catch_up(
        &self,
        submission: &TaskSubmission,
        passed_on: &mut usize,
        on_event: &mut (impl FnMut(&TurnEvent) + Send),
    ) -> Result<FinalResult, ClientError> {
        let (tenant, session, task_id) = (
            submission.tenant.as_str(),
            submission.session.as_str(),
            submission.task_id.as_str(),
        );
        // Known before reading: whether the task has ended, and the last event it has in the
        // stream. Past that event nothing more can come but a re-announced final result.
        let ended = self
            .look_up_final(tenant, session, task_id)
            .await
            .ok()
            .flatten();
        // One partition read for both: the stream sequences of one partition compare.
        let partition = self.bus.task_events_partition(tenant, task_id).await?;
        let last = match ended {
            Some(_) => self
                .bus
                .last_event_in(partition, tenant, task_id)
                .await?
                .map(|(sequence, _)| sequence),
            None => None,
        };
        if let (Some(result), None) = (&ended, last) {
            return Ok(self.announce_stored(on_event, result.clone()).await);
        }
        let messages = self.bus.replay_in(partition, tenant, task_id).await?;
        futures::pin_mut!(messages);
        let mut seen = 0usize;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| BusError::Pull(e.to_string()))?;
            let sequence = message.info().map(|i| i.stream_sequence).unwrap_or(0);
            seen += 1;
            if seen > *passed_on {
                *passed_on += 1;
                let event: TurnEvent = self.bus.decode(&message.payload)?;
                if let Some(result) = self.pass_on(on_event, event).await {
                    return Ok(result);
                }
            }
            if let (Some(result), Some(last)) = (&ended, last) {
                if sequence >= last {
                    return Ok(self.announce_stored(on_event, result.clone()).await);
                }
            }
        }
        Err(ClientError::StreamEnded)
    }

    /// Passes an event on (a final result with its whole answer); a final result ends the wait.
    async fn pass_on(
        &self,
        on_event: &mut (impl FnMut(&TurnEvent) + Send),
        mut event: TurnEvent,
    ) -> Option<FinalResult> {
        if let EventKind::Final { result } = event.event {
            event.event = EventKind::Final {
                result: self.completed(result).await,
            };
        }
        on_event(&event);
        match event.event {
            EventKind::Final { result } => Some(result),
            _ => None,
        }
    }

    /// Passes a stored final result on (with its whole answer) as the final event the stream did
    /// not deliver.
    async fn announce_stored(
        &self,
        on_event: &mut (impl FnMut(&TurnEvent) + Send),
        result: FinalResult,
    ) -> FinalResult {
        let result = self.completed(result).await;
        on_event(&TurnEvent {
            v: crate::protocol::PROTOCOL_VERSION,
            task_id: result.task_id.clone(),
            source: "lead".into(),
            seq: 0,
            at_ms: crate::protocol::now_ms(),
            event: EventKind::Final {
                result: result.clone(),
            },
        });
        result
    }
}

/// Pause before the events of a task are read again after a transient failure.
const CATCH_UP_RETRY: Duration = Duration::from_millis(500);

/// How often a client waiting for a task's final event asks whether a final result was stored
/// without being announced.
const FINAL_LOOKUP_EVERY: Duration = Duration::from_secs(10);

/// How long a result lookup waits for a lead's answer.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
