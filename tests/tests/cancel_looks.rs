//! A turn's cancel look, answered from what its lead heard only for a task stored while the lead
//! listened without a gap, and from `SKEIN_CANCEL` otherwise: the registry's coverage against a
//! real nats-server (a restart ends it), and a lead's turn starts counted by the stream gets
//! they send.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use skein_common::bus::SubmissionPlace;
use skein_common::cancel::CancelRegistry;
use skein_common::protocol::{CancelRequest, FailureKind, TurnStatus, PROTOCOL_VERSION};
use skein_common::subjects;
use skein_tests::support::chaos::wait_for_effect;
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::servers::NatsServer;
use skein_tests::support::{eventually, test_bus, unique, FakeOpenAi, FakeReply};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What a cancel registry heard answers a turn's cancel look only for a submission stored after
/// the registry knew itself complete: a request published before it listened is in
/// `SKEIN_CANCEL` alone, and a gap (here the server restarted) ends the coverage until it is read
/// again, from which point on only later submissions are covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_look_is_answered_from_what_was_heard_only_while_nothing_can_have_been_missed() {
    let mut nats = NatsServer::start();
    let bus = test_bus(&nats.url).await;
    bus.ensure_streams().await.expect("streams");
    let jetstream = async_nats::jetstream::new(bus.client().clone());
    let subject = subjects::submit_in(0, "acme", &unique("s"));
    let stored = || {
        let (jetstream, subject) = (&jetstream, subject.clone());
        async move {
            let ack = jetstream
                .publish(subject, "task".into())
                .await
                .expect("published")
                .await
                .expect("stored");
            SubmissionPlace {
                partition: 0,
                sequence: ack.sequence,
                stored_ns: 0,
            }
        }
    };
    let cancel = |task_id: &str| {
        let request = CancelRequest {
            v: PROTOCOL_VERSION,
            tenant: "acme".to_owned(),
            task_id: task_id.to_owned(),
            reason: "test".to_owned(),
            call_id: None,
        };
        let bus = &bus;
        async move {
            bus.request_cancel(&request)
                .await
                .expect("cancel published")
        }
    };

    // Stored and cancelled before anyone listened.
    let early = stored().await;
    cancel("early").await;
    let registry = CancelRegistry::default();
    let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
    registry
        .listen(&bus, &tracker, stop.clone(), None)
        .await
        .expect("listening");
    registry.cover_submissions(&bus, &tracker, stop.clone());
    assert_eq!(registry.heard_since("acme", "early", early), None);
    // Covered once the registry has read where the submit stream stood.
    let covered = |task_id: &'static str| {
        let registry = &registry;
        move || async move {
            let place = stored().await;
            registry
                .heard_since("acme", task_id, place)
                .map(|heard| (place, heard))
        }
    };
    let (late, heard) = eventually("the coverage", Duration::from_secs(20), covered("late")).await;
    assert!(!heard, "nothing was published for the late task");
    assert_eq!(
        registry.heard_since("acme", "early", early),
        None,
        "a task stored before the coverage is asked of the stream"
    );
    assert!(
        bus.cancel_requested("acme", "early").await.expect("look"),
        "which holds its request"
    );
    cancel("late").await;
    eventually("the late request heard", Duration::from_secs(10), || {
        let heard = registry.heard_since("acme", "late", late);
        async move { (heard == Some(true)).then_some(()) }
    })
    .await;

    // A gap: the restarted server's requests in between could have been missed.
    nats.restart();
    eventually("the gap noticed", Duration::from_secs(10), || {
        let heard = registry.heard_since("acme", "late", late);
        async move { heard.is_none().then_some(()) }
    })
    .await;
    let (after, heard) = eventually(
        "the coverage again",
        Duration::from_secs(30),
        covered("after"),
    )
    .await;
    assert!(!heard);
    assert!(after.sequence > late.sequence);
    assert_eq!(
        registry.heard_since("acme", "late", late),
        None,
        "a task stored before the gap is asked of the stream again"
    );
    stop.cancel();
    tracker.close();
    tracker.wait().await;
}

/// A turn's start asks `SKEIN_CANCEL` for a task stored and cancelled before its lead listened
/// (and ends it cancelled), but not for tasks stored since: one cancelled while it waited in the
/// stream behind a running task (the lead's one slot busy) ends cancelled without that look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_start_asks_the_cancel_stream_only_for_a_task_stored_before_its_lead_listened() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(Vec::new()).await;
    let spy = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("spy");
    let mut looks = spy
        .subscribe(format!(
            "$JS.API.STREAM.MSG.GET.{}",
            subjects::CANCEL_STREAM
        ))
        .await
        .expect("subscribed");
    spy.flush().await.expect("flushed");
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = asked.clone();
    tokio::spawn(async move {
        while let Some(look) = looks.next().await {
            let body = String::from_utf8_lossy(&look.payload).into_owned();
            seen.lock().expect("looks").push(body);
        }
    });
    // How many looks named the task's cancel subject (after a moment for copies in flight).
    let looks_for = |task_id: &str| {
        let (asked, subject) = (asked.clone(), subjects::cancel("acme", task_id));
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let asked = asked.lock().expect("looks");
            asked.iter().filter(|body| body.contains(&subject)).count()
        }
    };

    let client = cluster.client().await;
    let early = submission("acme", &unique("s"), "early");
    client.submit(&early).await.expect("submitted");
    client
        .cancel("acme", &early.task_id, "before any lead")
        .await
        .expect("cancelled");
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--concurrency", "1"]);
    cluster.start_nodes(0, &flags).await;
    let (result, _) = cluster.run(&early).await;
    assert_eq!(result.status, TurnStatus::Cancelled, "{result:?}");
    assert_eq!(result.failure.map(|f| f.kind), Some(FailureKind::Cancelled));
    assert!(looks_for(&early.task_id).await >= 1, "the stream was asked");

    // Once the lead's coverage stands, a task stored after it is not asked about.
    eventually(
        "a turn started without the look",
        Duration::from_secs(30),
        || {
            let (cluster, model) = (&cluster, &model);
            async move {
                model.push(FakeReply::answer("probe"));
                let probe = submission("acme", &unique("s"), "probe");
                let (result, _) = cluster.run(&probe).await;
                assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
                (looks_for(&probe.task_id).await == 0).then_some(())
            }
        },
    )
    .await;

    model.push(FakeReply::tool(
        "slow_effect",
        json!({ "key": "holds-the-slot", "ms": 60_000 }),
    ));
    let running = submission("acme", &unique("s"), "running");
    let waiting = submission("acme", &unique("s"), "waiting");
    let first = tokio::spawn({
        let (client, running) = (cluster.client().await, running.clone());
        async move { client.run(&running, Duration::from_secs(60), |_| {}).await }
    });
    wait_for_effect(&cluster.effects_file(), "holds-the-slot", true).await;
    client.submit(&waiting).await.expect("submitted");
    client
        .cancel("acme", &waiting.task_id, "while it waits")
        .await
        .expect("cancelled");
    client
        .cancel("acme", &running.task_id, "free the slot")
        .await
        .expect("cancelled");
    let running_result = first.await.expect("joined").expect("answered");
    assert_eq!(running_result.status, TurnStatus::Cancelled);
    let (result, _) = cluster.run(&waiting).await;
    assert_eq!(result.status, TurnStatus::Cancelled, "{result:?}");
    assert_eq!(
        result.failure.as_ref().map(|f| f.message.as_str()),
        Some("cancelled before it started"),
        "it never started"
    );
    assert_eq!(
        looks_for(&waiting.task_id).await,
        0,
        "the lead had heard it"
    );
    assert_eq!(looks_for(&running.task_id).await, 0);
}
