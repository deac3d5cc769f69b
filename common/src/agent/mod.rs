//! The agent runtime: one ReAct loop with clear seams, below its transport.
//!
//! - [`runtime`]: the loop itself, generic over its seams.
//! - [`seams`]: what the loop reaches outside itself — the tool and model `tower::Service`s, the
//!   tool directory, and the event, checkpoint and approval traits.
//! - [`middleware`]: layers around model and tool calls, and hooks around the turn, each
//!   reasoning step and each acting step; the system-prompt transformer chain.
//! - [`permissions`]: the pure decision of whether a call runs, asks or is denied.
//! - [`plan`]: the plans the model keeps: revisions checked and merged, the steps ready to run.
//! - [`definition`]: agent definitions (name, prompt, model, tools, limits, permissions, skills),
//!   loaded from a workspace folder (`AGENTS.md`, `subagents/*.md`, `skills/`, `permissions.toml`).
//! - [`model`]: model providers behind `ModelClient`.
//! - [`tools`]: the tool catalog a turn takes a snapshot of.
//! - [`prompt`]: system-prompt sections with priorities.
//! - [`skills`]: the skills catalog shown in the prompt and loaded on demand.
//! - [`context`]: what of the history goes to the model; eviction of huge tool results.
//! - [`tokens`]: counting a conversation's tokens (a tokenizer for OpenAI models, an estimate
//!   otherwise) and each model's context size.
//! - [`compaction`]: when a session's history, or a turn's own older steps, are summarised, where
//!   they are cut, what the summary requests say.
//! - [`replay`]: a recorded turn's calls, answering a replay of it without repeating side effects.
//! - [`structured`]: structured answers — checking a final answer against the agent's output
//!   schema, and the repair request an answer that fails gets.
//! - [`hooks`]: listeners that observe every event of a turn.
//! - [`memory`]: in-memory implementations of every seam, for embedding and tests.

pub mod compaction;
pub mod context;
pub mod definition;
pub mod hooks;
pub mod memory;
pub mod middleware;
pub mod model;
pub mod permissions;
pub mod plan;
pub mod prompt;
pub mod replay;
pub mod runtime;
pub mod seams;
pub mod skills;
pub mod structured;
pub mod tokens;
pub mod tools;
