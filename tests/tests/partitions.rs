//! Work partitions (`SKEIN_PARTITIONS`): tool calls go to one of several work streams by a hash
//! of their session, and workers serve every partition stream that exists. Checked with a real
//! nats-server and redis-server: calls of many sessions spread over three streams and every one
//! is answered; a cluster re-partitioned to more streams while a worker runs has the new
//! partitions served by it, and one re-partitioned to fewer has the calls waiting in the
//! partitions no longer dispatched to served by a worker that knows only one.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use skein_common::bus::{Bus, DEFAULT_MAX_PAYLOAD};
use skein_common::config::NatsConfig;
use skein_common::dispatch::{CallRoute, Dispatcher};
use skein_common::protocol::{CallOutcome, TaskOrigin};
use skein_common::subjects;
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::{stored_per_stream, unique};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Sessions whose calls are made: enough that each of three partitions gets some.
const SESSIONS: usize = 30;

/// A bus on the cluster's NATS that creates and dispatches to `partitions` work partitions.
async fn partitioned_bus(cluster: &TestCluster, partitions: u32) -> Bus {
    let cfg = NatsConfig {
        partitions,
        ..NatsConfig::local(cluster.nats.url.clone())
    };
    let bus = Bus::connect(&cfg, "test", DEFAULT_MAX_PAYLOAD)
        .await
        .expect("connects to the test NATS");
    bus.ensure_streams().await.expect("streams");
    bus
}

async fn dispatcher(cluster: &TestCluster, bus: &Bus, tracker: &TaskTracker) -> Arc<Dispatcher> {
    let dispatcher = Dispatcher::start(
        bus.clone(),
        cluster.store().await,
        &unique("lead"),
        tracker,
        CancellationToken::new(),
    )
    .await
    .expect("dispatcher");
    Arc::new(dispatcher)
}

fn origin(session: usize) -> TaskOrigin {
    TaskOrigin {
        task_id: unique("task"),
        tenant: "acme".into(),
        user: "tester".into(),
        session: format!("session-{session}"),
        workspace: format!("session-{session}"),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

/// One no-op call for each of [`SESSIONS`] sessions, all at once; how many were answered `Ok`.
async fn call_every_session(dispatcher: Arc<Dispatcher>) -> usize {
    let route = || CallRoute {
        pool: "default",
        timeout: Duration::from_secs(40),
        may_have_run: false,
    };
    futures::stream::iter(0..SESSIONS)
        .map(|session| {
            let dispatcher = dispatcher.clone();
            async move {
                let result = dispatcher
                    .call_tool(&origin(session).into(), 1, "c", "noop", json!({}), route())
                    .await;
                matches!(result.outcome, CallOutcome::Ok { .. })
            }
        })
        .buffer_unordered(SESSIONS)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await
}

/// How many messages each work partition's stream has ever stored.
async fn stored_per_partition(bus: &Bus, partitions: u32) -> Vec<u64> {
    stored_per_stream(bus.client(), (0..partitions).map(subjects::work_stream)).await
}

/// The sessions' expected spread over `partitions` (the hash every process uses).
fn expected_spread(partitions: u32) -> Vec<u64> {
    let mut counts = vec![0u64; partitions as usize];
    for session in 0..SESSIONS {
        let k = subjects::session_partition("acme", &format!("session-{session}"), partitions);
        counts[k as usize] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spread_over_the_partitions_and_every_one_is_answered() {
    let cluster = TestCluster::start();
    let bus = partitioned_bus(&cluster, 3).await;
    cluster.spawn_test_worker(cluster.worker_config(&["--partitions", "3"]));
    cluster.wait_for_workers(1).await;
    let tracker = TaskTracker::new();

    let answered = call_every_session(dispatcher(&cluster, &bus, &tracker).await).await;

    assert_eq!(answered, SESSIONS, "every call is answered");
    let expected = expected_spread(3);
    assert!(
        expected.iter().all(|&n| n > 0),
        "the sessions span every partition"
    );
    // Each call was stored once, in its session's partition.
    assert_eq!(stored_per_partition(&bus, 3).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_while_a_worker_runs_are_served_by_it() {
    let cluster = TestCluster::start();
    // The worker starts on one partition: only `SKEIN_WORK` exists.
    let one = partitioned_bus(&cluster, 1).await;
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    assert_eq!(one.work_partitions().await.expect("listed"), [0]);

    // The cluster is re-partitioned: a dispatcher with three partitions makes the new streams.
    let three = partitioned_bus(&cluster, 3).await;
    let tracker = TaskTracker::new();
    let answered = call_every_session(dispatcher(&cluster, &three, &tracker).await).await;

    assert_eq!(
        answered, SESSIONS,
        "calls in the new partitions are answered"
    );
    assert_eq!(stored_per_partition(&three, 3).await, expected_spread(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_left_in_partitions_no_longer_dispatched_to_are_served() {
    let cluster = TestCluster::start();
    // Calls are dispatched to three partitions while no worker runs: they wait in the streams.
    let three = partitioned_bus(&cluster, 3).await;
    let tracker = TaskTracker::new();
    let calls = tokio::spawn(call_every_session(
        dispatcher(&cluster, &three, &tracker).await,
    ));
    let bus = three.clone();
    skein_tests::support::eventually(
        "every call waits in a stream",
        Duration::from_secs(20),
        || {
            let bus = bus.clone();
            async move {
                let stored: u64 = stored_per_partition(&bus, 3).await.iter().sum();
                (stored == SESSIONS as u64).then_some(())
            }
        },
    )
    .await;

    // The cluster goes back to one partition; its worker finds the other two and serves them.
    cluster.spawn_test_worker(cluster.worker_config(&["--partitions", "1"]));
    let answered = calls.await.expect("the calls ran");

    assert_eq!(answered, SESSIONS, "no call is lost");
    // A worker replies before it acks: the last acks may still be on their way.
    skein_tests::support::eventually(
        "every partition drained: nothing pending, nothing unacknowledged",
        Duration::from_secs(10),
        || {
            let bus = three.clone();
            async move {
                for k in 0..3 {
                    let depth = bus
                        .consumer_depth(
                            &subjects::work_stream(k),
                            &subjects::tool_consumer("default"),
                        )
                        .await
                        .expect("the worker's consumer is bound on every partition");
                    if depth != (0, 0) {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
}
