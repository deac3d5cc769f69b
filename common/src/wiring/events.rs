//! `BusEvents`: the event seam over NATS — a turn's events go to the task's replayable event
//! subject (JetStream), and to the process's listeners. Sequence numbers are per source (the
//! lead's loop, or one subagent's loop) and grow across deliveries: a delivery's events are
//! numbered from `epoch << 32` (the delivery's number, counted in Redis; 0 for a delivery that
//! can be the only one), so a watcher de-duplicates by `(source, seq)` and orders by `seq`.
//!
//! Publishing an event is best effort for the turn: a failed publish is logged, never fails the
//! turn. Events are sent in order without waiting for the stream to confirm each one: a sink
//! keeps the confirmation of its latest event only (earlier ones are left to the client's
//! background acker, which frees their in-flight permits as they arrive), and
//! [`BusEvents::flush`] awaits it. The final event is the exception: [`BusEvents::announce`]
//! reports whether the stream stored it, and the lead settles a task only once it has (the final
//! result is also stored in Redis, where any lead answers a client's lookup).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use crate::agent::hooks::Listeners;
use crate::agent::seams::EventSink;
use crate::bus::{Bus, BusError, PendingAck};
use crate::protocol::{now_ms, EventKind, TaskOrigin, TurnEvent, PROTOCOL_VERSION};

/// Emits the events of one agent loop.
#[derive(Clone)]
pub struct BusEvents {
    bus: Bus,
    listeners: Listeners,
    /// The task the events belong to (the user's task, also for subagents).
    origin: TaskOrigin,
    source: Arc<str>,
    seq: Arc<AtomicU64>,
    /// The confirmation of the latest event, until it is awaited.
    latest: Arc<Mutex<Option<PendingAck>>>,
}

impl BusEvents {
    pub fn new(
        bus: Bus,
        listeners: Listeners,
        origin: TaskOrigin,
        source: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            bus,
            listeners,
            origin,
            source: source.into(),
            seq: Arc::new(AtomicU64::new(0)),
            latest: Arc::default(),
        }
    }

    /// Numbers this sink's events after those of every earlier delivery (see the module header).
    pub fn with_epoch(self, epoch: u64) -> Self {
        self.seq.store(epoch << 32, Ordering::Relaxed);
        self
    }

    /// A sink for a child loop of the same task.
    pub fn child(&self, source: impl Into<Arc<str>>) -> Self {
        Self::new(
            self.bus.clone(),
            self.listeners.clone(),
            self.origin.clone(),
            source,
        )
    }

    pub async fn emit(&self, event: EventKind) {
        let event = self.next_event(event);
        match self.bus.publish_event(&self.origin.tenant, &event).await {
            Ok(ack) => {
                if let Ok(mut latest) = self.latest.lock() {
                    // The previous confirmation, if still held, goes to the background acker.
                    *latest = Some(ack);
                }
            }
            Err(e) => {
                tracing::warn!(task_id = %event.task_id, error = %e, "turn event not published")
            }
        }
    }

    /// Publishes an event and waits until the stream has stored it (and so every event before
    /// it on this connection was handled too).
    pub async fn announce(&self, event: EventKind) -> Result<(), BusError> {
        // A final result always fits its event (its answer cut if need be), or the client would
        // wait for ever for an answer that is stored but never announced.
        let event = match event {
            EventKind::Final { result } => EventKind::Final {
                result: result.fitted(self.bus.max_payload().saturating_sub(EVENT_ROOM)),
            },
            other => other,
        };
        let event = self.next_event(event);
        let ack = self.bus.publish_event(&self.origin.tenant, &event).await?;
        ack.confirmed().await.map(|_| ())
    }

    /// Tells the listeners and numbers the event.
    fn next_event(&self, event: EventKind) -> TurnEvent {
        self.listeners.notify(&self.origin, &self.source, &event);
        TurnEvent {
            v: PROTOCOL_VERSION,
            task_id: self.origin.task_id.clone(),
            source: self.source.to_string(),
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            at_ms: now_ms(),
            event,
        }
    }

    /// Waits until the stream has confirmed the latest event (a failure is logged).
    pub async fn flush(&self) {
        let latest = self.latest.lock().ok().and_then(|mut latest| latest.take());
        if let Some(ack) = latest {
            if let Err(e) = ack.confirmed().await {
                tracing::warn!(error = %e, "turn event not stored");
            }
        }
    }
}

/// Room kept in a message for a final event's envelope (its other fields and headers).
const EVENT_ROOM: usize = 2048;

impl EventSink for BusEvents {
    fn emit(&self, event: EventKind) -> BoxFuture<'_, ()> {
        Box::pin(BusEvents::emit(self, event))
    }
}
