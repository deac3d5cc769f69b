//! `SkeinClient`: submit tasks and watch them, for the `skein` CLI and any Rust program. (Clients in
//! other languages do the same with a plain NATS client: publish a `TaskSubmission` JSON to
//! `skein.submit.{tenant}.{session}` with header `Nats-Msg-Id: <task_id>`, then read
//! `skein.events.{tenant}.{task_id}` from the `SKEIN_EVENTS` stream.)

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::bus::{Bus, BusError, Stored};
use crate::config::NatsConfig;
use crate::protocol::{EventKind, FinalResult, StoredFinal, TaskSubmission, TurnEvent};
use crate::subjects;

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
}

/// A connection for submitting and watching tasks.
#[derive(Clone)]
pub struct SkeinClient {
    bus: Bus,
}

impl SkeinClient {
    pub async fn connect(nats: &NatsConfig) -> Result<Self, ClientError> {
        let bus = Bus::connect(nats, "skein-client", crate::bus::DEFAULT_MAX_PAYLOAD).await?;
        // A tenant's user may read the streams but not change them: the cluster's processes
        // create and bound them, so a client that cannot only says so.
        if let Err(e) = bus.ensure_streams().await {
            tracing::debug!(error = %e, "streams not checked; the cluster's processes create them");
        }
        Ok(Self { bus })
    }

    pub fn from_bus(bus: Bus) -> Self {
        Self { bus }
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
        crate::protocol::validate_token("tenant", tenant).map_err(ClientError::Rejected)?;
        crate::protocol::validate_token("task_id", task_id).map_err(ClientError::Rejected)?;
        let request = crate::protocol::CancelRequest {
            v: crate::protocol::PROTOCOL_VERSION,
            tenant: tenant.to_owned(),
            task_id: task_id.to_owned(),
            reason: reason.to_owned(),
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
        let messages = self.bus.replay(subjects::events(tenant, task_id)).await?;
        let bus = self.bus.clone();
        let events = messages
            .map(move |message| {
                let message = message.map_err(|e| BusError::Pull(e.to_string()))?;
                Ok::<_, ClientError>(bus.decode::<TurnEvent>(&message.payload)?)
            })
            .scan(false, |finished, event| {
                if *finished {
                    return futures::future::ready(None);
                }
                if let Ok(TurnEvent {
                    event: EventKind::Final { .. },
                    ..
                }) = &event
                {
                    *finished = true;
                }
                futures::future::ready(Some(event))
            });
        Ok(events)
    }

    /// Asks any lead for a task's stored final result: `None` while the task has not ended (or
    /// no lead answered within `LOOKUP_TIMEOUT`).
    pub async fn stored_final(
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
        let subject = subjects::events(tenant, task_id);
        let mut disconnects = self.bus.disconnects();
        disconnects.mark_unchanged();
        let mut live = self.bus.subscribe(&subject).await?;
        let stored = self.submit_stored(submission).await?;
        let mut passed_on = 0usize;
        let wait = async {
            if stored == Stored::New {
                loop {
                    let message = tokio::select! {
                        biased;
                        // A gap: what was published meanwhile is only in the stream.
                        _ = disconnects.changed() => break,
                        message = live.next() => message,
                    };
                    let Some(message) = message else { break };
                    let event: TurnEvent = self.bus.decode(&message.payload)?;
                    passed_on += 1;
                    if let Some(result) = pass_on(&mut on_event, event) {
                        return Ok(result);
                    }
                }
            }
            drop(live);
            self.catch_up(submission, &subject, &mut passed_on, &mut on_event)
                .await
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(outcome) => outcome,
            Err(_) => match self.stored_final(tenant, session, task_id).await {
                Ok(Some(result)) => Ok(announce_stored(&mut on_event, result)),
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
        subject: &str,
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
            .stored_final(tenant, session, task_id)
            .await
            .ok()
            .flatten();
        let last = match ended {
            Some(_) => self
                .bus
                .last_event(subject)
                .await?
                .map(|(sequence, _)| sequence),
            None => None,
        };
        if let (Some(result), None) = (&ended, last) {
            return Ok(announce_stored(on_event, result.clone()));
        }
        let messages = self.bus.replay(subject.to_owned()).await?;
        futures::pin_mut!(messages);
        let mut seen = 0usize;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| BusError::Pull(e.to_string()))?;
            let sequence = message.info().map(|i| i.stream_sequence).unwrap_or(0);
            seen += 1;
            if seen > *passed_on {
                *passed_on += 1;
                let event: TurnEvent = self.bus.decode(&message.payload)?;
                if let Some(result) = pass_on(on_event, event) {
                    return Ok(result);
                }
            }
            if let (Some(result), Some(last)) = (&ended, last) {
                if sequence >= last {
                    return Ok(announce_stored(on_event, result.clone()));
                }
            }
        }
        Err(ClientError::StreamEnded)
    }
}

/// How long a result lookup waits for a lead's answer.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Passes an event on; a final result ends the wait.
fn pass_on(on_event: &mut impl FnMut(&TurnEvent), event: TurnEvent) -> Option<FinalResult> {
    on_event(&event);
    match event.event {
        EventKind::Final { result } => Some(result),
        _ => None,
    }
}

/// Passes a stored final result on as the final event the stream did not deliver.
fn announce_stored(on_event: &mut impl FnMut(&TurnEvent), result: FinalResult) -> FinalResult {
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
