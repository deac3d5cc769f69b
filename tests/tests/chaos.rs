//! Chaos: real processes are killed, stopped and restarted while work flows, and every promise is
//! checked — nothing lost, finished calls not run again, turns in order, poison set aside. Each
//! test prints its figures.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::proxy::TcpProxy;
use skein_tests::support::test_tools::{read_effects, EFFECTS_FILE_ENV};
use skein_tests::support::{eventually, unique, ChildProcess};
use skein_tests::support::{FakeOpenAi, FakeReply, NatsServer};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

fn scenario(cluster: &TestCluster, assistant_turns: serde_json::Value) -> PathBuf {
    PathBuf::from(cluster.scenario(assistant_turns))
}

fn effects_file(cluster: &TestCluster) -> PathBuf {
    cluster.effects_file()
}

/// A worker process that also provides the test tools.
fn test_worker(cluster: &TestCluster, extra: &[&str], log: &str) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    let mut args = cluster.process_args("worker");
    args[0] = "test-worker".into();
    cmd.args(args)
        .args(extra)
        .env(EFFECTS_FILE_ENV, effects_file(cluster));
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

fn lead_process(cluster: &TestCluster, extra: &[&str], log: &str) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(cluster.process_args("lead")).args(extra);
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

async fn wait_for_effect(path: &Path, key: &str, started: bool) {
    eventually(
        &format!("effect {key} to start"),
        Duration::from_secs(30),
        || async {
            let counts = read_effects(path);
            let count = counts.get(key)?;
            (if started { count.started } else { count.done } > 0).then_some(())
        },
    )
    .await
}

/// Within each source, event sequence numbers grow across deliveries, so a watcher can drop
/// what it saw (by `(source, seq)`) and keep the order.
fn assert_sequences_grow(events: &[TurnEvent]) {
    let mut last: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for event in events {
        let previous = last.insert(event.source.as_str(), event.seq);
        assert!(
            previous.is_none_or(|p| p < event.seq),
            "{}: seq {} after {previous:?}",
            event.source,
            event.seq
        );
    }
}

/// Submits every task, then collects every final result (events kept per task).
async fn run_all(
    cluster: &TestCluster,
    tasks: &[skein_common::protocol::TaskSubmission],
) -> Vec<(FinalResult, Vec<TurnEvent>)> {
    futures::future::join_all(tasks.iter().map(|task| cluster.run(task))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_tasks_complete_on_another_worker() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 1500 } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    );
    let flags = ["--ack-wait", "2s", "--concurrency", "8"];
    let mut doomed = test_worker(&cluster, &flags, "worker-doomed.log");
    let _survivor = test_worker(&cluster, &flags, "worker-survivor.log");
    cluster.wait_for_workers(2).await;
    cluster
        .start_nodes(0, &["--scenario", script.to_str().expect("utf-8 path")])
        .await;

    let tasks: Vec<_> = (0..8)
        .map(|i| submission("acme", &unique("s"), &format!("job{i}")))
        .collect();
    let running = run_all(&cluster, &tasks);
    let killer = async {
        // Kill one worker while both hold calls in flight.
        wait_for_effect(&effects_file(&cluster), "job7", true).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        doomed.kill();
    };
    let (results, ()) = tokio::join!(running, killer);

    let effects = read_effects(&effects_file(&cluster));
    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    let rerun = effects.values().filter(|c| c.started > 1).count();
    println!(
        "killed worker: submitted {} completed {} lost {} effects run more than once {}",
        tasks.len(),
        completed,
        tasks.len() - completed,
        rerun
    );
    for (task, (result, _)) in tasks.iter().zip(&results) {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let expected = format!("effect {} done", task.input);
        assert_eq!(
            result.answer.as_deref(),
            Some(expected.as_str()),
            "each turn got its own result once"
        );
        assert!(
            effects.get(&task.input).is_some_and(|c| c.done >= 1),
            "the effect of {} finished",
            task.input
        );
    }
    assert!(
        rerun >= 1,
        "the killed worker held calls that ran again elsewhere: {effects:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leads_turn_resumes_on_another_lead_without_rerunning_finished_calls() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [
                { "name": "slow_effect", "arguments": { "key": "a", "ms": 100 } },
                { "name": "slow_effect", "arguments": { "key": "b", "ms": 100 } }
            ] },
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "c", "ms": 2500 } } ] },
            { "answer": "resumed: {{observations}}" }
        ] }]),
    );
    let script = script.to_str().expect("utf-8 path");
    let _worker = test_worker(&cluster, &[], "worker.log");
    cluster.wait_for_workers(1).await;
    let lead_flags = [
        "--scenario",
        script,
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "2s",
    ];
    let mut first = lead_process(&cluster, &lead_flags, "lead-first.log");

    let task = submission("acme", &unique("s"), "resume me");
    let running = cluster.run(&task);
    let failover = async {
        // The first lead dies while step 2's call runs; a second lead takes over.
        wait_for_effect(&effects_file(&cluster), "c", true).await;
        first.kill();
        lead_process(&cluster, &lead_flags, "lead-second.log")
    };
    let ((result, events), _second) = tokio::join!(running, failover);

    let effects = read_effects(&effects_file(&cluster));
    let starts: Vec<Option<u32>> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::TurnStarted {
                resumed_at_step, ..
            } => Some(*resumed_at_step),
            _ => None,
        })
        .collect();
    println!("killed lead: turn starts {starts:?}, effects {effects:?}");
    assert_sequences_grow(&events);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(
        starts,
        vec![None, Some(2)],
        "the second lead resumed after step 2's model call"
    );
    for key in ["a", "b", "c"] {
        assert_eq!(
            effects.get(key).map(|c| c.started),
            Some(1),
            "{key} ran exactly once: {effects:?}"
        );
    }
    assert_eq!(result.iterations, 3, "no model call was repeated");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("effect a done") && answer.contains("effect c done"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leads_apply_a_burst_of_turns_of_one_session_in_order() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([{ "steps": [ { "answer": "{{input}} after {{previous_input}}" } ] }]),
    );
    let flags = ["--scenario", script.to_str().expect("utf-8 path")];
    cluster.start_nodes(0, &flags).await;
    cluster.start_nodes(0, &flags).await;

    let session = unique("s");
    let client = cluster.client().await;
    let tasks: Vec<_> = (0..12)
        .map(|i| submission("acme", &session, &format!("m{i}")))
        .collect();
    for task in &tasks {
        client.submit(task).await.expect("submitted");
    }
    let results = run_all(&cluster, &tasks).await;
    let stored = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("session loads");
    println!(
        "burst: submitted {} completed {} turns stored {}",
        tasks.len(),
        results
            .iter()
            .filter(|(r, _)| r.status == TurnStatus::Completed)
            .count(),
        stored.state.turns
    );
    assert_eq!(stored.state.turns, 12);
    assert_eq!(stored.state.history.len(), 24);
    for (i, pair) in stored.state.history.chunks(2).enumerate() {
        assert_eq!(
            pair[0].content,
            format!("m{i}"),
            "turn {i} applied in submission order"
        );
        let previous = if i == 0 {
            String::new()
        } else {
            format!("m{}", i - 1)
        };
        assert_eq!(
            pair[1].content,
            format!("m{i} after {previous}"),
            "turn {i} saw the turn before it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_and_undecodable_tasks_are_dead_lettered_and_the_cluster_keeps_serving() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        json!([
            { "steps": [
                { "tool_calls": [ { "name": "crash_worker", "arguments": {} } ] },
                { "answer": "after the poison: {{observations}}" }
            ] },
            { "steps": [ { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 10 } } ] },
                         { "answer": "still serving: {{observations}}" } ] }
        ]),
    );
    cluster
        .start_nodes(
            0,
            &[
                "--scenario",
                script.to_str().expect("utf-8 path"),
                "--max-attempts",
                "3",
            ],
        )
        .await;
    // Two workers, restarted whenever the poison kills one (as an orchestrator would).
    let flags = ["--max-attempts", "3", "--ack-wait", "1s"];
    let mut workers = [
        test_worker(&cluster, &flags, "worker-0.log"),
        test_worker(&cluster, &flags, "worker-1.log"),
    ];
    cluster.wait_for_workers(2).await;
    let restarts = std::sync::atomic::AtomicUsize::new(0);
    let session = unique("s");
    let poisoned = submission("acme", &session, "poison");
    let turn = cluster.run(&poisoned);
    let supervisor = async {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(40) {
            for (i, worker) in workers.iter_mut().enumerate() {
                if !worker.is_running() {
                    restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    *worker = test_worker(&cluster, &flags, &format!("worker-{i}-again.log"));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (result, _) = tokio::select! {
        done = turn => done,
        () = supervisor => panic!("the poisoned turn did not end"),
    };
    let answer = result.answer.clone().unwrap_or_default();
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert!(
        answer.contains("error (dead_lettered)"),
        "the turn got a clear failure: {answer}"
    );

    // An undecodable tool task is set aside too.
    let nats = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(nats);
    jetstream
        .publish("skein.tool.default.read_file", "{ not a task".into())
        .await
        .expect("publish")
        .await
        .expect("stored");

    // The cluster keeps serving.
    cluster.wait_for_workers(1).await;
    let (next, _) = cluster.run(&submission("acme", &session, "next")).await;
    assert_eq!(next.status, TurnStatus::Completed, "{next:?}");
    assert!(next.answer.unwrap_or_default().contains("effect next done"));

    let bus = skein_common::bus::Bus::connect(
        &skein_common::config::NatsConfig::local(cluster.nats.url.clone()),
        "test",
        skein_common::bus::DEFAULT_MAX_PAYLOAD,
    )
    .await
    .expect("bus");
    let letters = eventually("two dead letters", Duration::from_secs(10), || async {
        let letters = bus.dead_letters().await.ok()?;
        (letters.len() >= 2).then_some(letters)
    })
    .await;
    println!(
        "poison: worker restarts {} dead letters {:?}",
        restarts.load(std::sync::atomic::Ordering::Relaxed),
        letters
            .iter()
            .map(|l| (&l.original_subject, l.attempts, &l.reason))
            .collect::<Vec<_>>()
    );
    assert!(letters
        .iter()
        .any(|l| l.original_subject == "skein.tool.default.crash_worker" && l.attempts == 3));
    assert!(letters.iter().any(|l| l.reason.starts_with("undecodable")));
}

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

/// Scenario of the load tests: one slow call with a side effect per turn.
fn one_slow_call(cluster: &TestCluster, ms: u64) -> String {
    cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": ms } } ] },
        { "answer": "{{observations}}" }
    ] }]))
}

fn summarize(
    label: &str,
    tasks: &[skein_common::protocol::TaskSubmission],
    results: &[(FinalResult, Vec<TurnEvent>)],
    effects: &Path,
) {
    let effects = read_effects(effects);
    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    println!(
        "{label}: submitted {} completed {} lost {} effects run more than once {}",
        tasks.len(),
        completed,
        tasks.len() - completed,
        effects.values().filter(|c| c.started > 1).count()
    );
    for (task, (result, _)) in tasks.iter().zip(results) {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        assert_eq!(
            result.answer.as_deref(),
            Some(format!("effect {} done", task.input).as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_a_lead_and_a_worker_under_load_loses_nothing() {
    let cluster = TestCluster::start();
    let script = one_slow_call(&cluster, 1000);
    let lead_flags = [
        "--scenario",
        script.as_str(),
        "--grace",
        "20s",
        "--ack-wait",
        "3s",
    ];
    let worker_flags = ["--grace", "20s", "--ack-wait", "3s"];
    let mut draining_lead = lead_process(&cluster, &lead_flags, "lead-draining.log");
    let _lead = lead_process(&cluster, &lead_flags, "lead.log");
    let mut draining_worker = test_worker(&cluster, &worker_flags, "worker-draining.log");
    let _worker = test_worker(&cluster, &worker_flags, "worker.log");
    cluster.wait_for_workers(2).await;

    let tasks: Vec<_> = (0..10)
        .map(|i| submission("acme", &unique("s"), &format!("job{i}")))
        .collect();
    let running = run_all(&cluster, &tasks);
    let drain = async {
        eventually("work under way", Duration::from_secs(30), || async {
            (read_effects(&cluster.effects_file()).len() >= 4).then_some(())
        })
        .await;
        draining_lead.sigterm();
        draining_worker.sigterm();
        let lead_exit = draining_lead.wait_exit(Duration::from_secs(40)).await;
        let worker_exit = draining_worker.wait_exit(Duration::from_secs(40)).await;
        (lead_exit, worker_exit)
    };
    let (results, (lead_exit, worker_exit)) = tokio::join!(running, drain);
    summarize("sigterm", &tasks, &results, &cluster.effects_file());
    assert!(
        lead_exit.is_some_and(|s| s.success()),
        "the lead drained and exited: {lead_exit:?}"
    );
    assert!(
        worker_exit.is_some_and(|s| s.success()),
        "the worker drained and exited: {worker_exit:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_under_load_loses_nothing() {
    let mut cluster = TestCluster::start();
    let script = one_slow_call(&cluster, 1500);
    cluster.spawn_test_worker(cluster.worker_config(&["--ack-wait", "2s"]));
    cluster.wait_for_workers(1).await;
    cluster
        .start_nodes(0, &["--scenario", &script, "--ack-wait", "2s"])
        .await;

    let tasks: Vec<_> = (0..6)
        .map(|i| submission("acme", &unique("s"), &format!("job{i}")))
        .collect();
    let client = cluster.client().await;
    for task in &tasks {
        client.submit(task).await.expect("submitted");
    }
    eventually("work under way", Duration::from_secs(30), || async {
        (!read_effects(&cluster.effects_file()).is_empty()).then_some(())
    })
    .await;
    cluster.nats.restart();
    let results = run_all(&cluster, &tasks).await;
    summarize("nats restart", &tasks, &results, &cluster.effects_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_delays_turns_until_it_returns() {
    let mut cluster = TestCluster::start();
    let script = one_slow_call(&cluster, 200);
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &["--scenario", &script]).await;
    let (warm_up, _) = cluster
        .run(&submission("acme", &unique("s"), "warm-up"))
        .await;
    assert_eq!(
        warm_up.status,
        TurnStatus::Completed,
        "the lead is up before Redis goes away"
    );

    cluster.redis.stop();
    let tasks: Vec<_> = (0..4)
        .map(|i| submission("acme", &unique("s"), &format!("job{i}")))
        .collect();
    let client = cluster.client().await;
    for task in &tasks {
        client
            .submit(task)
            .await
            .expect("submitted while Redis is away");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.redis.restart();
    let results = run_all(&cluster, &tasks).await;
    summarize("redis outage", &tasks, &results, &cluster.effects_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_lead_dies_on_every_attempt_is_dead_lettered() {
    let cluster = TestCluster::start();
    let script = one_slow_call(&cluster, 2500);
    let _worker = test_worker(&cluster, &[], "worker.log");
    cluster.wait_for_workers(1).await;
    let flags = [
        "--scenario",
        script.as_str(),
        "--max-attempts",
        "1",
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "2s",
    ];
    let mut first = lead_process(&cluster, &flags, "lead-first.log");
    let task = submission("acme", &unique("s"), "doomed");
    let failover = async {
        wait_for_effect(&cluster.effects_file(), "doomed", true).await;
        first.kill();
        lead_process(&cluster, &flags, "lead-second.log")
    };
    let ((result, _), _second) = tokio::join!(cluster.run(&task), failover);
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let failure = result.failure.expect("a failure");
    assert!(
        failure.message.contains("gave up after 1 attempts"),
        "{failure:?}"
    );
    let letters = cluster
        .client()
        .await
        .bus()
        .dead_letters()
        .await
        .expect("dead letters");
    println!(
        "lead died every time: {:?}",
        letters
            .iter()
            .map(|l| (&l.original_subject, l.attempts))
            .collect::<Vec<_>>()
    );
    assert!(letters.iter().any(|l| l.original_subject
        == format!("skein.submit.acme.{}", task.session)
        && l.attempts == 1));
}

/// A lead whose final event never reaches the stream (its publishes on the event subjects are
/// refused by the broker, after the turn has completed and its result is stored): the client
/// still gets the answer, from the stored result through a lookup any lead answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_event_that_is_never_published_is_answered_from_the_stored_result() {
    let nats = NatsServer::start_with_config(
        r#"authorization {
  users = [
    { user: lead, password: lead-pw, permissions: { publish: { deny: ["skein.events.>"] } } }
    { user: client, password: client-pw }
  ]
}"#,
    );
    let cluster = TestCluster::with_nats(nats);
    let model = FakeOpenAi::start(vec![FakeReply::answer("stored, never announced")]).await;
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--nats-user", "lead", "--nats-password", "lead-pw"]);
    cluster.spawn_lead(cluster.lead_config(&flags));
    let client = SkeinClient::connect(&NatsConfig {
        user: Some("client".into()),
        password: Some("client-pw".into()),
        ..NatsConfig::local(cluster.nats.url.clone())
    })
    .await
    .expect("client connects");
    let task = submission("acme", &unique("s"), "hello");
    let mut events = Vec::new();
    let result = client
        .run(&task, Duration::from_secs(8), |e| events.push(e.clone()))
        .await
        .expect("the answer arrives although its final event was never published");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("stored, never announced"));
    // It came from the store: the stream holds nothing of the task.
    let last = client
        .bus()
        .last_event(&skein_common::subjects::events("acme", &task.task_id))
        .await
        .expect("the events stream can be read");
    assert!(last.is_none(), "{last:?}");
    assert!(matches!(
        events.last().map(|e| &e.event),
        Some(EventKind::Final { .. })
    ));
}

/// The client's own connection drops while the turn's final event is published: once it is
/// back, it reads what it missed from the stream instead of waiting on a live subscription that
/// will never see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_while_the_final_event_is_published_still_gets_it() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("published in the gap")]).await;
    let gate = model.hold();
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));
    let proxy = TcpProxy::start(cluster.nats.port()).await;
    let client = SkeinClient::connect(&NatsConfig::local(format!(
        "nats://127.0.0.1:{}",
        proxy.port
    )))
    .await
    .expect("client connects through the proxy");
    let task = submission("acme", &unique("s"), "hello");
    let running = {
        let (client, task) = (client.clone(), task.clone());
        tokio::spawn(async move { client.run(&task, Duration::from_secs(30), |_| {}).await })
    };
    // The turn is at its model call; the client is cut off; the turn ends meanwhile.
    eventually("the model call", Duration::from_secs(20), || async {
        (model.arrived() >= 1).then_some(())
    })
    .await;
    let mut disconnects = client.bus().disconnects();
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(10), disconnects.changed())
        .await
        .expect("the client notices the cut")
        .expect("the connection lives on");
    gate.add_permits(1);
    let observer = cluster.client().await;
    let subject = skein_common::subjects::events("acme", &task.task_id);
    eventually(
        "the final event in the stream",
        Duration::from_secs(20),
        || {
            let (observer, subject) = (observer.clone(), subject.clone());
            async move {
                let (_, last) = observer.bus().last_event(&subject).await.ok()??;
                matches!(last.event, EventKind::Final { .. }).then_some(())
            }
        },
    )
    .await;
    proxy.restore();
    let result = running
        .await
        .expect("the client task ends")
        .expect("the answer arrives after the gap");
    assert_eq!(result.answer.as_deref(), Some("published in the gap"));
}

/// The worker running a subagent is killed with -9 while the child turn's second call runs.
/// Another worker takes the subagent task over and resumes the child turn from its checkpoint:
/// the child's finished call does not run again and its model is not asked again for the steps
/// it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_subagent_resumes_from_its_checkpoint() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nname = \"assistant\"\ntools = [\"*\"]\nmax_iterations = 4\n+++\nDelegate.\n",
    )
    .expect("lead agent");
    std::fs::write(
        agents.join("subagents").join("helper.md"),
        "+++\nname = \"helper\"\ndescription = \"does the work\"\ntools = [\"slow_effect\"]\nmax_iterations = 4\n+++\nWork.\n",
    )
    .expect("subagent");
    let scenario = cluster.dir.join("subagent-scenario.json");
    std::fs::write(
        &scenario,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": "helper", "task": "work" } } ] },
                { "answer": "lead saw {{observations}}" }
            ] } ] },
            "helper": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "sub-a", "ms": 50 } } ] },
                { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "sub-b", "ms": 2500 } } ] },
                { "answer": "helper saw {{observations}}" }
            ] } ] }
        } })
        .to_string(),
    )
    .expect("scenario");
    let scenario = scenario.to_str().expect("utf-8 path");
    let agents = agents.to_str().expect("utf-8 path");
    let subagents = ["--scenario", scenario, "--ack-wait", "2s"];
    let tools_only = [
        "--scenario",
        scenario,
        "--ack-wait",
        "2s",
        "--subagents",
        "false",
    ];
    let mut first = test_worker(&cluster, &subagents, "worker-first.log");
    let _tools = test_worker(&cluster, &tools_only, "worker-tools.log");
    cluster.wait_for_workers(2).await;
    let _lead = lead_process(
        &cluster,
        &["--scenario", scenario, "--agents-dir", agents],
        "lead.log",
    );

    let task = submission("acme", &unique("s"), "delegate");
    let running = cluster.run(&task);
    let failover = async {
        // The subagent's worker dies while the child's second call runs.
        wait_for_effect(&effects_file(&cluster), "sub-b", true).await;
        first.kill();
        test_worker(&cluster, &subagents, "worker-second.log")
    };
    let ((result, events), _second) = tokio::join!(running, failover);

    let effects = read_effects(&effects_file(&cluster));
    let child_starts: Vec<Option<u32>> = events
        .iter()
        .filter(|e| e.source.starts_with("subagent:"))
        .filter_map(|e| match &e.event {
            EventKind::TurnStarted {
                resumed_at_step, ..
            } => Some(*resumed_at_step),
            _ => None,
        })
        .collect();
    println!("killed subagent worker: child starts {child_starts:?}, effects {effects:?}");
    assert_sequences_grow(&events);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(
        child_starts,
        vec![None, Some(2)],
        "the child turn resumed after its second model call"
    );
    assert_eq!(
        effects.get("sub-a").map(|c| c.started),
        Some(1),
        "the child's finished call ran once: {effects:?}"
    );
    assert!(
        effects.get("sub-b").is_some_and(|c| c.done >= 1),
        "the call in flight completed: {effects:?}"
    );
    let answer = result.answer.unwrap_or_default();
    assert!(answer.contains("helper saw"), "{answer}");
}

/// Another holder keeps the session's lease (a lead that is alive and busy, here a stranger's
/// token): a task waiting for it does not hold its slot for ever; after twice the lease's time to
/// live it is handed back to the broker. Once the lease is free and announced, the task runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_for_a_held_lease_hands_its_slot_back_and_runs_once_free() {
    let cluster = TestCluster::start();
    cluster.start_nodes(0, &["--lease-ttl", "1s"]).await;
    let client = cluster.client().await;
    let session = unique("s");
    let lease = skein_common::store::keys::lease("acme", &session);
    let redis = redis::Client::open(cluster.redis.url.as_str()).expect("redis url");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let () = redis::cmd("SET")
        .arg(&lease)
        .arg("a-stranger")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .expect("lease taken");
    let task = submission("acme", &session, "wait for me");
    client.submit(&task).await.expect("submitted");

    let jetstream = async_nats::jetstream::new(client.bus().client().clone());
    eventually(
        "the waiting task to be handed back",
        Duration::from_secs(20),
        || {
            let jetstream = jetstream.clone();
            async move {
                let mut consumer: async_nats::jetstream::consumer::PullConsumer = jetstream
                    .get_stream(skein_common::subjects::SUBMIT_STREAM)
                    .await
                    .ok()?
                    .get_consumer(skein_common::subjects::LEADS_CONSUMER)
                    .await
                    .ok()?;
                let info = consumer.info().await.ok()?;
                (info.num_redelivered > 0).then_some(())
            }
        },
    )
    .await;

    let () = redis::cmd("DEL")
        .arg(&lease)
        .query_async(&mut conn)
        .await
        .expect("lease freed");
    client
        .bus()
        .client()
        .publish(
            skein_common::subjects::turned("acme", &session),
            Default::default(),
        )
        .await
        .expect("announced");
    let result = client
        .run(&task, Duration::from_secs(30), |_| {})
        .await
        .expect("the task runs once the lease is free");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
}

/// SIGTERM reaches a worker while its call runs: the call finishes within the grace period on
/// that worker (it is not cut off and run again elsewhere), its result reaches the turn, and the
/// worker then exits cleanly. A worker started after the signal would run any call handed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_told_to_stop_finishes_its_running_call_first() {
    let cluster = TestCluster::start();
    let script = one_slow_call(&cluster, 1500);
    let flags = ["--grace", "20s", "--ack-wait", "2s"];
    let mut draining = test_worker(&cluster, &flags, "worker-draining.log");
    cluster.wait_for_workers(1).await;
    let _lead = lead_process(&cluster, &["--scenario", script.as_str()], "lead.log");
    let task = submission("acme", &unique("s"), "drain-me");
    let running = cluster.run(&task);
    let drain = async {
        wait_for_effect(&cluster.effects_file(), "drain-me", true).await;
        draining.sigterm();
        // Anything handed back would run here.
        let standby = test_worker(&cluster, &flags, "worker-standby.log");
        let exit = draining.wait_exit(Duration::from_secs(40)).await;
        (exit, standby)
    };
    let ((result, _), (exit, _standby)) = tokio::join!(running, drain);
    let effects = read_effects(&cluster.effects_file());
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let effect = effects.get("drain-me").expect("the call ran");
    assert_eq!(
        (effect.started, effect.done),
        (1, 1),
        "the running call finished where it ran, once: {effects:?}"
    );
    assert!(
        exit.is_some_and(|s| s.success()),
        "the worker drained and exited: {exit:?}"
    );
}
