//! Skein worker: a stateless process that runs tool tasks and subagent tasks for one pool.
//!
//! # Layout
//! - [`WorkerBuilder`]: a worker binary of your own, with your own typed tools.
//! - [`config`]: the `skein-worker` configuration.
//! - [`run`]: intake loops (pulls only for free slots, bounded by capacity), heartbeats, graceful drain.
//! - `intakes`: the pool's consumers on every work partition, sharing one set of slots.
//! - [`execute`]: running one tool task or subagent task, recording and returning its result.
//! - [`scope`]: `TaskScope`, the per-task owner of resources, closed in layers on every outcome.
//! - [`tools`]: the `Tool` contract, the registry, and the built-in tools (workspace files,
//!   `http_fetch`).
//! - [`mcp`]: MCP servers as tool providers (worker- or task-scoped), their tools `mcp__<server>__<tool>`.
//! - [`workspace`]: session workspaces for tools that run programs (check out, check in).

mod builder;
pub mod config;
pub mod execute;
mod intakes;
mod lending;
pub mod mcp;
pub mod run;
pub mod scope;
pub mod tools;
pub mod workspace;

pub use builder::WorkerBuilder;
pub use config::Config;
pub use run::{run, run_custom, run_with_stats, run_with_tools, WorkerError};
