//! Chaos, failures: work that is cut short or keeps failing ends cleanly. `cancel` stops a running
//! turn (session unchanged) and closes the worker's scope; deadlines stop running work and keep
//! expired work from starting; a call to an unreachable upstream is retried, dead-lettered and,
//! once the upstream is back, replayed with `skein dlq replay`.

use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::chaos::wait_for_effect;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_turn_stops_it_and_closes_the_worker_scopes() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 60000 } } ] },
        { "answer": "not reached" }
    ] }]));
    let stats = cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &["--scenario", &script]).await;
    let task = submission("acme", &unique("s"), "endless");
    let client = cluster.client().await;
    let cancel = async {
        wait_for_effect(&cluster.effects_file(), "endless", true).await;
        client
            .cancel("acme", &task.task_id, "test")
            .await
            .expect("cancel requested");
        Instant::now()
    };
    let ((result, _), asked) = tokio::join!(cluster.run(&task), cancel);
    println!(
        "cancel: final result {:?} after the request",
        asked.elapsed()
    );
    assert_eq!(result.status, TurnStatus::Cancelled, "{result:?}");
    let counts = eventually("the worker's scope closed", Duration::from_secs(10), || {
        let counts = stats.snapshot();
        async move { (counts.scopes_opened == 1 && counts.open_scopes() == 0).then_some(counts) }
    })
    .await;
    assert_eq!(counts.close_failures, 0);
    let effects = read_effects(&cluster.effects_file());
    assert_eq!(
        effects.get("endless").map(|c| (c.started, c.done)),
        Some((1, 0)),
        "the call was stopped"
    );
    let stored = cluster
        .store()
        .await
        .load("acme", &task.session)
        .await
        .expect("session loads");
    assert_eq!(
        stored.state.turns, 0,
        "a cancelled turn leaves the session as it was"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_stop_running_work_and_keep_expired_work_from_starting() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 60000 } } ] },
        { "answer": "not reached" }
    ] }]));
    let stats = cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &["--scenario", &script]).await;

    let mut running = submission("acme", &unique("s"), "bounded");
    running.deadline_ms = Some(skein_common::protocol::now_ms() + 1500);
    let (result, _) = cluster.run(&running).await;
    let failure = result.failure.expect("a failure");
    assert_eq!(
        failure.kind,
        skein_common::protocol::FailureKind::TimedOut,
        "{failure:?}"
    );

    let mut expired = submission("acme", &unique("s"), "expired");
    expired.deadline_ms = Some(skein_common::protocol::now_ms().saturating_sub(1));
    let (result, _) = cluster.run(&expired).await;
    assert_eq!(
        result.failure.map(|f| f.kind),
        Some(skein_common::protocol::FailureKind::TimedOut)
    );

    let effects = read_effects(&cluster.effects_file());
    assert_eq!(
        effects.get("bounded").map(|c| (c.started, c.done)),
        Some((1, 0)),
        "stopped at the deadline"
    );
    assert!(
        !effects.contains_key("expired"),
        "expired work never started"
    );
    let counts = eventually("scopes closed", Duration::from_secs(10), || {
        let counts = stats.snapshot();
        async move { (counts.open_scopes() == 0).then_some(counts) }
    })
    .await;
    println!("deadline: scopes {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_retried_then_dead_lettered_and_replays_once_it_is_back() {
    let cluster = TestCluster::start();
    let port = skein_tests::support::free_port();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "http_fetch", "arguments": { "url": format!("http://127.0.0.1:{port}/report") } } ] },
        { "answer": "{{observations}}" }
    ] }]));
    cluster.spawn_worker(cluster.worker_config(&[
        "--http-allow",
        "127.0.0.1",
        "--max-attempts",
        "3",
    ]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &["--scenario", &script]).await;

    let task = submission("acme", &unique("s"), "fetch the report");
    let (result, _) = cluster.run(&task).await;
    let answer = result.answer.unwrap_or_default();
    assert!(answer.starts_with("error (unavailable)"), "{answer}");

    let bus = cluster.client().await.bus().clone();
    let letters = bus.dead_letters().await.expect("dead letters");
    let letter = letters
        .iter()
        .find(|l| l.original_subject == "skein.tool.default.http_fetch")
        .expect("the call was dead-lettered");
    println!(
        "retry then dead letter: {} attempts, reason {:?}",
        letter.attempts, letter.reason
    );
    assert_eq!(letter.attempts, 3);

    // The operator inspects the dead letters with the CLI...
    let dlq = |args: &[&str]| {
        let mut all = vec![
            "dlq",
            "--nats-url",
            cluster.nats.url.as_str(),
            "--redis-url",
            cluster.redis.url.as_str(),
        ];
        all.extend_from_slice(args);
        let out = std::process::Command::new(NODE)
            .args(&all)
            .output()
            .expect("skein dlq runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listing = dlq(&["list"]);
    assert!(
        listing.contains("skein.tool.default.http_fetch") && listing.contains("3 attempts"),
        "{listing}"
    );
    let shown: serde_json::Value =
        serde_json::from_str(&dlq(&["show", &letter.seq.to_string()])).expect("show prints JSON");
    assert_eq!(shown["message"]["tool"], "http_fetch");

    // ...and once the upstream is back, replays it.
    let _upstream = skein_tests::support::slow_http::SlowHttp::start_on(port, Duration::ZERO).await;
    let seq = letter.seq.to_string();
    dlq(&["replay", &seq]);
    let store = cluster.store().await;
    let key = skein_common::protocol::call_key(&task.task_id, 1, "call_t1_s1_0");
    let replayed = eventually(
        "the replayed call's result",
        Duration::from_secs(20),
        || {
            let store = store.clone();
            let key = key.clone();
            let session = task.session.clone();
            async move {
                let recorded = store.recorded_result("acme", &session, &key).await.ok()??;
                recorded.outcome.is_ok().then_some(recorded)
            }
        },
    )
    .await;
    assert!(replayed
        .outcome
        .observation()
        .contains("slow answer for /report"));
    assert!(
        bus.dead_letter_at(letter.seq)
            .await
            .expect("dlq readable")
            .is_none(),
        "the letter is gone"
    );
    let missing = std::process::Command::new(NODE)
        .args([
            "dlq",
            "--nats-url",
            &cluster.nats.url,
            "--redis-url",
            &cluster.redis.url,
            "remove",
            &seq,
        ])
        .output()
        .expect("skein dlq runs");
    assert!(
        !missing.status.success(),
        "removing a letter that is gone is an error"
    );
    dlq(&["purge"]);
    assert_eq!(dlq(&["list"]).trim(), "no dead letters");
}
