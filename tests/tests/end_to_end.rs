//! The whole path through real processes and servers: submit → lead → model → tool and subagent
//! tasks on workers → answer.

use std::time::Duration;

use serde_json::{json, Value};
use skein_common::protocol::{child_session_id, EventKind, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::slow_http::SlowHttp;
use skein_tests::support::{unique, ChildProcess, FakeOpenAi, FakeReply};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

fn node(cluster: &TestCluster, role: &str, extra: &[&str], log: &str) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(cluster.process_args(role)).args(extra);
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

fn finished_tools(events: &[TurnEvent]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished {
                tool,
                ok,
                worker_id,
                ..
            } => Some((tool.clone(), *ok, worker_id.clone())),
            _ => None,
        })
        .collect()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parallel_tool_calls_run_on_two_worker_processes_and_return_in_order() {
    let cluster = TestCluster::start();
    let slow = SlowHttp::start(Duration::from_millis(400)).await;
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            (
                "http_fetch".into(),
                json!({ "url": format!("{}/first", slow.base_url) }),
            ),
            (
                "http_fetch".into(),
                json!({ "url": format!("{}/second", slow.base_url) }),
            ),
        ]),
        FakeReply::Answer("both pages fetched".into()),
    ])
    .await;
    let worker_flags = ["--concurrency", "1", "--http-allow", "127.0.0.1"];
    let _w1 = node(&cluster, "worker", &worker_flags, "worker-1.log");
    let _w2 = node(&cluster, "worker", &worker_flags, "worker-2.log");
    let _lead = node(
        &cluster,
        "lead",
        &[
            "--model-provider",
            "openai",
            "--model-base-url",
            &model.base_url,
            "--model-api-key",
            "sk-test-secret",
        ],
        "lead.log",
    );
    cluster.wait_for_workers(2).await;

    let task = submission("acme", &unique("s"), "fetch two pages");
    let (result, events) = cluster.run(&task).await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("both pages fetched"));
    let finished = finished_tools(&events);
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert!(
        finished
            .iter()
            .all(|(tool, ok, _)| tool == "http_fetch" && *ok),
        "{finished:?}"
    );
    assert_ne!(
        finished[0].2, finished[1].2,
        "each worker process ran one call: {finished:?}"
    );

    // The model saw both results, in the order it asked for them.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let asked: Vec<String> = requests[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "assistant"))
        .and_then(|m| m["tool_calls"].as_array())
        .map(|calls| {
            calls
                .iter()
                .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    let observed = tool_messages(&requests[1]);
    assert_eq!(
        observed
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>(),
        asked
    );
    assert!(
        observed[0].1.contains("/first") && observed[1].1.contains("/second"),
        "{observed:?}"
    );
    // The real provider sent the key, and the tools the workers announced.
    assert!(model
        .auth_headers()
        .iter()
        .all(|h| h.as_deref() == Some("Bearer sk-test-secret")));
    let tools: Vec<&str> = requests[0]["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        tools.contains(&"http_fetch") && tools.contains(&"read_file"),
        "{tools:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_turn_of_a_session_sees_the_first() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::Answer("the capital is Paris".into()),
        FakeReply::Answer("you asked about France".into()),
    ])
    .await;
    cluster.spawn_worker(cluster.worker_config(&[]));
    cluster.spawn_lead(cluster.lead_config(&[
        "--model-provider",
        "openai",
        "--model-base-url",
        &model.base_url,
    ]));
    cluster.wait_for_workers(1).await;

    let session = unique("s");
    let (first, _) = cluster
        .run(&submission(
            "acme",
            &session,
            "what is the capital of France?",
        ))
        .await;
    let (second, _) = cluster
        .run(&submission("acme", &session, "what did I ask?"))
        .await;
    assert_eq!(first.status, TurnStatus::Completed);
    assert_eq!(second.answer.as_deref(), Some("you asked about France"));

    let requests = model.requests();
    let history = requests[1]["messages"].to_string();
    assert!(
        history.contains("what is the capital of France?"),
        "{history}"
    );
    assert!(history.contains("the capital is Paris"), "{history}");
    let stored = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("session loads");
    assert_eq!(stored.state.turns, 2);
    assert_eq!(stored.version, 2);
    assert_eq!(
        stored.state.history.len(),
        4,
        "two user messages and two answers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_runs_on_a_worker_and_its_answer_returns_to_the_parent() {
    let cluster = TestCluster::start();
    // The bundled scripted scenario: the assistant writes a note and spawns the researcher, whose
    // own tool call (list_files) is dispatched to workers again.
    cluster.spawn_worker(cluster.worker_config(&[]));
    cluster.spawn_worker(cluster.worker_config(&[]));
    cluster.spawn_lead(cluster.lead_config(&[]));
    cluster.wait_for_workers(2).await;

    let session = unique("s");
    let task = submission("acme", &session, "take a note and look around");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("The workspace holds:"),
        "the researcher's answer reached the parent: {answer}"
    );

    let spawn_call = events
        .iter()
        .find_map(|e| match &e.event {
            EventKind::ToolFinished {
                tool,
                ok: true,
                call_id,
                ..
            } if tool == "spawn_agent" => Some(call_id.clone()),
            _ => None,
        })
        .expect("spawn_agent finished successfully");
    let child_source = format!("subagent:{spawn_call}");
    assert!(
        events.iter().any(|e| e.source == child_source
            && matches!(&e.event, EventKind::ToolFinished { tool, ok: true, .. } if tool == "list_files")),
        "the child's own tool call ran and streamed its events"
    );
    let child = cluster
        .store()
        .await
        .load("acme", &child_session_id(&session, &spawn_call))
        .await
        .expect("child session loads");
    assert_eq!(
        child.state.turns, 1,
        "the child session derived from the parent's holds the child turn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_escapes_are_denied_through_the_whole_path() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            (
                "read_file".into(),
                json!({ "path": "../../../../etc/passwd" }),
            ),
            (
                "write_file".into(),
                json!({ "path": "/tmp/skein-escape", "content": "x" }),
            ),
            (
                "list_files".into(),
                json!({ "path": "notes/../../other-session" }),
            ),
        ]),
        FakeReply::Answer("done".into()),
    ])
    .await;
    cluster.spawn_worker(cluster.worker_config(&[]));
    cluster.spawn_lead(cluster.lead_config(&[
        "--model-provider",
        "openai",
        "--model-base-url",
        &model.base_url,
    ]));
    cluster.wait_for_workers(1).await;

    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "escape"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed);
    let finished = finished_tools(&events);
    assert_eq!(finished.len(), 3);
    assert!(finished.iter().all(|(_, ok, _)| !ok), "{finished:?}");
    let observed = tool_messages(&model.requests()[1]);
    assert_eq!(observed.len(), 3);
    for (_, text) in &observed {
        assert!(text.starts_with("error (denied)"), "{text}");
    }
    assert!(!std::path::Path::new("/tmp/skein-escape").exists());
}
