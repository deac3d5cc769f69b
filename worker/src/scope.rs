//! `TaskScope`: ownership of everything one task opens on a worker, and its release.
//!
//! Every task a worker runs gets one [`TaskScope`]. What the task opens for itself (its scratch
//! directory, child processes, anything implementing [`OwnedResource`]) is handed to the scope,
//! and the worker's run loop calls [`TaskScope::close`] once the task has ended, whatever the
//! outcome: success, error, timeout, cancellation or a panic inside the task future (the scope is
//! held by the run loop outside that future, so it survives it).
//!
//! Invariants:
//! - resources are closed in reverse order of acquisition, each bounded by a timeout
//!   ([`RESOURCE_CLOSE_TIMEOUT`] by default); a failing, hanging or panicking close never stops
//!   the others, and every failure is reported together in [`CloseErrors`];
//! - a scope counts as closed exactly once in [`ScopeStats`]: by the first `close` that runs to
//!   the end, or else by `Drop`; each resource counts as closed once, when its close is attempted
//!   (`close_failures` counts the attempts that failed), so opened minus closed is what is alive;
//! - `Drop` of an unclosed scope is a safety net only: it logs a warning and releases what it can
//!   synchronously ([`OwnedResource::abandon`]: remove the scratch directory, start killing
//!   children);
//! - shared, borrowed things (NATS and Redis clients, the HTTP pool) never belong in a scope:
//!   closing a scope must never affect another task.
//!
//! A close that is cancelled half-way leaves the resources it has not reached in the scope: a later
//! `close` picks them up, and `Drop` abandons them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

/// Longest time one resource may take to close before it is reported as failed.
pub const RESOURCE_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a killed child may take to exit; shorter than [`RESOURCE_CLOSE_TIMEOUT`] so the
/// failure names the real cause.
const CHILD_EXIT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the `kill` command that signals a process group may run.
#[cfg(unix)]
const GROUP_KILL_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest label kept in a scratch directory name.
const MAX_LABEL_IN_NAME: usize = 64;

/// Something a task owns and that must be released when the task ends.
pub trait OwnedResource: Send + 'static {
    /// What the resource is, for logs and error reports (`"scratch_dir"`, `"child_process"`...).
    fn kind(&self) -> &'static str;

    /// Releases the resource. The scope bounds this with a timeout.
    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), String>>;

    /// Best-effort synchronous release, used only when a scope is dropped without being closed.
    /// The default does nothing beyond dropping the resource.
    fn abandon(self: Box<Self>) {}
}

/// Counters shared by every scope of a worker, for metrics and leak checks.
#[derive(Debug, Default)]
pub struct ScopeStats {
    scopes_opened: AtomicU64,
    scopes_closed: AtomicU64,
    resources_opened: AtomicU64,
    resources_closed: AtomicU64,
    close_failures: AtomicU64,
}

/// A point-in-time copy of [`ScopeStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScopeCounts {
    pub scopes_opened: u64,
    pub scopes_closed: u64,
    pub resources_opened: u64,
    pub resources_closed: u64,
    pub close_failures: u64,
}

impl ScopeStats {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn snapshot(&self) -> ScopeCounts {
        ScopeCounts {
            scopes_opened: self.scopes_opened.load(Ordering::Relaxed),
            scopes_closed: self.scopes_closed.load(Ordering::Relaxed),
            resources_opened: self.resources_opened.load(Ordering::Relaxed),
            resources_closed: self.resources_closed.load(Ordering::Relaxed),
            close_failures: self.close_failures.load(Ordering::Relaxed),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl ScopeCounts {
    /// Scopes opened and not yet closed.
    pub fn open_scopes(&self) -> u64 {
        self.scopes_opened.saturating_sub(self.scopes_closed)
    }

    /// Resources owned by some scope and not yet closed.
    pub fn open_resources(&self) -> u64 {
        self.resources_opened.saturating_sub(self.resources_closed)
    }
}

/// Why a scope could not provide something.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("could not create the scratch directory {path}")]
    CreateScratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the task scope is already closed")]
    Closed,
}

/// Every resource that failed to close, as `(kind, message)` in closing order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} resource(s) failed to close: {}", .failures.len(), describe_failures(.failures))]
pub struct CloseErrors {
    pub failures: Vec<(&'static str, String)>,
}

fn describe_failures(failures: &[(&'static str, String)]) -> String {
    failures
        .iter()
        .map(|(kind, message)| format!("{kind}: {message}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The resources of one task. See the module documentation.
pub struct TaskScope {
    stats: Arc<ScopeStats>,
    scratch_root: PathBuf,
    label: String,
    scratch: Option<PathBuf>,
    /// In order of acquisition; closed from the back.
    resources: Vec<Box<dyn OwnedResource>>,
    close_timeout: Duration,
    closed: bool,
}

impl std::fmt::Debug for TaskScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<&str> = self.resources.iter().map(|r| r.kind()).collect();
        f.debug_struct("TaskScope")
            .field("label", &self.label)
            .field("scratch", &self.scratch)
            .field("resources", &kinds)
            .field("closed", &self.closed)
            .finish()
    }
}

impl TaskScope {
    /// Opens a scope for one task; its scratch directory, if it needs one, goes under
    /// `scratch_root`. `label` names the task in logs and in the scratch directory name.
    pub fn new(stats: Arc<ScopeStats>, scratch_root: PathBuf, label: impl Into<String>) -> Self {
        ScopeStats::bump(&stats.scopes_opened);
        Self {
            stats,
            scratch_root,
            label: label.into(),
            scratch: None,
            resources: Vec::new(),
            close_timeout: RESOURCE_CLOSE_TIMEOUT,
            closed: false,
        }
    }

    /// Replaces the per-resource close timeout (default [`RESOURCE_CLOSE_TIMEOUT`]).
    pub fn with_close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Number of resources currently owned.
    pub fn owned(&self) -> usize {
        self.resources.len()
    }

    /// This task's scratch directory: created (mode 0700 on Unix) under the scratch root on the
    /// first call, the same path on later calls, removed when the scope closes.
    pub async fn scratch_dir(&mut self) -> Result<PathBuf, ScopeError> {
        if self.closed {
            return Err(ScopeError::Closed);
        }
        if let Some(path) = &self.scratch {
            return Ok(path.clone());
        }
        let path = self.scratch_root.join(scratch_name(&self.label));
        create_private_dir(&self.scratch_root, &path)
            .await
            .map_err(|source| ScopeError::CreateScratch {
                path: path.clone(),
                source,
            })?;
        self.scratch = Some(path.clone());
        self.own(Box::new(ScratchDir { path: path.clone() }));
        Ok(path)
    }

    /// Takes ownership of `resource`. Owning after the scope has closed releases it at once
    /// (best effort, synchronously) and logs a warning.
    pub fn own(&mut self, resource: Box<dyn OwnedResource>) {
        ScopeStats::bump(&self.stats.resources_opened);
        if self.closed {
            tracing::warn!(
                scope = %self.label,
                kind = resource.kind(),
                "resource handed to a closed task scope; releasing it now"
            );
            ScopeStats::bump(&self.stats.resources_closed);
            resource.abandon();
            return;
        }
        self.resources.push(resource);
    }

    /// Takes ownership of a child process: on close its process group is killed if it leads
    /// one (spawn it with `process_group(0)` to make sure grandchildren die too), else the child
    /// alone is, and it is then waited for.
    pub fn own_child(&mut self, child: tokio::process::Child) {
        self.own(Box::new(ChildProcess { child }));
    }

    /// Closes every owned resource, newest first, and reports all failures together. Calling it
    /// again after it has completed does nothing and returns `Ok`.
    pub async fn close(&mut self) -> Result<(), CloseErrors> {
        if self.closed {
            return Ok(());
        }
        let mut failures = Vec::new();
        // Pop one at a time so a cancelled close leaves the rest owned.
        while let Some(resource) = self.resources.pop() {
            let kind = resource.kind();
            let outcome = tokio::time::timeout(
                self.close_timeout,
                std::panic::AssertUnwindSafe(resource.close()).catch_unwind(),
            )
            .await;
            ScopeStats::bump(&self.stats.resources_closed);
            let failure = match outcome {
                Ok(Ok(Ok(()))) => None,
                Ok(Ok(Err(message))) => Some(message),
                Ok(Err(_panic)) => Some("close panicked".to_owned()),
                Err(_elapsed) => Some(format!("close timed out after {:?}", self.close_timeout)),
            };
            if let Some(message) = failure {
                ScopeStats::bump(&self.stats.close_failures);
                tracing::warn!(scope = %self.label, kind, error = %message, "resource failed to close");
                failures.push((kind, message));
            }
        }
        self.closed = true;
        self.scratch = None;
        ScopeStats::bump(&self.stats.scopes_closed);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(CloseErrors { failures })
        }
    }
}

impl Drop for TaskScope {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        tracing::warn!(
            scope = %self.label,
            resources = self.resources.len(),
            "task scope not closed"
        );
        ScopeStats::bump(&self.stats.scopes_closed);
        while let Some(resource) = self.resources.pop() {
            ScopeStats::bump(&self.stats.resources_closed);
            resource.abandon();
        }
    }
}

/// A unique directory name for a task labelled `label`.
fn scratch_name(label: &str) -> String {
    let mut name: String = label
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(MAX_LABEL_IN_NAME)
        .collect();
    if name.is_empty() {
        name.push_str("task");
    }
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

async fn create_private_dir(root: &Path, path: &Path) -> std::io::Result<()> {
    tokio::fs::create_dir_all(root).await?;
    let mut builder = tokio::fs::DirBuilder::new();
    #[cfg(unix)]
    builder.mode(0o700);
    builder.create(path).await
}

/// A task's scratch directory, removed recursively on close.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Owns an existing directory: it is removed, with everything in it, on close.
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }
}

impl OwnedResource for ScratchDir {
    fn kind(&self) -> &'static str {
        "scratch_dir"
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), String>> {
        async move {
            match tokio::fs::remove_dir_all(&self.path).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(format!("removing {}: {e}", self.path.display())),
            }
        }
        .boxed()
    }

    fn abandon(self: Box<Self>) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "could not remove scratch directory");
            }
        }
    }
}

/// A child process, killed (with its process group when it leads one) and reaped on close.
#[derive(Debug)]
pub struct ChildProcess {
    child: tokio::process::Child,
}

impl ChildProcess {
    pub fn new(child: tokio::process::Child) -> Self {
        Self { child }
    }
}

impl OwnedResource for ChildProcess {
    fn kind(&self) -> &'static str {
        "child_process"
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), String>> {
        let mut child = self.child;
        async move {
            // Signal the group first: the leader may already have exited and left members behind.
            let group_killed = match child.id() {
                Some(pid) => kill_group_if_leader(pid).await,
                None => false,
            };
            if !group_killed {
                if let Err(e) = child.start_kill() {
                    // Killing fails when the child has already exited; that is success here.
                    if !matches!(child.try_wait(), Ok(Some(_))) {
                        return Err(format!("killing the child: {e}"));
                    }
                }
            }
            match tokio::time::timeout(CHILD_EXIT_TIMEOUT, child.wait()).await {
                Ok(Ok(_status)) => Ok(()),
                Ok(Err(e)) => Err(format!("waiting for the child: {e}")),
                Err(_elapsed) => Err(format!(
                    "the child did not exit within {CHILD_EXIT_TIMEOUT:?} of being killed"
                )),
            }
        }
        .boxed()
    }

    fn abandon(mut self: Box<Self>) {
        // Tokio reaps dropped children in the background once they exit.
        if let Err(e) = self.child.start_kill() {
            tracing::debug!(error = %e, "could not kill an abandoned child (it may have exited)");
        }
    }
}

/// Sends SIGKILL to process group `pgid`. A group that is already gone is fine.
pub(crate) fn kill_group(pgid: u32) {
    let Ok(raw) = i32::try_from(pgid) else {
        return;
    };
    if raw <= 1 {
        // Never signal "every process" or init's group by accident.
        return;
    }
    match nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), nix::sys::signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid, error = %e, "could not kill a process group"),
    }
}

/// Kills the process group led by `pid`, if `pid` leads one. Returns whether the group was
/// signalled. `unsafe` is forbidden in this workspace, so the signal goes through `kill(1)`.
#[cfg(unix)]
async fn kill_group_if_leader(pid: u32) -> bool {
    if process_group_of(pid).await != Some(pid) {
        return false;
    }
    let mut command = tokio::process::Command::new("kill");
    command
        .args(["-s", "KILL", "--", &format!("-{pid}")])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(GROUP_KILL_TIMEOUT, command.status()).await {
        Ok(Ok(status)) => status.success(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "could not run kill(1); killing the leader only");
            false
        }
        Err(_elapsed) => false,
    }
}

#[cfg(not(unix))]
async fn kill_group_if_leader(_pid: u32) -> bool {
    false
}

/// The process group of `pid`, read from procfs; `None` where there is no procfs.
#[cfg(unix)]
async fn process_group_of(pid: u32) -> Option<u32> {
    let stat = tokio::fs::read_to_string(format!("/proc/{pid}/stat"))
        .await
        .ok()?;
    parse_process_group(&stat)
}

/// `/proc/PID/stat` is `pid (comm) state ppid pgrp ...`; `comm` may hold spaces and parentheses,
/// so fields are counted after the last `)`.
#[cfg_attr(not(unix), allow(dead_code))]
fn parse_process_group(stat: &str) -> Option<u32> {
    let (_, after_comm) = stat.rsplit_once(')')?;
    after_comm.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use crate::tools::test_support::TestDir;

    /// Records its close in a shared log; optionally fails, hangs or panics.
    struct Probe {
        name: &'static str,
        log: Arc<Mutex<Vec<&'static str>>>,
        behaviour: Behaviour,
    }

    #[derive(Clone, Copy)]
    enum Behaviour {
        Ok,
        Fail,
        Hang,
        Panic,
    }

    impl OwnedResource for Probe {
        fn kind(&self) -> &'static str {
            self.name
        }

        fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), String>> {
            async move {
                self.log.lock().expect("log lock").push(self.name);
                match self.behaviour {
                    Behaviour::Ok => Ok(()),
                    Behaviour::Fail => Err(format!("{} broke", self.name)),
                    Behaviour::Hang => futures::future::pending().await,
                    Behaviour::Panic => panic!("{} panicked", self.name),
                }
            }
            .boxed()
        }

        fn abandon(self: Box<Self>) {
            self.log.lock().expect("log lock").push("abandoned");
        }
    }

    fn probe(
        name: &'static str,
        log: &Arc<Mutex<Vec<&'static str>>>,
        behaviour: Behaviour,
    ) -> Box<Probe> {
        Box::new(Probe {
            name,
            log: log.clone(),
            behaviour,
        })
    }

    fn balanced(counts: ScopeCounts) {
        assert_eq!(counts.open_scopes(), 0, "{counts:?}");
        assert_eq!(counts.open_resources(), 0, "{counts:?}");
    }

    #[tokio::test]
    async fn closes_in_reverse_order() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t1");
        for name in ["first", "second", "third"] {
            scope.own(probe(name, &log, Behaviour::Ok));
        }
        scope.close().await.expect("all close");
        assert_eq!(*log.lock().expect("log"), ["third", "second", "first"]);
        let counts = stats.snapshot();
        assert_eq!(counts.resources_opened, 3);
        assert_eq!(counts.close_failures, 0);
        balanced(counts);
    }

    #[tokio::test]
    async fn failures_do_not_stop_other_closes_and_are_all_reported() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t2")
            .with_close_timeout(Duration::from_millis(50));
        scope.own(probe("a", &log, Behaviour::Ok));
        scope.own(probe("b", &log, Behaviour::Fail));
        scope.own(probe("c", &log, Behaviour::Hang));
        scope.own(probe("d", &log, Behaviour::Panic));
        scope.own(probe("e", &log, Behaviour::Fail));
        let errors = scope.close().await.expect_err("failures reported");
        assert_eq!(*log.lock().expect("log"), ["e", "d", "c", "b", "a"]);
        let kinds: Vec<&str> = errors.failures.iter().map(|(kind, _)| *kind).collect();
        assert_eq!(kinds, ["e", "d", "c", "b"]);
        let text = errors.to_string();
        assert!(text.starts_with("4 resource(s) failed to close"), "{text}");
        assert!(
            text.contains("e broke") && text.contains("b broke"),
            "{text}"
        );
        assert!(
            text.contains("panicked") && text.contains("timed out"),
            "{text}"
        );
        let counts = stats.snapshot();
        assert_eq!(counts.close_failures, 4);
        balanced(counts);
    }

    #[tokio::test]
    async fn second_close_is_a_no_op() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t3");
        scope.own(probe("only", &log, Behaviour::Fail));
        assert!(scope.close().await.is_err());
        assert!(scope.close().await.is_ok());
        assert!(scope.is_closed());
        drop(scope);
        assert_eq!(*log.lock().expect("log"), ["only"]);
        let counts = stats.snapshot();
        assert_eq!(counts.scopes_closed, 1);
        assert_eq!(counts.resources_closed, 1);
        balanced(counts);
    }

    #[tokio::test]
    async fn scratch_dir_is_reused_and_removed_on_close() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let mut scope = TaskScope::new(stats.clone(), dir.path().join("scratch"), "task/../x");
        let scratch = scope.scratch_dir().await.expect("created");
        assert!(scratch.is_dir());
        assert!(scratch.starts_with(dir.path().join("scratch")));
        assert_eq!(scope.scratch_dir().await.expect("reused"), scratch);
        std::fs::write(scratch.join("file"), b"data").expect("write");
        std::fs::create_dir(scratch.join("nested")).expect("mkdir");
        scope.close().await.expect("closes");
        assert!(!scratch.exists());
        assert!(matches!(scope.scratch_dir().await, Err(ScopeError::Closed)));
        let counts = stats.snapshot();
        assert_eq!(counts.resources_opened, 1);
        balanced(counts);
    }

    #[tokio::test]
    async fn drop_without_close_is_a_safety_net() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t5");
        let scratch = scope.scratch_dir().await.expect("created");
        scope.own(probe("p", &log, Behaviour::Ok));
        drop(scope);
        assert!(!scratch.exists());
        assert_eq!(*log.lock().expect("log"), ["abandoned"]);
        let counts = stats.snapshot();
        assert_eq!(counts.scopes_opened, 1);
        assert_eq!(counts.resources_opened, 2);
        balanced(counts);
    }

    #[tokio::test]
    async fn owning_after_close_releases_at_once() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t6");
        scope.close().await.expect("empty close");
        scope.own(probe("late", &log, Behaviour::Ok));
        assert_eq!(*log.lock().expect("log"), ["abandoned"]);
        assert_eq!(scope.owned(), 0);
        balanced(stats.snapshot());
    }

    #[test]
    fn process_group_is_read_after_the_command_name() {
        let stat = "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560";
        assert_eq!(parse_process_group(stat), Some(4242));
        assert_eq!(parse_process_group("17 (sh) R 3 9 9"), Some(9));
        assert_eq!(parse_process_group("garbage"), None);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn closing_a_group_leader_kills_its_whole_group() {
        use tokio::io::AsyncBufReadExt;

        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t7");
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        tokio::io::BufReader::new(stdout)
            .read_line(&mut line)
            .await
            .expect("grandchild pid");
        let grandchild: u32 = line.trim().parse().expect("pid");
        scope.own_child(child);
        scope.close().await.expect("child closes");
        // The grandchild is gone, or a zombie waiting for init to reap it.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim().to_owned()));
            match state {
                None => break,
                Some(rest) if rest.starts_with('Z') => break,
                Some(_) if std::time::Instant::now() > deadline => panic!("grandchild alive"),
                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        balanced(stats.snapshot());
    }

    #[tokio::test]
    async fn closing_a_plain_child_kills_it() {
        let dir = TestDir::new();
        let stats = Arc::new(ScopeStats::new());
        let mut scope = TaskScope::new(stats.clone(), dir.path().to_owned(), "t8");
        let child = tokio::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        scope.own_child(child);
        let started = std::time::Instant::now();
        scope.close().await.expect("child closes");
        assert!(started.elapsed() < Duration::from_secs(3));
        balanced(stats.snapshot());
    }
}
