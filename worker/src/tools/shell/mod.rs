//! The `shell` tool: runs a bash command in the session's workspace, sandboxed as far as the
//! platform allows, and reports its exit status and output. Off unless `shell` is in the worker's
//! tool list.
//!
//! A call checks the session's files out ([`CommandWorkspace::check_out`]), runs
//! `bash -c <command>` there (`sandbox` builds the command line, `process` runs it as a process
//! group, `capture` keeps its output), checks the files back in, and answers with one status
//! line, stdout and stderr, and the check-in summary.
//!
//! Invariants:
//! - a command ends with its call: its whole process group is killed right after bash exits,
//!   when its time is up, and when the call is cancelled, panics or the worker shuts down (the
//!   task's scope owns whatever is still running then); where a process namespace is available,
//!   every process the command started dies with it, whatever process group it moved to;
//! - what the command did is output, not a tool failure: a non-zero exit status, a signal and a
//!   timeout are reported in the first line of the output (a timeout is not a `TimedOut`
//!   failure: that would lose the output and be retried, running the command again);
//! - the output is at most the configured cap plus the status line, the section headers, one
//!   cut note per stream and the summary, which the registry's output cap always has room for;
//! - the wall time of a call is the call's `timeout_s`, capped by the configured maximum and
//!   kept inside the worker's tool timeout, so the command is killed (and its output returned)
//!   before the call itself times out;
//! - the command sees only the allowlisted environment (`sandbox::environment`), never the
//!   worker's own settings or secrets.

mod capture;
pub mod config;
mod fence;
mod process;
pub mod sandbox;

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use skein_common::protocol::ToolEffects;

pub use config::{ShellConfig, Unisolated};
pub use sandbox::Isolation;

use self::capture::split_budget;
use self::process::{Ended, Finished};
use self::sandbox::Limits;
use super::{Tool, ToolContext, ToolError};
use crate::workspace::CommandWorkspace;

/// Longest command line accepted (Linux refuses single arguments over 128 KiB).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// What the `shell` tool needs from the worker: its settings, where session files are checked
/// out, the isolation probed at start, and the worker's tool timeout.
#[derive(Clone)]
pub struct ShellSetup {
    config: ShellConfig,
    workspace: Arc<dyn CommandWorkspace>,
    isolation: Isolation,
    /// The paths a fenced command may read, found at start.
    readable: fence::ReadOnlyPaths,
    tool_timeout: Duration,
}

impl std::fmt::Debug for ShellSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellSetup")
            .field("config", &self.config)
            .field("isolation", &self.isolation)
            .field("tool_timeout", &self.tool_timeout)
            .finish_non_exhaustive()
    }
}

impl ShellSetup {
    /// The setup of a worker whose tool list has `shell`, else `None` (nothing is probed then).
    pub async fn configured(
        cfg: &crate::config::Config,
        workspace: Arc<dyn CommandWorkspace>,
    ) -> Option<Self> {
        if !cfg.tools().any(|tool| tool == Shell::NAME) {
            return None;
        }
        Some(Self::start(cfg.shell.clone(), workspace, cfg.process.tool_timeout).await)
    }

    /// Probes the isolation this platform allows, logs it once, and returns the setup.
    pub async fn start(
        config: ShellConfig,
        workspace: Arc<dyn CommandWorkspace>,
        tool_timeout: Duration,
    ) -> Self {
        let isolation = Isolation::probe(config.network).await;
        log_isolation(&config, &isolation);
        Self::with_isolation(config, workspace, isolation, tool_timeout)
    }

    /// A setup with `isolation` as given (not probed).
    pub fn with_isolation(
        config: ShellConfig,
        workspace: Arc<dyn CommandWorkspace>,
        isolation: Isolation,
        tool_timeout: Duration,
    ) -> Self {
        let readable = fence::ReadOnlyPaths::system_and(&config.read_paths);
        Self {
            config,
            workspace,
            isolation,
            readable,
            tool_timeout,
        }
    }

    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// The longest a command may run: the configured maximum, kept inside the tool timeout
    /// with a margin for checking in and answering.
    fn max_timeout(&self) -> Duration {
        self.config.max_timeout.min(with_margin(self.tool_timeout))
    }
}

/// The part of a call's time `limit` a command may use: the rest is kept for checking in and
/// answering.
fn with_margin(limit: Duration) -> Duration {
    let margin = (limit / 5).clamp(Duration::from_millis(100), Duration::from_secs(5));
    limit.saturating_sub(margin).max(Duration::from_millis(100))
}

fn log_isolation(config: &ShellConfig, isolation: &Isolation) {
    tracing::info!(
        filesystem_fenced = isolation.filesystem_fenced,
        network_isolated = isolation.network_isolated,
        processes_isolated = isolation.processes_isolated,
        user_namespace = isolation.user_namespace,
        parent_death_signal = isolation.parent_death_signal,
        "shell sandbox probed"
    );
    if !config.network && !isolation.network_isolated {
        tracing::warn!(
            "shell commands will have network access: no unprivileged network namespace works \
             here (`unshare --user --net` failed); set {}=true to allow it explicitly",
            config::ENV_SHELL_NETWORK
        );
    }
    if !isolation.isolates_files() {
        match config.unisolated {
            Unisolated::Allow => tracing::warn!(
                "shell commands run without isolation: neither Landlock nor user namespaces work \
                 here, and {}=allow lets them read and write every file of the worker's user",
                config::ENV_SHELL_UNISOLATED
            ),
            Unisolated::Refuse => tracing::warn!(
                "the shell tool will refuse every command: neither Landlock nor user namespaces \
                 work here ({}=allow runs them unisolated)",
                config::ENV_SHELL_UNISOLATED
            ),
        }
    } else if !isolation.filesystem_fenced {
        tracing::warn!(
            "shell commands are not held to their files: Landlock is not available here, so a \
             command can read what the worker's user can"
        );
    }
    if !isolation.processes_isolated {
        tracing::warn!(
            "shell commands run without a process namespace: a process that leaves the command's \
             process group (setsid) can outlive the call"
        );
    }
}

/// Arguments of `shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    /// The bash command line to run; the current directory is the session's workspace.
    pub command: String,
    /// Seconds the command may run (at most the worker's limit, which is also the default).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// Runs a bash command in the session's workspace.
#[derive(Debug, Clone)]
pub struct Shell {
    setup: ShellSetup,
}

impl Shell {
    pub fn new(setup: ShellSetup) -> Self {
        Self { setup }
    }

    fn limits(&self) -> Limits {
        Limits::from_config(&self.setup.config)
    }

    fn timeout(&self, asked: Option<u64>) -> Result<Duration, ToolError> {
        let max = self.setup.max_timeout();
        match asked {
            None => Ok(max),
            Some(0) => Err(ToolError::InvalidArguments(
                "shell: timeout_s must be at least 1".into(),
            )),
            Some(seconds) => Ok(Duration::from_secs(seconds).min(max)),
        }
    }

    /// Refuses commands where nothing keeps them from the worker's files, unless the operator
    /// allowed that (then every call says so in the log).
    fn check_isolated(&self) -> Result<(), ToolError> {
        if self.setup.isolation.isolates_files() {
            return Ok(());
        }
        match self.setup.config.unisolated {
            Unisolated::Allow => {
                tracing::warn!(
                    "running a shell command without isolation: it can read and write every file                      of the worker's user ({}=allow)",
                    config::ENV_SHELL_UNISOLATED
                );
                Ok(())
            }
            Unisolated::Refuse => Err(ToolError::Unavailable(format!(
                "shell: this worker cannot isolate commands (neither Landlock nor user namespaces                  work here), so it runs none; its operator can allow them anyway with {}=allow",
                config::ENV_SHELL_UNISOLATED
            ))),
        }
    }

    /// The call's file fence, where Landlock works: its checkout and scratch directory
    /// writable, the system's paths readable.
    fn fence(
        &self,
        checkout: &std::path::Path,
        home: &std::path::Path,
    ) -> Result<Option<landlock::RulesetCreated>, ToolError> {
        if !self.setup.isolation.filesystem_fenced {
            return Ok(None);
        }
        fence::ruleset(&[checkout, home], &self.setup.readable)
            .map(Some)
            .map_err(|e| {
                ToolError::Unavailable(format!(
                    "shell: the command's file fence could not be built: {e}"
                ))
            })
    }
}

fn check_command(command: &str) -> Result<(), ToolError> {
    if command.trim().is_empty() {
        return Err(ToolError::InvalidArguments(
            "shell: command is empty".into(),
        ));
    }
    if command.contains('\0') {
        return Err(ToolError::InvalidArguments(
            "shell: command contains a NUL byte".into(),
        ));
    }
    if command.len() > MAX_COMMAND_BYTES {
        return Err(ToolError::TooLarge(format!(
            "shell: command is {} bytes, at most {MAX_COMMAND_BYTES} are accepted; write a \
             script to a file and run that instead",
            command.len()
        )));
    }
    Ok(())
}

impl Tool for Shell {
    const NAME: &'static str = "shell";
    type Args = ShellArgs;

    fn description(&self) -> String {
        let limits = self.limits();
        format!(
            "Run a bash command in the session's workspace (the current directory) and get its \
             exit status, stdout and stderr. stdin is empty; HOME and TMPDIR are a scratch \
             directory removed after the call. The command and every process it starts, \
             background ones included, are killed when it ends or after {} (timeout_s may ask \
             for less). Each process may use {} s of CPU and {} of address space, {} processes \
             at most; {}. Output over {} bytes is cut in the middle. Write scripts to files \
             rather than passing long commands.",
            humantime::format_duration(self.setup.max_timeout()),
            limits.cpu_seconds,
            skein_common::workspace::human_size(limits.memory_bytes),
            limits.max_processes,
            self.setup.isolation.describe_network(),
            self.setup.config.max_output,
        )
    }

    /// Commands of one session share its workspace: two at once could trip over each other.
    fn concurrency_safe(&self) -> bool {
        false
    }

    /// A command can change or destroy anything the worker's user can reach.
    fn effects(&self) -> ToolEffects {
        ToolEffects::DESTRUCTIVE
    }

    async fn call(&self, args: ShellArgs, ctx: ToolContext<'_>) -> Result<String, ToolError> {
        check_command(&args.command)?;
        self.check_isolated()?;
        let started = std::time::Instant::now();
        // The call's own limit (its deadline, the worker's tool timeout) bounds the command too,
        // so its output and changes come back instead of being cut off with the call.
        let budget = with_margin(ctx.time_limit);
        let timeout = self.timeout(args.timeout_s)?.min(budget);
        let workspace = &self.setup.workspace;
        let checked_out = workspace.check_out(ctx.origin, ctx.scope).await?;
        let left = budget.saturating_sub(started.elapsed());
        // In tenths of a second, so the answer names a readable limit.
        let timeout = Duration::from_millis(timeout.min(left).as_millis() as u64 / 100 * 100)
            .max(Duration::from_millis(100));
        let home = home_dir(ctx.scope).await?;
        let call = sandbox::CallNames {
            idempotency_key: ctx.idempotency_key,
            task_id: &ctx.origin.task_id,
            session: &ctx.origin.session,
        };
        let env = sandbox::environment(&home, &self.setup.config.env, call);
        let fence = match self.fence(&checked_out.dir, &home) {
            Ok(fence) => fence,
            Err(e) => {
                if let Err(unsaved) = workspace.check_in(ctx.origin, checked_out).await {
                    tracing::warn!(error = %unsaved, "a checkout whose command never ran was not checked in");
                }
                return Err(e);
            }
        };
        let command = sandbox::command(
            &self.setup.isolation,
            &self.limits(),
            &args.command,
            &checked_out.dir,
            &env,
        );
        let cap = self.setup.config.max_output;
        let ran = process::run(command, fence, timeout, cap, ctx.scope).await;
        // Checked in whatever happened: a command that timed out may still have changed files.
        let checked_in = workspace.check_in(ctx.origin, checked_out).await;
        let finished = ran?;
        let status = status_line(&finished.ended, timeout, &self.limits());
        let summary = checked_in.map_err(|e| not_saved(e, &status))?;
        Ok(render(&finished, &status, cap, &summary))
    }
}

/// HOME and TMPDIR of a command: a directory of its own in the call's scratch directory (apart
/// from a checked-out workspace there), removed with the scope.
async fn home_dir(scope: &mut crate::scope::TaskScope) -> Result<std::path::PathBuf, ToolError> {
    let scratch = scope
        .scratch_dir()
        .await
        .map_err(|e| ToolError::Failed(format!("no scratch directory for the command: {e}")))?;
    let home = scratch.join("home");
    tokio::fs::create_dir_all(&home)
        .await
        .map_err(|e| ToolError::Failed(format!("could not create the command's home: {e}")))?;
    Ok(home)
}

/// The first line of the answer: how the command ended.
fn status_line(ended: &Ended, timeout: Duration, limits: &Limits) -> String {
    use std::os::unix::process::ExitStatusExt;

    let status = match ended {
        Ended::TimedOut => {
            return format!(
                "timed out after {}: the command and every process it started were killed",
                humantime::format_duration(timeout)
            )
        }
        Ended::Exited(status) => status,
    };
    if let Some(code) = status.code() {
        let hint = match code {
            126 => " (found but not executable)".to_owned(),
            127 => " (command not found)".to_owned(),
            129..=192 => format!(
                " (128 + {}: a process was killed by {})",
                code - 128,
                describe_signal(code - 128, limits)
            ),
            _ => String::new(),
        };
        format!("exit status: {code}{hint}")
    } else if let Some(signal) = status.signal() {
        format!("killed by {}", describe_signal(signal, limits))
    } else {
        format!("ended: {status}")
    }
}

/// `SIGXCPU (the CPU limit of 60 s per process)`, `SIGKILL`, or `signal 77`.
fn describe_signal(number: i32, limits: &Limits) -> String {
    use nix::sys::signal::Signal;
    match Signal::try_from(number) {
        Ok(Signal::SIGXCPU) => format!(
            "SIGXCPU (the CPU limit of {} s per process)",
            limits.cpu_seconds
        ),
        Ok(Signal::SIGKILL) => "SIGKILL (possibly out of memory)".to_owned(),
        Ok(signal) => signal.as_str().to_owned(),
        Err(_) => format!("signal {number}"),
    }
}

/// The answer: status line, stdout and stderr within `cap` bytes together, notes, summary.
fn render(finished: &Finished, status: &str, cap: usize, summary: &str) -> String {
    let mut text = status.to_owned();
    let (out, err) = (&finished.stdout, &finished.stderr);
    let (out_budget, err_budget) = split_budget(cap, out.total(), err.total());
    if out.total() == 0 && err.total() == 0 {
        text.push_str("\n(no output)");
    }
    for (name, capture, budget) in [("stdout", out, out_budget), ("stderr", err, err_budget)] {
        if capture.total() > 0 {
            let body = capture.render(budget);
            text.push_str(&format!(
                "\n--- {name} ---\n{}",
                body.trim_end_matches('\n')
            ));
        }
    }
    if !finished.drained {
        text.push_str(
            "\n[output may be incomplete: a process outside the command's process group kept \
             its output open]",
        );
    }
    // One line by the workspace's contract (`workspace: 2 written, 0 removed`), set apart like
    // a section header so it is not read as the command's output.
    let summary = summary.trim();
    if !summary.is_empty() {
        text.push_str(&format!("\n--- {summary} ---"));
    }
    text
}

/// A failed check-in, keeping its kind, saying the command did run.
fn not_saved(error: ToolError, status: &str) -> ToolError {
    let say = |message: String| {
        format!(
            "the command ran ({status}) but its workspace changes could not be saved: {message}"
        )
    };
    match error {
        ToolError::Unavailable(m) => ToolError::Unavailable(say(m)),
        ToolError::Denied(m) => ToolError::Denied(say(m)),
        ToolError::TooLarge(m) => ToolError::TooLarge(say(m)),
        ToolError::TimedOut => ToolError::Unavailable(say("the check-in timed out".into())),
        ToolError::InvalidArguments(m) | ToolError::NotFound(m) | ToolError::Failed(m) => {
            ToolError::Failed(say(m))
        }
    }
}

#[cfg(test)]
mod tests;
