//! Event listeners: observers of every event a turn emits (metrics, audit, tests). Listeners are
//! synchronous and must be cheap: they run on the turn's path, before the event is published.
//! (Hooks that may change a turn — around the turn, each reasoning and acting step, the system
//! prompt — are middleware: see `agent::middleware`.)

use std::sync::Arc;

use crate::protocol::{EventKind, TaskOrigin};

/// Observes a turn's events.
pub trait TurnListener: Send + Sync {
    fn on_event(&self, origin: &TaskOrigin, source: &str, event: &EventKind);
}

/// The listeners an event sink tells of every event.
#[derive(Clone, Default)]
pub struct Listeners {
    listeners: Vec<Arc<dyn TurnListener>>,
}

impl Listeners {
    pub fn with(mut self, listener: Arc<dyn TurnListener>) -> Self {
        self.listeners.push(listener);
        self
    }

    pub fn notify(&self, origin: &TaskOrigin, source: &str, event: &EventKind) {
        for listener in &self.listeners {
            listener.on_event(origin, source, event);
        }
    }
}
