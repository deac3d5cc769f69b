//! Running one command as a process group until it exits or its time is up, capturing its
//! output, and making sure no process of the group outlives the call.
//!
//! Invariants:
//! - the command leads its own process group (the caller builds it with `process_group(0)`);
//! - the group is sent SIGKILL right after its leader exits (background jobs left behind), when
//!   the time is up, and when the run is dropped before either (cancellation, a panic, the worker
//!   shutting down); in that last case the leader is handed to the task's scope, whose close
//!   kills its group again and reaps it;
//! - output is read while the command runs, so a chatty command never blocks on a full pipe;
//!   after the leader exits, reading goes on only until the pipes close or [`DRAIN_TIMEOUT`]
//!   passes (a process outside the group may hold them open).
//!
//! Signals go through `nix`, synchronously, so killing needs no `.await` and happens in `Drop`.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::capture::Capture;
pub(super) use crate::scope::kill_group;
use crate::scope::TaskScope;
use crate::tools::ToolError;

/// How long output is still read after the command ended.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a killed leader may take to exit before it is left to the scope.
const KILLED_EXIT_TIMEOUT: Duration = Duration::from_secs(3);

/// How a command ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Its leader exited (or was killed by a signal not sent by the worker).
    Exited(ExitStatus),
    /// Its time was up; the group was killed.
    TimedOut,
}

/// What a command did.
#[derive(Debug)]
pub(super) struct Finished {
    pub ended: Ended,
    pub stdout: Capture,
    pub stderr: Capture,
    /// False when the pipes were still open [`DRAIN_TIMEOUT`] after the end.
    pub drained: bool,
}

/// A spawned group leader: killed with its group if dropped before it was reaped.
struct RunningGroup<'s> {
    child: Option<Child>,
    pgid: Option<u32>,
    scope: &'s mut TaskScope,
}

impl RunningGroup<'_> {
    fn child(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("the child is taken only by `reaped` and by drop")
    }

    /// The leader has been reaped: kill what is left of its group; nothing left to hand over.
    fn reaped(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            kill_group(pgid);
        }
        self.child = None;
    }
}

impl Drop for RunningGroup<'_> {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            kill_group(pgid);
        }
        if let Some(child) = self.child.take() {
            // Not reaped: the scope reaps it (and kills its group once more) when it closes.
            self.scope.own_child(child);
        }
    }
}

/// Spawns `command` (held by `fence` when given) and runs it for at most `timeout`, keeping `keep` bytes of the head and the
/// tail of stdout and of stderr. See the module invariants.
pub(super) async fn run(
    mut command: Command,
    fence: Option<landlock::RulesetCreated>,
    timeout: Duration,
    keep: usize,
    scope: &mut TaskScope,
) -> Result<Finished, ToolError> {
    let not_started = |e| ToolError::Unavailable(format!("could not start bash: {e}"));
    // Held until the group is gone (see `FenceHold`).
    let (mut child, _hold) = match fence {
        Some(ruleset) => {
            let (child, hold) = super::fence::spawn(command, ruleset)
                .await
                .map_err(not_started)?;
            (child, Some(hold))
        }
        None => (command.spawn().map_err(not_started)?, None),
    };
    let pipes = (child.stdout.take(), child.stderr.take());
    let pgid = child.id();
    let mut group = RunningGroup {
        child: Some(child),
        pgid,
        scope,
    };
    let (Some(stdout), Some(stderr)) = pipes else {
        // Dropping the group kills it.
        return Err(ToolError::Failed(
            "the command's output pipes are missing".into(),
        ));
    };
    let mut out = Capture::new(keep);
    let mut err = Capture::new(keep);
    let (ended, drained) = {
        let reading = async {
            // A read error ends that stream's capture; what was read is kept.
            let (_, _) = tokio::join!(out.read_from(stdout), err.read_from(stderr));
        };
        tokio::pin!(reading);
        let mut read_all = false;
        let ended = {
            let waiting = wait_or_time_out(&mut group, timeout);
            tokio::pin!(waiting);
            loop {
                tokio::select! {
                    ended = &mut waiting => break ended,
                    () = &mut reading, if !read_all => read_all = true,
                }
            }
        };
        let drained = read_all
            || tokio::time::timeout(DRAIN_TIMEOUT, &mut reading)
                .await
                .is_ok();
        (ended, drained)
    };
    drop(group);
    Ok(Finished {
        ended: ended?,
        stdout: out,
        stderr: err,
        drained,
    })
}

/// Waits for the leader; when `timeout` passes first, kills the group and waits (bounded) for
/// the leader to go. The group is killed in either case.
async fn wait_or_time_out(
    group: &mut RunningGroup<'_>,
    timeout: Duration,
) -> Result<Ended, ToolError> {
    tokio::select! {
        status = group.child().wait() => {
            match status {
                Ok(status) => {
                    group.reaped();
                    Ok(Ended::Exited(status))
                }
                // Dropping the group kills it and hands the leader to the scope.
                Err(e) => Err(ToolError::Failed(format!("could not wait for the command: {e}"))),
            }
        }
        () = tokio::time::sleep(timeout) => {
            if let Some(pgid) = group.pgid {
                kill_group(pgid);
            }
            if let Ok(Ok(_)) =
                tokio::time::timeout(KILLED_EXIT_TIMEOUT, group.child().wait()).await
            {
                group.reaped();
            }
            Ok(Ended::TimedOut)
        }
    }
}
