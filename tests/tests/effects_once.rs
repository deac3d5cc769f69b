//! Effects applied once: a call's run in progress keeps its redelivered copies waiting for its
//! result, and every run of a call carries the same idempotency key, so an outside service can
//! apply a call that ran twice (its first worker killed mid-call) once.

use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::chaos::{run_all, scenario, wait_for_effect};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::effects_http::EffectsHttp;
use skein_tests::support::proxy::TcpProxy;
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// A worker process whose only tool is `http_request`, allowed to reach this machine.
fn http_worker(cluster: &TestCluster, log: &str) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(cluster.process_args("worker")).args([
        "--tools",
        "http_request",
        "--http-allow",
        "127.0.0.1",
        "--http-allow-private",
        "true",
        "--ack-wait",
        "2s",
        "--concurrency",
        "8",
    ]);
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

/// 24 turns, each one slow effect sent with `http_request` to a service that applies each
/// idempotency key once; one of the two workers is killed (`-9`) while both hold calls in flight.
/// Its calls run again on the other worker with the same keys: every effect is applied exactly
/// once and every turn completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_of_calls_rerun_after_a_worker_is_killed_are_applied_once() {
    const TURNS: usize = 24;
    let cluster = TestCluster::start();
    let service = EffectsHttp::start(Duration::from_millis(1500)).await;
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "http_request", "arguments": {
                "method": "POST",
                "url": format!("{}/effects", service.base_url),
                "json": { "effect": "{{input}}" }
            } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    );
    // `http_request` is destructive: the agent allows it by rule.
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nallow = [\"http_request\"]\n+++\nYou apply effects.\n",
    )
    .expect("AGENTS.md written");
    let mut doomed = http_worker(&cluster, "worker-doomed.log");
    let _survivor = http_worker(&cluster, "worker-survivor.log");
    cluster.wait_for_workers(2).await;
    cluster
        .start_nodes(
            0,
            &[
                "--scenario",
                script.to_str().expect("utf-8 path"),
                "--agents-dir",
                agents.to_str().expect("utf-8 path"),
            ],
        )
        .await;

    let tasks: Vec<_> = (0..TURNS)
        .map(|i| submission("acme", &unique("s"), &format!("effect{i}")))
        .collect();
    let started = Instant::now();
    let running = run_all(&cluster, &tasks);
    let killer = async {
        // Both workers hold calls (8 each at most): kill one mid-call.
        eventually(
            "calls in flight on both workers",
            Duration::from_secs(30),
            || async { (service.counts().in_flight > 8).then_some(()) },
        )
        .await;
        doomed.kill();
    };
    let (results, ()) = tokio::join!(running, killer);

    let counts = service.counts();
    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    println!(
        "killed worker: turns {TURNS} completed {completed} in {:?}; requests {} for {} keys, \
         keys sent more than once {}, effects applied {}, without key {}",
        started.elapsed(),
        counts.requests_by_key.values().sum::<u32>(),
        counts.requests_by_key.len(),
        counts.repeated_keys(),
        counts.applied_by_effect.values().sum::<u32>(),
        counts.without_key,
    );
    for (task, (result, _)) in tasks.iter().zip(&results) {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let expected = format!("applied {}", task.input.text());
        assert!(
            result
                .answer
                .as_deref()
                .is_some_and(|a| a.contains(&expected)),
            "{result:?}"
        );
        assert_eq!(
            counts.applied_by_effect.get(&task.input.text()),
            Some(&1),
            "effect {} applied exactly once",
            task.input.text()
        );
    }
    assert_eq!(counts.without_key, 0, "every request carried its key");
    assert_eq!(counts.requests_by_key.len(), TURNS, "one key per call");
    assert!(
        counts.repeated_keys() >= 1,
        "the killed worker held calls that ran again elsewhere: {counts:?}"
    );
}

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
    println!(
        "partitioned worker: effect started {} done {}",
        count.started, count.done
    );
    assert_eq!(
        (count.started, count.done),
        (1, 1),
        "the redelivered copy waited for the running call instead of running it again"
    );
    drop(proxy);
}
