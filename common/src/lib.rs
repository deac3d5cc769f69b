//! Skein's shared library: everything both the lead and the workers speak and run.
//!
//! # Layout
//! - [`protocol`]: versioned wire types (submissions, tool and subagent tasks, results, events,
//!   failures as data, content parts and images) and their JSON Schemas.
//! - [`subjects`]: every NATS subject, stream and consumer name, built by functions.
//! - [`bus`]: the one NATS transport (`Bus`): stream set-up, publishing with headers, pulling work
//!   only for free slots.
//! - [`store`]: session state, call results, final results and the worker registry in Redis.
//! - [`client`]: submitting tasks and watching their events, for the CLI and any Rust client.
//! - [`runs`]: a task's runs (its turn and every subagent under it) as a tree, from its events.
//! - [`cancel`]: the running work of a process by task, reached by cancel requests.
//! - [`dispatch`]: turning tool calls into tool and subagent tasks and collecting their results.
//! - [`agent`]: the agent runtime (the ReAct loop and its seams, middleware, permissions,
//!   definitions, model providers, prompt sections, skills, context); it imports no transport.
//! - [`wiring`]: the runtime's seams over NATS and Redis (events, checkpoints, approvals), the
//!   image layer that reads stored images into model requests, and the assembly of a cluster
//!   runtime.
//! - [`workspace`]: session workspaces in the NATS object store (one bucket per tenant), their
//!   path rules and size caps, for the workers' file tools and `skein workspace`.
//! - [`payloads`]: values too large for one broker message (arguments, inputs, answers, images)
//!   stored in the object store, and the references and previews that travel in their place.
//! - [`config`], [`telemetry`], [`shutdown`]: process plumbing shared by every binary, and
//!   [`global_allocator!`], the allocator every binary uses.
//! - [`startup`]: waiting for NATS and Redis at start-up, with backoff, bounded, stoppable.
//! - [`json_schema`]: the JSON Schema validator structured answers are checked with.

pub mod admin;
pub mod agent;
pub mod audit;
pub mod bus;
pub mod cancel;
pub mod client;
pub mod config;
pub mod dispatch;
pub mod json_out;
pub mod json_schema;
pub mod metrics;
pub mod payloads;
pub mod principals;
pub mod protocol;
pub mod runs;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod subjects;
pub mod telemetry;
pub mod text;
pub mod wiring;
pub mod workspace;

#[doc(hidden)]
pub use mimalloc;

/// Makes mimalloc the binary's global allocator; every Skein binary calls it once at its root,
/// the bench and test processes too, so that they measure what ships. A turn makes about 850
/// allocations (1,300 when glibc's allocator took about 30 % of the lead's CPU, its per-thread
/// arenas keeping what a burst had freed). Built without transparent huge pages (`no_thp`), with
/// which a process's resident memory grows in 2 MiB steps, and from mimalloc's v2 line (`v2`):
/// the v3 line keeps freed pages for a second before it returns them, and under a burst that is
/// what a lead holds for its turns in flight beyond what they use (about 4 KiB a turn).
#[macro_export]
macro_rules! global_allocator {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::mimalloc::MiMalloc = $crate::mimalloc::MiMalloc;
    };
}

/// The version every process announces.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
