//! MCP servers as tool providers, end to end: a real MCP server (`skein-mcp-fixture`, built with
//! rmcp) configured on a real worker, its tools in the catalog the model sees, calls carrying the
//! idempotency key, crashes and restarts, task-scoped servers closed with their task (also on a
//! timeout), worker-scoped servers closed when the worker stops, a streamable HTTP server, and
//! bad configurations refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use skein_common::protocol::{call_key, EventKind, TaskOrigin, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{eventually, free_port, unique, ChildProcess, FakeOpenAi, FakeReply};
use skein_worker::scope::ScopeStats;
use tokio_util::sync::CancellationToken;

const FIXTURE: &str = env!("CARGO_BIN_EXE_skein-mcp-fixture");

/// Files one fixture server writes: the pid of every start, and what `record` records.
struct FixtureFiles {
    starts: PathBuf,
    record: PathBuf,
}

impl FixtureFiles {
    fn new(cluster: &TestCluster) -> Self {
        Self {
            starts: cluster.dir.join(unique("mcp-starts")),
            record: cluster.dir.join(unique("mcp-record")),
        }
    }

    /// A stdio server entry running the fixture with `args`, owned as `scope` says.
    fn stdio(&self, scope: &str, args: &[&str]) -> Value {
        json!({
            "command": FIXTURE,
            "args": args,
            "env": {
                "SKEIN_MCP_FIXTURE_STARTS": self.starts,
                "SKEIN_MCP_FIXTURE_RECORD": self.record,
            },
            "scope": scope,
        })
    }

    /// Pids of the fixture processes started so far, in start order.
    fn started(&self) -> Vec<u32> {
        lines(&self.starts)
            .iter()
            .map(|line| line.parse().expect("a pid per line"))
            .collect()
    }

    fn recorded(&self) -> Vec<String> {
        lines(&self.record)
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Writes `{"mcpServers": servers}` into the cluster's directory; returns its path.
fn mcp_config(cluster: &TestCluster, servers: Value) -> String {
    let path = cluster.dir.join(unique("mcp")).with_extension("json");
    std::fs::write(&path, json!({ "mcpServers": servers }).to_string()).expect("config written");
    path.display().to_string()
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_ended(what: &str, pid: u32) {
    eventually(
        &format!("{what} (pid {pid}) to end"),
        Duration::from_secs(15),
        || async move { ended(pid).then_some(()) },
    )
    .await;
}

/// `(tool, ok, preview)` of every finished call of the turn.
fn finished(events: &[TurnEvent]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished {
                tool, ok, preview, ..
            } => Some((tool.clone(), *ok, preview.clone())),
            _ => None,
        })
        .collect()
}

/// `(tool_call_id, content)` of the tool messages in a model request.
fn tool_messages(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| {
                    (
                        m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                        m["content"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `(id, name)` of the tool calls the model asked for in the assistant message of `request`.
fn asked_calls(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "assistant"))
        .and_then(|m| m["tool_calls"].as_array())
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    (
                        c["id"].as_str().unwrap_or_default().to_owned(),
                        c["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A lead on `model` and an in-process worker with `worker_flags`; waits for the worker.
async fn start(
    cluster: &TestCluster,
    model: &FakeOpenAi,
    worker_flags: &[&str],
) -> Arc<ScopeStats> {
    let stats = cluster.spawn_worker(cluster.worker_config(worker_flags));
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));
    cluster.wait_for_workers(1).await;
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_servers_tools_join_the_catalog_and_calls_carry_the_idempotency_key() {
    let cluster = TestCluster::start();
    let files = FixtureFiles::new(&cluster);
    let config = mcp_config(&cluster, json!({ "fixture": files.stdio("worker", &[]) }));
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            (
                "mcp__fixture__echo".into(),
                json!({ "text": "hello over mcp" }),
            ),
            (
                "mcp__fixture__record".into(),
                json!({ "effect": "launched" }),
            ),
        ]),
        FakeReply::answer("done"),
    ])
    .await;
    start(&cluster, &model, &["--mcp-config", &config]).await;

    // The registry carries the server's tools, with effects from their annotations.
    let workers = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("registry");
    let tools = &workers[0].tools;
    let effects = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.effects)
            .unwrap_or_else(|| panic!("{name} announced: {tools:?}"))
    };
    assert!(effects("mcp__fixture__echo").read_only);
    assert!(effects("mcp__fixture__wipe").destructive);
    let record = effects("mcp__fixture__record");
    assert!(!record.read_only && !record.destructive, "{record:?}");

    let task = submission("acme", &unique("s"), "echo and record");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let calls = finished(&events);
    assert!(calls.iter().all(|(_, ok, _)| *ok), "{calls:?}");

    // The model saw the tool as the server describes it, and its output.
    let requests = model.requests();
    let echo = requests[0]["tools"]
        .as_array()
        .and_then(|tools| {
            tools
                .iter()
                .find(|t| t["function"]["name"] == "mcp__fixture__echo")
        })
        .cloned()
        .expect("mcp__fixture__echo offered to the model");
    assert_eq!(
        echo["function"]["description"],
        "Returns its text unchanged."
    );
    assert_eq!(
        echo["function"]["parameters"],
        json!({
            "type": "object",
            "properties": {"text": {"type": "string", "description": "What to echo."}},
            "required": ["text"]
        })
    );
    let observed = tool_messages(&requests[1]);
    assert_eq!(observed[0].1, "hello over mcp", "{observed:?}");
    assert_eq!(observed[1].1, "recorded", "{observed:?}");

    // The server got the call's idempotency key in `_meta`.
    let record_call = asked_calls(&requests[1])
        .into_iter()
        .find(|(_, name)| name == "mcp__fixture__record")
        .expect("the record call")
        .0;
    let origin = TaskOrigin {
        task_id: task.task_id.clone(),
        tenant: task.tenant.clone(),
        user: task.user.clone(),
        session: task.session.clone(),
        workspace: task.session.clone(),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    };
    let key =
        skein_worker::tools::idempotency_key(&origin, &call_key(&task.task_id, 1, &record_call));
    assert_eq!(files.recorded(), [format!("{key} launched")]);
    assert_eq!(files.started().len(), 1, "one worker-scoped server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_fails_the_call_visibly_and_is_restarted() {
    let cluster = TestCluster::start();
    let files = FixtureFiles::new(&cluster);
    let config = mcp_config(&cluster, json!({ "fixture": files.stdio("worker", &[]) }));
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("mcp__fixture__crash", json!({})),
        FakeReply::answer("it crashed"),
        FakeReply::tool("mcp__fixture__echo", json!({ "text": "back again" })),
        FakeReply::answer("it is back"),
    ])
    .await;
    start(&cluster, &model, &["--mcp-config", &config]).await;
    let first = files.started();
    assert_eq!(first.len(), 1, "{first:?}");

    let (crashed, events) = cluster
        .run(&submission("acme", &unique("s"), "crash it"))
        .await;
    assert_eq!(crashed.status, TurnStatus::Completed, "{crashed:?}");
    let calls = finished(&events);
    assert!(!calls[0].1, "{calls:?}");
    let seen = tool_messages(&model.requests()[1]);
    assert!(
        seen[0]
            .1
            .contains("mcp server fixture went away during the call"),
        "{seen:?}"
    );
    wait_ended("the crashed server", first[0]).await;

    // The supervisor starts it again; the next call goes to the new process.
    let restarted = eventually("a restart", Duration::from_secs(20), || {
        let started = files.started();
        async move { started.get(1).copied() }
    })
    .await;
    let (back, events) = cluster.run(&submission("acme", &unique("s"), "echo")).await;
    assert_eq!(back.status, TurnStatus::Completed, "{back:?}");
    let calls = finished(&events);
    assert!(calls[0].1, "{calls:?}");
    let seen = tool_messages(&model.requests()[3]);
    assert_eq!(seen[0].1, "back again", "{seen:?}");
    assert!(!ended(restarted), "the restarted server keeps running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_scoped_servers_end_with_their_task_also_on_a_timeout() {
    let cluster = TestCluster::start();
    let files = FixtureFiles::new(&cluster);
    let config = mcp_config(
        &cluster,
        json!({ "fixture": files.stdio("task", &["--helper-child"]) }),
    );
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("mcp__fixture__pid", json!({})),
        FakeReply::answer("got it"),
        FakeReply::tool("mcp__fixture__sleep", json!({ "ms": 600_000 })),
        FakeReply::answer("too slow"),
    ])
    .await;
    let stats = cluster.spawn_worker(cluster.worker_config(&[
        "--mcp-config",
        &config,
        "--tool-timeout",
        "5s",
    ]));
    let mut lead_flags = model_flags(&model.base_url).to_vec();
    lead_flags.extend(["--tool-timeout", "5s"]);
    cluster.spawn_lead(cluster.lead_config(&lead_flags));
    cluster.wait_for_workers(1).await;

    // The tool list was read from a server started once and closed again.
    let discovery = files.started();
    assert_eq!(discovery.len(), 1, "{discovery:?}");
    wait_ended("the discovery server", discovery[0]).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "which process?"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let seen = tool_messages(&model.requests()[1]);
    let pids: Value = serde_json::from_str(&seen[0].1).expect("pid answers JSON");
    let pid = pids["pid"].as_u64().expect("pid") as u32;
    let helper = pids["helper"].as_u64().expect("helper pid") as u32;
    assert_eq!(
        pids["pgid"].as_u64(),
        Some(u64::from(pid)),
        "leads its group"
    );
    assert_eq!(files.started(), [discovery[0], pid]);
    wait_ended("the task's server", pid).await;
    wait_ended("the task server's helper child", helper).await;

    // A call that runs out of time: its server is closed all the same.
    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "sleep"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let calls = finished(&events);
    assert!(!calls[0].1 && calls[0].2.contains("timed_out"), "{calls:?}");
    let started = files.started();
    assert_eq!(started.len(), 3, "{started:?}");
    wait_ended("the timed-out task's server", started[2]).await;

    let counts = eventually("scopes closed", Duration::from_secs(10), || {
        let counts = stats.snapshot();
        async move { (counts.open_scopes() == 0 && counts.scopes_closed >= 2).then_some(counts) }
    })
    .await;
    assert_eq!(counts.open_resources(), 0, "{counts:?}");
    assert!(
        counts.resources_opened >= 2,
        "each call owned its server: {counts:?}"
    );
    assert_eq!(counts.close_failures, 0, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_worker_closes_its_worker_scoped_servers() {
    let cluster = TestCluster::start();
    let files = FixtureFiles::new(&cluster);
    let config = mcp_config(
        &cluster,
        json!({ "fixture": files.stdio("worker", &["--helper-child"]) }),
    );
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("mcp__fixture__pid", json!({})),
        FakeReply::answer("got it"),
    ])
    .await;
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(skein_worker::run_with_stats(
        cluster.worker_config(&["--mcp-config", &config]),
        shutdown.clone(),
        Arc::default(),
    ));
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));
    cluster.wait_for_workers(1).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "which process?"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let seen = tool_messages(&model.requests()[1]);
    let pids: Value = serde_json::from_str(&seen[0].1).expect("pid answers JSON");
    let pid = pids["pid"].as_u64().expect("pid") as u32;
    let helper = pids["helper"].as_u64().expect("helper pid") as u32;
    assert_eq!(files.started(), [pid]);
    assert!(
        !ended(pid) && !ended(helper),
        "the server outlives the task"
    );

    shutdown.cancel();
    worker
        .await
        .expect("the worker task ends")
        .expect("the worker stops cleanly");
    // Closed (and reaped) before `run` returned; the helper died with the process group.
    assert!(ended(pid), "the server is gone once the worker has stopped");
    wait_ended("the server's helper child", helper).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_is_reached_by_url_with_its_headers() {
    let cluster = TestCluster::start();
    let port = free_port();
    let mut command = std::process::Command::new(FIXTURE);
    command.args(["--http", &port.to_string()]);
    let _server = ChildProcess::spawn(command, cluster.dir.join("mcp-http.log"));
    eventually(
        "the HTTP fixture to listen",
        Duration::from_secs(15),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(drop)
        },
    )
    .await;
    let config = mcp_config(
        &cluster,
        json!({ "remote": {
            "type": "http",
            "url": format!("http://127.0.0.1:{port}/mcp"),
            "headers": {"X-Fixture-Token": "tok-123"},
        }}),
    );
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            ("mcp__remote__echo".into(), json!({ "text": "over http" })),
            (
                "mcp__remote__header".into(),
                json!({ "name": "x-fixture-token" }),
            ),
            (
                "mcp__remote__fail".into(),
                json!({ "message": "no such row" }),
            ),
        ]),
        FakeReply::answer("done"),
    ])
    .await;
    start(&cluster, &model, &["--mcp-config", &config]).await;

    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "over http"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    // Calls finish in any order.
    let mut calls: Vec<(String, bool)> = finished(&events)
        .into_iter()
        .map(|(tool, ok, _)| (tool, ok))
        .collect();
    calls.sort();
    assert_eq!(
        calls,
        [
            ("mcp__remote__echo".to_owned(), true),
            ("mcp__remote__fail".to_owned(), false),
            ("mcp__remote__header".to_owned(), true)
        ]
    );
    let seen = tool_messages(&model.requests()[1]);
    assert_eq!(seen[0].1, "over http", "{seen:?}");
    assert_eq!(seen[1].1, "tok-123", "{seen:?}");
    assert!(seen[2].1.contains("no such row"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_bad_mcp_config_refuses_to_start() {
    let cluster = TestCluster::start();
    let refusal = |config: String| {
        let cfg = cluster.worker_config(&["--mcp-config", &config]);
        async move {
            let outcome = tokio::time::timeout(
                Duration::from_secs(60),
                skein_worker::run_with_stats(cfg, CancellationToken::new(), Arc::default()),
            )
            .await
            .expect("the worker gives up instead of hanging");
            outcome
                .expect_err("the worker refuses to start")
                .to_string()
        }
    };
    let both = mcp_config(
        &cluster,
        json!({ "twice": {"command": FIXTURE, "url": "http://127.0.0.1:1/mcp"} }),
    );
    let message = refusal(both).await;
    assert!(
        message.contains("\"twice\"") && message.contains("both command and url"),
        "{message}"
    );
    let unknown = mcp_config(&cluster, json!({ "s": {"command": FIXTURE, "argz": []} }));
    let message = refusal(unknown).await;
    assert!(
        message.contains("\"s\"") && message.contains("argz"),
        "{message}"
    );
    let missing = cluster.dir.join("no-such-mcp.json").display().to_string();
    let message = refusal(missing.clone()).await;
    assert!(message.contains(&missing), "{message}");
    let not_a_program = mcp_config(
        &cluster,
        json!({ "ghost": {"command": cluster.dir.join("no-such-program")} }),
    );
    let message = refusal(not_a_program).await;
    assert!(
        message.contains("\"ghost\"") && message.contains("cannot run"),
        "{message}"
    );
    assert!(
        cluster
            .store()
            .await
            .live_workers()
            .await
            .expect("registry")
            .is_empty(),
        "no worker announced itself"
    );
}
