//! A hostile or broken client harms no one: corrupt Redis values end their task at once with the
//! true reason (never a retry loop, never a leaked lease, the session's later turns run), a
//! resubmitted task id cannot overwrite the answer that stands, and refusals reach only the
//! clients that sent them.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use futures::StreamExt;
use skein_common::protocol::{EventKind, FailureKind, TaskSubmission, TurnStatus};
use skein_common::store::keys;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::{eventually, unique};

/// Plants a Redis value of the test's choosing.
async fn plant(cluster: &TestCluster, command: &[&str]) {
    let mut conn = redis::Client::open(cluster.redis.url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let mut cmd = redis::cmd(command[0]);
    for arg in &command[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query_async(&mut conn).await.expect("planted");
}

/// Publishes a submission as a plain NATS client would, with `message_id` (or none).
async fn publish_raw(cluster: &TestCluster, task: &TaskSubmission, message_id: Option<&str>) {
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let jetstream = async_nats::jetstream::new(client);
    let mut headers = HeaderMap::new();
    if let Some(id) = message_id {
        headers.insert(NATS_MESSAGE_ID, id);
    }
    jetstream
        .publish_with_headers(
            skein_common::subjects::submit(&task.tenant, &task.session),
            headers,
            serde_json::to_vec(task).expect("encode").into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored by JetStream");
}

/// The latest event of one of `acme`'s tasks, with its stream sequence.
async fn last_event(cluster: &TestCluster, task_id: &str) -> Option<(u64, EventKind)> {
    last_event_of(cluster, "acme", task_id).await
}

/// The latest event of a task of `tenant`, with its stream sequence.
async fn last_event_of(
    cluster: &TestCluster,
    tenant: &str,
    task_id: &str,
) -> Option<(u64, EventKind)> {
    let subject = skein_common::subjects::events(tenant, task_id);
    let (seq, event) = cluster
        .client()
        .await
        .bus()
        .last_event(&subject)
        .await
        .ok()??;
    Some((seq, event.event))
}

/// How many dead letters name `task_id` as their original id.
async fn letters_of(cluster: &TestCluster, task_id: &str) -> Vec<skein_common::bus::DeadLetter> {
    let letters = cluster
        .client()
        .await
        .bus()
        .dead_letters()
        .await
        .expect("dead letters");
    letters
        .into_iter()
        .filter(|l| {
            l.original_id
                .as_deref()
                .is_some_and(|id| id.ends_with(task_id))
        })
        .collect()
}

/// A Redis command that corrupts what a task (session, task id) reads.
type Corruption = fn(&str, &str) -> Vec<String>;

/// Corrupt state of every kind a turn reads: the session's state, its version, the task's
/// stored final, its attempts counter (a key of the wrong type), its event epoch. Each task ends
/// at once as a failure that names what is unreadable, is dead-lettered once with that reason,
/// leaves no lease behind, and the next turn of a session with intact state runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_ends_its_task_with_the_true_reason_and_later_turns_run() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let corruptions: [(&str, Corruption); 5] = [
        ("session state", |session, _| {
            let key = keys::session("acme", session);
            ["HSET", &key, "version", "1", "state", "{not json"]
                .map(String::from)
                .to_vec()
        }),
        ("session version", |session, _| {
            let key = keys::session("acme", session);
            ["HSET", &key, "version", "garbage"]
                .map(String::from)
                .to_vec()
        }),
        ("stored final", |session, task| {
            let key = keys::final_result("acme", session, task);
            ["SET", &key, "{not json"].map(String::from).to_vec()
        }),
        ("attempts of the wrong type", |session, task| {
            let key = keys::attempts("acme", session, &keys::turn_attempts_field(task));
            ["SET", &key, "a string"].map(String::from).to_vec()
        }),
        ("event epoch of the wrong type", |session, task| {
            let key = keys::event_epoch("acme", session, task);
            ["HSET", &key, "f", "v"].map(String::from).to_vec()
        }),
    ];
    for (what, corrupt) in corruptions {
        let session = unique("s");
        let task = submission("acme", &session, "hi");
        let command = corrupt(&session, &task.task_id);
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        plant(&cluster, &command).await;

        let started = std::time::Instant::now();
        let client = cluster.client().await;
        let result = client
            .run(&task, Duration::from_secs(30), |_| {})
            .await
            .unwrap_or_else(|e| panic!("{what}: a final result: {e}"));
        println!(
            "{what}: ended {:?} in {:?}",
            result.status,
            started.elapsed()
        );
        assert_eq!(result.status, TurnStatus::Failed, "{what}: {result:?}");
        let failure = result.failure.expect("a failure");
        assert_eq!(
            failure.kind,
            FailureKind::DeadLettered,
            "{what}: {failure:?}"
        );
        assert!(
            failure.message.contains("cannot be read"),
            "{what}: the true reason: {failure:?}"
        );
        // One letter, from the first delivery: no retry loop.
        let letters = letters_of(&cluster, &task.task_id).await;
        assert_eq!(letters.len(), 1, "{what}: {letters:?}");
        assert!(
            letters[0].reason.contains("cannot be read"),
            "{what}: {letters:?}"
        );
        assert_eq!(letters[0].attempts, 1, "{what}: {letters:?}");
        let store = cluster.store().await;
        let lease = store
            .try_lease("acme", &session, "probe", Duration::from_millis(50))
            .await;
        assert!(
            matches!(lease, Ok(true)),
            "{what}: no lease was left behind: {lease:?}"
        );
    }
    // A session whose only corrupt value belonged to one task runs its next turn.
    let session = unique("s");
    let doomed = submission("acme", &session, "hi");
    plant(
        &cluster,
        &[
            "SET",
            &keys::final_result("acme", &session, &doomed.task_id),
            "{not json",
        ],
    )
    .await;
    let (first, _) = cluster.run(&doomed).await;
    assert_eq!(first.status, TurnStatus::Failed, "{first:?}");
    let (next, _) = cluster.run(&submission("acme", &session, "again")).await;
    assert_eq!(next.status, TurnStatus::Completed, "{next:?}");
}

/// A task id resubmitted after its answer stands (here by a plain client with no broker
/// deduplication, naming an agent that does not exist) is answered with the answer that stands;
/// the stored answer is not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmitted_task_id_cannot_overwrite_its_answer() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let task = submission("acme", &unique("s"), "hi");
    let (original, _) = cluster.run(&task).await;
    assert_eq!(original.status, TurnStatus::Completed, "{original:?}");

    let (before, _) = last_event(&cluster, &task.task_id)
        .await
        .expect("its final");
    let mut resubmitted = task.clone();
    resubmitted.agent = "nobody".into();
    publish_raw(&cluster, &resubmitted, None).await;
    let announced = eventually(
        "the resubmission's answer",
        Duration::from_secs(30),
        || async {
            match last_event(&cluster, &task.task_id).await? {
                (seq, EventKind::Final { result }) if seq > before => Some(result),
                _ => None,
            }
        },
    )
    .await;
    assert_eq!(
        announced.status,
        TurnStatus::Completed,
        "the answer that stands is announced again: {announced:?}"
    );
    let stored = cluster
        .store()
        .await
        .final_result("acme", &task.session, &task.task_id)
        .await
        .expect("read");
    assert_eq!(stored.map(|r| r.status), Some(TurnStatus::Completed));
    eventually(
        "the resubmission to be settled",
        Duration::from_secs(10),
        || async {
            let (pending, unacked) = cluster
                .client()
                .await
                .bus()
                .consumer_depth(skein_common::subjects::SUBMIT_STREAM, "skein-leads")
                .await
                .ok()?;
            (pending == 0 && unacked == 0).then_some(())
        },
    )
    .await;
}

/// Two tenants may use the same task id at once: the broker's deduplication is scoped by tenant,
/// so neither submission is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_may_use_the_same_task_id() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let shared = unique("task");
    let mut first = submission("acme", &unique("s"), "hi");
    first.task_id = shared.clone();
    let mut second = submission("globex", &unique("s"), "hi");
    second.task_id = shared.clone();
    let bus = cluster.client().await.bus().clone();
    for task in [&first, &second] {
        let stored = bus.submit(task).await.expect("submitted");
        assert_eq!(stored, skein_common::bus::Stored::New, "{}", task.tenant);
    }
    for task in [&first, &second] {
        let client = cluster.client().await;
        let events = client.watch(&task.tenant, &shared).await.expect("watch");
        futures::pin_mut!(events);
        let answered = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(event) = futures::StreamExt::next(&mut events).await {
                if let EventKind::Final { result } = event.expect("event").event {
                    return result;
                }
            }
            panic!("no final");
        })
        .await
        .expect("answered within 30 s");
        assert_eq!(answered.status, TurnStatus::Completed, "{}", task.tenant);
    }
}

/// A refused submission that names a task which already has events (by mistake or on purpose)
/// is set aside without announcing a refusal on that task's subject: the task's clients keep
/// its real answer as the last word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_never_announced_over_a_real_task() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let task = submission("acme", &unique("s"), "hi");
    let (answer, _) = cluster.run(&task).await;
    assert_eq!(answer.status, TurnStatus::Completed);
    let (before, _) = last_event(&cluster, &task.task_id)
        .await
        .expect("its final");

    let mut forged = task.clone();
    forged.v = 9;
    let probe = unique("probe");
    publish_raw(&cluster, &forged, Some(&probe)).await;
    eventually(
        "the refusal to be set aside",
        Duration::from_secs(20),
        || async {
            let letters = letters_of(&cluster, &probe).await;
            (!letters.is_empty()).then_some(())
        },
    )
    .await;
    let (after, last) = last_event(&cluster, &task.task_id)
        .await
        .expect("its final");
    assert_eq!(
        after, before,
        "nothing was announced over the task: {last:?}"
    );
}

/// A submission so close to the broker's payload limit that its dead letter (the body plus the
/// letter's headers) cannot fit: the letter keeps the body's head and says so, the message is
/// settled once (no redelivery loop), the letter cannot be replayed, and the lead keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_always_fits_and_ends_the_message() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &[]).await;
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let limit = client.server_info().max_payload;
    let mut body = b"{\"v\":1,\"input\":\"".to_vec();
    body.resize(limit - 256, b'x');
    let probe = unique("huge");
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MESSAGE_ID, probe.as_str());
    async_nats::jetstream::new(client)
        .publish_with_headers("skein.submit.acme.raw", headers, body.clone().into())
        .await
        .expect("publish")
        .await
        .expect("stored by JetStream");

    let letter = eventually("the letter", Duration::from_secs(20), || async {
        letters_of(&cluster, &probe).await.into_iter().next()
    })
    .await;
    assert_eq!(
        letter.truncated_from,
        Some(body.len() as u64),
        "{:?}",
        letter.reason
    );
    assert!(letter.payload.len() < body.len());
    assert!(
        body.starts_with(&letter.payload),
        "the letter keeps the body's head"
    );
    assert!(letter.reason.len() <= skein_common::bus::MAX_DEAD_REASON);
    let bus = cluster.client().await.bus().clone();
    let replayed = bus.replay_dead_letter(&letter).await;
    assert!(
        replayed.is_err_and(|e| e.to_string().contains("cannot be replayed")),
        "a cut letter is not replayed"
    );
    eventually(
        "the message to be settled",
        Duration::from_secs(10),
        || async {
            let (pending, unacked) = bus
                .consumer_depth(skein_common::subjects::SUBMIT_STREAM, "skein-leads")
                .await
                .ok()?;
            (pending == 0 && unacked == 0).then_some(())
        },
    )
    .await;
    assert_eq!(
        letters_of(&cluster, &probe).await.len(),
        1,
        "one letter, no loop"
    );
    let (ok, _) = cluster
        .run(&submission("acme", &unique("s"), "still there?"))
        .await;
    assert_eq!(ok.status, TurnStatus::Completed);
}

/// A failure never echoes outside input at length: an id of 600 KB is refused with a message
/// that names the rule and shows only the id's head.
#[test]
fn failure_messages_are_bounded() {
    let huge = "x".repeat(600_000);
    let failure = skein_common::protocol::validate_token("tenant", &huge).expect_err("refused");
    assert!(failure.message.len() < 512, "{}", failure.message.len());
    assert!(failure.message.contains("tenant must be"));
    let failure = skein_common::protocol::Failure::new(FailureKind::ToolFailed, huge);
    assert_eq!(
        failure.message.len(),
        skein_common::protocol::MAX_FAILURE_MESSAGE,
        "cut to the cap"
    );
}

/// An answer larger than one message can carry still reaches its client: the final event keeps
/// the answer's head and says how long the whole is; the stored result keeps it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_payload_cap_is_announced_cut() {
    let cluster = TestCluster::start();
    let long = "\"quoted\" ".repeat(6_000);
    let script = cluster.scenario(serde_json::json!([{ "steps": [ { "answer": long } ] }]));
    cluster
        .start_nodes(0, &["--scenario", &script, "--max-payload", "16384"])
        .await;
    let task = submission("acme", &unique("s"), "say a lot");
    let (result, _) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(answer.len() < 16_384, "{}", answer.len());
    assert!(long.starts_with(answer.lines().next().unwrap_or_default()));
    assert!(
        answer.contains(&format!("{} bytes in all", long.len())),
        "{}",
        &answer[answer.len().saturating_sub(200)..]
    );
    let stored = cluster
        .store()
        .await
        .final_result("acme", &task.session, &task.task_id)
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(
        stored.answer.as_deref(),
        Some(long.as_str()),
        "stored whole"
    );
}

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
            outcome: skein_common::protocol::CallOutcome::Ok {
                output: "FORGED".into(),
            },
            worker_id: "nobody".into(),
            duration_ms: 0,
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
