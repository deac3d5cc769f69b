//! MCP servers as tool providers: the servers `--mcp-config` names are started, their tools join
//! the worker's registry as `mcp__<server>__<tool>`, and calls go to the server over MCP (rmcp).
//!
//! Ownership is explicit and depends on the server's `scope`:
//! - `worker` (the default): started when the worker starts, before it announces its tools;
//!   borrowed by every task; kept up by a supervisor that restarts it with backoff when it goes
//!   away; closed once when the worker stops, after running tasks have drained
//!   ([`McpServers::close`]);
//! - `task`: started once at worker start to list its tools, then closed; after that started
//!   again for every call, inside the task's [`TaskScope`](crate::scope::TaskScope), which closes
//!   it (killing its process group) when the task ends, on every outcome.
//!
//! A worker whose configuration is bad, or whose servers do not start and list their tools within
//! their startup timeout, does not start: it would announce a tool list unlike its pool's.
//!
//! # Layout
//! - [`config`]: the flag, the JSON file and its checks.
//! - [`connection`]: starting, listing and closing one server session.
//! - [`supervisor`]: keeping a worker-scoped server up.
//! - [`tool`]: names, specs, calls and results.

pub mod config;
pub mod connection;
mod supervisor;
pub mod tool;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{McpConfig, ServerScope, ServerSpec, TransportSpec, ENV_MCP_CONFIG};
pub use connection::StartError;

use connection::{Connection, Shared};
use supervisor::WorkerServer;
use tool::{McpTool, ServerSource};

use crate::tools::ToolRegistry;

/// How long closing the worker-scoped servers may take in all.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the MCP servers could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    #[error("cannot read the MCP config {path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid MCP config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("mcp server {server:?} {source}")]
    Start {
        server: String,
        #[source]
        source: StartError,
    },
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<McpError>),
    #[error("MCP HTTP client: {0}")]
    Http(String),
}

/// The worker-scoped servers this worker runs, and the background work of all its servers.
#[derive(Debug)]
pub struct McpServers {
    /// Worker-scoped servers by name, for logs.
    running: Vec<String>,
    stop: CancellationToken,
    background: TaskTracker,
    closed: bool,
}

impl McpServers {
    /// Starts the configured servers, lists their tools and adds them to `registry`. Without
    /// `--mcp-config` this does nothing. On error nothing is left running.
    pub async fn start(cfg: &McpConfig, registry: &mut ToolRegistry) -> Result<Self, McpError> {
        let specs = cfg.load()?;
        let background = TaskTracker::new();
        let mut servers = Self {
            running: Vec::new(),
            stop: CancellationToken::new(),
            background: background.clone(),
            closed: false,
        };
        if specs.is_empty() {
            servers.closed = true;
            return Ok(servers);
        }
        let shared = Shared {
            http: connection::http_client().map_err(McpError::Http)?,
            background,
        };
        let specs: Vec<Arc<ServerSpec>> = specs.into_iter().map(Arc::new).collect();
        let started = futures::future::join_all(specs.iter().map(|spec| {
            let shared = shared.clone();
            async move {
                let opened = Connection::open_and_list(spec, &shared).await;
                (spec.clone(), opened)
            }
        }))
        .await;

        let mut failures = Vec::new();
        let mut ready = Vec::new();
        for (spec, opened) in started {
            match opened {
                Ok(opened) => ready.push((spec, opened)),
                Err(source) => failures.push(McpError::Start {
                    server: spec.name.clone(),
                    source,
                }),
            }
        }
        if !failures.is_empty() {
            for (spec, (connection, _)) in ready {
                connection.close(&spec.name).await;
            }
            servers.close().await;
            return Err(if failures.len() == 1 {
                failures.remove(0)
            } else {
                McpError::Several(failures)
            });
        }

        for (spec, (connection, tools)) in ready {
            let source = match spec.scope {
                ServerScope::Worker => {
                    servers.running.push(spec.name.clone());
                    let server = WorkerServer::supervise(
                        spec.clone(),
                        connection,
                        shared.clone(),
                        servers.stop.child_token(),
                        &servers.background,
                    );
                    ServerSource::Worker(server)
                }
                ServerScope::Task => {
                    connection.close(&spec.name).await;
                    ServerSource::Task {
                        spec: spec.clone(),
                        shared: shared.clone(),
                    }
                }
            };
            let registered = register(registry, &spec.name, &tools, &source);
            tracing::info!(
                mcp_server = %spec.name,
                scope = ?spec.scope,
                listed = tools.len(),
                registered,
                "MCP server's tools registered"
            );
        }
        tracing::info!(
            worker_scoped = ?servers.running,
            servers = specs.len(),
            "MCP servers ready"
        );
        Ok(servers)
    }

    /// Names of the worker-scoped servers being kept up.
    pub fn worker_scoped(&self) -> &[String] {
        &self.running
    }

    /// Closes every worker-scoped server (its session closed, its process group killed) and
    /// waits, within a bound, for the servers' background work to end. Call it after running
    /// tasks have drained.
    pub async fn close(mut self) {
        self.closed = true;
        self.stop.cancel();
        self.background.close();
        if tokio::time::timeout(CLOSE_TIMEOUT, self.background.wait())
            .await
            .is_err()
        {
            tracing::warn!(timeout = ?CLOSE_TIMEOUT, "MCP servers did not all close in time");
        } else if !self.running.is_empty() {
            tracing::info!(closed = ?self.running, "MCP servers closed");
        }
    }
}

impl Drop for McpServers {
    fn drop(&mut self) {
        if !self.closed {
            // The supervisors still close their servers, in the background.
            tracing::warn!(servers = ?self.running, "MCP servers not closed; closing them now");
            self.stop.cancel();
        }
    }
}

/// Adds `tools` of `server` to the registry; a tool whose name is unusable or taken is left out
/// with a warning. Returns how many were added.
fn register(
    registry: &mut ToolRegistry,
    server: &str,
    tools: &[rmcp::model::Tool],
    source: &ServerSource,
) -> usize {
    let mut registered = 0;
    for listed in tools {
        let name = match tool::tool_name(server, &listed.name) {
            Ok(name) => name,
            Err(why) => {
                tracing::warn!(mcp_server = server, tool = %listed.name, "MCP tool left out: {why}");
                continue;
            }
        };
        if registry.contains(&name) {
            tracing::warn!(
                mcp_server = server,
                tool = %listed.name,
                name,
                "MCP tool left out: another tool already has its name"
            );
            continue;
        }
        let adapter = McpTool {
            server: server.to_owned(),
            remote: listed.name.to_string(),
            source: source.clone(),
        };
        registry.register_dynamic(tool::spec(name, listed), Arc::new(adapter));
        registered += 1;
    }
    registered
}
