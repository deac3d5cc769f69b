//! `EventSink`: where a turn's events go — the task's replayable event subject, and the hooks'
//! listeners. Sequence numbers are per source (the lead's loop, or one subagent's loop).
//!
//! Publishing an event is best effort for the turn: a failed publish is logged, never fails the
//! turn (the final result is also stored in Redis, where a client can always find it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::agent::hooks::Hooks;
use crate::bus::Bus;
use crate::protocol::{now_ms, EventKind, TaskOrigin, TurnEvent, PROTOCOL_VERSION};

/// Emits the events of one agent loop.
#[derive(Clone)]
pub struct EventSink {
    bus: Bus,
    hooks: Hooks,
    /// The task the events belong to (the user's task, also for subagents).
    origin: TaskOrigin,
    source: Arc<str>,
    seq: Arc<AtomicU64>,
}

impl EventSink {
    pub fn new(bus: Bus, hooks: Hooks, origin: TaskOrigin, source: impl Into<Arc<str>>) -> Self {
        Self {
            bus,
            hooks,
            origin,
            source: source.into(),
            seq: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A sink for a child loop of the same task.
    pub fn child(&self, source: impl Into<Arc<str>>) -> Self {
        Self::new(
            self.bus.clone(),
            self.hooks.clone(),
            self.origin.clone(),
            source,
        )
    }

    pub async fn emit(&self, event: EventKind) {
        self.hooks.notify(&self.origin, &self.source, &event);
        let event = TurnEvent {
            v: PROTOCOL_VERSION,
            task_id: self.origin.task_id.clone(),
            source: self.source.to_string(),
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            at_ms: now_ms(),
            event,
        };
        if let Err(e) = self.bus.publish_event(&self.origin.tenant, &event).await {
            tracing::warn!(task_id = %event.task_id, error = %e, "turn event not published");
        }
    }
}
