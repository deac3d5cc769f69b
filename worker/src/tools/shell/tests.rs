//! The `shell` tool against real processes: with no isolation, and with the isolation this
//! machine allows when that is more.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::scope::TaskScope;
use crate::tools::test_support::{origin, scope, TestDir};
use crate::workspace::VolumeWorkspace;

/// A tool call with everything it needs, in a temporary directory.
struct Fixture {
    dir: TestDir,
}

impl Fixture {
    fn new() -> Self {
        Self {
            dir: TestDir::new(),
        }
    }

    fn workspace_root(&self) -> PathBuf {
        self.dir.path().join("workspaces")
    }

    /// The session directory `origin("acme", "s1")` works in.
    fn session_dir(&self) -> PathBuf {
        self.workspace_root().join("acme").join("s1")
    }

    fn shell(&self, config: ShellConfig, isolation: &Isolation) -> Shell {
        let workspace = Arc::new(VolumeWorkspace::new(self.workspace_root()));
        Shell::new(ShellSetup::with_isolation(
            config,
            workspace,
            isolation.clone(),
            Duration::from_secs(120),
        ))
    }

    fn scope(&self) -> TaskScope {
        scope(&self.dir)
    }

    /// Runs one call in a fresh scope and closes the scope.
    async fn call(
        &self,
        shell: &Shell,
        command: &str,
        timeout_s: Option<u64>,
    ) -> Result<String, ToolError> {
        self.call_within(shell, command, timeout_s, Duration::from_secs(60))
            .await
    }

    /// [`call`](Self::call) for a call that may run `time_limit` in all.
    async fn call_within(
        &self,
        shell: &Shell,
        command: &str,
        timeout_s: Option<u64>,
        time_limit: Duration,
    ) -> Result<String, ToolError> {
        let mut scope = self.scope();
        let origin = origin("acme", "s1");
        let args = ShellArgs {
            command: command.to_owned(),
            timeout_s,
        };
        let ctx = ToolContext {
            origin: &origin,
            call_id: "c1",
            idempotency_key: "key-1",
            time_limit,
            scope: &mut scope,
        };
        let result = shell.call(args, ctx).await;
        scope.close().await.expect("the scope closes cleanly");
        result
    }
}

/// No isolation, plus the probed isolation when this machine allows any.
async fn isolations() -> Vec<Isolation> {
    let probed = Isolation::probe(false).await;
    let mut all = vec![Isolation::none()];
    if probed != Isolation::none() {
        all.push(probed);
    }
    all
}

fn unique_marker() -> String {
    format!("skein-marker-{}", uuid::Uuid::new_v4().simple())
}

/// Shell text that starts `sleep 1000` in the background under the name `marker`, waits until it
/// runs, and says so.
fn start_sleeper(marker: &str) -> String {
    format!(
        "(exec -a {marker} sleep 1000) & \
         until tr '\\0' ' ' < /proc/$!/cmdline 2>/dev/null | grep -q {marker}; do sleep 0.05; done; \
         echo \"sleeper {marker} up\""
    )
}

/// Live (not zombie) processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            (cmdline.contains(marker) && state != 'Z').then_some(cmdline)
        })
        .collect()
}

/// Waits (bounded) until no live process mentions `marker`; panics naming the survivors.
async fn assert_gone(marker: &str, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let alive = processes_with(marker);
        if alive.is_empty() {
            return;
        }
        if std::time::Instant::now() > deadline {
            panic!("{what}: still running: {alive:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The default settings, but commands run also where they cannot be isolated (these tests run
/// each case without isolation too).
fn config() -> ShellConfig {
    ShellConfig {
        unisolated: Unisolated::Allow,
        ..ShellConfig::default()
    }
}

#[tokio::test]
async fn runs_in_the_session_workspace_and_reports_the_exit_status() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(config(), &isolation);
        let output = fixture
            .call(
                &shell,
                "pwd; echo made > made.txt; echo oops >&2; exit 3",
                None,
            )
            .await
            .expect("a failing command is output, not a tool failure");
        let dir = std::fs::canonicalize(fixture.session_dir()).expect("session dir");
        assert_eq!(
            output,
            format!(
                "exit status: 3\n--- stdout ---\n{}\n--- stderr ---\noops",
                dir.display()
            ),
            "{isolation:?}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("made.txt")).expect("file made"),
            "made\n"
        );
    }
}

#[tokio::test]
async fn stdin_is_empty_and_silence_is_said() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(config(), &isolation);
        let output = fixture.call(&shell, "cat", None).await.expect("runs");
        assert_eq!(output, "exit status: 0\n(no output)", "{isolation:?}");
        let output = fixture
            .call(&shell, "read -r line; echo \"read status $?\"", None)
            .await
            .expect("runs");
        assert!(output.contains("read status 1"), "{output}");
        let output = fixture
            .call(&shell, "no-such-command-here", None)
            .await
            .expect("runs");
        assert!(
            output.starts_with("exit status: 127 (command not found)"),
            "{output}"
        );
    }
}

#[tokio::test]
async fn long_output_keeps_its_head_and_tail() {
    let fixture = Fixture::new();
    let shell = fixture.shell(
        ShellConfig {
            max_output: 1000,
            ..config()
        },
        &Isolation::none(),
    );
    let output = fixture
        .call(&shell, "seq 1 100000; seq 1 3 >&2", None)
        .await
        .expect("runs");
    assert!(
        output.starts_with("exit status: 0\n--- stdout ---\n1\n2\n3\n"),
        "{output}"
    );
    assert!(output.contains("bytes cut from the middle"), "{output}");
    assert!(
        output.ends_with("99999\n100000\n--- stderr ---\n1\n2\n3"),
        "{output}"
    );
    // 1000 bytes of output plus the framing.
    assert!(output.len() < 1000 + 200, "{}", output.len());
}

#[tokio::test]
async fn the_environment_is_reduced_to_the_allowlist() {
    // Cargo sets these for every test process; they stand in for the worker's secrets.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(
            ShellConfig {
                env: vec!["CARGO_PKG_NAME".into()],
                ..config()
            },
            &isolation,
        );
        let output = fixture
            .call(
                &shell,
                "env | cut -d= -f1 | sort; echo \"home=$HOME\"",
                None,
            )
            .await
            .expect("runs");
        let (_, body) = output.split_once("--- stdout ---\n").expect("stdout");
        let names: Vec<&str> = body.lines().filter(|l| !l.contains('=')).collect();
        let allowed = [
            "PATH",
            "HOME",
            "TMPDIR",
            "LANG",
            "LC_ALL",
            "TZ",
            "TERM",
            "CARGO_PKG_NAME",
            // Naming the call.
            "SKEIN_IDEMPOTENCY_KEY",
            "SKEIN_TASK_ID",
            "SKEIN_SESSION",
            // Set by bash itself.
            "PWD",
            "SHLVL",
            "_",
            "OLDPWD",
        ];
        assert!(
            names.iter().all(|n| allowed.contains(n)),
            "{isolation:?}: {names:?}"
        );
        assert!(names.contains(&"CARGO_PKG_NAME") && !names.contains(&"CARGO_MANIFEST_DIR"));
        let home = body
            .lines()
            .find_map(|l| l.strip_prefix("home="))
            .expect("home");
        assert!(
            home.contains("scratch"),
            "HOME is the call's scratch directory: {home}"
        );
        assert!(
            !std::path::Path::new(home).exists(),
            "removed with the scope"
        );
    }
}

#[tokio::test]
async fn limits_are_applied_to_the_command() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(
            ShellConfig {
                cpu_seconds: 7,
                memory_bytes: 256 * 1024 * 1024,
                max_processes: 100,
                ..config()
            },
            &isolation,
        );
        let output = fixture
            .call(
                &shell,
                "ulimit -t; ulimit -H -t; ulimit -v; ulimit -H -v; ulimit -u",
                None,
            )
            .await
            .expect("runs");
        assert_eq!(
            output, "exit status: 0\n--- stdout ---\n7\n8\n262144\n262144\n100",
            "{isolation:?}"
        );
    }
}

#[tokio::test]
async fn a_memory_hog_fails_under_the_address_space_limit() {
    let fixture = Fixture::new();
    let shell = fixture.shell(
        ShellConfig {
            memory_bytes: 64 * 1024 * 1024,
            ..config()
        },
        &Isolation::none(),
    );
    let output = fixture
        .call(
            &shell,
            "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo \"survived ${#x}\"",
            None,
        )
        .await
        .expect("runs");
    assert!(!output.starts_with("exit status: 0"), "{output}");
    assert!(!output.contains("survived"), "{output}");
    assert!(output.contains("cannot allocate"), "{output}");
}

#[tokio::test]
async fn a_cpu_hog_is_stopped_by_the_cpu_limit() {
    let fixture = Fixture::new();
    let shell = fixture.shell(
        ShellConfig {
            cpu_seconds: 1,
            ..config()
        },
        &Isolation::none(),
    );
    let output = fixture
        .call(&shell, "while :; do :; done", Some(40))
        .await
        .expect("runs");
    assert!(
        output.starts_with("exit status: 152 (128 + 24: a process was killed by SIGXCPU"),
        "{output}"
    );
}

#[tokio::test]
async fn background_jobs_do_not_survive_the_call() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(config(), &isolation);
        let marker = unique_marker();
        let output = fixture
            .call(&shell, &start_sleeper(&marker), None)
            .await
            .expect("runs");
        assert!(output.contains(&format!("sleeper {marker} up")), "{output}");
        assert!(output.starts_with("exit status: 0"), "{output}");
        assert_gone(&marker, &format!("{isolation:?}")).await;
    }
}

#[tokio::test]
async fn a_timeout_kills_the_group_and_returns_the_output_so_far() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(config(), &isolation);
        let marker = unique_marker();
        let command = format!("{}; echo waiting; sleep 1000", start_sleeper(&marker));
        let output = fixture
            .call(&shell, &command, Some(1))
            .await
            .expect("a timeout is output");
        assert!(
            output.starts_with(
                "timed out after 1s: the command and every process it started were killed\n"
            ),
            "{output}"
        );
        assert!(
            output.contains(&format!("sleeper {marker} up\nwaiting")),
            "{output}"
        );
        assert_gone(&marker, &format!("{isolation:?}")).await;
    }
}

#[tokio::test]
async fn a_process_that_leaves_the_group_dies_with_a_process_namespace() {
    let isolation = Isolation::probe(false).await;
    if !isolation.processes_isolated {
        eprintln!("no process namespace here; nothing to check");
        return;
    }
    let fixture = Fixture::new();
    let shell = fixture.shell(config(), &isolation);
    let marker = unique_marker();
    let command = format!(
        "setsid bash -c 'exec -a {marker} sleep 1000' > /dev/null 2>&1 & \
         until grep -q {marker} /proc/[0-9]*/cmdline 2>/dev/null; do sleep 0.05; done; echo up"
    );
    let output = fixture.call(&shell, &command, None).await.expect("runs");
    assert!(output.contains("up"), "{output}");
    assert_gone(&marker, "setsid escapee").await;
}

#[tokio::test]
async fn cancelling_the_call_kills_the_group() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(config(), &isolation);
        let marker = unique_marker();
        let started = fixture.session_dir().join(format!("{marker}.started"));
        let command = format!(
            "{}; echo > {marker}.started; sleep 1000",
            start_sleeper(&marker)
        );
        let mut scope = fixture.scope();
        let origin = origin("acme", "s1");
        {
            let ctx = ToolContext {
                origin: &origin,
                call_id: "c1",
                idempotency_key: "key-1",
                time_limit: std::time::Duration::from_secs(60),
                scope: &mut scope,
            };
            let call = shell.call(
                ShellArgs {
                    command,
                    timeout_s: None,
                },
                ctx,
            );
            tokio::pin!(call);
            let running = async {
                while !started.exists() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::select! {
                ended = &mut call => panic!("the call ended by itself: {ended:?}"),
                () = running => {}
                () = tokio::time::sleep(Duration::from_secs(30)) => panic!("the command never started"),
            }
            // Dropping the call here is the cancellation.
        }
        assert_eq!(
            scope.owned(),
            2,
            "the scratch directory and the command's leader belong to the scope"
        );
        scope.close().await.expect("the scope closes cleanly");
        assert_gone(&marker, &format!("{isolation:?}")).await;
    }
}

#[tokio::test]
async fn the_network_is_off_when_the_platform_allows() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listener");
    let port = listener.local_addr().expect("address").port();
    let command = format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo connected");
    let fixture = Fixture::new();
    let open = fixture.shell(config(), &Isolation::none());
    let output = fixture.call(&open, &command, None).await.expect("runs");
    assert!(output.contains("connected"), "without isolation: {output}");
    let isolation = Isolation::probe(false).await;
    if !isolation.network_isolated {
        eprintln!("no network namespace here; nothing more to check");
        return;
    }
    let closed = fixture.shell(config(), &isolation);
    let output = fixture.call(&closed, &command, None).await.expect("runs");
    assert!(!output.contains("connected"), "isolated: {output}");
    assert!(closed.description().contains("no network access"));
    // Allowing the network skips the namespace.
    assert!(!Isolation::probe(true).await.network_isolated);
}

#[tokio::test]
async fn bad_arguments_are_refused_before_anything_runs() {
    let fixture = Fixture::new();
    let shell = fixture.shell(config(), &Isolation::none());
    let cases = [
        ("  ", None, "empty"),
        ("echo \0", None, "NUL"),
        ("true", Some(0), "timeout_s"),
    ];
    for (command, timeout_s, expected) in cases {
        match fixture.call(&shell, command, timeout_s).await {
            Err(ToolError::InvalidArguments(m)) => assert!(m.contains(expected), "{m}"),
            other => panic!("{command:?}: {other:?}"),
        }
    }
    let long = "x".repeat(MAX_COMMAND_BYTES + 1);
    assert!(matches!(
        fixture.call(&shell, &long, None).await,
        Err(ToolError::TooLarge(_))
    ));
    assert!(!fixture.session_dir().exists(), "nothing was checked out");
}

#[test]
fn the_timeout_is_capped_and_kept_inside_the_tool_timeout() {
    let workspace = Arc::new(VolumeWorkspace::new("/nonexistent"));
    let setup = |max: u64, tool: u64| {
        Shell::new(ShellSetup::with_isolation(
            ShellConfig {
                max_timeout: Duration::from_secs(max),
                ..config()
            },
            workspace.clone(),
            Isolation::none(),
            Duration::from_secs(tool),
        ))
    };
    let shell = setup(50, 60);
    assert_eq!(shell.timeout(None), Ok(Duration::from_secs(50)));
    assert_eq!(shell.timeout(Some(5)), Ok(Duration::from_secs(5)));
    assert_eq!(shell.timeout(Some(500)), Ok(Duration::from_secs(50)));
    // A short tool timeout leaves a margin to answer in.
    let short = setup(50, 10);
    assert_eq!(short.timeout(None), Ok(Duration::from_secs(8)));
}

#[test]
fn the_spec_declares_a_destructive_tool_with_its_limits() {
    let workspace = Arc::new(VolumeWorkspace::new("/nonexistent"));
    let shell = Shell::new(ShellSetup::with_isolation(
        config(),
        workspace,
        Isolation::none(),
        Duration::from_secs(60),
    ));
    let description = shell.description();
    for needle in [
        "50s",
        "60 s of CPU",
        "4.0 GiB",
        "512 processes",
        "network access",
        "32768 bytes",
    ] {
        assert!(description.contains(needle), "{needle}: {description}");
    }
    let mut registry = crate::tools::ToolRegistry::new();
    registry.register(shell);
    let spec = registry.spec("shell").expect("registered");
    assert!(spec.effects.destructive && !spec.effects.read_only);
    assert!(!spec.concurrency_safe);
    assert_eq!(spec.parameters["required"], serde_json::json!(["command"]));
}

#[tokio::test]
async fn only_a_worker_listing_shell_sets_it_up() {
    use clap::Parser;
    let workspace: Arc<dyn CommandWorkspace> = Arc::new(VolumeWorkspace::new("/nonexistent"));
    let without = crate::config::Config::try_parse_from(["skein-worker"]).expect("flags");
    assert!(ShellSetup::configured(&without, workspace.clone())
        .await
        .is_none());
    let with =
        crate::config::Config::try_parse_from(["skein-worker", "--tools", "shell,read_file"])
            .expect("flags");
    assert_eq!(with.validate(), Ok(()));
    assert!(ShellSetup::configured(&with, workspace).await.is_some());
}

#[test]
fn the_answer_names_how_the_command_ended() {
    use std::os::unix::process::ExitStatusExt;
    let limits = Limits {
        cpu_seconds: 9,
        memory_bytes: 1 << 30,
        max_processes: 10,
    };
    let exited = |raw: i32| Ended::Exited(std::process::ExitStatus::from_raw(raw));
    let timeout = Duration::from_secs(3);
    assert_eq!(status_line(&exited(0), timeout, &limits), "exit status: 0");
    assert_eq!(
        status_line(&exited(137 << 8), timeout, &limits),
        "exit status: 137 (128 + 9: a process was killed by SIGKILL (possibly out of memory))"
    );
    assert_eq!(
        status_line(&exited(24), timeout, &limits),
        "killed by SIGXCPU (the CPU limit of 9 s per process)"
    );
    assert!(status_line(&Ended::TimedOut, timeout, &limits).starts_with("timed out after 3s"));

    let mut stdout = capture::Capture::new(100);
    stdout.push(b"out\n");
    let finished = Finished {
        ended: exited(0),
        stdout,
        stderr: capture::Capture::new(100),
        drained: false,
    };
    assert_eq!(
        render(
            &finished,
            "exit status: 0",
            100,
            "workspace: 2 written, 0 removed\n"
        ),
        "exit status: 0\n--- stdout ---\nout\n[output may be incomplete: a process outside the \
         command's process group kept its output open]\n--- workspace: 2 written, 0 removed ---"
    );
}

#[test]
fn a_failed_check_in_keeps_its_kind_and_says_the_command_ran() {
    let error = not_saved(
        ToolError::Unavailable("store down".into()),
        "exit status: 0",
    );
    assert_eq!(
        error,
        ToolError::Unavailable(
            "the command ran (exit status: 0) but its workspace changes could not be saved: \
             store down"
                .into()
        )
    );
    assert!(matches!(
        not_saved(ToolError::NotFound("x".into()), "s"),
        ToolError::Failed(_)
    ));
}

/// A call with less time left than the shell's own limits stops its command within that time
/// and still answers, with the output so far.
#[tokio::test]
async fn a_command_is_stopped_within_the_calls_own_time_limit() {
    let fixture = Fixture::new();
    let shell = fixture.shell(config(), &Isolation::none());
    let output = fixture
        .call_within(
            &shell,
            "echo before; sleep 100; echo after",
            None,
            Duration::from_secs(2),
        )
        .await
        .expect("a timeout is output, not a failure");
    assert!(output.starts_with("timed out after"), "{output}");
    assert!(
        output.contains("\nbefore") && !output.contains("\nafter"),
        "{output}"
    );
}

#[tokio::test]
async fn a_worker_that_cannot_isolate_refuses_commands_unless_its_operator_allows_them() {
    let fixture = Fixture::new();
    let refusing = fixture.shell(ShellConfig::default(), &Isolation::none());
    let refused = fixture
        .call(&refusing, "echo ran > ran.txt", None)
        .await
        .expect_err("refused");
    assert!(
        matches!(&refused, ToolError::Unavailable(m) if m.contains("SKEIN_SHELL_UNISOLATED=allow")),
        "{refused:?}"
    );
    assert!(
        !fixture.session_dir().join("ran.txt").exists(),
        "the refused command did not run"
    );
    let allowed = fixture.shell(config(), &Isolation::none());
    let output = fixture
        .call(&allowed, "echo ran", None)
        .await
        .expect("allowed, it runs");
    assert!(output.contains("ran"), "{output}");
}

#[tokio::test]
async fn a_command_is_told_its_call_task_and_session() {
    let fixture = Fixture::new();
    for isolation in isolations().await {
        let shell = fixture.shell(config(), &isolation);
        let output = fixture
            .call(
                &shell,
                "echo \"[$SKEIN_IDEMPOTENCY_KEY|$SKEIN_TASK_ID|$SKEIN_SESSION]\"",
                None,
            )
            .await
            .expect("runs");
        assert!(
            output.contains("[key-1|task-1|s1]"),
            "{isolation:?}: {output}"
        );
    }
}

#[tokio::test]
async fn a_fenced_command_reads_and_writes_only_its_own_files() {
    let isolation = Isolation::probe(false).await;
    assert!(
        isolation.filesystem_fenced || !super::fence::available(),
        "the probe finds Landlock where the kernel has it"
    );
    if !isolation.filesystem_fenced {
        eprintln!("no Landlock here; nothing to check");
        return;
    }
    let fixture = Fixture::new();
    // The worker's own file, and another session's checkout.
    let secret = fixture.dir.path().join("worker-secret.txt");
    std::fs::write(&secret, "the worker's secret").expect("secret written");
    let other = fixture.workspace_root().join("acme").join("s2");
    std::fs::create_dir_all(&other).expect("another session");
    std::fs::write(other.join("notes.txt"), "another session's notes").expect("notes written");
    let outside = fixture.dir.path().join("escaped.txt");
    let shell = fixture.shell(ShellConfig::default(), &isolation);
    let command = format!(
        "cat {secret}; cat {notes}; echo out > {outside}; ls {other}; \
         echo mine > mine.txt && cat mine.txt; head -c 3 /usr/bin/env | wc -c; \
         echo scratch > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"",
        secret = secret.display(),
        notes = other.join("notes.txt").display(),
        outside = outside.display(),
        other = other.display(),
    );
    let output = fixture.call(&shell, &command, None).await.expect("runs");
    assert!(!output.contains("the worker's secret"), "{output}");
    assert!(!output.contains("another session's notes"), "{output}");
    assert!(!outside.exists(), "nothing written outside: {output}");
    assert_eq!(
        output.matches("Permission denied").count(),
        4,
        "each reach outside refused: {output}"
    );
    assert!(output.contains("mine\n"), "its own checkout: {output}");
    assert!(output.contains("\n3\n"), "the system's programs: {output}");
    assert!(
        output.contains("scratch\n"),
        "its scratch directory: {output}"
    );
    assert_eq!(
        std::fs::read_to_string(fixture.session_dir().join("mine.txt")).expect("kept"),
        "mine\n"
    );
}
