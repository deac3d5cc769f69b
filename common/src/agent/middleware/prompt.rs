//! The system-prompt transformer chain: functions that rewrite an agent's assembled system prompt
//! before each model call.
//!
//! Invariants: transformers run in the order they were added, each getting what the one before
//! returned; an empty chain returns the prompt unchanged. Transformers are synchronous and run on
//! the turn's path: they should be quick.

use std::sync::Arc;

use crate::protocol::AgentSpec;

/// Rewrites the system prompt of an agent.
pub type PromptTransformer = Arc<dyn Fn(&AgentSpec, String) -> String + Send + Sync>;

/// The transformers of a runtime, in the order they were added.
#[derive(Clone, Default)]
pub struct PromptChain {
    transformers: Vec<PromptTransformer>,
}

impl PromptChain {
    /// Adds a transformer, applied after the ones already there.
    pub fn push(&mut self, transformer: PromptTransformer) {
        self.transformers.push(transformer);
    }

    pub fn is_empty(&self) -> bool {
        self.transformers.is_empty()
    }

    pub fn len(&self) -> usize {
        self.transformers.len()
    }

    /// `prompt` through every transformer, in order.
    pub fn apply(&self, agent: &AgentSpec, prompt: String) -> String {
        self.transformers
            .iter()
            .fold(prompt, |prompt, transform| transform(agent, prompt))
    }
}

impl std::fmt::Debug for PromptChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptChain")
            .field("transformers", &self.transformers.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::agent_spec;
    use super::*;

    #[test]
    fn transformers_apply_in_the_order_added() {
        let mut chain = PromptChain::default();
        assert_eq!(chain.apply(&agent_spec(), "base".into()), "base");

        chain.push(Arc::new(|agent, prompt| {
            format!("{prompt}\nYou are {}.", agent.name)
        }));
        chain.push(Arc::new(|_, prompt| prompt.to_uppercase()));

        assert_eq!(
            chain.apply(&agent_spec(), "base".into()),
            "BASE\nYOU ARE CODER."
        );
    }
}
