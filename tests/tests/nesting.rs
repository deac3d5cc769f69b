//! Nested subagents under load: a lead's agent calls a subagent that calls its own subagent,
//! both served by one worker pool's subagent consumer with fewer slots than there are callers.
//! Each waiting subagent lends its slot to its children, so every turn completes; a pool whose
//! slots were all held by waiting parents would deadlock until the subagent timeout.

use serde_json::json;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::unique;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_subagents_under_load_never_wait_on_their_callers_slots() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    let define = |path: &str, text: &str| {
        std::fs::write(agents.join(path), text).expect("agent definition written")
    };
    define(
        "AGENTS.md",
        "+++\nname = \"assistant\"\nsubagents = [\"planner\"]\nmax_iterations = 3\n+++\nDelegate.\n",
    );
    define(
        "subagents/planner.md",
        "+++\nname = \"planner\"\ndescription = \"plans\"\nsubagents = [\"researcher\"]\nmax_iterations = 3\n+++\nPlan.\n",
    );
    define(
        "subagents/researcher.md",
        "+++\nname = \"researcher\"\ndescription = \"finds\"\nmax_iterations = 2\n+++\nFind.\n",
    );
    let scenario = cluster.dir.join("nesting-scenario.json");
    let spawn = |agent: &str| json!({ "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": agent, "task": "go" } } ] });
    std::fs::write(
        &scenario,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": [ spawn("planner"), { "answer": "lead got {{observations}}" } ] } ] },
            "planner": { "turns": [ { "steps": [ spawn("researcher"), { "answer": "planner got {{observations}}" } ] } ] },
            "researcher": { "turns": [ { "steps": [ { "answer": "found it" } ] } ] }
        } })
        .to_string(),
    )
    .expect("scenario written");
    let scenario = scenario.to_str().expect("utf-8 path");
    let agents = agents.to_str().expect("utf-8 path");

    // Two subagent slots, three times as many callers; a child that waited for a slot held by
    // its caller would wait out the two-minute subagent timeout, past the client's wait.
    let slots = 2;
    cluster.spawn_worker(cluster.worker_config(&[
        "--scenario",
        scenario,
        "--concurrency",
        &slots.to_string(),
        "--subagent-timeout",
        "120s",
    ]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        scenario,
        "--agents-dir",
        agents,
        "--subagent-timeout",
        "120s",
    ]));

    let tasks: Vec<_> = (0..slots * 3)
        .map(|_| submission("acme", &unique("s"), "delegate twice"))
        .collect();
    let started = std::time::Instant::now();
    let runs = futures::future::join_all(tasks.iter().map(|task| cluster.run(task))).await;
    println!(
        "{} nested turns on {slots} subagent slots in {:?}",
        runs.len(),
        started.elapsed()
    );
    for (result, events) in runs {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let answer = result.answer.unwrap_or_default();
        assert!(
            answer.contains("planner got") && answer.contains("found it"),
            "the answer carries both levels: {answer}"
        );
        let child_turns = events
            .iter()
            .filter(|e| e.source.starts_with("subagent:"))
            .filter(|e| matches!(e.event, EventKind::TurnStarted { .. }))
            .count();
        assert_eq!(
            child_turns, 2,
            "both nested turns are reported to the client"
        );
    }
}
