//! Effects applied once: a call's run in progress keeps its redelivered copies waiting for its
//! result, and every run of a call carries the same idempotency key, so an outside service can
//! apply a call that ran twice (its first worker killed mid-call) once.

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::chaos::{scenario, wait_for_effect};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::proxy::TcpProxy;
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::unique;

/// A worker cut off from the broker mid-call keeps running it (Redis is still reachable); the
/// broker redelivers the call to another worker after the ack wait, and that copy waits for the
/// running one's result instead of applying the effect a second time beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_redelivered_while_its_call_still_runs_waits_for_that_runs_result() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 6000 } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    );
    cluster
        .start_nodes(0, &["--scenario", script.to_str().expect("utf-8 path")])
        .await;
    let proxy = TcpProxy::start(cluster.nats.port()).await;
    let mut cut_off = cluster.worker_config(&["--ack-wait", "2s"]);
    cut_off.nats.url = format!("nats://127.0.0.1:{}", proxy.port);
    cluster.spawn_test_worker(cut_off);
    cluster.wait_for_workers(1).await;

    let task = submission("acme", &unique("s"), "partitioned");
    let running = cluster.run(&task);
    let partition = async {
        wait_for_effect(&cluster.effects_file(), "partitioned", true).await;
        // The only worker runs the call; a second one joins, then the first loses the broker.
        cluster.spawn_test_worker(cluster.worker_config(&["--ack-wait", "2s"]));
        cluster.wait_for_workers(2).await;
        proxy.cut();
    };
    let ((result, _events), ()) = tokio::join!(running, partition);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("effect partitioned done"));
    let effects = read_effects(&cluster.effects_file());
    let count = effects.get("partitioned").expect("the effect ran");
    println!("partitioned worker: effect started {} done {}", count.started, count.done);
    assert_eq!(
        (count.started, count.done),
        (1, 1),
        "the redelivered copy waited for the running call instead of running it again"
    );
    drop(proxy);
}
