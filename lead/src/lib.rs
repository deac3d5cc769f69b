//! Skein lead: takes submitted tasks, runs each agent turn, dispatches tool and subagent calls to
//! workers, and streams and stores the result. Also home of the `skein` CLI.
//!
//! # Layout
//! - [`config`]: the `skein-lead` configuration.
//! - [`server`]: the lead process — intake of submissions, session lease, load, turn, save, result;
//!   [`LeadBuilder`] adds an embedder's middleware and listeners.
//! - [`approvals`]: turns that wait for a person — suspending, parking without a slot, recording
//!   answers and waking the turn.
//! - [`control`]: pausing, resuming and steering running turns — recording controls, the flag a
//!   wake raises on a running turn, what the turn reads at its step boundaries.
//! - [`by_task`]: what the lead holds for each task it works on, removed with its guard.
//! - [`expiry`]: the sweep that removes the workspaces of expired sessions.
//! - [`lease`]: keeping a session lease while a turn runs (lost, or presumed lost).
//! - [`results`]: answers clients' lookups of stored final results.
//! - [`turns`]: waiting for a session's turn — announcements that a session is free, and the
//!   waiters they wake.
//! - [`gateway`]: the HTTP gateway (OpenAI's Chat Completions, models and Responses; A2A; keys
//!   per tenant, rate limits, CORS).
//! - [`cli`]: the `skein` command (submit, workers, cancel, pause, resume, steer, approvals,
//!   approve, deny, plan, dlq, trace, dev, lead, gateway, worker), and what the `skein-lead` and
//!   `skein-gateway` binaries run.

// The worker that `skein worker` runs in this crate is one deep future.
#![recursion_limit = "256"]

mod admission;
pub mod approvals;
pub mod by_task;
pub mod cli;
pub mod config;
pub mod control;
pub mod expiry;
pub mod gateway;
pub mod lease;
pub mod results;
pub mod server;
pub mod turns;

pub use config::Config;
pub use server::{run, LeadBuilder, LeadError};
