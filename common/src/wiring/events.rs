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
//!
//! No event outgrows a broker message. Before it is published, a value over the inline limit
//! (`payloads::inline_limit`: 256 KiB on a 1 MiB bus) is fitted: a text delta (`model_delta`,
//! `reasoning_delta`) is split into several events, in order; the arguments of `tool_started` and
//! `approval_requested` are stored in the tenant's payload bucket and shown as a string
//! previewing their JSON (head and tail) with `arguments_ref`; a final answer is stored the same
//! way (`answer_ref`), and cut to fit if it cannot be stored. An event still too large for a
//! message is replaced by a `warning` saying so, so the stream never misses a position.
//! Listeners (in-process) get each event whole, once, before it is fitted.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use crate::agent::hooks::Listeners;
use crate::agent::seams::EventSink;
use crate::bus::{Bus, BusError, EventMessage, PendingAck};
use crate::payloads::{inline_limit, PayloadStore};
use crate::protocol::{
    now_ms, EventKind, Failure, FailureKind, TaskOrigin, TurnEventRef, PROTOCOL_VERSION,
};

/// Emits the events of one agent loop.
#[derive(Clone)]
pub struct BusEvents {
    bus: Bus,
    listeners: Listeners,
    /// The task the events belong to (the user's task, also for subagents), shared with the
    /// turn and its calls.
    origin: Arc<TaskOrigin>,
    source: Arc<str>,
    seq: Arc<AtomicU64>,
    /// The confirmation of the latest event, until it is awaited.
    latest: Arc<Mutex<Option<PendingAck>>>,
    /// Where values too large for an event are stored.
    payloads: PayloadStore,
}

impl BusEvents {
    /// A sink for `origin`'s events from `source`; values too large for an event go to
    /// `payloads` (the process's own store, shared, so that a bucket is looked up once).
    pub fn new(
        bus: Bus,
        payloads: &PayloadStore,
        listeners: Listeners,
        origin: impl Into<Arc<TaskOrigin>>,
        source: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            payloads: payloads.clone(),
            bus,
            listeners,
            origin: origin.into(),
            source: source.into(),
            seq: Arc::new(AtomicU64::new(0)),
            latest: Arc::default(),
        }
    }

    /// The task whose events this sink carries, shared (a turn's calls take it from here).
    pub fn origin(&self) -> &Arc<TaskOrigin> {
        &self.origin
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
            &self.payloads,
            self.listeners.clone(),
            self.origin.clone(),
            source,
        )
    }

    /// Sends `event` (see the module header). Boxed, as through [`EventSink`]: fitting and
    /// publishing an event is a future of a KiB or more, and inline it would grow the future of
    /// every loop that emits one by that much for the loop's whole life. The box keeps the event
    /// once (an `async fn` would keep it as argument and again as local), and each piece only
    /// as the message it is encoded into.
    pub fn emit(&self, event: EventKind) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.listeners.notify(&self.origin, &self.source, &event);
            for event in self.fit(event).await {
                self.send(event).await;
            }
        })
    }

    /// Publishes one fitted event without waiting for its confirmation (a failure is logged).
    /// Numbered and encoded before the future is made: the future keeps only the message.
    fn send(&self, event: EventKind) -> impl Future<Output = ()> + Send + '_ {
        let message = self.message(&event);
        async move {
            let sent = match message {
                Ok(message) => self.bus.send_event(message).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(ack) => {
                    if let Ok(mut latest) = self.latest.lock() {
                        // The previous confirmation, if still held, goes to the background acker.
                        *latest = Some(ack);
                    }
                }
                Err(e) => {
                    tracing::warn!(task_id = %self.origin.task_id, error = %e, "turn event not published")
                }
            }
        }
    }

    /// Publishes an event and waits until the stream has stored it (and so every event before
    /// it on this connection was handled too). Boxed: a task announces once, at its end, and
    /// inline this future (fitting a final result, its publish and confirmation) would grow by
    /// several KiB every turn's future, held for the whole turn.
    pub fn announce(&self, event: EventKind) -> BoxFuture<'_, Result<(), BusError>> {
        Box::pin(async move {
            // Fitting and publishing are brief and their future large (several KiB); the wait
            // for the stream's ack is long and small. Only the wait stays in this box.
            let ack = Box::pin(self.announce_unconfirmed(event)).await?;
            match ack {
                Some(ack) => ack.confirmed().await.map(|_| ()),
                None => Ok(()),
            }
        })
    }

    /// Publishes an event as [`BusEvents::announce`] does, but for the stream's ack; `None` when
    /// there was nothing to publish.
    async fn announce_unconfirmed(&self, event: EventKind) -> Result<Option<PendingAck>, BusError> {
        self.listeners.notify(&self.origin, &self.source, &event);
        // A final result always fits its event (its answer by reference, or cut if it cannot be
        // stored), or the client would wait for ever for an answer that is never announced.
        let mut pieces = self.fit(event).await;
        let Some(last) = pieces.pop() else {
            return Ok(None);
        };
        for piece in pieces {
            self.send(piece).await;
        }
        // The event is dropped once encoded: the wait for the connection keeps only the message.
        let message = self.message(&last);
        drop(last);
        self.bus.send_event(message?).await.map(Some)
    }

    /// The events that carry `event` within a broker message (see the module header).
    /// (A plain function returning its future: an `async fn` would keep the event twice.)
    fn fit(&self, event: EventKind) -> impl Future<Output = Vec<EventKind>> + Send + '_ {
        let limit = inline_limit(self.bus.max_payload());
        async move {
            match event {
                EventKind::ModelDelta { text } if text.len() > limit => split(&text, limit)
                    .map(|text| EventKind::ModelDelta { text })
                    .collect(),
                EventKind::ReasoningDelta { text } if text.len() > limit => split(&text, limit)
                    .map(|text| EventKind::ReasoningDelta { text })
                    .collect(),
                EventKind::ToolStarted {
                    call_id,
                    tool,
                    arguments,
                    arguments_ref: None,
                    permission,
                    rule,
                } => {
                    let (arguments, arguments_ref) = self
                        .payloads
                        .arguments_for_event(&self.origin, arguments, limit)
                        .await;
                    vec![EventKind::ToolStarted {
                        call_id,
                        tool,
                        arguments,
                        arguments_ref,
                        permission,
                        rule,
                    }]
                }
                EventKind::ApprovalRequested {
                    call_id,
                    tool,
                    arguments,
                    arguments_ref: None,
                    rule,
                    expires_at_ms,
                } => {
                    let (arguments, arguments_ref) = self
                        .payloads
                        .arguments_for_event(&self.origin, arguments, limit)
                        .await;
                    vec![EventKind::ApprovalRequested {
                        call_id,
                        tool,
                        arguments,
                        arguments_ref,
                        rule,
                        expires_at_ms,
                    }]
                }
                EventKind::Final { result } => {
                    let message_limit = self.bus.max_payload().saturating_sub(EVENT_ROOM);
                    let result = self
                        .payloads
                        .final_for_message(result, limit, message_limit)
                        .await;
                    vec![EventKind::Final { result }]
                }
                other => vec![other],
            }
        }
    }

    /// A numbered event encoded for its subject; one still too large for a message becomes a
    /// `warning` saying so, in its place.
    /// `event`, numbered next and encoded for its subject.
    fn message(&self, event: &EventKind) -> Result<EventMessage, BusError> {
        let event = self.number(event);
        match self.bus.event_message(&self.origin.tenant, event) {
            Err(BusError::TooLarge { size, limit }) => {
                let kind = serde_json::to_value(event.event)
                    .ok()
                    .and_then(|value| value["type"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                tracing::warn!(task_id = %event.task_id, kind, size, "turn event too large; a warning takes its place");
                let failure = Failure::new(
                    FailureKind::TooLarge,
                    format!(
                        "a {kind} event of {size} bytes was left out: over the {limit}-byte \
                         message cap"
                    ),
                );
                let warning = EventKind::Warning { failure };
                let warning = TurnEventRef {
                    event: &warning,
                    ..event
                };
                self.bus.event_message(&self.origin.tenant, warning)
            }
            other => other,
        }
    }

    /// Numbers an event of this sink.
    fn number<'a>(&'a self, event: &'a EventKind) -> TurnEventRef<'a> {
        TurnEventRef {
            v: PROTOCOL_VERSION,
            task_id: &self.origin.task_id,
            source: &self.source,
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

/// `text` in pieces of at most `limit` bytes (at least one character each), cut at character
/// boundaries.
fn split(text: &str, limit: usize) -> impl Iterator<Item = String> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let mut end = crate::text::floor_char_boundary(text, start.saturating_add(limit));
        if end <= start {
            end = crate::text::ceil_char_boundary(text, start + 1);
        }
        let piece = text[start..end].to_owned();
        start = end;
        Some(piece)
    })
}

impl EventSink for BusEvents {
    fn emit(&self, event: EventKind) -> BoxFuture<'_, ()> {
        BusEvents::emit(self, event)
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_pieces_keep_the_text_in_order_within_the_limit() {
        let text = format!("a{}b", "é".repeat(1000));
        let pieces: Vec<String> = split(&text, 101).collect();
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| p.len() <= 101 && !p.is_empty()));
        // Full pieces but the last: a cut moves back at most to the character's start.
        assert!(pieces.iter().rev().skip(1).all(|p| p.len() >= 100));
        // A limit below one character still moves on, one character at a time.
        assert_eq!(split("éé", 1).collect::<Vec<_>>(), ["é", "é"]);
        assert_eq!(split("", 10).count(), 0);
    }
}
