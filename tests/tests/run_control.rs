//! Pause, resume and steer, with real NATS, Redis, lead processes and workers (the model
//! scripted): a paused turn dispatches nothing new, parks without a lead and survives the death
//! of the lead that parked it; a resumed turn completes on another lead with no call run twice;
//! a steer message reaches the model's next request and joins the session once, also when the
//! lead dies after taking it.

use std::time::Duration;

use serde_json::json;
use skein_common::protocol::message::Role;
use skein_common::protocol::{EventKind, TurnEvent, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

fn lead(cluster: &TestCluster, script: &str) -> ChildProcess {
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(cluster.process_args("lead")).args([
        "--scenario",
        script,
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "2s",
    ]);
    ChildProcess::spawn(cmd, cluster.dir.join(unique("lead")).with_extension("log"))
}

fn effects(cluster: &TestCluster, key: &str) -> (usize, usize) {
    read_effects(&cluster.effects_file())
        .get(key)
        .map_or((0, 0), |c| (c.started, c.done))
}

/// Runs `skein` with the cluster's NATS; returns success and output.
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

fn count(events: &[TurnEvent], wanted: fn(&EventKind) -> bool) -> usize {
    events
        .iter()
        .filter(|e| e.source == "lead" && wanted(&e.event))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_turn_survives_its_lead_and_resumes_on_another_without_running_a_call_twice() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "first", "ms": 1500 } } ] },
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "second", "ms": 10 } } ] },
        { "answer": "both done" }
    ] }]));
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    let mut first = lead(&cluster, &script);

    let session = unique("s");
    let task = submission("acme", &session, "work slowly");
    let running = cluster.run(&task);
    let controlling = async {
        eventually(
            "the first call running",
            Duration::from_secs(30),
            || async { (effects(&cluster, "first").0 == 1).then_some(()) },
        )
        .await;
        // The session comes from the task's events.
        let (ok, text) = skein(&cluster, &["pause", &task.task_id]);
        assert!(ok, "{text}");
        assert!(text.contains(&session), "the session was found: {text}");
        // The running call finishes and is recorded; the turn parks and leaves its lead.
        let store = cluster.store().await;
        eventually("the turn parked", Duration::from_secs(30), || {
            let store = store.clone();
            let session = session.clone();
            let cluster = &cluster;
            async move {
                let parked = effects(cluster, "first").1 == 1
                    && store.running_turn("acme", &session).await.ok()?.is_none();
                parked.then_some(())
            }
        })
        .await;
        first.kill();
        let second = lead(&cluster, &script);
        assert_eq!(
            effects(&cluster, "second"),
            (0, 0),
            "a paused turn dispatches nothing new"
        );
        let (ok, text) = skein(&cluster, &["resume", &task.task_id, "--session", &session]);
        assert!(ok, "{text}");
        second
    };
    let ((result, events), _second) = tokio::join!(running, controlling);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("both done"));
    assert_eq!(
        effects(&cluster, "first"),
        (1, 1),
        "the first call ran once"
    );
    assert_eq!(
        effects(&cluster, "second"),
        (1, 1),
        "the second call ran once"
    );
    assert_eq!(
        result.iterations, 3,
        "the model was not asked again for a step"
    );
    assert_eq!(count(&events, |e| matches!(e, EventKind::Paused { .. })), 1);
    assert_eq!(count(&events, |e| matches!(e, EventKind::Resumed {})), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_message_reaches_the_next_model_request_once_across_a_lead_killed_after_it() {
    let cluster = TestCluster::start();
    // Step 2's call is keyed by the last user message the model saw: the steer text.
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "first", "ms": 1500 } } ] },
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 1500 } } ] },
        { "answer": "last said: {{input}}" }
    ] }]));
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    let mut first = lead(&cluster, &script);

    let session = unique("s");
    let task = submission("acme", &session, "start");
    let steer = "use-the-blue-one";
    let running = cluster.run(&task);
    let steering = async {
        eventually(
            "the first call running",
            Duration::from_secs(30),
            || async { (effects(&cluster, "first").0 == 1).then_some(()) },
        )
        .await;
        let (ok, text) = skein(&cluster, &["steer", &task.task_id, steer]);
        assert!(ok, "{text}");
        // The model's next request carried it: its call is keyed by it. The lead dies while
        // that call runs, after the step that took the message was checkpointed.
        eventually(
            "the steered call running",
            Duration::from_secs(30),
            || async { (effects(&cluster, steer).0 == 1).then_some(()) },
        )
        .await;
        first.kill();
        lead(&cluster, &script)
    };
    let ((result, events), _second) = tokio::join!(running, steering);

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(
        result.answer.as_deref(),
        Some(format!("last said: {steer}").as_str())
    );
    assert_eq!(
        effects(&cluster, steer),
        (1, 1),
        "the steered call ran once"
    );
    assert_eq!(
        count(&events, |e| matches!(e, EventKind::Steered { .. })),
        1,
        "steered once across both leads"
    );
    let history = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("session loads")
        .state
        .history;
    let users: Vec<&str> = history
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        users,
        ["start", steer],
        "the steer message joined the session once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_that_cannot_apply_are_refused_with_the_reason() {
    let cluster = TestCluster::start();
    let (ok, text) = skein(&cluster, &["steer", "t-unknown", "  "]);
    assert!(!ok);
    // Without a session and without events, the CLI says what to do.
    assert!(text.contains("--session"), "{text}");
    let (ok, text) = skein(&cluster, &["steer", "t1", " ", "--session", "s1"]);
    assert!(!ok);
    assert!(text.contains("needs a text"), "{text}");
    let (ok, text) = skein(&cluster, &["pause", "t1", "--session", "bad.session"]);
    assert!(!ok);
    assert!(text.contains("session"), "{text}");
}
