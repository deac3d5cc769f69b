//! Submit partitions (`SKEIN_PARTITIONS`): submissions go to one of several submit streams by a
//! hash of their session, and leads serve every submit partition stream that exists. Checked with
//! a real nats-server and redis-server: the turns of many sessions spread over three streams and
//! every one ends; a session whose tasks were split over two partitions by a re-partition still
//! has its turns applied in submission order; a partition made while a lead runs is served by it.

use std::time::Duration;

use serde_json::json;
use skein_common::client::SkeinClient;
use skein_common::protocol::{TaskSubmission, TurnStatus};
use skein_common::subjects;
use skein_tests::support::chaos::scenario;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::{stored_per_stream, unique};

/// Lead flags for a scripted model that answers each task with its input and the input of the
/// session's turn before it.
fn echo_flags(cluster: &TestCluster) -> Vec<String> {
    let script = scenario(
        cluster,
        json!([{ "steps": [ { "answer": "{{input}} after {{previous_input}}" } ] }]),
    );
    vec!["--scenario".into(), script.display().to_string()]
}

/// A session of tenant `acme` that lands in a partition other than 0 of three.
fn session_outside_partition_zero() -> String {
    (0..)
        .map(|i| format!("{}-{i}", unique("s")))
        .find(|session| subjects::session_partition("acme", session, 3) != 0)
        .expect("some session hashes elsewhere")
}

/// `each` sessions of tenant `acme` in every one of `partitions` partitions (names drawn at random
/// until each partition has its share, so no partition is left empty by chance).
fn sessions_per_partition(each: usize, partitions: u32) -> Vec<String> {
    let mut counts = vec![0; partitions as usize];
    (0..)
        .map(|i| format!("{}-{i}", unique("s")))
        .filter(|session| {
            let slot =
                &mut counts[subjects::session_partition("acme", session, partitions) as usize];
            *slot += 1;
            *slot <= each
        })
        .take(each * partitions as usize)
        .collect()
}

/// How many messages each submit partition's stream has ever stored.
async fn stored_per_partition(client: &SkeinClient, partitions: u32) -> Vec<u64> {
    let streams = (0..partitions).map(subjects::submit_stream);
    stored_per_stream(client.bus().client(), streams).await
}

/// Runs `task` to its final result through `client` (the one that submitted it: a client with
/// another partition count would submit it again elsewhere).
async fn completed(client: &SkeinClient, task: &TaskSubmission) -> String {
    let result = client
        .run(task, Duration::from_secs(60), |_| {})
        .await
        .expect("the task reaches a final result");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    result.answer.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_spread_over_the_submit_partitions_and_every_one_ends() {
    let cluster = TestCluster::start();
    let mut flags = echo_flags(&cluster);
    flags.extend(["--partitions".into(), "3".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    cluster.start_nodes(0, &flags).await;
    let client = cluster.partitioned_client(3).await;

    let sessions = sessions_per_partition(4, 3);
    let tasks: Vec<_> = sessions
        .iter()
        .map(|session| submission("acme", session, "hello"))
        .collect();
    let outputs =
        futures::future::join_all(tasks.iter().map(|task| completed(&client, task))).await;

    assert!(outputs.iter().all(|output| output == "hello after "));
    let mut expected = vec![0u64; 3];
    for session in &sessions {
        expected[subjects::session_partition("acme", session, 3) as usize] += 1;
    }
    assert_eq!(expected, [4, 4, 4], "the sessions span every partition");
    // Each task was stored once, in its session's partition, and none waits there.
    assert_eq!(stored_per_partition(&client, 3).await, expected);
    for k in 0..3 {
        drained(client.bus(), k).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_turns_keep_their_order_across_a_repartition() {
    let cluster = TestCluster::start();
    let (one, three) = (
        cluster.partitioned_client(1).await,
        cluster.partitioned_client(3).await,
    );
    let session = session_outside_partition_zero();
    // Submitted while no lead runs: the first and last to `SKEIN_SUBMIT`, the middle one, by a
    // client of the re-partitioned cluster, to another partition.
    let tasks: Vec<_> = (0..3)
        .map(|i| submission("acme", &session, &format!("m{i}")))
        .collect();
    let submitters = [&one, &three, &one];
    for (task, client) in tasks.iter().zip(submitters) {
        client.submit(task).await.expect("submitted");
    }
    let k = subjects::session_partition("acme", &session, 3) as usize;
    let stored = stored_per_partition(&three, 3).await;
    assert_eq!((stored[0], stored[k]), (2, 1), "split over two partitions");

    // A lead of one partition finds the other at start and serves both, in submission order.
    let flags = echo_flags(&cluster);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    cluster.start_nodes(0, &flags).await;
    let outputs = futures::future::join_all(
        tasks
            .iter()
            .zip(submitters)
            .map(|(task, client)| completed(client, task)),
    )
    .await;

    assert_eq!(outputs, ["m0 after ", "m1 after m0", "m2 after m1"]);
    let stored = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("session loads");
    assert_eq!(stored.state.turns, 3);
    let inputs: Vec<_> = stored
        .state
        .history
        .iter()
        .step_by(2)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        inputs,
        ["m0", "m1", "m2"],
        "turns applied in submission order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_partitions_made_while_a_lead_runs_are_served_by_it() {
    let cluster = TestCluster::start();
    let flags = echo_flags(&cluster);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // The lead starts on one partition: only `SKEIN_SUBMIT` exists.
    cluster.start_nodes(0, &flags).await;
    let one = cluster.partitioned_client(1).await;
    assert_eq!(one.bus().submit_partitions().await.expect("listed"), [0]);

    // The cluster is re-partitioned: a client with three partitions makes the new streams and
    // submits to one of them.
    let three = cluster.partitioned_client(3).await;
    let session = session_outside_partition_zero();
    let task = submission("acme", &session, "hello");

    assert_eq!(completed(&three, &task).await, "hello after ");
    let k = subjects::session_partition("acme", &session, 3);
    drained(three.bus(), k).await;
}

/// Waits until the leads' consumer on submit partition `k` holds nothing pending and nothing
/// unacknowledged. A lead acks a submission after its final event is stored, so the last acks
/// may still be on their way when a client has every answer.
async fn drained(bus: &skein_common::bus::Bus, k: u32) {
    skein_tests::support::eventually(
        &format!("submit partition {k} drained"),
        std::time::Duration::from_secs(10),
        || async move {
            let depth = bus
                .consumer_depth(&subjects::submit_stream(k), subjects::LEADS_CONSUMER)
                .await
                .expect("the leads' consumer is bound on the partition");
            (depth == (0, 0)).then_some(())
        },
    )
    .await;
}
