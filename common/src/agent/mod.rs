//! The agent runtime: one ReAct loop with clear seams.
//!
//! - [`definition`]: agent definitions (name, prompt, model, tools, limits), loaded from a workspace
//!   folder (`AGENTS.md`, `subagents/*.md`, `skills/`).
//! - [`message`]: the conversation model.
//! - [`model`]: model providers behind `ModelClient`.
//! - [`prompt`]: system-prompt sections with priorities.
//! - [`skills`]: the skills catalog shown in the prompt.
//! - [`context`]: what of the history goes to the model; eviction of huge tool results.
//! - [`hooks`]: listeners and transformers around the turn.
//! - [`events`]: the turn's event stream.
//! - [`runtime`]: the loop itself.

pub mod context;
pub mod definition;
pub mod events;
pub mod hooks;
pub mod message;
pub mod model;
pub mod prompt;
pub mod runtime;
pub mod skills;
