//! Chaos: real processes are killed, stopped and restarted while work flows, and every promise is
//! checked — nothing lost, finished calls not run again, turns in order, poison set aside. Each
//! test prints its figures.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::{read_effects, EFFECTS_FILE_ENV};
use skein_tests::support::{eventually, unique, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// Writes a scripted-model scenario into the cluster's directory; returns its path.
fn scenario(cluster: &TestCluster, assistant_turns: serde_json::Value) -> PathBuf {
    let path = cluster.dir.join(format!("{}.json", unique("scenario")));
    let scenario = json!({ "agents": { "assistant": { "turns": assistant_turns } } });
    std::fs::write(&path, scenario.to_string()).expect("scenario written");
    path
}

fn effects_file(cluster: &TestCluster) -> PathBuf {
    cluster.dir.join("effects.log")
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
