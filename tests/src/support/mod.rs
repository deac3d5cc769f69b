//! Shared test support: re-exports of the server fixtures ([`NatsServer`], [`RedisServer`],
//! [`FakeOpenAi`]) plus small helpers every integration test needs — unique names
//! ([`unique`]), bounded polling ([`eventually`]) and child processes that die with their handle
//! ([`ChildProcess`]).

pub mod agent_protocol;
pub mod browser;
pub mod chaos;
pub mod cluster;
pub mod effects_http;
pub mod fake_anthropic;
pub mod fake_openai;
pub mod gateway;
pub mod hostile;
pub mod mcp_fixture;
pub mod nats_cluster;
pub mod node;
pub mod otlp;
pub mod principals;
pub mod proxy;
pub mod python_sdk;
pub mod redis_ha;
pub mod servers;
pub mod slow_http;
pub mod soak;
pub mod test_tools;
pub mod tls;
pub mod traced;
pub mod workspaces;

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

pub use fake_openai::{FakeOpenAi, FakeReply, FAKE_COMPLETION_TOKENS, FAKE_PROMPT_TOKENS};
pub use servers::{free_port, NatsServer, RedisServer};

/// How often [`eventually`] and [`ChildProcess::wait_exit`] poll.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// `"{prefix}-{8 random hex digits}"`: a fresh name for streams, keys, sessions and the like.
/// Valid as a token (`[A-Za-z0-9_-]`) as long as `prefix` is.
/// Runs `cmd` (a lead or worker started with a bad setting) and returns its stderr once it has
/// stopped at start with the bad-configuration status, 64.
///
/// # Panics
/// When it does not stop within 60 s, or stops with another status.
pub async fn stopped_at_start(mut cmd: tokio::process::Command, role: &str) -> String {
    cmd.kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("the {role} stops at start"))
        .expect("the process runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(64), "{role}: {stderr}");
    stderr
}

pub fn unique(prefix: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &random[..8])
}

/// A bus of the test process on the NATS server at `nats_url` (default payload cap).
///
/// # Panics
/// When it cannot connect.
pub async fn test_bus(nats_url: &str) -> skein_common::bus::Bus {
    skein_common::bus::Bus::connect(
        &skein_common::config::NatsConfig::local(nats_url.to_owned()),
        "test",
        skein_common::bus::DEFAULT_MAX_PAYLOAD,
    )
    .await
    .expect("connects to the test NATS")
}

/// How many messages each of the `streams` has ever stored (its last sequence), in order.
///
/// # Panics
/// When a stream does not exist or does not answer.
pub async fn stored_per_stream(
    client: &async_nats::Client,
    streams: impl IntoIterator<Item = String>,
) -> Vec<u64> {
    let jetstream = async_nats::jetstream::new(client.clone());
    let mut stored = Vec::new();
    for name in streams {
        let mut stream = jetstream
            .get_stream(&name)
            .await
            .unwrap_or_else(|e| panic!("stream {name}: {e}"));
        let info = stream.info().await.expect("stream info");
        stored.push(info.state.last_sequence);
    }
    stored
}

/// Polls `f` every 50 ms until it yields `Some`, and returns that value.
///
/// # Panics
/// When `timeout` passes first (a hanging `f` counts against the timeout too), with
/// `"timed out after {timeout:?} waiting for {what}"`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = async {
        loop {
            if let Some(value) = f().await {
                return value;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    };
    match tokio::time::timeout(timeout, poll).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// A spawned process whose stdout and stderr go to a log file; it is killed (SIGKILL) when the
/// handle is dropped.
#[derive(Debug)]
pub struct ChildProcess {
    child: std::process::Child,
    log_path: PathBuf,
    description: String,
}

impl ChildProcess {
    /// Spawns `cmd` with stdin closed and stdout/stderr appended to `log_path` (created if
    /// missing).
    ///
    /// # Panics
    /// When the log file cannot be opened or the program cannot be started.
    pub fn spawn(mut cmd: Command, log_path: impl AsRef<Path>) -> Self {
        let log_path = log_path.as_ref().to_path_buf();
        let description = format!("{cmd:?}");
        let stdout = open_log(&log_path);
        let stderr = stdout
            .try_clone()
            .expect("a log file handle can be duplicated for stderr");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        let child = cmd
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {description}: {error}"));
        Self {
            child,
            log_path,
            description,
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Where stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The log so far (lossily decoded); empty when it cannot be read. Meant for assertion
    /// messages.
    pub fn log(&self) -> String {
        read_log(&self.log_path)
    }

    /// Asks the process to shut down gracefully (SIGTERM, sent with the `kill` command).
    ///
    /// # Panics
    /// When the `kill` command cannot be run.
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("the `kill` command runs (needed to send SIGTERM)");
        // A non-zero status means the process is already gone, which is fine.
        let _ = status;
    }

    /// Whether the process has not exited yet.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running then.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => {}
                Err(error) => panic!("cannot query the state of {}: {error}", self.description),
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Kills the process (SIGKILL) and reaps it. Does nothing if it has already exited.
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // Errors mean the process exited in between; either way it is gone.
            let _ = self.child.kill();
        }
        // Reaping after SIGKILL returns promptly.
        let _ = self.child.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn open_log(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|error| panic!("cannot open log file {}: {error}", path.display()))
}

fn read_log(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_tokens_and_differ() {
        let a = unique("sess");
        let b = unique("sess");
        assert_ne!(a, b);
        assert_eq!(a.len(), "sess-".len() + 8);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }

    #[tokio::test]
    async fn eventually_returns_the_first_some() {
        let mut calls = 0;
        let value = eventually("the third call", Duration::from_secs(5), || {
            calls += 1;
            let ready = calls >= 3;
            async move { ready.then_some(42) }
        })
        .await;
        assert_eq!(value, 42);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for nothing")]
    async fn eventually_panics_on_timeout() {
        eventually("nothing", Duration::from_millis(120), || async {
            None::<()>
        })
        .await;
    }

    #[tokio::test]
    async fn child_process_logs_and_terminates() {
        let dir = std::env::temp_dir().join(unique("skein-test-child"));
        std::fs::create_dir_all(&dir).expect("the temp dir is writable");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo hello; exec sleep 30");
        let mut child = ChildProcess::spawn(cmd, dir.join("child.log"));
        eventually("the greeting", Duration::from_secs(5), || {
            let log = child.log();
            async move { log.contains("hello").then_some(()) }
        })
        .await;
        child.sigterm();
        let status = child.wait_exit(Duration::from_secs(5)).await;
        assert!(status.is_some(), "sleep ignored SIGTERM");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
