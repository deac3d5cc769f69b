//! Plans the model keeps, run as a DAG across workers, with real NATS, Redis, leads and workers
//! (the model scripted): independent steps run at once and a step waits for the ones it names;
//! a revision that rewrites a finished step is refused and the model sees why; a lead killed
//! during `run_plan` is replaced without running a step twice; the permission policy applies to
//! every step's subagent (a denied step fails, a step that asks suspends the turn until a person
//! answers, and the steps that ran meanwhile do not run again).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use skein_common::protocol::{EventKind, StepOutcome, StepStatus, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// An agents folder: a planning `assistant` (with `permissions`, a TOML table body) whose
/// subagents are `researcher` and `writer`.
fn planning_agents(cluster: &TestCluster, permissions: &str) -> PathBuf {
    let dir = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(dir.join("subagents")).expect("agents dir");
    let define = |path: &str, text: String| {
        std::fs::write(dir.join(path), text).expect("agent definition written")
    };
    define(
        "AGENTS.md",
        format!(
            "+++\nname = \"assistant\"\nplanning = true\nsubagents = [\"researcher\", \"writer\"]\n\
             max_iterations = 6\n[permissions]\n{permissions}\n+++\nPlan, then run the plan.\n"
        ),
    );
    define(
        "subagents/researcher.md",
        "+++\nname = \"researcher\"\ndescription = \"finds things\"\n+++\nFind.\n".into(),
    );
    define(
        "subagents/writer.md",
        "+++\nname = \"writer\"\ndescription = \"writes\"\n+++\nWrite.\n".into(),
    );
    dir
}

/// The three-step plan: two research steps, then a writing step after both.
fn three_steps() -> Value {
    json!({ "name": "update_plan", "arguments": { "explanation": "two at once, then one", "plan": [
        { "id": "a", "step": "Find A", "status": "pending", "agent": "researcher", "input": "find-a" },
        { "id": "b", "step": "Find B", "status": "pending", "agent": "researcher", "input": "find-b" },
        { "id": "c", "step": "Write it up", "status": "pending", "agent": "writer", "input": "write-c", "after": ["a", "b"] }
    ] } })
}

/// A scenario: the assistant writes the plan and runs it in one response, then takes `then`
/// steps; each subagent runs `slow_effect` keyed by its input for `ms`, then answers.
fn scenario(cluster: &TestCluster, then: Vec<Value>, ms: u64) -> String {
    let mut steps =
        vec![json!({ "tool_calls": [ three_steps(), { "name": "run_plan", "arguments": {} } ] })];
    steps.extend(then);
    let subagent = json!({ "turns": [ { "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": ms } } ] },
        { "answer": "{{agent}} did {{input}}" }
    ] } ] });
    let path = cluster
        .dir
        .join(format!("{}.json", unique("plan-scenario")));
    std::fs::write(
        &path,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": steps } ] },
            "researcher": subagent,
            "writer": subagent
        } })
        .to_string(),
    )
    .expect("scenario written");
    path.display().to_string()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Two in-process workers with the test tools, running subagents from `scenario`.
async fn two_workers(cluster: &TestCluster, scenario: &str) {
    for _ in 0..2 {
        cluster.spawn_test_worker(cluster.worker_config(&["--scenario", scenario]));
    }
    cluster.wait_for_workers(2).await;
}

fn starts(cluster: &TestCluster, key: &str) -> usize {
    read_effects(&cluster.effects_file())
        .get(key)
        .map_or(0, |c| c.started)
}

/// The plan events of the lead, in order, as short strings: `started a`, `finished a ok`.
fn step_events(events: &[TurnEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::PlanStepStarted { step_id, .. } => Some(format!("started {step_id}")),
            EventKind::PlanStepFinished { step_id, ok, .. } => Some(format!(
                "finished {step_id} {}",
                if *ok { "ok" } else { "failed" }
            )),
            _ => None,
        })
        .collect()
}

fn position(log: &[String], entry: &str) -> usize {
    log.iter()
        .position(|e| e == entry)
        .unwrap_or_else(|| panic!("no {entry:?} in {log:?}"))
}

fn skein(cluster: &TestCluster, args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(NODE);
    command.args(args).args(["--redis-url", &cluster.redis.url]);
    if args[0] == "approve" {
        command.args(["--nats-url", &cluster.nats.url]);
    }
    let output = command.output().expect("skein runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_steps_run_at_once_and_a_step_waits_for_the_ones_it_names() {
    let cluster = TestCluster::start();
    // After the run, the model tries to rewrite a finished step: refused, and it sees why.
    let rewrite = json!({ "tool_calls": [ { "name": "update_plan", "arguments": { "plan": [
        { "id": "a", "step": "Find A again, differently", "status": "pending", "agent": "researcher" }
    ] } } ] });
    let script = scenario(
        &cluster,
        vec![rewrite, json!({ "answer": "done: {{observations}}" })],
        300,
    );
    let agents = planning_agents(&cluster, "");
    two_workers(&cluster, &script).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        &script,
        "--agents-dir",
        path_str(&agents),
    ]));

    let session = unique("s");
    let task = submission("acme", &session, "plan the report");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");

    let log = step_events(&events);
    assert_eq!(
        log.len(),
        6,
        "three steps started and finished once: {log:?}"
    );
    // Both independent steps start before either ends; the third only after both ended.
    let first_end = log
        .iter()
        .position(|e| e.starts_with("finished"))
        .expect("an end");
    assert!(position(&log, "started a") < first_end, "{log:?}");
    assert!(position(&log, "started b") < first_end, "{log:?}");
    let c = position(&log, "started c");
    assert!(
        c > position(&log, "finished a ok") && c > position(&log, "finished b ok"),
        "{log:?}"
    );
    for key in ["find-a", "find-b", "write-c"] {
        assert_eq!(starts(&cluster, key), 1, "{key} ran once");
    }

    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("researcher did find-a"),
        "run_plan returned the outcomes: {answer}"
    );
    assert!(answer.contains("writer did write-c"), "{answer}");
    assert!(
        answer.contains("completed by a worker and cannot be changed"),
        "the refused revision is observed: {answer}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.event, EventKind::PlanUpdated { plan } if plan.plan.len() == 3)),
        "plan_updated carries the whole plan"
    );

    // The session keeps the plan as the run left it: every step completed, with its worker.
    let store = cluster.store().await;
    let plan = store
        .load("acme", &session)
        .await
        .expect("session loads")
        .state
        .plan
        .expect("the session keeps its plan");
    assert_eq!(plan.plan.len(), 3, "the refused revision changed nothing");
    for step in &plan.plan {
        assert_eq!(step.status, StepStatus::Completed, "{step:?}");
        assert!(step.worker_id.is_some(), "{step:?}");
        assert!(
            matches!(&step.outcome, Some(StepOutcome::Answer(answer)) if answer.contains("did"))
        );
    }
    let (ok, text) = skein(&cluster, &["plan", &session, "--tenant", "acme"]);
    assert!(ok, "{text}");
    assert!(text.contains("[x] a Find A (researcher on "), "{text}");
    assert!(text.contains("[x] c Write it up (writer on "), "{text}");
    assert!(text.contains("after a, b"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_killed_during_run_plan_is_replaced_without_running_a_step_twice() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        vec![json!({ "answer": "done: {{observations}}" })],
        1500,
    );
    let agents = planning_agents(&cluster, "");
    two_workers(&cluster, &script).await;
    let flags = [
        "--scenario",
        &script,
        "--agents-dir",
        path_str(&agents),
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "2s",
    ];
    let lead = |cluster: &TestCluster| {
        let mut cmd = std::process::Command::new(NODE);
        cmd.args(cluster.process_args("lead")).args(flags);
        ChildProcess::spawn(cmd, cluster.dir.join(unique("lead")).with_extension("log"))
    };
    let mut first = lead(&cluster);

    let task = submission("acme", &unique("s"), "plan the report");
    let running = cluster.run(&task);
    let replacing = async {
        // Both independent steps are running on the workers when the lead dies.
        eventually("both steps running", Duration::from_secs(30), || async {
            (starts(&cluster, "find-a") == 1 && starts(&cluster, "find-b") == 1).then_some(())
        })
        .await;
        first.kill();
        lead(&cluster)
    };
    let ((result, events), _second) = tokio::join!(running, replacing);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    for key in ["find-a", "find-b", "write-c"] {
        assert_eq!(starts(&cluster, key), 1, "{key} ran once across both leads");
    }
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.contains("researcher did find-a") && answer.contains("researcher did find-b"),
        "{answer}"
    );
    assert!(answer.contains("writer did write-c"), "{answer}");
    assert_eq!(
        result.iterations, 2,
        "the model was not asked again for the plan"
    );
    assert!(
        events.iter().any(|e| matches!(
            &e.event,
            EventKind::TurnStarted {
                resumed_at_step: Some(1),
                ..
            }
        )),
        "the second lead resumed the turn at its plan step"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_step_fails_and_holds_its_dependents() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        vec![json!({ "answer": "done: {{observations}}" })],
        10,
    );
    let agents = planning_agents(&cluster, "deny = [\"spawn_agent(researcher)\"]");
    two_workers(&cluster, &script).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        &script,
        "--agents-dir",
        path_str(&agents),
    ]));

    let session = unique("s");
    let (result, events) = cluster.run(&submission("acme", &session, "plan")).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(
        step_events(&events),
        ["finished a failed", "finished b failed"],
        "denied steps never start, and c waits for them"
    );
    assert_eq!(starts(&cluster, "find-a") + starts(&cluster, "write-c"), 0);
    let plan = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("loads")
        .state
        .plan
        .expect("plan");
    assert_eq!(plan.plan[0].status, StepStatus::Failed);
    assert!(
        matches!(&plan.plan[0].outcome, Some(StepOutcome::Failure(failure)) if failure.message.contains("deny rule spawn_agent(researcher)")),
        "{:?}",
        plan.plan[0]
    );
    assert_eq!(plan.plan[2].status, StepStatus::Pending, "c stays pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_asks_suspends_the_turn_and_the_steps_that_ran_do_not_run_again() {
    let cluster = TestCluster::start();
    let script = scenario(
        &cluster,
        vec![json!({ "answer": "done: {{observations}}" })],
        10,
    );
    let agents = planning_agents(&cluster, "ask = [\"spawn_agent(writer)\"]");
    two_workers(&cluster, &script).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        &script,
        "--agents-dir",
        path_str(&agents),
    ]));

    let task = submission("acme", &unique("s"), "plan");
    let running = cluster.run(&task);
    let approving = async {
        let store = cluster.store().await;
        let request = eventually("an approval request", Duration::from_secs(30), || {
            let store = store.clone();
            let task_id = task.task_id.clone();
            async move {
                store
                    .approval_request("acme", &task_id)
                    .await
                    .ok()
                    .flatten()
            }
        })
        .await;
        assert_eq!(request.calls.len(), 1, "{request:?}");
        let call = &request.calls[0];
        assert_eq!(call.tool, "spawn_agent");
        assert!(call.call_id.ends_with("-c"), "the step's call: {call:?}");
        assert_eq!(call.arguments["agent"], "writer");
        assert_eq!(
            (starts(&cluster, "find-a"), starts(&cluster, "write-c")),
            (1, 0)
        );
        let (ok, text) = skein(
            &cluster,
            &[
                "approve",
                &task.task_id,
                "--tenant",
                "acme",
                "--call",
                &call.call_id,
            ],
        );
        assert!(ok, "{text}");
    };
    let ((result, events), ()) = tokio::join!(running, approving);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    for key in ["find-a", "find-b", "write-c"] {
        assert_eq!(starts(&cluster, key), 1, "{key} ran once");
    }
    assert!(result
        .answer
        .unwrap_or_default()
        .contains("writer did write-c"));
    let requested = events
        .iter()
        .filter(|e| matches!(e.event, EventKind::ApprovalRequested { .. }))
        .count();
    assert_eq!(requested, 1, "asked once");
}
