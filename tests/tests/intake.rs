//! A durable intake (`Intake::serve`) against a real nats-server: it never takes more messages
//! than it has free slots (nothing waits in a client-side buffer while its ack deadline runs
//! out), and it takes new messages as soon as slots free up.

use std::sync::Arc;
use std::time::Duration;

use skein_common::bus::{Bus, ConsumerSettings, Disposition, Intake, Received, Slots};
use skein_common::subjects;
use skein_tests::support::servers::NatsServer;
use skein_tests::support::{eventually, test_bus, unique};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A bus on `nats` with Skein's streams, a new pool's tool consumer bound (its durable name and
/// intake), and `queued` tool tasks (`{"n": i}`) waiting for it.
async fn queued_tool_intake(nats: &NatsServer, queued: usize) -> (Bus, String, Intake) {
    let bus = test_bus(&nats.url).await;
    bus.ensure_streams().await.expect("streams");
    let pool = unique("pool");
    let durable = subjects::tool_consumer(&pool);
    let intake = bus
        .intake(&ConsumerSettings {
            stream: subjects::WORK_STREAM.into(),
            durable: durable.clone(),
            filter: subjects::tool_filter(0, &pool),
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            max_ack_pending: None,
        })
        .await
        .expect("intake");
    for i in 0..queued {
        bus.publish_work(
            subjects::tool_task(0, &pool, "noop"),
            &serde_json::json!({ "n": i }),
            &format!("{pool}-{i}"),
        )
        .await
        .expect("published");
    }
    (bus, durable, intake)
}

#[tokio::test]
async fn intake_holds_no_more_messages_than_free_slots_and_refills_as_they_free() {
    let nats = NatsServer::start();
    let queued = 10;
    let (bus, durable, intake) = queued_tool_intake(&nats, queued).await;

    // Three slots; every handler holds its message until it is let go.
    let capacity = 3;
    let release = Arc::new(Semaphore::new(0));
    let (started, mut starts) = mpsc::channel(queued);
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let serving = tokio::spawn({
        let (release, shutdown, tracker) = (release.clone(), shutdown.clone(), tracker.clone());
        intake.serve(
            Slots::new(capacity),
            shutdown,
            tracker,
            move |received: Received<serde_json::Value>| {
                let (release, started) = (release.clone(), started.clone());
                async move {
                    let Received::Decoded(delivery) = received else {
                        panic!("the test's messages decode");
                    };
                    let _ = started.send(()).await;
                    if let Ok(permit) = release.acquire().await {
                        permit.forget();
                    }
                    delivery.settle(Disposition::Ack).await;
                }
            },
        )
    });

    let depth = || async {
        bus.consumer_depth(subjects::WORK_STREAM, &durable)
            .await
            .ok()
    };
    for _ in 0..capacity {
        tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .expect("a slot's message arrives")
            .expect("started");
    }
    // Delivered is exactly what runs: the rest still waits at the broker.
    let (pending, ack_pending) = eventually("depth", Duration::from_secs(10), || async {
        depth()
            .await
            .filter(|&(pending, _)| pending == (queued - capacity) as u64)
    })
    .await;
    assert_eq!(ack_pending, capacity as u64);
    assert_eq!(pending, (queued - capacity) as u64);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        depth().await,
        Some(((queued - capacity) as u64, capacity as u64))
    );
    assert!(
        starts.try_recv().is_err(),
        "no message runs beyond the slots"
    );

    // Freeing two slots takes exactly two more.
    release.add_permits(2);
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .expect("freed slots take new messages")
            .expect("started");
    }
    let (pending, ack_pending) = eventually("depth after two", Duration::from_secs(10), || async {
        depth().await.filter(|&(pending, ack_pending)| {
            pending == (queued - capacity - 2) as u64 && ack_pending == capacity as u64
        })
    })
    .await;
    assert_eq!((pending, ack_pending), ((queued - 5) as u64, 3));

    // Let everything through: all messages run, once each.
    release.add_permits(queued);
    for _ in 0..(queued - capacity - 2) {
        tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .expect("the rest run")
            .expect("started");
    }
    eventually("drained", Duration::from_secs(10), || async {
        depth().await.filter(|&d| d == (0, 0))
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("intake stops on shutdown")
        .expect("intake task");
    assert!(starts.try_recv().is_err(), "no message ran twice");
}

/// Processes with different settings bind the same durable consumer: its ack wait only grows (a
/// shorter one would let the broker redeliver work a process with the longer one still holds),
/// and the outstanding-delivery limit follows the newest process, on nats-server 2.9.
#[tokio::test]
async fn a_consumer_created_with_other_settings_is_reconciled() {
    let nats = NatsServer::start();
    let bus = test_bus(&nats.url).await;
    bus.ensure_streams().await.expect("streams");
    let pool = unique("pool");
    let settings = |ack_wait: u64, max_ack_pending: Option<i64>| ConsumerSettings {
        stream: subjects::WORK_STREAM.into(),
        durable: subjects::tool_consumer(&pool),
        filter: subjects::tool_filter(0, &pool),
        ack_wait: Duration::from_secs(ack_wait),
        max_deliver: -1,
        max_ack_pending,
    };
    let config = |bus: &Bus| {
        let bus = bus.clone();
        let durable = subjects::tool_consumer(&pool);
        async move {
            let stream = async_nats::jetstream::new(bus.client().clone())
                .get_stream(subjects::WORK_STREAM)
                .await
                .expect("stream");
            stream
                .consumer_info(&durable)
                .await
                .expect("consumer info")
                .config
        }
    };

    bus.intake(&settings(2, None)).await.expect("created");
    let created = config(&bus).await;
    assert_eq!(created.ack_wait, Duration::from_secs(2));
    assert_eq!(created.max_ack_pending, 1000);

    bus.intake(&settings(6, Some(-1))).await.expect("updated");
    let updated = config(&bus).await;
    assert_eq!(updated.ack_wait, Duration::from_secs(6));
    assert_eq!(updated.max_ack_pending, -1);

    bus.intake(&settings(1, Some(-1))).await.expect("bound");
    let kept = config(&bus).await;
    assert_eq!(
        kept.ack_wait,
        Duration::from_secs(6),
        "the ack wait never shrinks"
    );
}

/// Every queue is bounded: a stream created before its limits gets them, and a full work queue
/// refuses a new message with an error its publisher sees (nothing already queued is dropped).
#[tokio::test]
async fn streams_are_bounded_and_old_streams_get_their_limits() {
    use async_nats::jetstream::stream;
    use skein_common::bus::STREAM_LIMITS;
    let nats = NatsServer::start();
    let bus = test_bus(&nats.url).await;
    let jetstream = async_nats::jetstream::new(bus.client().clone());
    // A submit stream as an older build created it: no limits.
    jetstream
        .create_stream(stream::Config {
            name: subjects::SUBMIT_STREAM.into(),
            subjects: vec![subjects::SUBMIT_ALL.into()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("old stream");
    bus.ensure_streams().await.expect("streams");
    for name in [subjects::SUBMIT_STREAM, subjects::WORK_STREAM] {
        let mut queue = jetstream.get_stream(name).await.expect("stream");
        let config = queue.info().await.expect("info").config.clone();
        assert_eq!(config.max_messages, STREAM_LIMITS.queue_messages, "{name}");
        assert_eq!(config.max_bytes, STREAM_LIMITS.queue_bytes, "{name}");
        assert_eq!(config.max_age, STREAM_LIMITS.queue_age, "{name}");
        assert_eq!(config.discard, stream::DiscardPolicy::New, "{name}");
    }
    let mut events = jetstream
        .get_stream(subjects::EVENTS_STREAM)
        .await
        .expect("events");
    assert_eq!(
        events.info().await.expect("info").config.max_bytes,
        STREAM_LIMITS.events_bytes
    );

    // A full queue (here shrunk to two messages) refuses the third.
    let mut tiny = jetstream
        .get_stream(subjects::WORK_STREAM)
        .await
        .expect("work")
        .info()
        .await
        .expect("info")
        .config
        .clone();
    tiny.max_messages = 2;
    jetstream.update_stream(tiny).await.expect("shrunk");
    let pool = unique("pool");
    for n in 0..2 {
        bus.publish_work(
            subjects::tool_task(0, &pool, "noop"),
            &serde_json::json!({ "n": n }),
            &format!("{pool}-{n}"),
        )
        .await
        .expect("queued");
    }
    let refused = bus
        .publish_work(
            subjects::tool_task(0, &pool, "noop"),
            &serde_json::json!({ "n": 2 }),
            &format!("{pool}-2"),
        )
        .await;
    assert!(refused.is_err(), "a full queue refuses: {refused:?}");
}

/// Pulling one message at a time (one free slot) subscribes once: each pull request goes to the
/// same inbox, so the broker's subscription table is not changed twice per pull. Counted with
/// nats-server's own subscription statistics (`/subsz`).
#[tokio::test]
async fn pulls_reuse_one_inbox_rather_than_subscribing_for_each() {
    let monitor = skein_tests::support::servers::free_port();
    let nats = NatsServer::start_with_config(&format!("http: 127.0.0.1:{monitor}"));
    let inserts = || async move {
        let stats: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{monitor}/subsz"))
            .await
            .expect("monitoring answers")
            .json()
            .await
            .expect("subscription statistics");
        stats["num_inserts"].as_u64().expect("num_inserts")
    };
    let queued = 40;
    let (_bus, _, intake) = queued_tool_intake(&nats, queued).await;
    let before = inserts().await;

    let (ran, mut runs) = mpsc::channel(queued);
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(intake.serve(
        Slots::new(1),
        shutdown.clone(),
        TaskTracker::new(),
        move |received: Received<serde_json::Value>| {
            let ran = ran.clone();
            async move {
                let Received::Decoded(delivery) = received else {
                    panic!("the test's messages decode");
                };
                let n = delivery.body()["n"].as_u64();
                delivery.settle(Disposition::Ack).await;
                let _ = ran.send(n).await;
            }
        },
    ));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..queued {
        let n = tokio::time::timeout(Duration::from_secs(10), runs.recv())
            .await
            .expect("every message runs")
            .expect("ran");
        assert!(seen.insert(n), "message {n:?} ran twice");
    }
    let subscribed = inserts().await - before;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("intake stops on shutdown")
        .expect("intake task");
    assert_eq!(seen.len(), queued);
    // One pull per message (one slot): a subscription per pull would be `queued` of them.
    assert!(
        subscribed <= 2,
        "{subscribed} subscriptions made for {queued} pulls"
    );
}
