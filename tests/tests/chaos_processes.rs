//! Chaos, processes: real lead and worker processes are killed (`-9`), crash, or are told to stop
//! (SIGTERM), and the NATS and Redis servers restart or go away, while work flows. Checked: nothing
//! is lost, finished calls and model steps are not run again (a killed lead's or subagent worker's
//! turn resumes from its checkpoint), a turn or call that kills its process every time is
//! dead-lettered, and a draining process finishes its running work. Each test prints its figures.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};
use skein_tests::support::chaos::{run_all, scenario, wait_for_effect, wait_for_recorded_results};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::{read_effects, EFFECTS_FILE_ENV};
use skein_tests::support::{eventually, unique, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

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
        let expected = format!("effect {} done", task.input.text());
        assert_eq!(
            result.answer.as_deref(),
            Some(expected.as_str()),
            "each turn got its own result once"
        );
        assert!(
            effects.get(&task.input.text()).is_some_and(|c| c.done >= 1),
            "the effect of {} finished",
            task.input.text()
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

/// A lead killed after one of a step's parallel calls has its result recorded (the other still
/// running): the lead that resumes the turn answers the finished call from its record and does
/// not publish it again; only the unfinished call goes out once more. (A worker would not run the
/// copy either, so the test counts what is published on the tool's subject.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_turn_does_not_publish_a_call_whose_result_is_recorded() {
    let cluster = TestCluster::start();
    let (fast, slow) = (unique("fast"), unique("slow"));
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [
                { "name": "slow_effect", "arguments": { "key": fast, "ms": 10 } },
                // Long enough to outlast the resume (the lease's 2 s, the new lead's start) on a
                // loaded machine: a result recorded first would rightly not go out again.
                { "name": "slow_effect", "arguments": { "key": slow, "ms": 6000 } }
            ] },
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
    let client = cluster.client().await;
    let mut published = client
        .bus()
        .client()
        .subscribe("skein.tool.*.slow_effect")
        .await
        .expect("subscribed");

    let task = submission("acme", &unique("s"), "resume me");
    let running = cluster.run(&task);
    let failover = async {
        // The fast call's result is recorded while the slow one runs: the lead dies now.
        wait_for_effect(&effects_file(&cluster), &slow, true).await;
        wait_for_recorded_results(&cluster, &task, 1).await;
        first.kill();
        lead_process(&cluster, &lead_flags, "lead-second.log")
    };
    let ((result, _), _second) = tokio::join!(running, failover);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let effects = read_effects(&effects_file(&cluster));
    assert_eq!(
        effects.get(&fast).map(|c| c.started),
        Some(1),
        "{effects:?}"
    );

    // Everything published on the tool's subject, by key.
    let mut times_published = std::collections::BTreeMap::<&str, usize>::new();
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_millis(500), published.next()).await
    {
        let payload = String::from_utf8_lossy(&message.payload);
        for key in [fast.as_str(), slow.as_str()] {
            if payload.contains(key) {
                *times_published.entry(key).or_default() += 1;
            }
        }
    }
    assert_eq!(
        times_published.get(fast.as_str()),
        Some(&1),
        "the recorded call went out once, before the kill: {times_published:?}"
    );
    assert!(
        times_published.get(slow.as_str()).is_some_and(|n| *n >= 2),
        "the unfinished call was published again: {times_published:?}"
    );
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
            Some(format!("effect {} done", task.input.text()).as_str())
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

/// SIGTERM reaches a worker while its call runs: the call finishes within the grace period on
/// that worker (it is not cut off and run again elsewhere), its result reaches the turn, and the
/// worker then exits cleanly. A worker started after the signal would run any call handed back.
/// The call outlasts the intake's stop by far: a stopping worker first lets its pull requests in
/// flight end (up to 2 s), and only then drains, so a shorter call would be over before the drain
/// began and a drain that cut running work short would go unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_told_to_stop_finishes_its_running_call_first() {
    let cluster = TestCluster::start();
    let script = one_slow_call(&cluster, 8000);
    let flags = ["--grace", "30s", "--ack-wait", "2s"];
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
