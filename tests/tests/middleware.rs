//! An embedder's middleware on a real cluster: the example `guarded-lead` (examples/guarded-lead)
//! adds a tool layer that refuses calls whose arguments mention a blocked word. Its refusal is an
//! observation the model sees; the call never reaches a worker; other calls run as usual.

use serde_json::json;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::unique;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guarded_lead_blocks_calls_that_mention_its_word() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [
            { "name": "write_file", "arguments": { "path": "deploy.txt", "content": "ship to production now" } },
            { "name": "write_file", "arguments": { "path": "notes.txt", "content": "ship to staging" } }
        ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    cluster.spawn_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    // Workspace edits would ask in the default mode: this agent accepts them.
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nmode = \"accept_edits\"\n+++\nYou write files.\n",
    )
    .expect("AGENTS.md written");
    let cfg = cluster.lead_config(&[
        "--scenario",
        &script,
        "--agents-dir",
        agents.to_str().expect("utf-8 path"),
    ]);
    let stop = CancellationToken::new();
    let lead = tokio::spawn(skein_example_guarded_lead::run(
        cfg,
        "production",
        stop.clone(),
    ));

    let task = submission("acme", &unique("s"), "ship it");
    let (result, events) = cluster.run(&task).await;
    stop.cancel();
    lead.await.expect("lead task").expect("lead ran");

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("blocked by the guarded lead") && answer.contains("\"production\""),
        "{answer}"
    );
    let finished: Vec<(String, bool, String)> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished {
                call_id,
                ok,
                worker_id,
                ..
            } => Some((call_id.clone(), *ok, worker_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 2, "{finished:?}");
    let blocked: Vec<_> = finished.iter().filter(|(_, ok, _)| !ok).collect();
    assert_eq!(blocked.len(), 1, "one call blocked: {finished:?}");
    assert!(
        blocked[0].2.is_empty(),
        "the blocked call reached no worker"
    );
    assert!(
        cluster
            .workspace_file("acme", &task.session, "notes.txt")
            .await
            .is_some(),
        "the other call ran"
    );
    assert!(
        cluster
            .workspace_file("acme", &task.session, "deploy.txt")
            .await
            .is_none(),
        "the blocked call did not"
    );
}
