//! Subagents as first-class runs of their type: workers that list agent types take only those,
//! through one consumer per type, and the lead routes each spawn to a pool that runs its type; a
//! pool whose workers are configured two ways fails clearly; an agent's `max_concurrency` caps
//! its runs across the cluster, the tasks over the cap waiting in the stream.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use skein_common::protocol::{EventKind, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::unique;

/// Writes an agents folder under the cluster's directory: `AGENTS.md` for the assistant, and
/// each `(name, front matter)` as a subagent. Returns its path.
fn agents_folder(cluster: &TestCluster, main: &str, subagents: &[(&str, &str)]) -> String {
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::write(agents.join("AGENTS.md"), main).expect("main agent written");
    for (name, front) in subagents {
        let text = format!("+++\nname = \"{name}\"\ndescription = \"the {name}\"\n{front}+++\nYou are the {name}.\n");
        std::fs::write(agents.join("subagents").join(format!("{name}.md")), text)
            .expect("subagent written");
    }
    agents.display().to_string()
}

/// Writes a scenario file of these agents' scripts; returns its path.
fn scenario(cluster: &TestCluster, agents: serde_json::Value) -> String {
    let path = cluster.dir.join(format!("{}.json", unique("scenario")));
    std::fs::write(&path, json!({ "agents": agents }).to_string()).expect("scenario written");
    path.display().to_string()
}

fn spawn(agent: &str, task: &str) -> serde_json::Value {
    json!({ "name": "spawn_agent", "arguments": { "agent": agent, "task": task } })
}

/// The child turns of a run: each `subagent:<call_id>` source with its agent and the instance
/// that ran it.
fn child_turns(events: &[TurnEvent]) -> BTreeMap<String, (String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::TurnStarted {
                agent, instance, ..
            } if e.source.starts_with("subagent:") => {
                Some((e.source.clone(), (agent.clone(), instance.clone())))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subagent_type_runs_on_a_worker_that_lists_it() {
    let cluster = TestCluster::start();
    let agents = agents_folder(
        &cluster,
        "+++\nname = \"assistant\"\nsubagents = [\"researcher\", \"writer\", \"editor\"]\nmax_iterations = 3\n+++\nDelegate.\n",
        &[("researcher", ""), ("writer", ""), ("editor", "")],
    );
    let scenario = scenario(
        &cluster,
        json!({
            "assistant": { "turns": [ { "steps": [
                { "tool_calls": [ spawn("researcher", "find"), spawn("writer", "write"), spawn("editor", "edit") ] },
                { "answer": "got {{observations}}" }
            ] } ] },
            "researcher": { "turns": [ { "steps": [ { "answer": "researched" } ] } ] },
            "writer": { "turns": [ { "steps": [ { "answer": "written" } ] } ] },
            "editor": { "turns": [ { "steps": [ { "answer": "edited" } ] } ] }
        }),
    );
    // Two workers of one pool, each taking one type through its own consumer.
    let researching =
        cluster.worker_config(&["--scenario", &scenario, "--subagents", "researcher"]);
    let writing = cluster.worker_config(&["--scenario", &scenario, "--subagents", "writer"]);
    let (researcher_id, writer_id) = (
        researching.process.instance_id("worker"),
        writing.process.instance_id("worker"),
    );
    cluster.spawn_worker(researching);
    cluster.spawn_worker(writing);
    cluster.wait_for_workers(2).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));

    let (result, events) = cluster
        .run(&submission("acme", &unique("s"), "delegate"))
        .await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("researched") && answer.contains("written"),
        "{answer}"
    );
    let children = child_turns(&events);
    assert_eq!(
        children.get("subagent:call_t1_s1_0"),
        Some(&("researcher".to_owned(), researcher_id)),
        "{children:?}"
    );
    assert_eq!(
        children.get("subagent:call_t1_s1_1"),
        Some(&("writer".to_owned(), writer_id)),
        "{children:?}"
    );
    assert_eq!(
        children.len(),
        2,
        "no child turn for the editor: {children:?}"
    );
    // No live worker runs the editor: the spawn ends unavailable, saying so, and the turn goes on.
    let editor = events
        .iter()
        .find_map(|e| match &e.event {
            EventKind::ToolFinished {
                call_id,
                ok,
                preview,
                ..
            } if call_id == "call_t1_s1_2" && !e.source.starts_with("subagent:") => {
                Some((*ok, preview.clone()))
            }
            _ => None,
        })
        .expect("the editor's spawn finished");
    assert!(!editor.0, "{editor:?}");
    assert!(
        editor
            .1
            .contains("error (unavailable): no live worker runs subagent \"editor\""),
        "{editor:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_configured_two_ways_fails_at_start_naming_both_consumers() {
    let cluster = TestCluster::start();
    cluster.spawn_worker(cluster.worker_config(&["--subagents", "researcher"]));
    cluster.wait_for_workers(1).await;

    // Every type beside a consumer of one type: the work-queue stream refuses the overlap.
    let every = cluster.worker_config(&["--subagents", "true"]);
    let ran = tokio::time::timeout(
        Duration::from_secs(30),
        skein_worker::run(every, cluster.shutdown_token()),
    )
    .await
    .expect("the worker stops at once");
    let error = ran
        .expect_err("a worker configured unlike its pool fails")
        .to_string();
    for named in [
        "skein-agents-default ",
        "skein-agents-default~researcher",
        "pool default",
        "SKEIN_SUBAGENTS",
    ] {
        assert!(error.contains(named), "{named:?} not in: {error}");
    }
    let live = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("registry");
    assert_eq!(live.len(), 1, "the refused worker never announced itself");
}

/// `start` and `done` lines of an effects file, in order: how many effects were in progress at
/// most at one moment.
fn most_at_once(effects: &Path) -> usize {
    let (mut running, mut most) = (0usize, 0usize);
    for line in std::fs::read_to_string(effects).unwrap_or_default().lines() {
        match line.split('\t').next() {
            Some("start") => running += 1,
            Some("done") => running = running.saturating_sub(1),
            _ => {}
        }
        most = most.max(running);
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_caps_an_agents_runs_across_the_cluster() {
    let cluster = TestCluster::start();
    let agents = agents_folder(
        &cluster,
        "+++\nname = \"assistant\"\nsubagents = [\"solo\"]\nmax_iterations = 3\n+++\nDelegate.\n",
        &[(
            "solo",
            "tools = [\"slow_effect\"]\nmax_concurrency = 1\nmax_iterations = 3\n",
        )],
    );
    let scenario = scenario(
        &cluster,
        json!({
            "assistant": { "turns": [ { "steps": [
                { "tool_calls": [ spawn("solo", "{{input}}") ] },
                { "answer": "{{observations}}" }
            ] } ] },
            "solo": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 200 } } ] },
                { "answer": "solo did {{input}}" }
            ] } ] }
        }),
    );
    // Two workers with room for every parent and child at once: only the cap holds them back.
    for _ in 0..2 {
        cluster.spawn_test_worker(cluster.worker_config(&["--scenario", &scenario]));
    }
    cluster.wait_for_workers(2).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));

    let tasks: Vec<_> = (0..6)
        .map(|i| submission("acme", &unique("s"), &format!("job-{i}")))
        .collect();
    let runs = futures::future::join_all(tasks.iter().map(|task| cluster.run(task))).await;

    for (i, (result, _)) in runs.iter().enumerate() {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let answer = result.answer.clone().unwrap_or_default();
        assert!(answer.contains(&format!("solo did job-{i}")), "{answer}");
    }
    let effects = read_effects(&cluster.effects_file());
    for i in 0..6 {
        let count = effects
            .get(&format!("job-{i}"))
            .copied()
            .unwrap_or_default();
        assert_eq!((count.started, count.done), (1, 1), "job-{i}: {count:?}");
    }
    assert_eq!(
        most_at_once(&cluster.effects_file()),
        1,
        "two runs of the capped agent overlapped"
    );
    let store = cluster.store().await;
    assert_eq!(
        store.agent_runs("solo").await.expect("slots read"),
        0,
        "every run released its slot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_slots_are_counted_in_redis_and_a_silent_holders_lapse() {
    let cluster = TestCluster::start();
    let store = cluster.store().await;
    let agent = unique("agent");
    let lease = Duration::from_secs(30);
    assert!(store
        .try_take_agent_slot(&agent, "a", 2, lease)
        .await
        .expect("asked"));
    assert!(store
        .try_take_agent_slot(&agent, "b", 2, lease)
        .await
        .expect("asked"));
    assert!(
        !store
            .try_take_agent_slot(&agent, "c", 2, lease)
            .await
            .expect("asked"),
        "the third run waits"
    );
    assert!(
        store
            .try_take_agent_slot(&agent, "a", 2, lease)
            .await
            .expect("asked"),
        "a holder asking again keeps its slot"
    );
    assert_eq!(store.agent_runs(&agent).await.expect("read"), 2);
    store
        .release_agent_slot(&agent, "a")
        .await
        .expect("released");
    assert!(store
        .try_take_agent_slot(&agent, "c", 2, lease)
        .await
        .expect("asked"));
    assert!(store
        .renew_agent_slot(&agent, "c", lease)
        .await
        .expect("renewed"));
    assert!(!store
        .renew_agent_slot(&agent, "a", lease)
        .await
        .expect("asked"));

    // A holder that stops renewing (its worker died) loses its slot once the lease lapses.
    let other = unique("agent");
    let short = Duration::from_millis(200);
    assert!(store
        .try_take_agent_slot(&other, "dead", 1, short)
        .await
        .expect("asked"));
    assert!(!store
        .try_take_agent_slot(&other, "next", 1, lease)
        .await
        .expect("asked"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        store
            .try_take_agent_slot(&other, "next", 1, lease)
            .await
            .expect("asked"),
        "the silent holder's slot lapsed"
    );
    assert!(!store
        .renew_agent_slot(&other, "dead", lease)
        .await
        .expect("asked"));
}
