//! Every task's resource scope is closed, whatever the outcome: success, error or timeout.

use std::time::Duration;

use serde_json::json;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::slow_http::SlowHttp;
use skein_tests::support::{eventually, unique, FakeOpenAi, FakeReply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_close_on_success_error_and_timeout() {
    let cluster = TestCluster::start();
    let slow = SlowHttp::start(Duration::from_secs(5)).await;
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            (
                "write_file".into(),
                json!({ "path": "ok.txt", "content": "fine" }),
            ),
            ("read_file".into(), json!({ "path": "missing.txt" })),
            (
                "http_fetch".into(),
                json!({ "url": format!("{}/never", slow.base_url) }),
            ),
        ]),
        FakeReply::Answer("done".into()),
    ])
    .await;
    let stats = cluster.spawn_worker(cluster.worker_config(&[
        "--http-allow",
        "127.0.0.1",
        "--tool-timeout",
        "500ms",
    ]));
    cluster.spawn_lead(cluster.lead_config(&[
        "--model-provider",
        "openai",
        "--model-base-url",
        &model.base_url,
        "--tool-timeout",
        "500ms",
    ]));
    cluster.wait_for_workers(1).await;

    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "three outcomes"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed);
    let outcomes: Vec<(String, bool, String)> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished {
                tool, ok, preview, ..
            } => Some((tool.clone(), *ok, preview.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(outcomes[0].1, "write succeeded: {outcomes:?}");
    assert!(
        !outcomes[1].1 && outcomes[1].2.contains("tool_failed"),
        "read failed: {outcomes:?}"
    );
    assert!(
        !outcomes[2].1 && outcomes[2].2.contains("timed_out"),
        "fetch timed out: {outcomes:?}"
    );

    let counts = eventually("all scopes closed", Duration::from_secs(10), || {
        let counts = stats.snapshot();
        async move { (counts.scopes_closed == 3).then_some(counts) }
    })
    .await;
    assert_eq!(counts.scopes_opened, 3, "{counts:?}");
    assert_eq!(counts.open_scopes(), 0, "{counts:?}");
    assert_eq!(counts.open_resources(), 0, "{counts:?}");
    assert_eq!(counts.close_failures, 0, "{counts:?}");
}
