//! `SkeinClient`: submit tasks and watch them, for the `skein` CLI and any Rust program. (Clients in
//! other languages do the same with a plain NATS client: publish a `TaskSubmission` JSON to
//! `skein.submit.{tenant}.{session}` with header `Nats-Msg-Id: <task_id>`, then read
//! `skein.events.{tenant}.{task_id}` from the `SKEIN_EVENTS` stream.)

use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::bus::{Bus, BusError, Stored};
use crate::config::NatsConfig;
use crate::protocol::{EventKind, FinalResult, TaskSubmission, TurnEvent};
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
}

/// A connection for submitting and watching tasks.
#[derive(Clone)]
pub struct SkeinClient {
    bus: Bus,
}

impl SkeinClient {
    pub async fn connect(nats: &NatsConfig) -> Result<Self, ClientError> {
        let bus = Bus::connect(nats, "skein-client", crate::bus::DEFAULT_MAX_PAYLOAD).await?;
        bus.ensure_streams().await?;
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

    /// Submits a task and waits for its final result, passing every event to `on_event`.
    ///
    /// It listens on the task's event subject before it submits, so the events of a new task
    /// arrive live, without a stream consumer per task. A resubmitted task (whose events may be
    /// older than the subscription), or a subscription that ends early (the connection dropped),
    /// is read from the event stream instead, past the events already passed on.
    pub async fn run(
        &self,
        submission: &TaskSubmission,
        timeout: Duration,
        mut on_event: impl FnMut(&TurnEvent) + Send,
    ) -> Result<FinalResult, ClientError> {
        let subject = subjects::events(&submission.tenant, &submission.task_id);
        let mut live = self
            .bus
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|e| BusError::Consumer {
                consumer: subject,
                message: e.to_string(),
            })?;
        let stored = self.submit_stored(submission).await?;
        let wait = async {
            let mut passed_on = 0;
            // Passes an event on; the final result ends the wait.
            let mut pass_on = |event: TurnEvent| {
                on_event(&event);
                match event.event {
                    EventKind::Final { result } => Some(result),
                    _ => None,
                }
            };
            if stored == Stored::New {
                while let Some(message) = live.next().await {
                    passed_on += 1;
                    if let Some(result) = pass_on(self.bus.decode(&message.payload)?) {
                        return Ok(result);
                    }
                }
            }
            drop(live);
            let events = self
                .watch(&submission.tenant, &submission.task_id)
                .await?
                .skip(passed_on);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                if let Some(result) = pass_on(event?) {
                    return Ok(result);
                }
            }
            Err(ClientError::StreamEnded)
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ClientError::TimedOut(timeout))?
    }
}
