//! Skein worker: a stateless process that runs tool tasks and subagent tasks for one pool.
//!
//! # Layout
//! - [`config`]: the `skein-worker` configuration.
//! - [`run`]: intake loops (pulls only for free slots, bounded by capacity), heartbeats, graceful drain.
//! - [`execute`]: running one tool task or subagent task, recording and returning its result.
//! - [`scope`]: `TaskScope`, the per-task owner of resources, closed in layers on every outcome.
//! - [`tools`]: the `Tool` contract, the registry, and the built-in tools (workspace files,
//!   `http_fetch`).
//! - [`workspace`]: session workspaces for tools that run programs (check out, check in).

pub mod config;
pub mod execute;
mod lending;
pub mod run;
pub mod scope;
pub mod tools;
pub mod workspace;

pub use config::Config;
pub use run::{run, run_custom, run_with_stats, run_with_tools, WorkerError};
