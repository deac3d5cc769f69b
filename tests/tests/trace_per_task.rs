//! Every delivery of a task its client did not trace is one trace: handed back by a stopping
//! lead, resumed after an approval, resumed after a pause. Real lead and worker processes export
//! to an OTLP receiver; each test checks that every start of the task names one trace, that every
//! span exported is in it with its parent exported, and that one delivery starts it.

use std::time::Duration;

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::otlp::OtlpReceiver;
use skein_tests::support::traced::{
    deliveries, one_root_delivery, one_trace_for_every_start, whole_trace, Exporting,
};
use skein_tests::support::{eventually, unique, FakeOpenAi, FakeReply};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// A task its client sent without trace context, handed back by a lead told to stop in the middle
/// of a slow call and finished by another lead: both deliveries, and everything under them, are
/// one trace, and every span's parent was exported (the second delivery continues the first
/// delivery's span, which its lead exported as it stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_handed_back_by_a_stopping_lead_stays_in_one_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let key = unique("slow");
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({ "key": key, "ms": 3000 })),
        FakeReply::answer("done after the hand-back"),
    ])
    .await;
    let _worker = Exporting::new(NODE, &cluster, &receiver.endpoint).test_worker("worker.log");
    cluster.wait_for_workers(1).await;
    let flags = ["--ack-wait", "2s", "--lease-ttl", "2s", "--grace", "1s"];
    let lead = |log| {
        Exporting::new(NODE, &cluster, &receiver.endpoint).process(
            "lead",
            &model.base_url,
            None,
            &flags,
            log,
        )
    };
    let mut first = lead("lead1.log");

    let task = submission("acme", &unique("s"), "take your time");
    let running = cluster.run(&task);
    let stopping = async {
        eventually(
            "the slow call to start",
            Duration::from_secs(30),
            || async { (cluster.effect_starts(&key) > 0).then_some(()) },
        )
        .await;
        first.sigterm();
        let exit = first.wait_exit(Duration::from_secs(30)).await;
        assert!(
            exit.is_some_and(|s| s.success()),
            "the lead stopped: {exit:?}"
        );
        lead("lead2.log")
    };
    let ((result, events), _second) = tokio::join!(running, stopping);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let trace_id =
        one_trace_for_every_start(&result, &events, 2, "started, handed back, started again");

    let spans = whole_trace(&receiver, &trace_id, |spans| {
        deliveries(spans, &task.session).len() >= 2
            && spans
                .iter()
                .filter(|s| s.name == "invoke_agent assistant")
                .count()
                >= 2
    })
    .await;
    let delivered = deliveries(&spans, &task.session);
    let root = delivered
        .iter()
        .find(|s| s.parent_span_id.is_empty())
        .expect("the first delivery starts the trace");
    assert!(
        delivered
            .iter()
            .filter(|s| s.span_id != root.span_id)
            .all(|s| s.parent_span_id == root.span_id),
        "every later delivery continues the first: {delivered:?}"
    );
    let services: std::collections::BTreeSet<_> =
        spans.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(
        services,
        ["skein-lead", "skein-worker"].into_iter().collect()
    );
}

/// A call that waits for a person suspends the turn (its delivery ends and the message is held);
/// `skein approve` answers, and the turn resumes on a later delivery: the suspended and the
/// resumed delivery, and the approved call the worker runs, are one trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_then_resumed_turn_stays_in_one_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({ "key": unique("deploy"), "ms": 10 })),
        FakeReply::answer("deployed after approval"),
    ])
    .await;
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nask = [\"slow_effect\"]\n+++\nYou are careful.\n",
    )
    .expect("AGENTS.md written");
    let _worker = Exporting::new(NODE, &cluster, &receiver.endpoint).test_worker("worker.log");
    cluster.wait_for_workers(1).await;
    let _lead = Exporting::new(NODE, &cluster, &receiver.endpoint).process(
        "lead",
        &model.base_url,
        None,
        &["--agents-dir", agents.to_str().expect("utf-8 path")],
        "lead.log",
    );

    let task = submission("acme", &unique("s"), "deploy it");
    let running = cluster.run(&task);
    let approving = async {
        let store = cluster.store().await;
        eventually("the approval request", Duration::from_secs(30), || {
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
        let approved = std::process::Command::new(NODE)
            .args(["approve", &task.task_id, "--tenant", "acme", "--by", "ann"])
            .args([
                "--redis-url",
                &cluster.redis.url,
                "--nats-url",
                &cluster.nats.url,
            ])
            .output()
            .expect("skein approve runs");
        assert!(
            approved.status.success(),
            "{}",
            String::from_utf8_lossy(&approved.stderr)
        );
    };
    let ((result, events), ()) = tokio::join!(running, approving);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("deployed after approval"));
    let trace_id = one_trace_for_every_start(&result, &events, 2, "asked, then resumed");

    let spans = whole_trace(&receiver, &trace_id, |spans| {
        deliveries(spans, &task.session).len() >= 2
            && spans
                .iter()
                .any(|s| s.service == "skein-worker" && s.name == "execute_tool slow_effect")
    })
    .await;
    one_root_delivery(&spans, &task.session);
}

/// A turn paused while its call runs parks (its delivery ends; no lead holds it) and `skein
/// resume` lets a later delivery continue it: the parked and the resumed delivery, and both calls
/// the worker runs, are one trace, every span's parent exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_then_resumed_turn_stays_in_one_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let (first, second) = (unique("before-pause"), unique("after-resume"));
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({ "key": first, "ms": 1500 })),
        FakeReply::tool("slow_effect", json!({ "key": second, "ms": 10 })),
        FakeReply::answer("done after the pause"),
    ])
    .await;
    let _worker = Exporting::new(NODE, &cluster, &receiver.endpoint).test_worker("worker.log");
    cluster.wait_for_workers(1).await;
    let _lead = Exporting::new(NODE, &cluster, &receiver.endpoint).process(
        "lead",
        &model.base_url,
        None,
        &[],
        "lead.log",
    );

    let session = unique("s");
    let task = submission("acme", &session, "work, then wait");
    let running = cluster.run(&task);
    let controlling = async {
        eventually(
            "the first call running",
            Duration::from_secs(30),
            || async { (cluster.effect_starts(&first) > 0).then_some(()) },
        )
        .await;
        let control = |args: &[&str]| {
            let output = std::process::Command::new(NODE)
                .args(args)
                .args(["--nats-url", &cluster.nats.url, "--tenant", "acme"])
                .output()
                .expect("skein runs");
            assert!(
                output.status.success(),
                "skein {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        control(&["pause", &task.task_id]);
        let store = cluster.store().await;
        eventually("the turn parked", Duration::from_secs(30), || {
            let (store, session) = (store.clone(), session.clone());
            async move {
                store
                    .running_turn("acme", &session)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            }
        })
        .await;
        control(&["resume", &task.task_id, "--session", &session]);
    };
    let ((result, events), ()) = tokio::join!(running, controlling);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("done after the pause"));
    let trace_id = one_trace_for_every_start(&result, &events, 2, "paused, then resumed");

    let spans = whole_trace(&receiver, &trace_id, |spans| {
        deliveries(spans, &session).len() >= 2
            && spans
                .iter()
                .filter(|s| s.service == "skein-worker" && s.name == "execute_tool slow_effect")
                .count()
                >= 2
    })
    .await;
    one_root_delivery(&spans, &session);
}
