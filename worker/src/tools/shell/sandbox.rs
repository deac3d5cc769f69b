//! How a command is started: which isolation this platform allows (probed once, when the worker
//! starts), the argument vector that applies it, the resource limits, and the environment.
//!
//! The command line, outermost first:
//! 1. `setpriv --pdeathsig KILL --`, where it works: if the worker dies, the command's leader gets
//!    SIGKILL (with a process namespace that takes every process of the command with it);
//! 2. `unshare --user --map-root-user [--net] [--pid --fork --kill-child --mount-proc] --`, the
//!    strongest combination that works here: an empty network namespace unless the network is
//!    allowed, and a process namespace whose init is the wrapper below, so every process the
//!    command starts dies when it ends (setsid and double forks included) and `/proc` shows only
//!    the command's own processes;
//! 3. `bash -c WRAPPER`: lowers RLIMIT_CPU, RLIMIT_AS and RLIMIT_NPROC (hard and soft, never
//!    raising a lower limit the worker already has; the CPU hard limit is one second above the
//!    soft one, so SIGXCPU says why before SIGKILL), then runs the model's command with
//!    `bash -c` as its child and exits with its status. The model's command is never pid 1, so
//!    it sees normal signal behaviour.
//!
//! Where Landlock works, the command is started by a thread that enforces the call's ruleset
//! (`fence`), so all of these and everything the command starts are held to its files. A process
//! under Landlock may not mount, so a fenced command gets no process namespace (it would need a
//! /proc of its own): its group is still killed with the call.
//!
//! Invariants: the environment of a command is built from nothing: PATH, HOME and TMPDIR (a
//! directory in the call's scratch directory), `SKEIN_IDEMPOTENCY_KEY`, `SKEIN_TASK_ID` and
//! `SKEIN_SESSION` naming the call, LANG, LC_ALL, TZ and TERM when the worker has them, plus the
//! configured names; nothing else of the worker's environment is passed
//! (validation refuses `SKEIN_*` names). The model's command is passed as one argument, never
//! spliced into a script.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::config::ShellConfig;

/// Variables passed through from the worker when it has them.
pub const PASSED_ENV: [&str; 4] = ["LANG", "LC_ALL", "TZ", "TERM"];

/// PATH of commands when the worker has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Bound on one probe command.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Applies the limits given as `$2 $3 $4` (CPU seconds, address space in KiB, processes), then
/// runs `$1` with bash and exits with its status. A limit already lower than asked is kept. The
/// CPU limit's hard value is one second above the soft one, so a process gets SIGXCPU (which
/// says why) before the kernel's SIGKILL.
const WRAPPER: &str = r#"fail() { echo "the worker could not apply its limit: ulimit $*" >&2; exit 125; }
lower() {
  had=$(ulimit -H "$1") || fail "$@"
  hard=$had
  if [ "$had" = unlimited ] || [ "$had" -gt "$3" ]; then hard=$3; fi
  if [ "$hard" -gt "$2" ]; then soft=$2; else soft=$hard; fi
  ulimit -S "$1" "$soft" || fail "$@"
  if [ "$hard" != "$had" ]; then ulimit -H "$1" "$hard" || fail "$@"; fi
}
lower -t "$2" "$(($2 + 1))" && lower -v "$3" "$3" && lower -u "$4" "$4" || exit 125
bash -c "$1"
exit $?"#;

/// Name the wrapper runs under (its `$0`), seen in process listings.
const WRAPPER_NAME: &str = "shell-sandbox";

/// The isolation commands get on this worker, decided once by [`Isolation::probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// `setpriv --pdeathsig KILL` works.
    pub parent_death_signal: bool,
    /// Commands run in an empty network namespace.
    pub network_isolated: bool,
    /// Commands run in their own process namespace (with their own `/proc`).
    pub processes_isolated: bool,
    /// Commands run in a user namespace (needed for the other two without privileges).
    pub user_namespace: bool,
    /// Landlock holds commands to their checkout, their scratch directory and the system's
    /// read-only paths (see `fence`).
    pub filesystem_fenced: bool,
}

impl Isolation {
    /// No isolation at all: a plain `bash` in its own process group.
    pub fn none() -> Self {
        Self {
            parent_death_signal: false,
            network_isolated: false,
            processes_isolated: false,
            user_namespace: false,
            filesystem_fenced: false,
        }
    }

    /// Whether a command is kept from the worker's files: by Landlock, or at least by a user
    /// namespace of its own. Without either, the tool refuses commands unless allowed.
    pub fn isolates_files(&self) -> bool {
        self.filesystem_fenced || self.user_namespace
    }

    /// Finds the strongest isolation that works here: tries each combination with `true`,
    /// strongest first. `network_allowed` skips the network namespace.
    pub async fn probe(network_allowed: bool) -> Self {
        let filesystem_fenced = super::fence::available();
        let parent_death_signal = runs(&["setpriv", "--pdeathsig", "KILL", "--", "true"]).await;
        // A process namespace needs its own /proc, which needs a mount, which Landlock forbids:
        // a fenced command keeps the system's /proc and no process namespace (through that
        // /proc its process ids would be wrong).
        let mut candidates = Vec::new();
        if !network_allowed {
            if !filesystem_fenced {
                candidates.push((true, true));
            }
            candidates.push((true, false));
        }
        if !filesystem_fenced {
            candidates.push((false, true));
        }
        for (network_isolated, processes_isolated) in candidates {
            let isolation = Self {
                parent_death_signal: false,
                network_isolated,
                processes_isolated,
                user_namespace: true,
                filesystem_fenced,
            };
            let mut argv = isolation.prefix();
            argv.push("true".into());
            if runs_as(&isolation, &argv).await {
                return Self {
                    parent_death_signal,
                    ..isolation
                };
            }
        }
        Self {
            parent_death_signal,
            filesystem_fenced,
            ..Self::none()
        }
    }

    /// What the model is told about the network.
    pub fn describe_network(&self) -> &'static str {
        if self.network_isolated {
            "no network access"
        } else {
            "network access"
        }
    }

    /// The isolating programs before `bash`, outermost first.
    fn prefix(&self) -> Vec<String> {
        let mut argv: Vec<String> = Vec::new();
        if self.parent_death_signal {
            argv.extend(["setpriv", "--pdeathsig", "KILL", "--"].map(String::from));
        }
        if self.user_namespace {
            argv.extend(["unshare", "--user", "--map-root-user"].map(String::from));
            if self.network_isolated {
                argv.push("--net".into());
            }
            if self.processes_isolated {
                argv.extend(["--pid", "--fork", "--kill-child", "--mount-proc"].map(String::from));
            }
            argv.push("--".into());
        }
        argv
    }
}

/// Whether `argv` runs and exits 0 within [`PROBE_TIMEOUT`] as a command of `isolation` would:
/// fenced (with a scratch directory of its own) when it fences.
async fn runs_as(isolation: &Isolation, argv: &[String]) -> bool {
    if !isolation.filesystem_fenced {
        return runs(argv).await;
    }
    let scratch =
        std::env::temp_dir().join(format!("skein-probe-{}", uuid::Uuid::new_v4().simple()));
    if std::fs::create_dir_all(&scratch).is_err() {
        return false;
    }
    let fenced = super::fence::ruleset(&[&scratch], &super::fence::ReadOnlyPaths::system_and(&[]));
    let ran = match fenced {
        Ok(ruleset) => run_probe(argv, Some(ruleset)).await,
        Err(_) => false,
    };
    let _ = std::fs::remove_dir_all(&scratch);
    ran
}

/// Whether `argv` runs and exits 0 within [`PROBE_TIMEOUT`].
async fn runs<S: AsRef<std::ffi::OsStr>>(argv: &[S]) -> bool {
    run_probe(argv, None).await
}

async fn run_probe<S: AsRef<std::ffi::OsStr>>(
    argv: &[S],
    fence: Option<landlock::RulesetCreated>,
) -> bool {
    let Some((program, args)) = argv.split_first() else {
        return false;
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let ran = async {
        let (mut child, _hold) = match fence {
            Some(ruleset) => {
                let (child, hold) = super::fence::spawn(command, ruleset).await.ok()?;
                (child, Some(hold))
            }
            None => (command.spawn().ok()?, None),
        };
        child.wait().await.ok()
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, ran).await,
        Ok(Some(status)) if status.success()
    )
}

/// The limits applied to every process of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub cpu_seconds: u64,
    pub memory_bytes: u64,
    pub max_processes: u64,
}

impl Limits {
    pub fn from_config(cfg: &ShellConfig) -> Self {
        Self {
            cpu_seconds: cfg.cpu_seconds,
            memory_bytes: cfg.memory_bytes,
            max_processes: cfg.max_processes,
        }
    }

    /// RLIMIT_AS in the KiB `ulimit -v` takes (at least 1).
    fn memory_kib(&self) -> u64 {
        (self.memory_bytes / 1024).max(1)
    }
}

/// The environment of a command: see the module invariants.
pub fn environment(home: &Path, extra: &[String], call: CallNames<'_>) -> Vec<(String, OsString)> {
    let path = std::env::var_os("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into());
    let mut env = vec![
        ("PATH".to_owned(), path),
        ("HOME".to_owned(), home.as_os_str().to_owned()),
        ("TMPDIR".to_owned(), home.as_os_str().to_owned()),
        (ENV_IDEMPOTENCY_KEY.to_owned(), call.idempotency_key.into()),
        (ENV_TASK_ID.to_owned(), call.task_id.into()),
        (ENV_SESSION.to_owned(), call.session.into()),
    ];
    for name in PASSED_ENV
        .iter()
        .copied()
        .chain(extra.iter().map(|s| s.as_str()))
    {
        if env.iter().any(|(known, _)| known == name) {
            continue;
        }
        if let Some(value) = std::env::var_os(name) {
            env.push((name.to_owned(), value));
        }
    }
    env
}

/// What a command is told of the call it runs for, so a script can make its effects idempotent.
#[derive(Debug, Clone, Copy)]
pub struct CallNames<'a> {
    /// The same for every run of the call (`SKEIN_IDEMPOTENCY_KEY`).
    pub idempotency_key: &'a str,
    pub task_id: &'a str,
    pub session: &'a str,
}

/// The variables naming the call in a command's environment.
pub const ENV_IDEMPOTENCY_KEY: &str = "SKEIN_IDEMPOTENCY_KEY";
pub const ENV_TASK_ID: &str = "SKEIN_TASK_ID";
pub const ENV_SESSION: &str = "SKEIN_SESSION";

/// The command that runs `script` in `dir` under `isolation` and `limits`, with only `env`, in a
/// process group of its own, stdin from /dev/null and stdout and stderr piped.
pub fn command(
    isolation: &Isolation,
    limits: &Limits,
    script: &str,
    dir: &Path,
    env: &[(String, OsString)],
) -> Command {
    let mut argv = isolation.prefix();
    argv.extend([
        "bash".to_owned(),
        "-c".to_owned(),
        WRAPPER.to_owned(),
        WRAPPER_NAME.to_owned(),
        script.to_owned(),
        limits.cpu_seconds.to_string(),
        limits.memory_kib().to_string(),
        limits.max_processes.to_string(),
    ]);
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_follows_the_isolation() {
        assert!(Isolation::none().prefix().is_empty());
        let full = Isolation {
            parent_death_signal: true,
            network_isolated: true,
            processes_isolated: true,
            user_namespace: true,
            filesystem_fenced: false,
        };
        assert_eq!(
            full.prefix().join(" "),
            "setpriv --pdeathsig KILL -- unshare --user --map-root-user --net --pid --fork \
             --kill-child --mount-proc --"
        );
        let network_only = Isolation {
            processes_isolated: false,
            parent_death_signal: false,
            ..full
        };
        assert_eq!(
            network_only.prefix().join(" "),
            "unshare --user --map-root-user --net --"
        );
    }

    #[test]
    fn the_environment_is_built_from_nothing() {
        let home = Path::new("/scratch/call");
        let call = CallNames {
            idempotency_key: "key-1",
            task_id: "t1",
            session: "s1",
        };
        let env = environment(home, &["SHELL_TEST_NOT_SET_ANYWHERE".to_owned()], call);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            &names[..6],
            [
                "PATH",
                "HOME",
                "TMPDIR",
                ENV_IDEMPOTENCY_KEY,
                ENV_TASK_ID,
                ENV_SESSION
            ]
        );
        assert!(
            names[6..].iter().all(|n| PASSED_ENV.contains(n)),
            "{names:?}"
        );
        assert_eq!(env[1].1, home.as_os_str());
        assert_eq!(env[3].1, "key-1");
    }

    #[tokio::test]
    async fn a_missing_program_does_not_probe_as_working() {
        assert!(!runs(&["skein-no-such-program-anywhere"]).await);
        assert!(!runs(&["false"]).await);
        assert!(runs(&["true"]).await);
    }
}
