//! The lead and worker processes of the bench: this binary re-run as `skein-bench node ...`
//! (the lead optionally under a profiler), waiting for workers to register, and what is read from
//! the running processes (memory from `/proc`, turns in flight from the lead's admin server).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use skein_common::store::SessionStore;
use skein_tests::support::ChildProcess;

use crate::report::Report;
use crate::Failed;

/// The lead and worker processes of the bench.
pub(crate) struct Nodes {
    pub(crate) nats: String,
    pub(crate) redis: String,
    pub(crate) dir: PathBuf,
    /// A profiler command the lead runs under.
    pub(crate) wrap_lead: Option<String>,
    /// The processes' log filter (`SKEIN_LOG`).
    pub(crate) log: String,
    /// Work partitions of the processes (`SKEIN_PARTITIONS`).
    pub(crate) partitions: u32,
}

impl Nodes {
    /// `admin` is the node's admin address, or `off`.
    fn command(&self, role: &str, id: &str, admin: &str) -> std::process::Command {
        let exe = std::env::current_exe().unwrap_or_else(|_| "skein-bench".into());
        let wrapper: Vec<&str> = match (&self.wrap_lead, role) {
            (Some(wrapper), "lead") => wrapper.split_whitespace().collect(),
            _ => Vec::new(),
        };
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = std::process::Command::new(program);
                cmd.args(args).arg(exe);
                // A group of its own, so that the lead under the profiler stops with it
                // (`stop_lead`): killing the profiler alone would leave the lead running.
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                cmd
            }
            None => std::process::Command::new(exe),
        };
        cmd.args([
            "node",
            role,
            "--nats-url",
            &self.nats,
            "--redis-url",
            &self.redis,
        ])
        .args(["--instance-id", id, "--admin-addr", admin])
        .env("SKEIN_LOG", &self.log)
        .env(
            skein_common::config::ENV_PARTITIONS,
            self.partitions.to_string(),
        );
        cmd
    }

    /// A gateway on `port` with the keys file `keys`, without a rate limit.
    pub(crate) fn gateway(&self, keys: &std::path::Path, port: u16) -> ChildProcess {
        let exe = std::env::current_exe().unwrap_or_else(|_| "skein-bench".into());
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["node", "gateway", "--nats-url", &self.nats])
            .args(["--redis-url", &self.redis])
            .args(["--gateway-addr", &format!("127.0.0.1:{port}")])
            .args(["--gateway-keys", &keys.display().to_string()])
            .args(["--gateway-requests-per-minute", "0"])
            .env("SKEIN_LOG", &self.log);
        ChildProcess::spawn(cmd, self.dir.join("gateway.log"))
    }

    pub(crate) fn worker(&self, id: &str) -> ChildProcess {
        let mut cmd = self.command("test-worker", id, "off");
        cmd.args(["--concurrency", "64", "--subagents", "false"])
            .args([
                "--workspace-root",
                &self.dir.join("ws").display().to_string(),
            ]);
        ChildProcess::spawn(cmd, self.dir.join(format!("{id}.log")))
    }

    /// A worker that runs subagents (scripted by `scenario`) and the test tools.
    pub(crate) fn subagent_worker(&self, id: &str, scenario: &std::path::Path) -> ChildProcess {
        let mut cmd = self.command("test-worker", id, "off");
        cmd.args(["--concurrency", "64", "--subagents", "true"])
            .args(["--scenario", &scenario.display().to_string()])
            .args([
                "--workspace-root",
                &self.dir.join("ws").display().to_string(),
            ])
            .env(
                skein_tests::support::test_tools::EFFECTS_FILE_ENV,
                self.dir.join("effects.log"),
            );
        ChildProcess::spawn(cmd, self.dir.join(format!("{id}.log")))
    }

    /// A lead whose agents come from `agents` (the plan bench's).
    pub(crate) fn planning_lead(
        &self,
        scenario: &std::path::Path,
        agents: &std::path::Path,
    ) -> ChildProcess {
        let mut cmd = self.command("lead", "bench-plan-lead", "off");
        cmd.args(["--concurrency", "64"])
            .args(["--scenario", &scenario.display().to_string()])
            .args(["--agents-dir", &agents.display().to_string()]);
        ChildProcess::spawn(cmd, self.dir.join("plan-lead.log"))
    }

    /// The lead, with its admin server on `admin` (its metrics tell the turns in flight).
    pub(crate) fn lead(&self, scenario: &std::path::Path, admin: &str) -> ChildProcess {
        let mut cmd = self.command("lead", "bench-lead", admin);
        cmd.args([
            "--concurrency",
            "1000",
            "--scenario",
            &scenario.display().to_string(),
        ]);
        ChildProcess::spawn(cmd, self.dir.join("lead.log"))
    }

    /// Stops a lead from [`Nodes::lead`]. Under a profiler, the lead in the profiler's process
    /// group is asked to stop (SIGTERM), and the group given a minute to end, so that the
    /// profiler writes what it measured; what is left of the group is then killed.
    pub(crate) async fn stop_lead(&self, lead: &mut ChildProcess) {
        if self.wrap_lead.is_some() {
            let group = lead.id().to_string();
            let run = |program: &str, args: &[&str]| {
                std::process::Command::new(program)
                    .args(args)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success())
            };
            if run("pkill", &["-TERM", "-g", &group, "-f", " node lead "]) {
                let deadline = Instant::now() + Duration::from_secs(60);
                while run("pgrep", &["-g", &group]) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            run("pkill", &["-KILL", "-g", &group]);
        }
        lead.kill();
    }
}

pub(crate) async fn wait_workers(store: &SessionStore, n: usize) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.live_workers().await?.len() < n {
        if Instant::now() > deadline {
            return Err(format!("{n} workers did not come up").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Time from spawning a worker process to its first announcement, median of 5.
pub(crate) async fn start_to_ready(
    nodes: &Nodes,
    store: &SessionStore,
    report: &mut Report,
) -> Result<Duration, Failed> {
    let mut taken = Vec::new();
    for i in 0..5 {
        let id = format!("ready-{i}");
        let started = Instant::now();
        let mut worker = nodes.worker(&id);
        loop {
            if store
                .live_workers()
                .await?
                .iter()
                .any(|w| w.worker_id == id)
            {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err("a worker did not get ready".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        taken.push(started.elapsed());
        worker.sigterm();
        let _ = worker.wait_exit(Duration::from_secs(10)).await;
        store.remove_worker(&id).await?;
    }
    taken.sort();
    report.add(
        "skein: worker start to ready",
        taken[2].as_secs_f64() * 1e3,
        "ms",
    );
    Ok(taken[2])
}

/// The whole answer (status line, headers, body) of `GET path` on the admin server `admin`.
async fn admin_get(admin: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: node\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    Some(answer)
}

/// Waits until the process whose admin server is `admin` answers `/readyz` with 200 (at most 60 s).
pub(crate) async fn wait_ready(admin: &str) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let answer = admin_get(admin, "/readyz").await.unwrap_or_default();
        let status = answer
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(1));
        if status == Some("200") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{admin} not ready within 60 s").into())
}

/// The lead's `skein_in_flight{kind="turn"}` gauge, read from its admin server.
pub(crate) async fn turns_in_flight(admin: &str) -> Option<f64> {
    let read = async {
        let body = admin_get(admin, "/metrics").await?;
        body.lines()
            .find(|line| line.starts_with("skein_in_flight{") && line.contains("kind=\"turn\""))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.trim().parse().ok())
    };
    tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .ok()
        .flatten()
}

/// A memory figure of a process from /proc (KiB).
pub(crate) fn rss_kib(pid: u32, field: &str) -> Result<f64, Failed> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {field} for process {pid}").into())
}
