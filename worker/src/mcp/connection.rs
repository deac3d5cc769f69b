//! One live MCP client session: starting a server (a stdio child process in its own process group,
//! or a streamable HTTP endpoint), listing its tools, and closing it.
//!
//! Invariants:
//! - a stdio server leads its own process group (`process_group(0)`) and is spawned by this module,
//!   not by rmcp's child-process transport, so the worker holds the `Child` and closing kills the
//!   whole group (through [`ChildProcess`]) before reaping the leader;
//! - a stdio server inherits only [`INHERITED_ENV`] from the worker (so the worker's own secrets
//!   never reach it) plus its configured `env`; its stderr is forwarded to the log line by line;
//! - starting is bounded by the server's startup timeout; a start that fails or runs out of time
//!   leaves nothing running;
//! - [`Connection::close`] is the only way a session ends on purpose: the MCP session is closed
//!   (stdin closed, or the HTTP session deleted), then the process group is killed and reaped.
//!   Dropping a `Connection` (or a start half-way) instead still cancels the session and
//!   kills the process group at once, as a safety net.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, Tool};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{Peer, RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::{ServerSpec, TransportSpec};
use crate::scope::{ChildProcess, OwnedResource};

/// Variables a stdio server inherits from the worker (the usual set MCP clients pass on).
pub const INHERITED_ENV: [&str; 9] = [
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "TZ", "TMPDIR",
];

/// Bound on closing the MCP session before the process group is killed.
const SESSION_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest stderr line logged; the rest of a longer line is dropped.
const MAX_STDERR_LINE: usize = 2048;

/// What sessions share: the HTTP client of streamable HTTP servers and the tracker of the tasks
/// that forward stderr.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub http: reqwest_mcp::Client,
    pub background: TaskTracker,
}

/// Why a server could not be started or listed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("cannot run {command:?}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed the MCP handshake: {0}")]
    Handshake(#[source] Box<rmcp::service::ClientInitializeError>),
    #[error("failed to list its tools: {0}")]
    ListTools(#[source] ServiceError),
    #[error("did not start and list its tools within {0:?}")]
    TimedOut(Duration),
}

/// A started server: its MCP session and, for stdio servers, its process.
pub(crate) struct Connection {
    service: RunningService<RoleClient, ClientConfig>,
    process: Option<ServerProcess>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("pid", &self.pid())
            .finish()
    }
}

impl Connection {
    /// Starts the server `spec` describes, bounded by its startup timeout.
    pub async fn open(spec: &ServerSpec, shared: &Shared) -> Result<Self, StartError> {
        let client = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("skein-worker", skein_common::VERSION),
        );
        match &spec.transport {
            TransportSpec::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args)
                    .env_clear()
                    .envs(
                        INHERITED_ENV
                            .iter()
                            .filter_map(|name| std::env::var_os(name).map(|v| (*name, v))),
                    )
                    .envs(env)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                #[cfg(unix)]
                cmd.process_group(0);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let mut child = cmd.spawn().map_err(|source| StartError::Spawn {
                    command: command.clone(),
                    source,
                })?;
                let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
                // From here on, however this future ends, the process group dies with it.
                let process = ServerProcess::new(child);
                let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
                    process.kill(&spec.name).await;
                    return Err(StartError::Spawn {
                        command: command.clone(),
                        source: std::io::Error::other("the child's stdio pipes are missing"),
                    });
                };
                shared
                    .background
                    .spawn(forward_stderr(spec.name.clone(), process.pid(), stderr));
                let handshake =
                    tokio::time::timeout(spec.startup_timeout, client.serve((stdout, stdin))).await;
                match handshake {
                    Ok(Ok(service)) => Ok(Self {
                        service,
                        process: Some(process),
                    }),
                    Ok(Err(e)) => {
                        process.kill(&spec.name).await;
                        Err(StartError::Handshake(Box::new(e)))
                    }
                    Err(_elapsed) => {
                        process.kill(&spec.name).await;
                        Err(StartError::TimedOut(spec.startup_timeout))
                    }
                }
            }
            TransportSpec::Http { url, headers } => {
                let headers: HashMap<_, _> = headers
                    .iter()
                    .filter_map(|(name, value)| {
                        // Checked when the configuration was loaded.
                        let name = reqwest_mcp::header::HeaderName::from_bytes(name.as_bytes());
                        let value = reqwest_mcp::header::HeaderValue::from_str(value);
                        match (name, value) {
                            (Ok(name), Ok(mut value)) => {
                                value.set_sensitive(true);
                                Some((name, value))
                            }
                            _ => None,
                        }
                    })
                    .collect();
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(headers);
                let transport =
                    StreamableHttpClientTransport::with_client(shared.http.clone(), config);
                match tokio::time::timeout(spec.startup_timeout, client.serve(transport)).await {
                    Ok(Ok(service)) => Ok(Self {
                        service,
                        process: None,
                    }),
                    Ok(Err(e)) => Err(StartError::Handshake(Box::new(e))),
                    Err(_elapsed) => Err(StartError::TimedOut(spec.startup_timeout)),
                }
            }
        }
    }

    /// Starts the server and lists its tools, both within its startup timeout; on failure
    /// nothing is left running.
    pub async fn open_and_list(
        spec: &ServerSpec,
        shared: &Shared,
    ) -> Result<(Self, Vec<Tool>), StartError> {
        let started = tokio::time::Instant::now();
        let connection = Self::open(spec, shared).await?;
        let left = spec.startup_timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, connection.peer().list_all_tools()).await {
            Ok(Ok(tools)) => Ok((connection, tools)),
            Ok(Err(e)) => {
                connection.close(&spec.name).await;
                Err(StartError::ListTools(e))
            }
            Err(_elapsed) => {
                connection.close(&spec.name).await;
                Err(StartError::TimedOut(spec.startup_timeout))
            }
        }
    }

    /// The handle calls go through; usable while the session runs.
    pub fn peer(&self) -> &Peer<RoleClient> {
        self.service.peer()
    }

    /// The server's process id (stdio servers).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(ServerProcess::pid)
    }

    /// Keeps the session until it ends by itself (the server exited or closed the connection:
    /// returns true) or `stop` is cancelled (returns false); either way the session is then
    /// closed and the process group killed and reaped.
    pub async fn serve_until(self, stop: &CancellationToken, server: &str) -> bool {
        let Self { service, process } = self;
        let cancel = service.cancellation_token();
        let ended = service.waiting();
        tokio::pin!(ended);
        let by_itself = tokio::select! {
            _ = &mut ended => true,
            _ = stop.cancelled() => {
                cancel.cancel();
                if tokio::time::timeout(SESSION_CLOSE_TIMEOUT, &mut ended).await.is_err() {
                    tracing::debug!(mcp_server = server, "MCP session did not close in time");
                }
                false
            }
        };
        if let Some(process) = process {
            process.kill(server).await;
        }
        by_itself
    }

    /// Closes the MCP session, then kills the server's process group and reaps it. Failures
    /// are logged; nothing is left running that can be reached.
    pub async fn close(self, server: &str) {
        let Self {
            mut service,
            process,
        } = self;
        match service.close_with_timeout(SESSION_CLOSE_TIMEOUT).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::debug!(mcp_server = server, "MCP session did not close in time"),
            Err(e) => tracing::debug!(mcp_server = server, error = %e, "MCP session task failed"),
        }
        if let Some(process) = process {
            process.kill(server).await;
        }
    }

    /// The connection as a resource of a task's scope.
    pub fn into_resource(self, server: &str) -> ServerResource {
        ServerResource {
            server: server.to_owned(),
            connection: Some(self),
        }
    }
}

/// A stdio server's process, leader of its own process group. [`ServerProcess::kill`] kills the
/// group and reaps the leader; dropping it unkilled signals the group at once (and `kill_on_drop`
/// the leader), so no path leaves a server running.
struct ServerProcess {
    child: Option<Child>,
}

impl ServerProcess {
    fn new(child: Child) -> Self {
        Self { child: Some(child) }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    async fn kill(mut self, server: &str) {
        let Some(child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        if let Err(e) = Box::new(ChildProcess::new(child)).close().await {
            tracing::warn!(mcp_server = server, pid, error = %e, "MCP server process not stopped");
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let Some(child) = self.child.take() else {
            return;
        };
        // The leader is not reaped yet (its `Child` is still held), so its id still names the
        // group; the signal is one system call, fine on an async thread.
        if let Some(pid) = child.id() {
            crate::scope::kill_group(pid);
        }
        drop(child);
    }
}

/// A task-scoped server as a resource of the task's scope: closing the scope closes it.
#[derive(Debug)]
pub struct ServerResource {
    server: String,
    connection: Option<Connection>,
}

impl OwnedResource for ServerResource {
    fn kind(&self) -> &'static str {
        "mcp_server"
    }

    fn close(mut self: Box<Self>) -> futures::future::BoxFuture<'static, Result<(), String>> {
        Box::pin(async move {
            if let Some(connection) = self.connection.take() {
                connection.close(&self.server).await;
            }
            Ok(())
        })
    }

    fn abandon(mut self: Box<Self>) {
        // Dropping cancels the session and kills the process group (`ServerProcess`).
        if let Some(connection) = self.connection.take() {
            tracing::warn!(mcp_server = %self.server, pid = connection.pid(), "MCP server abandoned");
        }
    }
}

/// Logs a server's stderr, a line at a time, until it closes.
async fn forward_stderr(server: String, pid: Option<u32>, stderr: ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line: Vec<u8> = Vec::new();
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let (used, complete) = match chunk.iter().position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None => (chunk.len(), false),
        };
        let room = MAX_STDERR_LINE.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..used.min(room)]);
        reader.consume(used);
        if complete {
            log_stderr(&server, pid, &line);
            line.clear();
        }
    }
    if !line.is_empty() {
        log_stderr(&server, pid, &line);
    }
}

fn log_stderr(server: &str, pid: Option<u32>, line: &[u8]) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    if !text.is_empty() {
        tracing::info!(mcp_server = server, pid, "{text}");
    }
}

/// The HTTP client of streamable HTTP servers: TLS with rustls (ring) and the webpki roots, a
/// connect timeout, and no redirects (configure the endpoint's final URL). Calls are bounded by
/// the task's timeout and starts by the startup timeout, not here: a session's event stream
/// stays open.
pub(crate) fn http_client() -> Result<reqwest_mcp::Client, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest_mcp::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest_mcp::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;
    use crate::mcp::config::ServerScope;
    use crate::tools::test_support::TestDir;

    /// A "server" that never answers the handshake and leaves a grandchild in its group, whose
    /// pid it writes to `pid_file`.
    fn silent_server(pid_file: &Path, startup_timeout: Duration) -> ServerSpec {
        ServerSpec {
            name: "silent".into(),
            transport: TransportSpec::Stdio {
                command: "sh".into(),
                args: vec![
                    "-c".into(),
                    format!("sleep 300 & echo $! > '{}'; wait", pid_file.display()),
                ],
                env: BTreeMap::new(),
                cwd: None,
            },
            scope: ServerScope::Worker,
            startup_timeout,
        }
    }

    fn shared() -> Shared {
        Shared {
            http: http_client().expect("HTTP client"),
            background: TaskTracker::new(),
        }
    }

    /// The grandchild's pid, once the stand-in server has written it (bounded wait).
    async fn grandchild(pid_file: &Path) -> u32 {
        for _ in 0..500 {
            if let Some(pid) = std::fs::read_to_string(pid_file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the stand-in server never wrote {}", pid_file.display());
    }

    /// Waits (bounded) until `pid` is gone or a zombie.
    async fn ended(pid: u32) -> bool {
        for _ in 0..250 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim().to_owned()));
            match state {
                None => return true,
                Some(rest) if rest.starts_with('Z') => return true,
                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        false
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_start_that_times_out_leaves_nothing_running() {
        let dir = TestDir::new();
        let pid_file = dir.path().join("grandchild");
        let spec = silent_server(&pid_file, Duration::from_secs(1));
        let opened = Connection::open(&spec, &shared()).await;
        assert!(matches!(opened, Err(StartError::TimedOut(_))), "{opened:?}");
        let pid = grandchild(&pid_file).await;
        assert!(ended(pid).await, "grandchild {pid} survived");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_start_dropped_half_way_kills_the_process_group() {
        let dir = TestDir::new();
        let pid_file = dir.path().join("grandchild");
        let spec = silent_server(&pid_file, Duration::from_secs(60));
        let shared = shared();
        let mut opening = Box::pin(Connection::open(&spec, &shared));
        let pid = tokio::select! {
            opened = &mut opening => panic!("the silent server cannot start: {opened:?}"),
            pid = grandchild(&pid_file) => pid,
        };
        drop(opening);
        assert!(ended(pid).await, "grandchild {pid} survived");
    }

    #[tokio::test]
    async fn a_server_that_exits_at_once_fails_its_start() {
        let spec = ServerSpec {
            name: "quitter".into(),
            transport: TransportSpec::Stdio {
                command: "sh".into(),
                args: vec!["-c".into(), "exit 3".into()],
                env: BTreeMap::new(),
                cwd: None,
            },
            scope: ServerScope::Task,
            startup_timeout: Duration::from_secs(30),
        };
        let opened = Connection::open_and_list(&spec, &shared()).await;
        assert!(
            matches!(opened, Err(StartError::Handshake(_))),
            "{opened:?}"
        );
    }
}
