//! The soak: many tool tasks of every outcome — success, failure, timeout, cancellation, panic,
//! `shell` (leaving a background process behind) and task-scoped MCP calls — dispatched to worker
//! processes, and what those processes hold before and after: open file descriptors, child
//! processes, scratch entries, resident memory and the open-resources gauges of their metrics.
//! `skein-bench soak` runs it at size; `tests/tests/soak.rs` runs a smaller one in CI.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::bus::Bus;
use skein_common::dispatch::{CallRoute, Dispatcher};
use skein_common::protocol::{CallOutcome, CancelRequest, TaskOrigin, PROTOCOL_VERSION};

use super::unique;

/// What each task of the soak does, in turn (task `i` does `KINDS[i % KINDS.len()]`).
pub const KINDS: [Kind; 10] = [
    Kind::Succeed,
    Kind::Fail,
    Kind::TimeOut,
    Kind::Cancel,
    Kind::Panic,
    Kind::Shell,
    Kind::Mcp,
    Kind::Succeed,
    Kind::Shell,
    Kind::Mcp,
];

/// One kind of soak task and the outcome it must end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Succeed,
    Fail,
    TimeOut,
    Cancel,
    Panic,
    Shell,
    Mcp,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Succeed => "success",
            Kind::Fail => "failure",
            Kind::TimeOut => "timeout",
            Kind::Cancel => "cancel",
            Kind::Panic => "panic",
            Kind::Shell => "shell",
            Kind::Mcp => "mcp (task-scoped)",
        }
    }

    /// The outcome label the task must end with: `ok` or a failure kind.
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Succeed | Kind::Shell | Kind::Mcp => "ok",
            Kind::Fail => "tool_failed",
            Kind::TimeOut => "timed_out",
            Kind::Cancel => "cancelled",
            Kind::Panic => "internal",
        }
    }

    /// The tool, its arguments and the call's time limit.
    fn call(self) -> (&'static str, Value, Duration) {
        let long = Duration::from_secs(60);
        match self {
            Kind::Succeed => ("noop", json!({}), long),
            Kind::Fail => ("fail", json!({ "message": "soak failure" }), long),
            Kind::TimeOut => (
                "slow_effect",
                json!({ "key": "soak-timeout", "ms": 60_000 }),
                Duration::from_millis(300),
            ),
            Kind::Cancel => (
                "slow_effect",
                json!({ "key": "soak-cancel", "ms": 60_000 }),
                long,
            ),
            Kind::Panic => ("panic", json!({}), long),
            Kind::Shell => (
                "shell",
                json!({ "command": "echo soak > soak.txt; sleep 1000 & echo left a sleeper" }),
                long,
            ),
            Kind::Mcp => ("mcp__soak__echo", json!({ "text": "soak" }), long),
        }
    }
}

/// The MCP configuration of a soak worker: the fixture server (`command` with `args`), started
/// per task.
pub fn mcp_config(command: &Path, args: &[&str]) -> Value {
    json!({ "mcpServers": { "soak": { "command": command, "args": args, "scope": "task" } } })
}

/// Flags of a soak worker (after its role): one of `workers` sharing the pool, reachable for
/// metrics on `admin`, with its scratch directory `scratch` and the MCP configuration file `mcp`.
pub fn worker_flags(
    nats: &str,
    redis: &str,
    id: &str,
    admin: &str,
    scratch: &Path,
    mcp: &Path,
) -> Vec<String> {
    [
        "--nats-url",
        nats,
        "--redis-url",
        redis,
        "--instance-id",
        id,
        "--admin-addr",
        admin,
        "--concurrency",
        "32",
        "--subagents",
        "false",
        "--heartbeat",
        "500ms",
        "--tools",
        "shell",
        "--scratch-dir",
        &scratch.display().to_string(),
        "--mcp-config",
        &mcp.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// How the soak's tasks ended, by kind and outcome label.
#[derive(Debug, Default)]
pub struct SoakRun {
    pub outcomes: BTreeMap<Kind, BTreeMap<String, usize>>,
    pub elapsed: Duration,
}

impl SoakRun {
    /// Tasks that ended otherwise than their kind must, as `(kind, outcome, count)`.
    pub fn unexpected(&self) -> Vec<(Kind, String, usize)> {
        let mut wrong = Vec::new();
        for (kind, outcomes) in &self.outcomes {
            for (outcome, n) in outcomes {
                if outcome != kind.expected() {
                    wrong.push((*kind, outcome.clone(), *n));
                }
            }
        }
        wrong
    }

    pub fn total(&self) -> usize {
        self.outcomes.values().flat_map(|o| o.values()).sum()
    }
}

/// Dispatches `tasks` soak tasks, at most `in_flight` at once, and waits for every result.
pub async fn run(
    bus: &Bus,
    dispatcher: Arc<Dispatcher>,
    tasks: usize,
    in_flight: usize,
) -> SoakRun {
    let started = Instant::now();
    let batch = unique("soak");
    let results = futures::stream::iter(0..tasks)
        .map(|i| {
            let (dispatcher, bus, batch) = (dispatcher.clone(), bus.clone(), batch.clone());
            async move {
                let kind = KINDS[i % KINDS.len()];
                (kind, one_task(&bus, &dispatcher, &batch, i, kind).await)
            }
        })
        .buffer_unordered(in_flight)
        .collect::<Vec<_>>()
        .await;
    let mut run = SoakRun {
        elapsed: started.elapsed(),
        ..SoakRun::default()
    };
    for (kind, outcome) in results {
        *run.outcomes
            .entry(kind)
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }
    run
}

async fn one_task(bus: &Bus, dispatcher: &Dispatcher, batch: &str, i: usize, kind: Kind) -> String {
    let origin = std::sync::Arc::new(TaskOrigin {
        task_id: format!("{batch}-{i}"),
        tenant: "soak".into(),
        user: "soak".into(),
        session: format!("s{}", i % 16),
        workspace: format!("s{}", i % 16),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    });
    let (tool, arguments, timeout) = kind.call();
    let route = CallRoute {
        pool: "default",
        timeout,
        may_have_run: false,
    };
    let call = dispatcher.call_tool(&origin, 1, "c", tool, arguments, route);
    let result = if kind == Kind::Cancel {
        let cancel = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let request = CancelRequest {
                v: PROTOCOL_VERSION,
                tenant: origin.tenant.clone(),
                task_id: origin.task_id.clone(),
                reason: "soak".into(),
                call_id: None,
            };
            if let Err(e) = bus.request_cancel(&request).await {
                eprintln!("soak: cancel request not published: {e}");
            }
        };
        let (result, ()) = tokio::join!(call, cancel);
        result
    } else {
        call.await
    };
    match result.outcome {
        CallOutcome::Ok { .. } => "ok".to_owned(),
        CallOutcome::Failed { failure } => failure.kind.as_str().to_owned(),
    }
}

/// What one worker process holds at a moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Holdings {
    pub open_fds: usize,
    /// Processes descended from the worker (shells, their leftovers, MCP servers).
    pub child_processes: usize,
    /// Entries in the worker's scratch directory (task scratch dirs, workspace check-outs).
    pub scratch_entries: usize,
    pub rss_kib: u64,
    /// `skein_open_resources{kind="scopes"}` from the worker's metrics.
    pub open_scopes: f64,
    /// `skein_open_resources{kind="task_resources"}` from the worker's metrics.
    pub open_task_resources: f64,
}

/// A worker process of the soak.
#[derive(Debug, Clone)]
pub struct SoakWorker {
    pub pid: u32,
    pub admin: String,
    pub scratch: PathBuf,
}

impl SoakWorker {
    /// What the process holds now (gauges as of its last heartbeat).
    pub async fn holdings(&self) -> Holdings {
        let gauges = metrics(&self.admin).await;
        let gauge = |kind: &str| {
            gauges
                .get(&format!("skein_open_resources{{kind=\"{kind}\"}}"))
                .copied()
                .unwrap_or(f64::NAN)
        };
        Holdings {
            open_fds: std::fs::read_dir(format!("/proc/{}/fd", self.pid))
                .map(|d| d.count())
                .unwrap_or(0),
            child_processes: descendants(self.pid),
            scratch_entries: std::fs::read_dir(&self.scratch)
                .map(|d| d.count())
                .unwrap_or(0),
            rss_kib: rss_kib(self.pid),
            open_scopes: gauge("scopes"),
            open_task_resources: gauge("task_resources"),
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How many processes descend from `pid` (read from /proc).
pub fn descendants(pid: u32) -> usize {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: fields counted after the last `)`.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(parent) = parent {
            children.entry(parent).or_default().push(child);
        }
    }
    let mut count = 0;
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if let Some(kids) = children.get(&p) {
            count += kids.len();
            stack.extend(kids);
        }
    }
    count
}

/// The metric samples of a process's admin server, by series.
async fn metrics(admin: &str) -> HashMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: worker\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        Some(
            body.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_owned(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    };
    tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}
