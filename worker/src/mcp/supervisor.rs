//! Worker-scoped servers: one supervisor task per server holds its session for the worker's whole
//! life, restarts a server that went away, and closes it when the worker stops.
//!
//! Invariants:
//! - the supervisor is the only owner of the server's [`Connection`]; tool calls borrow its
//!   [`Peer`] through the published [`ServerState`] and never close it;
//! - a server that exits or closes its connection is restarted after a backoff that starts at
//!   [`FIRST_BACKOFF`] and doubles up to [`MAX_BACKOFF`] (back to the start once a server has
//!   stayed up for [`MAX_BACKOFF`]); while it is down, calls fail at once with
//!   `ToolError::Unavailable` (which the worker retries), and while it is starting they wait for
//!   the start, bounded by the server's startup timeout;
//! - on stop the session is closed and the process group killed exactly once, whatever state the
//!   server was in; the state then stays [`ServerState::Stopped`].

use std::sync::Arc;
use std::time::Duration;

use rmcp::{Peer, RoleClient};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::ServerSpec;
use super::connection::{Connection, Shared};
use crate::tools::ToolError;

/// First wait before restarting a server that went away.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Longest wait between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where a worker-scoped server stands, as calls see it.
#[derive(Debug, Clone)]
pub(crate) enum ServerState {
    Up(Peer<RoleClient>),
    /// Being started again.
    Starting,
    /// Gone; the next start is `retry_in` after it went down.
    Down {
        reason: String,
        retry_in: Duration,
    },
    /// Closed for good (the worker is stopping).
    Stopped,
}

/// A worker-scoped server as its tools see it: the name and the state its supervisor publishes.
#[derive(Debug, Clone)]
pub(crate) struct WorkerServer {
    name: Arc<str>,
    startup_timeout: Duration,
    state: watch::Receiver<ServerState>,
}

impl WorkerServer {
    /// Hands `first` (already started) to a new supervisor task on `tracker`; it runs until
    /// `stop` is cancelled, then closes the server.
    pub fn supervise(
        spec: Arc<ServerSpec>,
        first: Connection,
        shared: Shared,
        stop: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let (publish, state) = watch::channel(ServerState::Up(first.peer().clone()));
        let server = Self {
            name: spec.name.as_str().into(),
            startup_timeout: spec.startup_timeout,
            state,
        };
        tracker.spawn(supervise(spec, first, shared, stop, publish));
        server
    }

    /// The session to call through, waiting while the server is being restarted.
    pub async fn peer(&self) -> Result<Peer<RoleClient>, ToolError> {
        let name = &self.name;
        let mut state = self.state.clone();
        let settled = tokio::time::timeout(
            self.startup_timeout,
            state.wait_for(|s| !matches!(s, ServerState::Starting)),
        )
        .await;
        let state = match settled {
            Ok(Ok(state)) => state.clone(),
            Ok(Err(_supervisor_gone)) => ServerState::Stopped,
            Err(_elapsed) => {
                return Err(ToolError::Unavailable(format!(
                    "mcp server {name} is restarting and did not come up within {:?}",
                    self.startup_timeout
                )))
            }
        };
        match state {
            ServerState::Up(peer) => Ok(peer),
            ServerState::Down { reason, retry_in } => Err(ToolError::Unavailable(format!(
                "mcp server {name} is down ({reason}); next restart within {retry_in:?}"
            ))),
            ServerState::Stopped | ServerState::Starting => Err(ToolError::Unavailable(format!(
                "mcp server {name} is stopped: the worker is shutting down"
            ))),
        }
    }
}

async fn supervise(
    spec: Arc<ServerSpec>,
    first: Connection,
    shared: Shared,
    stop: CancellationToken,
    publish: watch::Sender<ServerState>,
) {
    let name = spec.name.as_str();
    let mut connection = first;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let pid = connection.pid();
        publish.send_replace(ServerState::Up(connection.peer().clone()));
        let up_since = tokio::time::Instant::now();
        if !connection.serve_until(&stop, name).await {
            publish.send_replace(ServerState::Stopped);
            tracing::info!(mcp_server = name, pid, "MCP server closed");
            return;
        }
        if up_since.elapsed() >= MAX_BACKOFF {
            backoff = FIRST_BACKOFF;
        }
        let mut reason = "it exited or closed the connection".to_owned();
        tracing::warn!(
            mcp_server = name,
            pid,
            ?backoff,
            "MCP server went away; restarting it"
        );
        connection = loop {
            publish.send_replace(ServerState::Down {
                reason: reason.clone(),
                retry_in: backoff,
            });
            tokio::select! {
                _ = stop.cancelled() => {
                    publish.send_replace(ServerState::Stopped);
                    return;
                }
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            publish.send_replace(ServerState::Starting);
            // Dropping a start half-way kills what it spawned (see `connection`).
            let opened = tokio::select! {
                _ = stop.cancelled() => {
                    publish.send_replace(ServerState::Stopped);
                    return;
                }
                opened = Connection::open(&spec, &shared) => opened,
            };
            match opened {
                Ok(connection) => break connection,
                Err(e) => {
                    tracing::warn!(mcp_server = name, error = %e, ?backoff, "MCP server did not restart");
                    reason = format!("its restart failed: {e}");
                }
            }
        };
        tracing::info!(
            mcp_server = name,
            pid = connection.pid(),
            "MCP server restarted"
        );
    }
}
