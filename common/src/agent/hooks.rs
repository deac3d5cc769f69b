//! Hooks around a turn: listeners that observe every event a turn emits (metrics, audit, tests),
//! and system-prompt transformers that may rewrite the assembled prompt before each model call.
//! Hooks are synchronous and must be cheap: they run on the turn's path.

use std::sync::Arc;

use crate::protocol::{AgentSpec, EventKind, TaskOrigin};

/// Observes a turn's events.
pub trait TurnListener: Send + Sync {
    fn on_event(&self, origin: &TaskOrigin, source: &str, event: &EventKind);
}

/// Rewrites the system prompt of an agent before a model call.
pub type PromptTransformer = Arc<dyn Fn(&AgentSpec, String) -> String + Send + Sync>;

/// The hooks a runtime applies to every turn.
#[derive(Clone, Default)]
pub struct Hooks {
    listeners: Vec<Arc<dyn TurnListener>>,
    transformers: Vec<PromptTransformer>,
}

impl Hooks {
    pub fn with_listener(mut self, listener: Arc<dyn TurnListener>) -> Self {
        self.listeners.push(listener);
        self
    }

    pub fn with_prompt_transformer(mut self, transformer: PromptTransformer) -> Self {
        self.transformers.push(transformer);
        self
    }

    pub(crate) fn notify(&self, origin: &TaskOrigin, source: &str, event: &EventKind) {
        for listener in &self.listeners {
            listener.on_event(origin, source, event);
        }
    }

    pub(crate) fn transform_prompt(&self, agent: &AgentSpec, prompt: String) -> String {
        self.transformers
            .iter()
            .fold(prompt, |prompt, transform| transform(agent, prompt))
    }
}
