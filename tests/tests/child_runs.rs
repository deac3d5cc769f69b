//! Subagents as child runs of their task, with real NATS, Redis, a lead and a worker (the model
//! scripted): cancelling a task stops its subagent in the middle of the subagent's own call;
//! cancelling one child alone stops it and the runs under it while its caller goes on; and
//! `skein runs tree` shows the task's runs nested as they called each other, with the process
//! that ran each.

use std::time::Duration;

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

fn skein(cluster: &TestCluster, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(NODE)
        .args(args)
        .args(["--nats-url", &cluster.nats.url, "--tenant", "acme"])
        .output()
        .expect("skein runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// An `assistant` that hands its task to `planner`, which hands it to `researcher`, which runs
/// `slow_effect` keyed `key` for `ms`.
fn nested(cluster: &TestCluster, key: &str, ms: u64) -> (String, String) {
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    let define = |path: &str, text: &str| std::fs::write(agents.join(path), text).expect("written");
    define(
        "AGENTS.md",
        "+++\nname = \"assistant\"\nsubagents = [\"planner\"]\n+++\nDelegate.\n",
    );
    define(
        "subagents/planner.md",
        "+++\nname = \"planner\"\ndescription = \"plans\"\nsubagents = [\"researcher\"]\n+++\nPlan.\n",
    );
    define(
        "subagents/researcher.md",
        "+++\nname = \"researcher\"\ndescription = \"finds\"\n+++\nFind.\n",
    );
    let spawn = |agent: &str| json!({ "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": agent, "task": "go" } } ] });
    let scenario = cluster.dir.join(format!("{}.json", unique("nested")));
    std::fs::write(
        &scenario,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": [ spawn("planner"), { "answer": "got {{observations}}" } ] } ] },
            "planner": { "turns": [ { "steps": [ spawn("researcher"), { "answer": "planned {{observations}}" } ] } ] },
            "researcher": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": key, "ms": ms } } ] },
                { "answer": "found" }
            ] } ] }
        } })
        .to_string(),
    )
    .expect("scenario written");
    (scenario.display().to_string(), agents.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_of_a_task_form_a_tree_of_the_processes_that_ran_them() {
    let cluster = TestCluster::start();
    let (scenario, agents) = nested(&cluster, "leaf", 10);
    let worker = cluster.worker_config(&["--scenario", &scenario]);
    let worker_id = worker
        .process
        .instance_id
        .clone()
        .expect("test workers have ids");
    cluster.spawn_test_worker(worker);
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));
    let task = submission("acme", &unique("s"), "delegate");
    let (result, events) = cluster.run(&task).await;
    // Every level's model reused one call id: the sources still tell the runs apart.
    let sources: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e.source.as_str()).collect();
    assert_eq!(
        sources.into_iter().collect::<Vec<_>>(),
        [
            "lead",
            "subagent:call_t1_s1_0",
            "subagent:call_t1_s1_0/call_t1_s1_0"
        ],
        "child events name their parent"
    );
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");

    let (ok, text) = skein(&cluster, &["runs", "tree", &task.task_id]);
    assert!(ok, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("assistant on ") && lines[0].contains("· completed"),
        "{text}"
    );
    assert!(
        lines[1].starts_with(&format!("└─ planner on {worker_id} · completed")),
        "{text}"
    );
    assert!(
        lines[2].starts_with(&format!("   └─ researcher on {worker_id} · completed")),
        "{text}"
    );
    let (ok, json) = skein(&cluster, &["runs", "tree", &task.task_id, "--json"]);
    assert!(ok, "{json}");
    let tree: serde_json::Value = serde_json::from_str(json.trim()).expect("json tree");
    assert_eq!(tree["children"][0]["children"][0]["agent"], "researcher");
    // Every run reports the tokens of its own model calls, subagents included.
    let tokens = |run: &serde_json::Value| run["tokens"].as_u64().unwrap_or(0);
    let planner = &tree["children"][0];
    assert!(tokens(&tree) > 0, "{tree}");
    assert!(tokens(planner) > 0, "{tree}");
    assert!(tokens(&planner["children"][0]) > 0, "{tree}");
    assert!(lines[2].contains(" tokens"), "{text}");
    let (ok, text) = skein(&cluster, &["runs", "tree", "no-such-task"]);
    assert!(!ok && text.contains("has no events"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_task_stops_its_subagents_in_the_middle_of_their_calls() {
    let cluster = TestCluster::start();
    let (scenario, agents) = nested(&cluster, "deep", 30_000);
    let scopes = cluster.spawn_test_worker(cluster.worker_config(&["--scenario", &scenario]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));
    let task = submission("acme", &unique("s"), "delegate");
    let running = cluster.run(&task);
    let cancelling = async {
        eventually(
            "the grandchild's call running",
            Duration::from_secs(30),
            || async {
                read_effects(&cluster.effects_file())
                    .get("deep")
                    .is_some_and(|c| c.started == 1)
                    .then_some(())
            },
        )
        .await;
        let (ok, text) = skein(&cluster, &["cancel", &task.task_id]);
        assert!(ok, "{text}");
    };
    let ((result, _), ()) = tokio::join!(running, cancelling);
    assert_eq!(result.status, TurnStatus::Cancelled, "{result:?}");
    let deep = read_effects(&cluster.effects_file())
        .get("deep")
        .cloned()
        .expect("the call started");
    assert_eq!(
        (deep.started, deep.done),
        (1, 0),
        "the call was stopped, not finished"
    );
    // The grandchild's call (and every run that held a scope) closed long before the call's
    // 30 s were up: they were stopped, not left to run.
    eventually("every scope closed", Duration::from_secs(10), || async {
        let counts = scopes.snapshot();
        (counts.scopes_opened >= 1 && counts.scopes_opened == counts.scopes_closed).then_some(())
    })
    .await;
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("deep")
            .map(|c| c.done),
        Some(0)
    );
    let (ok, text) = skein(&cluster, &["runs", "tree", &task.task_id]);
    assert!(ok, "{text}");
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains("· cancelled")),
        "{text}"
    );
    assert!(
        text.contains("planner on") && text.contains("researcher on"),
        "{text}"
    );
    assert!(!text.contains("running"), "no run is left running: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_child_cancelled_alone_stops_with_its_own_children_and_its_caller_goes_on() {
    let cluster = TestCluster::start();
    let (scenario, agents) = nested(&cluster, "alone", 30_000);
    let scopes = cluster.spawn_test_worker(cluster.worker_config(&["--scenario", &scenario]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));
    let task = submission("acme", &unique("s"), "delegate");
    let running = cluster.run(&task);
    let cancelling = async {
        eventually(
            "the grandchild's call running",
            Duration::from_secs(30),
            || async {
                read_effects(&cluster.effects_file())
                    .get("alone")
                    .is_some_and(|c| c.started == 1)
                    .then_some(())
            },
        )
        .await;
        // The planner's run (the lead's first call), and with it the researcher under it.
        let (ok, text) = skein(
            &cluster,
            &["cancel", &task.task_id, "--call", "call_t1_s1_0"],
        );
        assert!(ok && text.contains("run call_t1_s1_0"), "{text}");
    };
    let ((result, events), ()) = tokio::join!(running, cancelling);
    assert_eq!(
        result.status,
        TurnStatus::Completed,
        "the task went on: {result:?}"
    );
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.starts_with("got error (stopped)"),
        "the lead observed the stop: {answer}"
    );
    let stopped = events.iter().any(|e| {
        e.source == "lead"
            && matches!(
                &e.event,
                skein_common::protocol::EventKind::ToolFinished { ok: false, .. }
            )
    });
    assert!(stopped, "the spawn ended failed");
    eventually("every scope closed", Duration::from_secs(10), || async {
        let counts = scopes.snapshot();
        (counts.scopes_opened >= 1 && counts.scopes_opened == counts.scopes_closed).then_some(())
    })
    .await;
    assert_eq!(
        read_effects(&cluster.effects_file())
            .get("alone")
            .map(|c| c.done),
        Some(0),
        "the grandchild's call was stopped, not finished"
    );
}

/// The fields of a hash of the parent session's task (`keys::results` or `keys::attempts`).
async fn task_hash(
    conn: &mut redis::aio::MultiplexedConnection,
    key: String,
) -> std::collections::HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("hgetall")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_turn_saved_before_its_result_was_recorded_is_not_run_again() {
    use skein_common::store::keys;

    let cluster = TestCluster::start();
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nname = \"assistant\"\nsubagents = [\"researcher\"]\n+++\nDelegate.\n",
    )
    .expect("written");
    std::fs::write(
        agents.join("subagents/researcher.md"),
        "+++\nname = \"researcher\"\ndescription = \"finds\"\n+++\nFind.\n",
    )
    .expect("written");
    let spawn = json!({ "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": "researcher", "task": "go" } } ] });
    let scenario = cluster.dir.join(format!("{}.json", unique("once")));
    std::fs::write(
        &scenario,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": [ spawn, { "answer": "got {{observations}}" } ] } ] },
            "researcher": { "turns": [ { "steps": [ { "answer": "found" } ] } ] }
        } })
        .to_string(),
    )
    .expect("scenario written");
    let scenario = scenario.display().to_string();

    // The worker's Redis user may do everything but record a call's result (HSETNX): it saves
    // the child session, then fails to record, as a worker that dies between the two would.
    let client = redis::Client::open(cluster.redis.url.as_str()).expect("redis url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let acl = |change: &'static str| {
        let mut conn = conn.clone();
        async move {
            let () = redis::cmd("ACL")
                .arg(&[
                    "SETUSER",
                    "skein-worker",
                    "on",
                    ">worker-pw",
                    "~*",
                    "&*",
                    "+@all",
                ])
                .arg(change)
                .query_async(&mut conn)
                .await
                .expect("acl setuser");
        }
    };
    acl("-hsetnx").await;
    let mut worker = cluster.worker_config(&["--scenario", &scenario]);
    worker.redis.url = format!(
        "redis://skein-worker:worker-pw@127.0.0.1:{}/",
        cluster.redis.port()
    );
    cluster.spawn_test_worker(worker);
    cluster.wait_for_workers(1).await;
    let agents = agents.display().to_string();
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &scenario, "--agents-dir", &agents]));
    let session = unique("s");
    let task = submission("acme", &session, "delegate");
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("got found"));

    // Two more deliveries of the subagent task came and went (the first delivery is not
    // counted; each later one is, when it is admitted, after the one before it settled).
    let attempts = keys::attempts("acme", &session, &format!("{}:0:x", task.task_id));
    eventually(
        "two redeliveries of the subagent task",
        Duration::from_secs(60),
        || {
            let (mut conn, attempts) = (conn.clone(), attempts.clone());
            async move {
                let counts = task_hash(&mut conn, attempts).await;
                counts
                    .iter()
                    .any(|(field, n)| {
                        !field.starts_with("turn:") && n.parse::<u64>().unwrap_or(0) >= 2
                    })
                    .then_some(())
            }
        },
    )
    .await;
    acl("+hsetnx").await;
    let results = keys::results("acme", &session, &format!("{}:0:x", task.task_id));
    let recorded = eventually(
        "the call's result recorded",
        Duration::from_secs(60),
        || {
            let (mut conn, results) = (conn.clone(), results.clone());
            async move { task_hash(&mut conn, results).await.into_values().next() }
        },
    )
    .await;
    assert!(recorded.contains("found"), "{recorded}");

    // The child turn ran once: its session holds one turn, one question and one answer.
    let child = skein_common::protocol::child_session_id(&session, "call_t1_s1_0");
    let store = cluster.store().await;
    let loaded = store.load("acme", &child).await.expect("child session");
    assert_eq!(loaded.state.turns, 1, "{:?}", loaded.state.history);
    assert_eq!(loaded.state.history.len(), 2, "{:?}", loaded.state.history);
    // What the child left for the next delivery goes once the result is recorded.
    eventually(
        "the child's leftovers dropped",
        Duration::from_secs(30),
        || {
            let mut conn = conn.clone();
            let pattern = format!("{}*", keys::call_outcome("acme", &child, ""));
            async move {
                let left: Vec<String> = redis::cmd("KEYS")
                    .arg(pattern)
                    .query_async(&mut conn)
                    .await
                    .expect("keys");
                left.is_empty().then_some(())
            }
        },
    )
    .await;
}
