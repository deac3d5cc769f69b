//! Forged internal messages are not believed — registry entries, results for another call — and
//! a battery of malformed, oversized and forged messages and corrupt Redis values, sent under a
//! stream of valid tasks, harms no valid task.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use futures::StreamExt;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_common::store::keys;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::hostile::{last_event_of, plant};
use skein_tests::support::{eventually, unique};

/// A forged worker registry entry (written by anyone who can reach Redis) with a heartbeat from
/// the future and a huge heartbeat period, or names that are not tokens, is never routed to and
/// is pruned; an honest worker's entry stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_registry_entries_are_not_believed() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let now = skein_common::protocol::now_ms();
    let honest = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("registry");
    assert_eq!(honest.len(), 1);
    let forged = |id: &str, pool: &str, heartbeat_ms: u64, every: u64| {
        let mut entry = honest[0].clone();
        entry.worker_id = id.to_owned();
        entry.pool = pool.to_owned();
        entry.heartbeat_ms = heartbeat_ms;
        entry.heartbeat_every_ms = every;
        serde_json::to_string(&entry).expect("encode")
    };
    let entries = [
        ("future", forged("future", "evil", now + 3_600_000, 1_000)),
        ("forever", forged("forever", "evil", now, u64::MAX / 4)),
        ("bad pool", forged("bad pool", "evil pool", now, 1_000)),
        ("elsewhere", forged("not-elsewhere", "evil", now, 1_000)),
    ];
    for (id, json) in &entries {
        plant(&cluster, &["HSET", keys::WORKERS, id, json]).await;
    }
    // "forever" is alive now; it must stop being so once its claimed period would have kept it.
    let store = cluster.store().await;
    let routable = store.routable_workers().await.expect("registry");
    let ids: Vec<_> = routable.iter().map(|w| w.worker_id.as_str()).collect();
    assert!(!ids.contains(&"future"), "{ids:?}");
    assert!(!ids.contains(&"bad pool"), "{ids:?}");
    assert!(!ids.contains(&"elsewhere"), "{ids:?}");
    assert!(ids.contains(&honest[0].worker_id.as_str()), "{ids:?}");
    let forever = routable
        .iter()
        .find(|w| w.worker_id == "forever")
        .expect("recent");
    assert!(
        !forever.is_alive(now + 10 * 60_000),
        "a claimed period does not keep an entry alive for ever"
    );
    let mut conn = redis::Client::open(cluster.redis.url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg(keys::WORKERS)
        .query_async(&mut conn)
        .await
        .expect("keys");
    for pruned in ["future", "bad pool", "elsewhere"] {
        assert!(
            !left.iter().any(|k| k == pruned),
            "{pruned} pruned: {left:?}"
        );
    }
}

/// A client that can see a tool task publishes a result for another call on its reply subject
/// while the real call runs: the dispatcher drops it, and the real result is the one the model
/// sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_another_call_is_dropped() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(serde_json::json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "real", "ms": 1500 } } ] },
        { "answer": "saw {{observations}}" }
    ] }]));
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &["--scenario", &script]).await;

    let spy = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let mut tasks = spy.subscribe("skein.tool.>").await.expect("subscribe");
    let task = submission("acme", &unique("s"), "go");
    let running = cluster.run(&task);
    let forge = async {
        let message = tasks.next().await.expect("a tool task");
        let tool_task: skein_common::protocol::ToolTask =
            serde_json::from_slice(&message.payload).expect("a tool task");
        let forged = skein_common::protocol::ToolResult {
            v: skein_common::protocol::PROTOCOL_VERSION,
            call_id: format!("{}-not", tool_task.call_id),
            outcome: skein_common::protocol::CallOutcome::ok("FORGED"),
            worker_id: "nobody".into(),
            duration_ms: 0,
            attempts: 0,
        };
        spy.publish(
            tool_task.reply_to.clone(),
            serde_json::to_vec(&forged).expect("encode").into(),
        )
        .await
        .expect("forged");
        spy.flush().await.expect("flushed");
    };
    let ((result, _), ()) = tokio::join!(running, forge);
    let answer = result.answer.unwrap_or_default();
    assert!(answer.contains("effect real done"), "{answer}");
    assert!(!answer.contains("FORGED"), "{answer}");
}

/// What one bad input is, and how it must end.
struct BadInput {
    what: &'static str,
    subject: String,
    message_id: String,
    payload: Vec<u8>,
    /// Set aside as exactly one dead letter (otherwise: answered or dropped, never redelivered).
    lettered: bool,
}

/// A battery of malformed, oversized and forged messages and corrupt Redis values, sent while
/// valid tasks arrive every 200 ms on one lead and two workers: every valid task completes, every
/// bad message that must be set aside has exactly one letter, every queue drains (nothing is
/// redelivered for ever), and no other tenant sees an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_battery_of_bad_input_harms_no_valid_task() {
    use skein_common::subjects;
    let cluster = TestCluster::start();
    for _ in 0..2 {
        cluster.spawn_worker(cluster.worker_config(&[]));
    }
    cluster.wait_for_workers(2).await;
    cluster.spawn_lead(cluster.lead_config(&["--max-payload", "65536"]));

    let valid_task = |n: usize| submission("acme", &format!("valid-{n}"), "hello");
    let mut battery: Vec<BadInput> = Vec::new();
    let mut add = |what, subject: String, payload: Vec<u8>, lettered| {
        battery.push(BadInput {
            what,
            subject,
            message_id: unique("bad"),
            payload,
            lettered,
        })
    };
    let good = serde_json::to_value(submission("mallory", "m1", "hi")).expect("encode");
    let with = |field: &str, value: serde_json::Value| {
        let mut body = good.clone();
        body[field] = value;
        body["task_id"] = serde_json::json!(unique("t"));
        serde_json::to_vec(&body).expect("encode")
    };
    for n in 0..5 {
        add(
            "not JSON",
            subjects::submit("mallory", "m1"),
            format!("{{ nope {n}").into_bytes(),
            true,
        );
    }
    add(
        "oversized",
        subjects::submit("mallory", "m1"),
        with("input", "x".repeat(100_000).into()),
        true,
    );
    add(
        "a 60 KB tenant",
        subjects::submit("mallory", "m1"),
        with("tenant", "t".repeat(60_000).into()),
        true,
    );
    add(
        "wrong version",
        subjects::submit("mallory", "m1"),
        with("v", 9.into()),
        true,
    );
    add(
        "misrouted",
        subjects::submit("mallory", "elsewhere"),
        with("session", "m1".into()),
        true,
    );
    add(
        "unknown field",
        subjects::submit("mallory", "m1"),
        with("surprise", true.into()),
        true,
    );
    add(
        "unknown agent",
        subjects::submit("mallory", "m1"),
        with("agent", "nobody".into()),
        false,
    );
    add(
        "a past deadline",
        subjects::submit("mallory", "m1"),
        with("deadline_ms", 1.into()),
        false,
    );
    for n in 0..3 {
        add(
            "undecodable tool task",
            "skein.tool.default.read_file".into(),
            format!("garbage {n}").into_bytes(),
            true,
        );
        add(
            "undecodable subagent task",
            "skein.agent.default.researcher".into(),
            format!("garbage {n}").into_bytes(),
            true,
        );
        add(
            "undecodable approval",
            subjects::approval("mallory", "t1"),
            format!("garbage {n}").into_bytes(),
            true,
        );
        add(
            "undecodable cancel",
            subjects::cancel("mallory", &format!("t{n}")),
            b"garbage".to_vec(),
            false,
        );
        add(
            "forged result",
            format!("skein.reply.nobody.{n}"),
            b"{\"v\":1}".to_vec(),
            false,
        );
    }
    // Corrupt state under sessions of their own: those tasks end failed, set aside once.
    let mut corrupt_tasks = Vec::new();
    for n in 0..3 {
        let task = submission("mallory", &unique("corrupt"), "hi");
        let key = keys::session("mallory", &task.session);
        plant(
            &cluster,
            &["HSET", &key, "version", &format!("garbage-{n}")],
        )
        .await;
        corrupt_tasks.push(task);
    }
    plant(
        &cluster,
        &["HSET", keys::WORKERS, "forged", "{\"not\": \"an entry\"}"],
    )
    .await;

    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client.clone());
    let valid_count = 20;
    let valid: Vec<_> = (0..valid_count).map(valid_task).collect();
    let cluster_ref = &cluster;
    let runs = async {
        let runs = valid.iter().enumerate().map(|(n, task)| async move {
            tokio::time::sleep(Duration::from_millis(200 * n as u64)).await;
            cluster_ref.run(task).await
        });
        futures::future::join_all(runs).await
    };
    let attack = async {
        for bad in &battery {
            let mut headers = HeaderMap::new();
            headers.insert(NATS_MESSAGE_ID, bad.message_id.as_str());
            let durable = !bad.subject.starts_with("skein.reply.");
            if durable {
                jetstream
                    .publish_with_headers(bad.subject.clone(), headers, bad.payload.clone().into())
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e}", bad.what))
                    .await
                    .unwrap_or_else(|e| panic!("{}: stored: {e}", bad.what));
            } else {
                client
                    .publish_with_headers(bad.subject.clone(), headers, bad.payload.clone().into())
                    .await
                    .expect("published");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for task in &corrupt_tasks {
            cluster
                .client()
                .await
                .submit(task)
                .await
                .expect("submitted");
        }
    };
    let (results, ()) = tokio::join!(runs, attack);

    let completed = results
        .iter()
        .filter(|(r, _)| r.status == TurnStatus::Completed)
        .count();
    assert_eq!(completed, valid_count, "every valid task completed");
    let bus = cluster.client().await.bus().clone();
    for (stream, durable) in [
        (subjects::SUBMIT_STREAM, subjects::LEADS_CONSUMER.to_owned()),
        (
            subjects::APPROVALS_STREAM,
            subjects::APPROVALS_CONSUMER.to_owned(),
        ),
        (subjects::WORK_STREAM, subjects::tool_consumer("default")),
        (subjects::WORK_STREAM, subjects::agent_consumer("default")),
    ] {
        eventually(
            &format!("{durable} to drain"),
            Duration::from_secs(30),
            || async {
                let (pending, unacked) = bus.consumer_depth(stream, &durable).await.ok()?;
                (pending == 0 && unacked == 0).then_some(())
            },
        )
        .await;
    }
    let letters = bus.dead_letters().await.expect("dead letters");
    let mut lettered = 0;
    for bad in battery.iter().filter(|b| b.lettered) {
        let mine = letters
            .iter()
            .filter(|l| l.original_id.as_deref() == Some(bad.message_id.as_str()))
            .count();
        assert_eq!(mine, 1, "{}: one letter", bad.what);
        lettered += 1;
    }
    for task in &corrupt_tasks {
        let mine = letters
            .iter()
            .filter(|l| {
                l.original_id
                    .as_deref()
                    .is_some_and(|id| id.ends_with(&task.task_id))
            })
            .count();
        assert_eq!(mine, 1, "corrupt session: one letter");
        let last = eventually("the corrupt task's final", Duration::from_secs(20), || {
            last_event_of(&cluster, "mallory", &task.task_id)
        })
        .await;
        assert!(matches!(last.1, EventKind::Final { .. }), "{:?}", last.1);
    }
    // No event of the battery reached the tenant whose valid tasks ran.
    for (result, events) in &results {
        assert!(
            events.iter().all(|e| e.task_id == result.task_id),
            "only its own events"
        );
    }
    println!(
        "battery: {} bad inputs ({} set aside once each, {} corrupt sessions set aside), {} valid tasks completed, every queue drained, {} letters in all",
        battery.len(),
        lettered,
        corrupt_tasks.len(),
        completed,
        letters.len()
    );
}
