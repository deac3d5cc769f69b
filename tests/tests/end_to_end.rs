//! The whole path through real processes and servers: submit → lead → model → tool and subagent
//! tasks on workers → answer.

use std::time::Duration;

use serde_json::{json, Value};
use skein_common::protocol::{child_session_id, EventKind, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
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
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

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
    // The bundled scripted scenario: the assistant writes a note and plans three research steps
    // (two at once, the third after both) that the researcher runs; its own tool call
    // (list_files) is dispatched to workers again.
    cluster.start_nodes(2, &[]).await;

    let session = unique("s");
    let task = submission("acme", &session, "take a note and look around");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("The workspace holds:"),
        "the researcher's answer reached the parent: {answer}"
    );

    let step_calls: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::PlanStepStarted { call_id, .. } => Some(call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        step_calls.len(),
        3,
        "the three plan steps ran: {step_calls:?}"
    );
    let spawn_call = step_calls[0].clone();
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
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iteration_limit_ends_in_a_summary_not_an_error() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![("list_files".into(), json!({}))]),
        FakeReply::ToolCalls(vec![("list_files".into(), json!({}))]),
        FakeReply::Answer("summary: looked twice, found nothing".into()),
    ])
    .await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

    let mut task = submission("acme", &unique("s"), "keep looking");
    task.overrides = Some(Box::new(skein_common::protocol::AgentOverrides {
        max_iterations: Some(2),
        ..Default::default()
    }));
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert!(result.limit_reached);
    assert_eq!(result.iterations, 3, "two steps and the summary");
    assert_eq!(
        result.answer.as_deref(),
        Some("summary: looked twice, found nothing")
    );
    let last = &model.requests()[2];
    assert!(
        last.get("tools").is_none(),
        "the summary call offers no tools: {last}"
    );
    assert!(
        last["messages"].to_string().contains("steps allowed"),
        "the model is told why"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmitting_a_task_id_runs_the_turn_once() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::Answer("only once".into())]).await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let task = submission("acme", &unique("s"), "hello");
    let (first, _) = cluster.run(&task).await;
    // Within the broker's dedup window the copy is dropped at publish; after it, the lead answers
    // from the stored final result. Either way the turn does not run again.
    let (second, _) = cluster.run(&task).await;
    assert_eq!(first.answer.as_deref(), Some("only once"));
    assert_eq!(second, first);
    assert_eq!(model.requests().len(), 1, "one model call in all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drains_on_sigterm_and_leaves_the_registry() {
    let cluster = TestCluster::start();
    let mut worker = node(&cluster, "worker", &["--grace", "5s"], "worker.log");
    cluster.wait_for_workers(1).await;
    worker.sigterm();
    let status = worker.wait_exit(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "clean exit: {status:?}\n{}",
        worker.log()
    );
    let live = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("registry readable");
    assert!(
        live.is_empty(),
        "the drained worker left the registry: {live:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_whose_models_reuse_call_ids_get_their_own_results() {
    // The scripted model gives every session the same call ids (call_t1_s1_0, ...): results must
    // still reach the turn that dispatched the call.
    let cluster = TestCluster::start();
    cluster.start_nodes(2, &[]).await;

    let turns = (0..6).map(|_| {
        let task = submission("acme", &unique("s"), "take a note");
        let cluster = &cluster;
        async move { cluster.run(&task).await }
    });
    for (result, events) in futures::future::join_all(turns).await {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let finished = finished_tools(&events);
        assert!(finished.iter().all(|(_, ok, _)| *ok), "{finished:?}");
        assert!(result.answer.unwrap_or_default().contains("notes/"));
    }
}
