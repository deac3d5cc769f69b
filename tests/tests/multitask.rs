//! A submission's `multitask` policy, with two clients on one session whose first task is still
//! running when the second arrives: `enqueue` waits for it, `reject` ends at once, `rollback`
//! cancels it (its messages not kept), `interrupt` stops it at its next step keeping its messages.
//!
//! The first task is held where the policy must find it running: its model call waits at the
//! fake model server until the test lets it through, or its tool call works for a minute.

use std::time::Duration;

use serde_json::{json, Value};
use skein_common::protocol::message::Role;
use skein_common::protocol::{FailureKind, MultitaskPolicy, TurnStatus};
use skein_tests::support::chaos::wait_for_effect;
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique, FakeOpenAi, FakeReply};

/// The session's stored history as (role, content) pairs.
async fn history(cluster: &TestCluster, session: &str) -> Vec<(Role, String)> {
    let stored = cluster
        .store()
        .await
        .load("acme", session)
        .await
        .expect("the session loads");
    stored
        .state
        .history
        .into_iter()
        .map(|m| (m.role, m.content))
        .collect()
}

/// The contents of a model request's messages of `role`.
fn contents(request: &Value, role: &str) -> Vec<String> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter(|m| m["role"] == role)
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `n` model requests have reached the fake server (held or answered).
async fn requests_arrived(model: &FakeOpenAi, n: usize) {
    eventually(
        &format!("{n} model request(s)"),
        Duration::from_secs(30),
        || {
            let arrived = model.arrived();
            async move { (arrived >= n).then_some(()) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_waits_for_the_running_task_then_runs_after_it() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer("first done"),
        FakeReply::answer("second done"),
    ])
    .await;
    let gate = model.hold();
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let session = unique("s");
    let first = submission("acme", &session, "first question");
    let mut second = submission("acme", &session, "second question");
    second.multitask = MultitaskPolicy::Enqueue;
    let client = cluster.client().await;

    let later = async {
        // The first task is running: its model call is held.
        requests_arrived(&model, 1).await;
        client.submit(&second).await.expect("second submitted");
        gate.add_permits(2);
        // Watches the task submitted above (a resubmit is deduplicated).
        cluster.run(&second).await
    };
    let ((first_result, _), (second_result, _)) = tokio::join!(cluster.run(&first), later);

    assert_eq!(
        first_result.status,
        TurnStatus::Completed,
        "{first_result:?}"
    );
    assert_eq!(first_result.answer.as_deref(), Some("first done"));
    assert_eq!(
        second_result.status,
        TurnStatus::Completed,
        "{second_result:?}"
    );
    assert_eq!(second_result.answer.as_deref(), Some("second done"));
    // The second ran after the first had ended: its model call saw the first turn whole.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        contents(&requests[1], "user"),
        ["first question", "second question"]
    );
    assert_eq!(contents(&requests[1], "assistant"), ["first done"]);
    assert_eq!(
        history(&cluster, &session).await,
        [
            (Role::User, "first question".to_owned()),
            (Role::Assistant, "first done".to_owned()),
            (Role::User, "second question".to_owned()),
            (Role::Assistant, "second done".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_ends_the_second_task_at_once_naming_the_first_which_completes() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("first done")]).await;
    let gate = model.hold();
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let session = unique("s");
    let first = submission("acme", &session, "first question");
    let mut second = submission("acme", &session, "second question");
    second.multitask = MultitaskPolicy::Reject;

    let later = async {
        requests_arrived(&model, 1).await;
        // Answered while the first task still holds the session.
        let rejected = cluster.run(&second).await;
        gate.add_permits(1);
        rejected
    };
    let ((first_result, _), (rejected, events)) = tokio::join!(cluster.run(&first), later);

    assert_eq!(rejected.status, TurnStatus::Rejected, "{rejected:?}");
    let failure = rejected.failure.expect("a rejection says why");
    assert_eq!(failure.kind, FailureKind::SessionBusy, "{failure:?}");
    assert!(
        failure.message.contains(&first.task_id),
        "the rejection names the task holding the session: {failure:?}"
    );
    assert_eq!(events.len(), 1, "a rejected task never started: {events:?}");
    let stored = cluster
        .client()
        .await
        .stored_final("acme", &session, &second.task_id)
        .await
        .expect("lookup answers")
        .expect("the rejection is stored");
    assert_eq!(stored.status, TurnStatus::Rejected);

    assert_eq!(
        first_result.status,
        TurnStatus::Completed,
        "{first_result:?}"
    );
    assert_eq!(first_result.answer.as_deref(), Some("first done"));
    assert_eq!(
        model.requests().len(),
        1,
        "the rejected task made no model call"
    );
    assert_eq!(
        history(&cluster, &session).await,
        [
            (Role::User, "first question".to_owned()),
            (Role::Assistant, "first done".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_cancels_the_running_task_without_keeping_its_messages() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        // The first task's call works for a minute: the rollback must stop it.
        FakeReply::tool("slow_effect", json!({ "key": "first", "ms": 60_000 })),
        FakeReply::answer("second done"),
    ])
    .await;
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let session = unique("s");
    let first = submission("acme", &session, "first question");
    let mut second = submission("acme", &session, "second question");
    second.multitask = MultitaskPolicy::Rollback;

    let later = async {
        wait_for_effect(&cluster.effects_file(), "first", true).await;
        cluster.run(&second).await
    };
    let ((first_result, _), (second_result, _)) = tokio::join!(cluster.run(&first), later);

    assert_eq!(
        first_result.status,
        TurnStatus::Cancelled,
        "{first_result:?}"
    );
    assert_eq!(
        first_result.failure.map(|f| f.kind),
        Some(FailureKind::Cancelled)
    );
    assert_eq!(
        second_result.status,
        TurnStatus::Completed,
        "{second_result:?}"
    );
    assert_eq!(second_result.answer.as_deref(), Some("second done"));
    let effects = read_effects(&cluster.effects_file());
    assert_eq!(
        effects.get("first").map(|c| (c.started, c.done)),
        Some((1, 0)),
        "the first task's call was stopped"
    );
    // The second task's model call saw nothing of the first turn, nor does the session keep it.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(contents(&requests[1], "user"), ["second question"]);
    assert!(contents(&requests[1], "tool").is_empty());
    assert_eq!(
        history(&cluster, &session).await,
        [
            (Role::User, "second question".to_owned()),
            (Role::Assistant, "second done".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_stops_the_running_task_at_its_next_step_keeping_its_messages() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("noop", json!({})),
        // Not asked by the first task: it is interrupted before its second model call.
        FakeReply::answer("second done"),
    ])
    .await;
    let gate = model.hold();
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let session = unique("s");
    let first = submission("acme", &session, "first question");
    let mut second = submission("acme", &session, "second question");
    second.multitask = MultitaskPolicy::Interrupt;
    let client = cluster.client().await;
    let store = cluster.store().await;

    let later = async {
        // The first task is running (its first model call is held) when the second arrives...
        requests_arrived(&model, 1).await;
        client.submit(&second).await.expect("second submitted");
        // ...and asks it to stop; then the first goes on to its next step.
        eventually("the interrupt request", Duration::from_secs(30), || async {
            let (controls, _) = store
                .controls("acme", &session, &first.task_id, 0)
                .await
                .ok()?;
            (controls.interrupted_by? == second.task_id).then_some(())
        })
        .await;
        gate.add_permits(2);
        cluster.run(&second).await
    };
    let ((first_result, first_events), (second_result, _)) =
        tokio::join!(cluster.run(&first), later);

    assert_eq!(
        first_result.status,
        TurnStatus::Completed,
        "{first_result:?}"
    );
    let note = first_result.answer.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("interrupted by task {}", second.task_id)),
        "{note}"
    );
    assert!(
        first_events.iter().any(|e| matches!(
            &e.event,
            skein_common::protocol::EventKind::ToolFinished { tool, ok: true, .. } if tool == "noop"
        )),
        "the step before the interrupt ran: {first_events:?}"
    );
    assert_eq!(
        second_result.status,
        TurnStatus::Completed,
        "{second_result:?}"
    );
    assert_eq!(second_result.answer.as_deref(), Some("second done"));
    // The first task asked the model once; the second saw the first turn's work.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(contents(&requests[1], "tool"), ["ok"]);
    assert_eq!(
        contents(&requests[1], "user"),
        ["first question", "second question"]
    );
    let kept = history(&cluster, &session).await;
    let roles: Vec<Role> = kept.iter().map(|(role, _)| *role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::User,
            Role::Assistant
        ],
        "{kept:?}"
    );
    assert_eq!(kept[0].1, "first question");
    assert_eq!(kept[2].1, "ok");
    assert_eq!(kept[3].1, note);
    assert_eq!(kept[5].1, "second done");
}
