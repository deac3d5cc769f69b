//! Redis that survives the loss of a node. A lead and a worker on a primary watched by Sentinels
//! (`redis+sentinel://`) run a burst of turns while the primary is killed (SIGKILL) and the
//! Sentinels promote its replica: every turn completes, and the results are on the new primary. A
//! lead and two workers on a three-primary Redis Cluster (`redis+cluster://`) run a burst of
//! turns across sessions spread over every primary: every turn completes, and the store's listing
//! finds the sessions of every primary. Each test prints its figures. On a cluster, a request a
//! node refused unrun is sent again (a transaction to the node its slot moved to), and one whose
//! connection dropped while the node held it is not (it runs once).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::config::RedisConfig;
use skein_common::protocol::{TaskSubmission, TurnStatus};
use skein_common::store::{CallAdmission, RunMarker, SessionStore};
use skein_tests::support::chaos::{run_all, scenario, wait_for_effect};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::redis_ha::{RedisCluster, ReplyCutter, SentinelGroup};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{eventually, unique};

/// The store over `url`.
async fn store(url: &str) -> SessionStore {
    SessionStore::connect(&RedisConfig::local(url))
        .await
        .unwrap_or_else(|e| panic!("the store connects over {url}: {e}"))
}

/// Waits until `n` workers are live in the registry behind `store`.
async fn wait_for_workers(store: &SessionStore, n: usize) {
    eventually(
        &format!("{n} live workers"),
        Duration::from_secs(20),
        || async move {
            let live = store.live_workers().await.ok()?;
            (live.len() >= n).then_some(())
        },
    )
    .await
}

/// Starts a lead and `workers` test workers (with the test tools) whose Redis is `redis_url`; a
/// short lease, so a turn whose lease could not be released while Redis was away is taken up
/// again soon.
fn start_nodes(cluster: &TestCluster, redis_url: &str, workers: usize, script: &str) {
    for _ in 0..workers {
        let mut cfg = cluster.worker_config(&["--ack-wait", "2s"]);
        cfg.redis.url = redis_url.to_owned();
        cluster.spawn_test_worker(cfg);
    }
    let mut cfg = cluster.lead_config(&[
        "--scenario",
        script,
        "--ack-wait",
        "2s",
        "--lease-ttl",
        "3s",
    ]);
    cfg.redis.url = redis_url.to_owned();
    cluster.spawn_lead(cfg);
}

/// Each turn calls `slow_effect` once (keyed by its input), then answers with the result.
fn one_call_per_turn(cluster: &TestCluster, ms: u64) -> String {
    scenario(
        cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": ms } } ] },
            { "answer": "{{observations}}" }
        ] }]),
    )
    .to_str()
    .expect("utf-8 path")
    .to_owned()
}

/// Every task completed with its own call's result.
fn assert_all_completed(
    tasks: &[TaskSubmission],
    results: &[(
        skein_common::protocol::FinalResult,
        Vec<skein_common::protocol::TurnEvent>,
    )],
) {
    for (task, (result, _)) in tasks.iter().zip(results) {
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        let expected = format!("effect {} done", task.input.text());
        assert_eq!(result.answer.as_deref(), Some(expected.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_complete_while_sentinel_fails_the_primary_over() {
    let mut group = SentinelGroup::start().await;
    let cluster = TestCluster::start();
    let url = group.url();
    let script = one_call_per_turn(&cluster, 300);
    start_nodes(&cluster, &url, 1, &script);
    let store = store(&url).await;
    wait_for_workers(&store, 1).await;

    let tenant = "acme";
    let tasks: Vec<_> = (0..16)
        .map(|i| submission(tenant, &unique("s"), &format!("job{i}")))
        .collect();
    let (before, after) = tasks.split_at(8);
    let running_before = run_all(&cluster, before);
    let failover = async {
        // The primary dies while the first turns hold calls in flight; the rest are submitted
        // while the Sentinels have not promoted the replica yet.
        wait_for_effect(&cluster.effects_file(), "job0", true).await;
        group.primary.stop();
        let killed = Instant::now();
        let (results_after, ()) = tokio::join!(run_all(&cluster, after), async {
            group.wait_for_failover().await;
            println!(
                "sentinel failover: replica promoted {:?} after the kill",
                killed.elapsed()
            );
        });
        (results_after, killed)
    };
    let (mut results, (results_after, killed)) = tokio::join!(running_before, failover);
    results.extend(results_after);
    println!(
        "sentinel failover: every turn ended {:?} after the kill",
        killed.elapsed()
    );

    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    let effects = read_effects(&cluster.effects_file());
    let rerun = effects.values().filter(|c| c.started > 1).count();
    println!(
        "sentinel failover: submitted {} completed {} lost {} calls run more than once {}",
        tasks.len(),
        completed,
        tasks.len() - completed,
        rerun
    );
    assert_all_completed(&tasks, &results);
    assert_eq!(
        group.agreed_primary_port().await,
        Some(group.replica.port()),
        "the replica is the primary now; sentinel logs:\n{}",
        group.log()
    );
    // The store opened before the failover follows the new primary: its first request after the
    // kill may fail (the connection to the dead primary breaks), later ones read every final
    // result back from the new primary.
    for task in &tasks {
        let stored = eventually(
            "the final result read from the new primary",
            Duration::from_secs(10),
            || async {
                store
                    .final_result(tenant, &task.session, &task.task_id)
                    .await
                    .ok()
            },
        )
        .await
        .unwrap_or_else(|| panic!("{} has its final result stored", task.task_id));
        assert_eq!(stored.status, TurnStatus::Completed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_turns_on_a_redis_cluster_completes_across_every_primary() {
    let redis_cluster = RedisCluster::start().await;
    let cluster = TestCluster::start();
    let url = redis_cluster.url();
    let script = one_call_per_turn(&cluster, 50);
    start_nodes(&cluster, &url, 2, &script);
    let store = store(&url).await;
    wait_for_workers(&store, 2).await;

    // Eight sessions on each primary, so every step of a turn runs on each of them.
    let tenant = unique("t");
    let per_node = 8;
    let mut sessions: Vec<Vec<String>> = vec![Vec::new(); redis_cluster.nodes.len()];
    while sessions.iter().any(|on_node| on_node.len() < per_node) {
        let session = unique("s");
        let node = redis_cluster
            .node_of(&skein_common::store::keys::session(&tenant, &session))
            .await;
        if sessions[node].len() < per_node {
            sessions[node].push(session);
        }
    }
    let tasks: Vec<_> = sessions
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, session)| submission(&tenant, session, &format!("job{i}")))
        .collect();
    let results = run_all(&cluster, &tasks).await;

    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    let pattern = skein_common::store::keys::session(&tenant, "*");
    let mut held = Vec::new();
    for node in 0..redis_cluster.nodes.len() {
        held.push(redis_cluster.keys_on(node, &pattern).await.len());
    }
    println!(
        "redis cluster: submitted {} completed {} lost {} session keys per primary {held:?}",
        tasks.len(),
        completed,
        tasks.len() - completed
    );
    assert_all_completed(&tasks, &results);
    assert_eq!(held, vec![per_node; redis_cluster.nodes.len()]);
    let listed: BTreeSet<String> = store
        .sessions(&tenant)
        .await
        .expect("sessions listed")
        .into_iter()
        .map(|summary| {
            assert_eq!(summary.turns, 1, "{summary:?}");
            summary.session
        })
        .collect();
    let expected: BTreeSet<String> = sessions.into_iter().flatten().collect();
    assert_eq!(listed, expected, "the listing visits every primary");
}

/// One command on a fresh connection to a node of the test deployment.
async fn on_node<T: redis::FromRedisValue>(url: &str, cmd: &mut redis::Cmd) -> T {
    let client = redis::Client::open(url).expect("a node URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("the node answers");
    cmd.query_async(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("{cmd:?} on {url}: {e}"))
}

/// Whether a client of `CLIENT LIST` waits on the paused node (flag `b`, blocked).
fn held(clients: &str) -> bool {
    clients.lines().any(|client| {
        client.split(' ').any(|field| {
            field
                .strip_prefix("flags=")
                .is_some_and(|f| f.contains('b'))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_request_whose_answer_was_lost_is_not_sent_again() {
    let redis_cluster = RedisCluster::start().await;
    let (tenant, session, call) = ("acme", unique("s"), "t1:0:call_1");
    let attempts = skein_common::store::keys::attempts(tenant, &session, call);
    let index = redis_cluster.node_of(&attempts).await;
    let node = redis_cluster.nodes[index].url.clone();
    let cutter = ReplyCutter::start(redis_cluster.nodes[index].port()).await;
    redis_cluster.announce_through(index, &cutter).await;
    let store = store(&redis_cluster.url()).await;
    let marker = RunMarker {
        owner: "worker-1",
        ttl: Duration::from_secs(60),
    };
    let admitted = store.admit_call(tenant, &session, call, marker).await;
    assert!(
        matches!(admitted, Ok(CallAdmission::Attempt { count: 1, .. })),
        "the store reaches the node through the cutter: {admitted:?}"
    );

    // The node holds its writes: the next attempt's count waits there, sent, until the node goes
    // on; meanwhile its connection drops, so its client cannot know whether it was applied.
    let () = on_node(
        &node,
        redis::cmd("CLIENT").arg("PAUSE").arg(600_000).arg("WRITE"),
    )
    .await;
    let counted = store.admit_call(tenant, &session, call, marker);
    let lose_the_answer = async {
        eventually(
            "the count held by the node",
            Duration::from_secs(20),
            || {
                let node = node.clone();
                async move {
                    let clients: String = on_node(&node, redis::cmd("CLIENT").arg("LIST")).await;
                    held(&clients).then_some(())
                }
            },
        )
        .await;
        cutter.cut_replies();
    };
    let (unanswered, ()) = tokio::join!(counted, lose_the_answer);
    let () = on_node(&node, redis::cmd("CLIENT").arg("UNPAUSE")).await;
    assert!(unanswered.is_err(), "no answer came: {unanswered:?}");
    let count = eventually("the held count applied", Duration::from_secs(20), || {
        let node = node.clone();
        let attempts = attempts.clone();
        async move {
            let clients: String = on_node(&node, redis::cmd("CLIENT").arg("LIST")).await;
            if held(&clients) {
                return None;
            }
            on_node::<Option<u64>>(&node, redis::cmd("HGET").arg(&attempts).arg(call)).await
        }
    })
    .await;
    assert_eq!(
        count, 2,
        "the attempt whose answer was lost was counted once: it was not sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_request_refused_by_a_node_is_sent_where_its_slot_went() {
    let redis_cluster = RedisCluster::start().await;
    let store = store(&redis_cluster.url()).await;
    let (tenant, session, work) = ("acme", unique("s"), "t1");
    let key = skein_common::store::keys::event_epoch(tenant, &session, work);
    let from = redis_cluster.node_of(&key).await;
    let to = (from + 1) % redis_cluster.nodes.len();
    let urls: Vec<String> = redis_cluster.nodes.iter().map(|n| n.url.clone()).collect();
    let slot: u16 = on_node(&urls[from], redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key)).await;
    let target: String = on_node(&urls[to], redis::cmd("CLUSTER").arg("MYID")).await;
    // The key's (empty) slot moves to another node after the store learnt where it was: the
    // store's first try meets a `MOVED`, which nothing ran.
    for index in [to, from, 3 - to - from] {
        let () = on_node(
            &urls[index],
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&target),
        )
        .await;
    }
    assert_eq!(
        store
            .next_event_epoch(tenant, &session, work)
            .await
            .expect("sent again where the slot went"),
        1
    );
    assert_eq!(redis_cluster.keys_on(to, &key).await, vec![key.clone()]);
    assert!(redis_cluster.keys_on(from, &key).await.is_empty());
}
