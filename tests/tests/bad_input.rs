//! Bad input gets a clear error and nothing is lost: malformed and oversized submissions, unknown
//! agents and tools, invalid tool arguments, undecodable tool tasks, unreachable servers.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use futures::StreamExt;
use serde_json::json;
use skein_common::client::ClientError;
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::protocol::{EventKind, FailureKind, FinalResult, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{free_port, unique, FakeOpenAi, FakeReply};

/// Publishes raw bytes as a submission (on session `raw` of `tenant`) with a task id header, then
/// waits for that task's final result on its event subject.
async fn submit_raw(
    cluster: &TestCluster,
    tenant: &str,
    task_id: &str,
    payload: Vec<u8>,
) -> FinalResult {
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client);
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, task_id);
    jetstream
        .publish_with_headers(
            format!("skein.submit.{tenant}.raw"),
            headers,
            payload.into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored by JetStream");
    let events = cluster
        .client()
        .await
        .watch(tenant, task_id)
        .await
        .expect("watch");
    futures::pin_mut!(events);
    let wait = async {
        while let Some(event) = events.next().await {
            if let EventKind::Final { result } = event.expect("decodable event").event {
                return result;
            }
        }
        panic!("event stream ended without a final result");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("final result within 30s")
}

fn failure_kind(result: &FinalResult) -> Option<FailureKind> {
    result.failure.as_ref().map(|f| f.kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_submissions_end_with_clear_failures_and_the_lead_keeps_serving() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &["--max-payload", "4096"]).await;

    let malformed = submit_raw(
        &cluster,
        "acme",
        "bad-json-1",
        b"{ this is not json".to_vec(),
    )
    .await;
    assert_eq!(malformed.status, TurnStatus::Failed);
    assert_eq!(
        failure_kind(&malformed),
        Some(FailureKind::InvalidInput),
        "{malformed:?}"
    );

    let mut huge = submission("acme", &unique("s"), "x");
    huge.input = "x".repeat(10_000).into();
    huge.task_id = "too-big-1".into();
    let oversized = submit_raw(
        &cluster,
        "acme",
        "too-big-1",
        serde_json::to_vec(&huge).expect("encode"),
    )
    .await;
    assert_eq!(
        failure_kind(&oversized),
        Some(FailureKind::TooLarge),
        "{oversized:?}"
    );
    assert!(oversized
        .failure
        .as_ref()
        .is_some_and(|f| f.message.contains("4096")));

    let wrong_version = json!({"v": 9, "task_id": "v9", "tenant": "acme", "user": "u", "session": "raw", "agent": "assistant", "input": "hi"});
    let versioned = submit_raw(
        &cluster,
        "acme",
        "v9",
        serde_json::to_vec(&wrong_version).expect("encode"),
    )
    .await;
    assert_eq!(failure_kind(&versioned), Some(FailureKind::InvalidInput));
    assert!(versioned
        .failure
        .as_ref()
        .is_some_and(|f| f.message.contains("version")));

    // A task must travel on its own session's subject (ordering and tenant isolation rely on it).
    let mut misrouted = submission("acme", "other-session", "hi");
    misrouted.task_id = "misrouted-1".into();
    let payload = serde_json::to_vec(&misrouted).expect("encode");
    let misrouted = submit_raw(&cluster, "acme", "misrouted-1", payload).await;
    assert_eq!(failure_kind(&misrouted), Some(FailureKind::InvalidInput));
    assert!(misrouted
        .failure
        .as_ref()
        .is_some_and(|f| f.message.contains("skein.submit.acme.other-session")));

    // Nothing is stored under the names a refused message carries...
    let planted = cluster
        .store()
        .await
        .final_result("acme", "other-session", "misrouted-1")
        .await;
    assert!(matches!(planted, Ok(None)), "{planted:?}");
    // ...and every refused submission is kept as a dead letter for inspection.
    let letters = cluster
        .client()
        .await
        .bus()
        .dead_letters()
        .await
        .expect("dead letters");
    let refused = letters
        .iter()
        .filter(|l| l.reason.starts_with("rejected:"))
        .count();
    assert_eq!(refused, 4, "{letters:?}");

    // Nothing above stopped the lead.
    let (ok, _) = cluster
        .run(&submission("acme", &unique("s"), "still there?"))
        .await;
    assert_eq!(ok.status, TurnStatus::Completed, "{ok:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_agents_fail_the_task_and_name_the_known_ones() {
    let cluster = TestCluster::start();
    cluster.spawn_lead(cluster.lead_config(&[]));
    let mut task = submission("acme", &unique("s"), "hello");
    task.agent = "nobody".into();
    let (result, _) = cluster.run(&task).await;
    assert_eq!(failure_kind(&result), Some(FailureKind::UnknownAgent));
    assert!(result
        .failure
        .as_ref()
        .is_some_and(|f| f.message.contains("assistant")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_and_invalid_arguments_become_observations() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            ("no_such_tool".into(), json!({})),
            ("read_file".into(), json!({ "path": 5 })),
            ("write_file".into(), json!({ "path": "a.txt" })),
            (
                "read_file".into(),
                json!({ "path": "a.txt", "mode": "fast" }),
            ),
        ]),
        FakeReply::Answer("recovered".into()),
    ])
    .await;
    cluster.start_nodes(1, &model_flags(&model.base_url)).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "misuse tools"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed);
    assert_eq!(result.answer.as_deref(), Some("recovered"));
    let requests = model.requests();
    let observations: Vec<String> = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(observations.len(), 4, "{observations:?}");
    assert!(
        observations[0].starts_with("error (unknown_tool)"),
        "{}",
        observations[0]
    );
    assert!(
        observations[0].contains("read_file"),
        "lists the available tools"
    );
    for text in &observations[1..] {
        assert!(text.starts_with("error (invalid_arguments)"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_model_fails_the_turn_as_retryable() {
    let cluster = TestCluster::start();
    let dead = format!("http://127.0.0.1:{}/v1", free_port());
    cluster.start_nodes(0, &model_flags(&dead)).await;
    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "hello?"))
        .await;
    assert_eq!(result.status, TurnStatus::Failed);
    let failure = result.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::Unavailable, "{failure:?}");
    assert!(failure.retryable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_error_status_is_reported() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::Status(
        400,
        "bad request: no such model".into(),
    )])
    .await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "hello?"))
        .await;
    let failure = result.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::ModelFailed);
    assert!(!failure.retryable);
    assert!(failure.message.contains("no such model"), "{failure:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_tool_tasks_are_terminated_and_the_worker_keeps_serving() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client);
    jetstream
        .publish("skein.tool.default.read_file", "garbage".into())
        .await
        .expect("publish")
        .await
        .expect("stored");

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "work as usual"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = jetstream
        .get_stream("SKEIN_WORK")
        .await
        .expect("work stream")
        .get_consumer("skein-tools-default")
        .await
        .expect("pool consumer");
    let info = consumer.info().await.expect("consumer info");
    assert_eq!(info.num_pending, 0, "nothing left waiting");
    assert_eq!(info.num_ack_pending, 0, "nothing stuck unacknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ids_are_rejected_by_the_client_before_publishing() {
    let cluster = TestCluster::start();
    let mut task = submission("acme", &unique("s"), "hi");
    task.tenant = "a.b".into();
    let err = cluster
        .client()
        .await
        .submit(&task)
        .await
        .expect_err("rejected");
    assert!(
        matches!(err, ClientError::Rejected(ref f) if f.kind == FailureKind::InvalidInput),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_nats_or_redis_stop_start_up_with_a_clear_error() {
    let cluster = TestCluster::start();
    let dead_nats = format!("nats://127.0.0.1:{}", free_port());
    let dead_redis = format!("redis://127.0.0.1:{}/", free_port());

    // Start-up waits for its servers as long as SKEIN_STARTUP_TIMEOUT allows, then says which.
    let mut cfg = cluster.lead_config(&["--startup-timeout", "2s"]);
    cfg.nats = NatsConfig::local(dead_nats.clone());
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        skein_lead::run(cfg, Default::default()),
    )
    .await
    .expect("gives up in time")
    .expect_err("cannot run without NATS");
    assert!(err.to_string().contains(&dead_nats), "{err}");

    let mut cfg = cluster.worker_config(&["--startup-timeout", "2s"]);
    cfg.redis = RedisConfig::local(dead_redis);
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        skein_worker::run(cfg, Default::default()),
    )
    .await
    .expect("gives up in time")
    .expect_err("cannot run without Redis");
    assert!(err.to_string().contains("redis"), "{err}");
}

/// A plain NATS client forges subagent tasks: one nested deeper than workers allow, one whose
/// agent spec would loop 10,000 times. The worker trusts neither: each is refused with the rule
/// named in the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_subagent_tasks_are_checked_by_the_worker() {
    use futures::StreamExt;
    use skein_common::protocol::{
        AgentSpec, SubagentTask, TaskOrigin, ToolResult, PROTOCOL_VERSION,
    };
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client.clone());
    let task = |n: u32, depth: u32, max_iterations: u32| {
        let session = unique("s");
        SubagentTask {
            v: PROTOCOL_VERSION,
            origin: TaskOrigin {
                task_id: unique("t"),
                tenant: "acme".into(),
                user: "u".into(),
                session: session.clone(),
                workspace: session.clone(),
                deadline_ms: None,
                budget: None,
                run_budget: None,
            }
            .into(),
            call_id: format!("c{n}"),
            call_key: format!("forged:{n}"),
            child_session: format!("{session}-child"),
            agent: AgentSpec {
                name: "researcher".into(),
                description: String::new(),
                system_prompt: "forged".into(),
                model: String::new(),
                tools: vec![],
                subagents: vec![],
                max_iterations,
                permissions: Default::default(),
                skills: None,
                context_tokens: None,
                fallback_models: Vec::new(),
                planning: false,
                max_parallel_steps: None,
                max_concurrency: None,
                budget: None,
                output_schema: None,
            },
            input: "hello".into(),
            input_ref: None,
            reply_to: format!("skein.reply.forger.{n}"),
            timeout_ms: 7 * 24 * 3600 * 1000,
            depth,
            first_dispatch: true,
            skills: vec![],
        }
    };
    let mut replies = client
        .subscribe("skein.reply.forger.>")
        .await
        .expect("subscribe");
    for (n, depth, iterations) in [(1, 99, 4), (2, 1, 10_000)] {
        jetstream
            .publish(
                "skein.agent.default.researcher",
                serde_json::to_vec(&task(n, depth, iterations))
                    .expect("encodes")
                    .into(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let mut failures = std::collections::BTreeMap::new();
    while failures.len() < 2 {
        let reply = tokio::time::timeout(Duration::from_secs(20), replies.next())
            .await
            .expect("a reply for each forged task")
            .expect("subscription open");
        let result: ToolResult = serde_json::from_slice(&reply.payload).expect("a tool result");
        failures.insert(result.call_id.clone(), result.outcome.observation());
    }
    assert!(
        failures["c1"].contains("depth must be 1..=2"),
        "{failures:?}"
    );
    assert!(
        failures["c2"].contains("max_iterations must be 1..="),
        "{failures:?}"
    );
}
