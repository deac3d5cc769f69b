//! A small soak in CI: tool tasks of every outcome (success, failure, timeout, cancellation,
//! panic, `shell` leaving a sleeper behind, task-scoped MCP servers) against two worker processes;
//! afterwards the workers hold what they held before: no child processes, no scratch entries, no
//! open scopes or task resources, file descriptors and memory back near where they were.
//! `skein-bench soak` runs the same at size (20,000 tasks).

use std::sync::Arc;
use std::time::Duration;

use skein_common::dispatch::Dispatcher;
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::servers::free_port;
use skein_tests::support::soak::{self, Holdings, SoakWorker};
use skein_tests::support::{eventually, unique, ChildProcess};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");
const MCP_FIXTURE: &str = env!("CARGO_BIN_EXE_skein-mcp-fixture");

/// Tasks of the CI soak (the bench runs 20,000).
const TASKS: usize = 300;

/// File descriptors a worker may hold beyond its warmed-up baseline afterwards (pooled
/// connections to the broker, Redis and HTTP peers come and go).
const FD_SLACK: usize = 16;

fn start_worker(cluster: &TestCluster, n: usize) -> (ChildProcess, SoakWorker) {
    let mcp = cluster.dir.join("mcp.json");
    std::fs::write(
        &mcp,
        soak::mcp_config(MCP_FIXTURE.as_ref(), &[]).to_string(),
    )
    .expect("MCP configuration written");
    let admin = format!("127.0.0.1:{}", free_port());
    let scratch = cluster.dir.join(format!("scratch-{n}"));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let mut cmd = std::process::Command::new(NODE);
    cmd.arg("test-worker")
        .args(soak::worker_flags(
            &cluster.nats.url,
            &cluster.redis.url,
            &unique("soak-worker"),
            &admin,
            &scratch,
            &mcp,
        ))
        .env("SKEIN_TEST_EFFECTS", cluster.effects_file());
    let process = ChildProcess::spawn(cmd, cluster.dir.join(format!("worker-{n}.log")));
    let worker = SoakWorker {
        pid: process.id(),
        admin,
        scratch,
    };
    (process, worker)
}

/// Waits until a worker is quiet: no children, no scratch entries, gauges at zero.
async fn settled(worker: &SoakWorker) -> Holdings {
    eventually(
        "the worker to release what its tasks held",
        Duration::from_secs(30),
        || async {
            let now = worker.holdings().await;
            (now.child_processes == 0
                && now.scratch_entries == 0
                && now.open_scopes == 0.0
                && now.open_task_resources == 0.0)
                .then_some(now)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_hold_nothing_more_after_tasks_of_every_outcome() {
    let cluster = TestCluster::start();
    let (_first, first) = start_worker(&cluster, 1);
    let (_second, second) = start_worker(&cluster, 2);
    cluster.wait_for_workers(2).await;
    let bus = skein_common::bus::Bus::connect(
        &skein_common::config::NatsConfig::local(cluster.nats.url.clone()),
        "soak",
        1024 * 1024,
    )
    .await
    .expect("bus");
    let tracker = TaskTracker::new();
    let dispatcher = Arc::new(
        Dispatcher::start(
            bus.clone(),
            cluster.store().await,
            &unique("soak-lead"),
            &tracker,
            CancellationToken::new(),
        )
        .await
        .expect("dispatcher"),
    );

    // Warm up at the same concurrency (lazy pools, allocator arenas of busy threads, first MCP
    // start), then take the baseline.
    let warm = soak::run(&bus, dispatcher.clone(), 10 * soak::KINDS.len(), 32).await;
    assert!(
        warm.unexpected().is_empty(),
        "warm-up: {:?}",
        warm.unexpected()
    );
    println!("warm-up: {} tasks in {:?}", warm.total(), warm.elapsed);
    let before = [settled(&first).await, settled(&second).await];

    let run = soak::run(&bus, dispatcher.clone(), TASKS, 32).await;
    let after = [settled(&first).await, settled(&second).await];
    println!(
        "soak: {} tasks in {:?}: {:?}\nbefore {before:?}\nafter  {after:?}",
        run.total(),
        run.elapsed,
        run.outcomes
    );
    assert_eq!(run.total(), TASKS);
    assert!(run.unexpected().is_empty(), "{:?}", run.unexpected());
    for (before, after) in before.iter().zip(&after) {
        assert!(
            after.open_fds <= before.open_fds + FD_SLACK,
            "file descriptors: {before:?} -> {after:?}"
        );
        // Memory is not returned to the system at once; it must not grow with the tasks run.
        assert!(
            after.rss_kib < before.rss_kib + before.rss_kib / 2,
            "resident memory: {before:?} -> {after:?}"
        );
    }
}
