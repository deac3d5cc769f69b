//! Payloads by reference: a tool result far over the output cap (5 MB) completes its turn; the
//! model sees its head and tail and where the whole is, and the whole is in the session's
//! workspace for the file tools.

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::chaos::scenario;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::unique;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_megabyte_tool_result_completes_its_turn_by_reference() {
    const BYTES: usize = 5 * 1024 * 1024;
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "big_output", "arguments": { "bytes": BYTES } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    );
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster
        .start_nodes(0, &["--scenario", script.to_str().expect("utf-8 path")])
        .await;
    cluster.wait_for_workers(1).await;

    let task = submission("acme", &unique("s"), "make it big");
    let (result, _events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.expect("an answer");
    assert!(
        answer.len() < 70 * 1024,
        "the model saw a preview: {} bytes",
        answer.len()
    );
    assert!(
        answer.starts_with("HEAD") && answer.ends_with("TAIL"),
        "{answer:.300}"
    );
    assert!(
        answer.contains(&format!("the whole output ({BYTES} bytes)")),
        "{answer:.300}"
    );
    let path = answer
        .split_whitespace()
        .find(|word| word.starts_with(".skein/results/"))
        .expect("the preview names the file")
        .trim_end_matches(':');
    let whole = cluster
        .workspace_file("acme", &task.session, path)
        .await
        .expect("the whole output is in the workspace");
    assert_eq!(whole.len(), BYTES);
    assert!(whole.starts_with("HEAD") && whole.ends_with("TAIL"));
}
