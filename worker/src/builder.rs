//! [`WorkerBuilder`]: a worker binary of your own, with your own typed tools, in a few lines.
//!
//! ```no_run
//! # use skein_worker::tools::{Tool, ToolContext, ToolError};
//! # struct Shout;
//! # #[derive(serde::Deserialize, schemars::JsonSchema)]
//! # struct ShoutArgs { text: String }
//! # impl Tool for Shout {
//! #     const NAME: &'static str = "shout";
//! #     type Args = ShoutArgs;
//! #     fn description(&self) -> String { "Shouts.".into() }
//! #     async fn call(&self, args: ShoutArgs, _: ToolContext<'_>) -> Result<String, ToolError> {
//! #         Ok(args.text.to_uppercase())
//! #     }
//! # }
//! fn main() -> std::process::ExitCode {
//!     skein_worker::WorkerBuilder::new().tool(Shout).main()
//! }
//! ```
//!
//! What a tool gets for free from the worker it is registered on: its JSON Schema derived from
//! its `Args` type and arguments checked against it, the pool's consumer and heartbeats, a
//! [`TaskScope`](crate::scope::TaskScope) per call that closes whatever the call opened on every
//! outcome, the call's idempotency key, retries of transient failures, timeouts, cancellation,
//! drain on SIGTERM, metrics and traces. `SKEIN_TOOLS` selects among the built-in tools; the
//! tools added here are always provided.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use skein_common::agent::middleware::Middleware;
use skein_common::shutdown::serve_until_signal;
use tokio_util::sync::CancellationToken;

use crate::scope::ScopeStats;
use crate::tools::{Tool, ToolRegistry};
use crate::{Config, WorkerError};

type Registration = Box<dyn FnOnce(&mut ToolRegistry) + Send>;

/// A worker with tools of your own (see the module docs).
#[must_use]
pub struct WorkerBuilder {
    tools: Vec<Registration>,
    middleware: Middleware,
    stats: Arc<ScopeStats>,
    config: Option<Config>,
}

impl Default for WorkerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerBuilder {
    pub fn new() -> Self {
        Self {
            tools: Vec::new(),
            middleware: Middleware::new(),
            stats: Arc::default(),
            config: None,
        }
    }

    /// Provides `tool` (under `T::NAME`) on this worker.
    pub fn tool<T: Tool>(mut self, tool: T) -> Self {
        self.tools
            .push(Box::new(move |registry| registry.register(tool)));
        self
    }

    /// Lets `add` register tools directly (several, or built at run time).
    pub fn tools_from(mut self, add: impl FnOnce(&mut ToolRegistry) + Send + 'static) -> Self {
        self.tools.push(Box::new(add));
        self
    }

    /// Middleware around the model and tool calls of the subagent loops this worker runs.
    pub fn middleware(mut self, middleware: Middleware) -> Self {
        self.middleware = middleware;
        self
    }

    /// Counts this worker's task scopes into `stats` (for embedders and tests).
    pub fn scope_stats(mut self, stats: Arc<ScopeStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Runs with `config` instead of the one read from the command line and environment.
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Runs the worker until `shutdown` is cancelled, then drains (for embedding in a program
    /// that owns its runtime, telemetry and signals). Without [`config`](Self::config), the
    /// configuration is read from the command line and environment.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let cfg = match self.config {
            Some(cfg) => cfg,
            None => Config::try_parse().map_err(|e| WorkerError::Config(e.to_string()))?,
        };
        let tools = self.tools;
        let register = move |registry: &mut ToolRegistry| {
            for add in tools {
                add(registry);
            }
        };
        crate::run_custom(cfg, shutdown, self.stats, register, self.middleware).await
    }

    /// The whole program: reads the configuration (`--help` lists it), starts telemetry
    /// (`OTEL_*`), runs until SIGTERM or Ctrl-C, drains. Exit code 64 for bad configuration.
    pub fn main(self) -> ExitCode {
        match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime.block_on(self.serve()),
            Err(e) => {
                eprintln!("skein-worker: cannot start the async runtime: {e}");
                ExitCode::FAILURE
            }
        }
    }

    /// [`main`](Self::main) on a runtime the caller owns.
    pub async fn serve(mut self) -> ExitCode {
        let mut cfg = match self.config.take() {
            Some(cfg) => cfg,
            None => Config::parse(),
        };
        let instance = cfg.process.instance_id("worker");
        cfg.process.instance_id = Some(instance.clone());
        let validated = cfg.validate();
        let telemetry = cfg.telemetry.clone();
        let program = self.config(cfg);
        serve_until_signal(
            "skein-worker",
            &instance,
            &telemetry,
            validated,
            |shutdown| program.run(shutdown),
        )
        .await
    }
}
