//! A worker of one's own (`examples/custom-worker`): typed tools registered with the builder are
//! announced with their derived schemas and effects, and a turn driven by the model through the
//! real OpenAI-compatible provider runs them on it.

use serde_json::json;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_example_custom_worker::{Ledger, WordCount};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{unique, FakeOpenAi, FakeReply};
use skein_worker::WorkerBuilder;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_the_tools_of_a_worker_built_with_the_builder() {
    let cluster = TestCluster::start();
    let ledger_file = cluster.dir.join("ledger.tsv");
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            ("word_count".into(), json!({ "text": "one two three" })),
            (
                "ledger_append".into(),
                json!({ "entry": "coffee", "cents": 350 }),
            ),
        ]),
        FakeReply::Answer("counted and recorded".into()),
    ])
    .await;
    // Only the builder's tools: no built-in ones, no subagents.
    let cfg = cluster.worker_config(&["--tools", "", "--subagents", "false"]);
    let worker = WorkerBuilder::new()
        .tool(WordCount)
        .tool(Ledger::new(&ledger_file))
        .config(cfg)
        .run(cluster.shutdown_token());
    tokio::spawn(async move { worker.await.expect("the custom worker runs") });
    // The ledger is destructive: the agent allows it by rule, as a user would.
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nallow = [\"ledger_append\"]\n+++\nYou keep the books.\n",
    )
    .expect("AGENTS.md written");
    let mut lead_flags = model_flags(&model.base_url).to_vec();
    lead_flags.extend(["--agents-dir", agents.to_str().expect("utf-8 path")]);
    cluster.start_nodes(0, &lead_flags).await;
    cluster.wait_for_workers(1).await;

    let workers = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("registry");
    let specs = &workers[0].tools;
    let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["ledger_append", "word_count"]);
    assert!(specs[0].effects.destructive && !specs[0].effects.read_only);
    assert!(specs[1].effects.read_only);
    assert_eq!(specs[0].parameters["required"], json!(["entry", "cents"]));

    let task = submission("acme", &unique("s"), "count and record");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("counted and recorded"));
    let mut finished: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished {
                tool,
                ok: true,
                preview,
                ..
            } => Some((tool.clone(), preview.clone())),
            _ => None,
        })
        .collect();
    finished.sort();
    assert_eq!(
        finished,
        [
            (
                "ledger_append".to_owned(),
                "recorded: coffee (350 cents)".to_owned()
            ),
            ("word_count".to_owned(), "3 words".to_owned())
        ],
        "{events:?}"
    );
    // The model sent both results back in its order.
    let follow_up = model
        .requests()
        .last()
        .expect("a second request")
        .to_string();
    assert!(follow_up.contains("3 words") && follow_up.contains("recorded: coffee"));

    let entries = Ledger::new(&ledger_file)
        .entries()
        .expect("ledger readable");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (key, entry, cents) = &entries[0];
    assert_eq!((entry.as_str(), *cents), ("coffee", 350));
    assert_eq!(key.len(), 36, "a UUID idempotency key: {key}");
}
