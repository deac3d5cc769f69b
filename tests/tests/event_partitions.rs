//! Events partitions (`SKEIN_PARTITIONS`): a task's events go to one of several events streams by
//! a hash of its tenant and task id, and every reader finds them. Checked with a real nats-server
//! and redis-server: the events of many tasks spread over three streams, each task's in its own
//! partition only; a client with another partition count still finds, watches and lists them;
//! and an events stream an older build made (all of `skein.events.>`) is narrowed so the
//! partitions fit beside it, with its events still read.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use skein_common::bus::Bus;
use skein_common::bus::DEFAULT_MAX_PAYLOAD;
use skein_common::config::NatsConfig;
use skein_common::protocol::{EventKind, TurnEvent, TurnStatus, PROTOCOL_VERSION};
use skein_common::subjects;
use skein_tests::support::chaos::scenario;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::servers::NatsServer;
use skein_tests::support::unique;

/// The task ids whose events partition `partition`'s stream holds, read from its subjects.
async fn tasks_in_partition(bus: &Bus, partition: u32) -> BTreeSet<String> {
    let stream = bus
        .jetstream()
        .get_stream(subjects::events_stream(partition))
        .await
        .unwrap_or_else(|e| panic!("events partition {partition}: {e}"));
    let subjects: Vec<(String, usize)> = stream
        .info_with_subjects(subjects::events_in(partition, "acme", "*"))
        .await
        .expect("the events stream answers")
        .try_collect()
        .await
        .expect("its subjects");
    subjects
        .iter()
        .map(|(subject, _)| {
            let (k, _, task) = subjects::parse_events(subject).expect("an event subject");
            assert_eq!(k, partition, "{subject} is in its partition's stream");
            task.to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tasks_events_go_to_its_partition_and_every_reader_finds_them() {
    let cluster = TestCluster::start();
    let script = scenario(&cluster, json!([{ "steps": [ { "answer": "done" } ] }]));
    let script = script.display().to_string();
    cluster
        .start_nodes(0, &["--scenario", &script, "--partitions", "3"])
        .await;
    let three = cluster.partitioned_client(3).await;

    // Four tasks for each partition, drawn until every partition has them (random task ids,
    // where twelve drawn at once leave a partition empty about once in forty runs).
    let mut per_partition = vec![Vec::new(); 3];
    for i in 0..1000 {
        if per_partition.iter().all(|tasks: &Vec<_>| tasks.len() == 4) {
            break;
        }
        let task = submission("acme", &format!("{}-{i}", unique("s")), "hello");
        let k = subjects::events_partition("acme", &task.task_id, 3) as usize;
        if per_partition[k].len() < 4 {
            per_partition[k].push(task);
        }
    }
    let tasks: Vec<_> = per_partition.into_iter().flatten().collect();
    let results = futures::future::join_all(
        tasks
            .iter()
            .map(|task| three.run(task, Duration::from_secs(60), |_| {})),
    )
    .await;
    for result in results {
        assert_eq!(
            result.expect("every task ends").status,
            TurnStatus::Completed
        );
    }

    // Each task's events are in its partition's stream and in no other.
    let mut expected = vec![BTreeSet::new(); 3];
    for task in &tasks {
        let k = subjects::events_partition("acme", &task.task_id, 3);
        expected[k as usize].insert(task.task_id.clone());
    }
    assert!(
        expected.iter().all(|tasks| !tasks.is_empty()),
        "the tasks span every partition: {expected:?}"
    );
    for (k, expected) in expected.iter().enumerate() {
        assert_eq!(&tasks_in_partition(three.bus(), k as u32).await, expected);
    }

    // A client of one partition (a setting not yet raised) reads them all the same.
    let one = cluster.partitioned_client(1).await;
    let listed: BTreeSet<String> = one
        .bus()
        .tenant_tasks("acme")
        .await
        .expect("listed")
        .into_iter()
        .map(|(task, _)| task)
        .collect();
    for task in &tasks {
        let id = task.task_id.as_str();
        assert!(listed.contains(id), "{id} is listed");
        let (_, first) = one
            .bus()
            .first_event("acme", id)
            .await
            .expect("read")
            .expect("a first event");
        assert!(
            matches!(first.event, EventKind::TurnStarted { .. }),
            "{first:?}"
        );
        assert_eq!(
            one.bus()
                .task_events_partition("acme", id)
                .await
                .expect("found"),
            subjects::events_partition("acme", id, 3)
        );
        let watched: Vec<TurnEvent> = tokio::time::timeout(
            Duration::from_secs(20),
            one.watch("acme", id).await.expect("watch").try_collect(),
        )
        .await
        .expect("the watch ends at the final event")
        .expect("events");
        assert!(
            matches!(
                watched.last().map(|e| &e.event),
                Some(EventKind::Final { .. })
            ),
            "{id}: {watched:?}"
        );
        assert_eq!(
            one.bus().event_count("acme", id).await.expect("counted"),
            watched.len() as u64
        );
    }
}

#[tokio::test]
async fn an_events_stream_made_before_its_partitions_is_narrowed_and_its_events_stay_readable() {
    let nats = NatsServer::start();
    let connect = |partitions| {
        let config = NatsConfig {
            partitions,
            ..NatsConfig::local(nats.url.clone())
        };
        async move {
            Bus::connect(&config, "test", DEFAULT_MAX_PAYLOAD)
                .await
                .expect("connect")
        }
    };
    let old = connect(1).await;
    // The events stream as an older build made it, holding an event of a task that a process of
    // three partitions would place elsewhere.
    old.jetstream()
        .create_stream(jetstream::stream::Config {
            name: subjects::EVENTS_STREAM.into(),
            subjects: vec![subjects::EVENTS_ALL.into()],
            allow_direct: true,
            ..Default::default()
        })
        .await
        .expect("old stream");
    let task_id = (0..)
        .map(|i| format!("{}-{i}", unique("t")))
        .find(|task| subjects::events_partition("acme", task, 3) != 0)
        .expect("some task hashes elsewhere");
    let event = |kind| TurnEvent {
        v: PROTOCOL_VERSION,
        task_id: task_id.clone(),
        source: "lead".into(),
        seq: 1,
        at_ms: 1,
        event: kind,
    };
    let started = event(EventKind::Resumed {});
    old.publish_event("acme", &started)
        .await
        .expect("published")
        .confirmed()
        .await
        .expect("stored");

    let three = connect(3).await;
    three.ensure_streams().await.expect("streams");
    let mut events = three
        .jetstream()
        .get_stream(subjects::EVENTS_STREAM)
        .await
        .expect("events stream");
    let config = events.info().await.expect("info").config.clone();
    assert_eq!(config.subjects, [subjects::events_subjects(0)], "narrowed");
    assert_eq!(three.event_partitions().await.expect("listed"), [0, 1, 2]);

    // Found where the older build put it, though this process would place it elsewhere.
    let (_, found) = three
        .first_event("acme", &task_id)
        .await
        .expect("read")
        .expect("the older event");
    assert_eq!(found, started);
    assert_eq!(
        three
            .task_events_partition("acme", &task_id)
            .await
            .expect("found"),
        0
    );
    let replayed: Vec<_> = three
        .replay("acme", &task_id)
        .await
        .expect("replay")
        .take(1)
        .map(|message| message.expect("a message").payload.clone())
        .collect()
        .await;
    assert_eq!(
        three.decode::<TurnEvent>(&replayed[0]).expect("an event"),
        started
    );

    // A new task's events go to its own partition.
    let fresh = (0..)
        .map(|i| format!("{}-{i}", unique("t")))
        .find(|task| subjects::events_partition("acme", task, 3) == 2)
        .expect("some task hashes to 2");
    let mut next = event(EventKind::Resumed {});
    next.task_id = fresh.clone();
    three
        .publish_event("acme", &next)
        .await
        .expect("published")
        .confirmed()
        .await
        .expect("stored");
    assert_eq!(
        three.events_subject("acme", &fresh),
        subjects::events_in(2, "acme", &fresh)
    );
    assert_eq!(
        tasks_in_partition(&three, 2).await,
        BTreeSet::from([fresh.clone()])
    );
    assert_eq!(
        three
            .task_events_partition("acme", &fresh)
            .await
            .expect("found"),
        2
    );
}
