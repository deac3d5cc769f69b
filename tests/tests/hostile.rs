//! A hostile or broken client harms no one: corrupt Redis values end their task at once with the
//! true reason (never a retry loop, never a leaked lease, the session's later turns run), a lease
//! planted without an expiry lapses so its session runs, a resubmitted task id cannot overwrite
//! the answer that stands, refusals reach only the clients that sent them, dead letters and
//! answers always fit a message, and forged, expired, altered, unprivileged or replayed
//! signatures run nothing. Forged internal messages and a battery of bad input are in
//! `forged.rs`.

use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use skein_common::principals::Signer;
use skein_common::protocol::{EventKind, FailureKind, TaskSubmission, TurnStatus};
use skein_common::store::keys;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::hostile::{last_event, letters_of, plant, publish_raw};
use skein_tests::support::principals::{audited, client_of, hand_signed, people, refused_because};
use skein_tests::support::{eventually, unique};

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

/// A session lease with no expiry (which no lead writes: set by hand or by a broken tool) does
/// not keep its session from running for ever: the lead that finds it held gives it the lease's
/// time to live, and the session's turn runs once it lapses. Taking a lease on its own (as a
/// session's removal does) gives such a lease its time to live too, without taking it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_expiry_lapses_and_its_session_runs() {
    let cluster = TestCluster::start();
    cluster.start_nodes(1, &["--lease-ttl", "2s"]).await;
    let session = unique("s");
    plant(
        &cluster,
        &["SET", &keys::lease("acme", &session), "planted"],
    )
    .await;
    let (result, _) = cluster.run(&submission("acme", &session, "hi")).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");

    let other = unique("s");
    let key = keys::lease("acme", &other);
    plant(&cluster, &["SET", &key, "planted"]).await;
    let taken = cluster
        .store()
        .await
        .try_lease("acme", &other, "probe", Duration::from_secs(60))
        .await
        .expect("asked");
    assert!(
        !taken,
        "a lease that may still be someone's is not taken over"
    );
    let mut conn = redis::Client::open(cluster.redis.url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("its time to live");
    assert!(ttl > 0, "the lease lapses now: PTTL {ttl}");
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

/// An answer larger than one message can carry still reaches its client whole: the final event
/// carries its head and tail, how long the whole is and where it is stored (`answer_ref`), which
/// the client reads; the stored result keeps it whole too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_payload_cap_is_announced_by_reference() {
    let cluster = TestCluster::start();
    let long = "\"quoted\" ".repeat(6_000);
    let script = cluster.scenario(serde_json::json!([{ "steps": [ { "answer": long } ] }]));
    cluster
        .start_nodes(0, &["--scenario", &script, "--max-payload", "16384"])
        .await;
    let task = submission("acme", &unique("s"), "say a lot");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some(long.as_str()), "read whole");
    assert!(events.last().is_some_and(|e| e.seq > 0), "announced");

    let (_, last) = cluster
        .client()
        .await
        .bus()
        .last_event("acme", &task.task_id)
        .await
        .expect("read")
        .expect("the final event");
    let EventKind::Final { result: announced } = last.event else {
        panic!("the last event is the final one: {last:?}");
    };
    let preview = announced.answer.unwrap_or_default();
    assert!(preview.len() < 16_384, "{}", preview.len());
    assert!(long.starts_with(preview.lines().next().unwrap_or_default()));
    assert!(
        preview.contains(&format!("{} bytes in all", long.len())),
        "{preview}"
    );
    assert!(announced.answer_ref.is_some(), "where the whole is");
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

/// On a cluster that requires signatures, a submission with a forged signature (a stranger's,
/// under a listed key), an expired one (signed ten minutes before the broker stored it), one by
/// a principal whose role may not submit, and one whose signed body was altered each end
/// `denied` with that reason, none of them runs, and each is in the audit trail; a signed
/// submission published again (a replay, under another message id) is answered with the answer
/// that stands, and its turn does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_expired_altered_unprivileged_and_replayed_signatures_harm_no_one() {
    let cluster = TestCluster::start();
    let people = people(&cluster);
    let principals = people.file.to_str().expect("utf-8 path").to_owned();
    cluster
        .start_nodes(
            1,
            &["--principals", &principals, "--require-signed", "true"],
        )
        .await;
    let plain = client_of(&cluster, None).await;
    let signed_at = |task: &TaskSubmission, signer: &Signer, named: &Signer, at_ms: u64| {
        let subject = skein_common::subjects::submit(&task.tenant, &task.session);
        let payload = serde_json::to_vec(task).expect("json");
        let mut headers = hand_signed(signer, named, &subject, &payload, at_ms);
        headers.insert(NATS_MESSAGE_ID, unique("msg").as_str());
        (subject, headers, payload)
    };
    let now = skein_common::protocol::now_ms();
    let stranger = Signer::generate();
    let forged = submission("acme", &unique("s"), "forged");
    let expired = submission("acme", &unique("s"), "expired");
    let unprivileged = submission("acme", &unique("s"), "paul may only approve");
    let altered = submission("acme", &unique("s"), "altered");
    let cases = [
        (
            &forged,
            signed_at(&forged, &stranger, &people.bob, now),
            "does not verify",
        ),
        (
            &expired,
            signed_at(&expired, &people.bob, &people.bob, now - 600_000),
            "expired",
        ),
        (
            &unprivileged,
            signed_at(&unprivileged, &people.paul, &people.paul, now),
            "paul may not submit",
        ),
        (
            &altered,
            {
                let (subject, headers, _) = signed_at(&altered, &people.bob, &people.bob, now);
                let mut changed = altered.clone();
                changed.input = "something else".into();
                (
                    subject,
                    headers,
                    serde_json::to_vec(&changed).expect("json"),
                )
            },
            "does not verify",
        ),
    ];
    for (task, (subject, headers, payload), needle) in cases {
        skein_tests::support::principals::publish_raw(&plain, subject, headers, payload).await;
        let result = eventually("the refusal's answer", Duration::from_secs(30), || async {
            match last_event(&cluster, &task.task_id).await? {
                (_, EventKind::Final { result }) => Some(result),
                _ => None,
            }
        })
        .await;
        let failure = result.failure.clone().expect("a failure");
        assert_eq!(failure.kind, FailureKind::Denied, "{result:?}");
        assert!(
            failure.message.contains(needle),
            "{needle}: {}",
            failure.message
        );
        audited(&plain, task, needle, refused_because(needle)).await;
    }

    // A signed submission, then the same signed message again under another message id.
    let bob = client_of(&cluster, Some(&people.bob)).await;
    let task = submission("acme", &unique("s"), "once");
    let first = bob
        .run(&task, Duration::from_secs(60), |_| {})
        .await
        .expect("answered");
    assert_eq!(first.status, TurnStatus::Completed, "{first:?}");
    let (before, _) = last_event(&cluster, &task.task_id)
        .await
        .expect("its final");
    let (subject, mut headers, payload) = {
        let subject = skein_common::subjects::submit(&task.tenant, &task.session);
        let payload = serde_json::to_vec(&task).expect("json");
        let mut headers = HeaderMap::new();
        people.bob.sign(&mut headers, &subject, &payload, None);
        (subject, headers, payload)
    };
    headers.insert(NATS_MESSAGE_ID, unique("replay").as_str());
    skein_tests::support::principals::publish_raw(&plain, subject, headers, payload).await;
    let again = eventually("the replay's answer", Duration::from_secs(30), || async {
        match last_event(&cluster, &task.task_id).await? {
            (seq, EventKind::Final { result }) if seq > before => Some(result),
            _ => None,
        }
    })
    .await;
    assert_eq!(
        again.answer, first.answer,
        "the answer that stands, not a new turn"
    );
    assert_eq!(again.iterations, first.iterations);
    let turns = cluster
        .store()
        .await
        .turn_records("acme", &task.session)
        .await
        .expect("turn records");
    assert_eq!(turns.len(), 1, "the turn ran once: {turns:?}");
}
