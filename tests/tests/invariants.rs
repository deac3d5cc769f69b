//! The invariants the reliability promises stand on, each broken on purpose in a deterministic
//! way against real servers: a stale lead's writes are refused (lease token), a stale version is
//! refused (compare-and-set), a recorded result is answered instead of run again (the
//! dispatcher's and the worker's look-ups), a resubmitted task is dropped by the broker
//! (`Nats-Msg-Id`), a turn starts only when no older task of its session is unfinished, and a
//! step's results come back in the model's order, not in completion order.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use skein_common::bus::{Bus, Stored, SubmissionPlace};
use skein_common::config::RedisConfig;
use skein_common::dispatch::{CallRoute, Dispatcher};
use skein_common::protocol::{
    call_key, CallOutcome, FinalResult, TaskOrigin, ToolResult, ToolTask, TurnStatus,
    PROTOCOL_VERSION,
};
use skein_common::store::{
    SessionState, SessionStore, StoreError, TurnCheckpoint, TurnClaim, TurnStart,
};
use skein_common::subjects;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::servers::{NatsServer, RedisServer};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{test_bus, unique};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

async fn store(redis: &RedisServer) -> SessionStore {
    SessionStore::connect(&RedisConfig::local(redis.url.clone()))
        .await
        .expect("redis reachable")
}

/// A bus on `nats`, without its streams.
async fn bus(nats: &NatsServer) -> Bus {
    test_bus(&nats.url).await
}

/// A plain connection to `redis`, to read and plant keys as they are stored.
async fn raw_connection(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

fn claim<'a>(session: &'a str, task: &'a str, token: &'a str) -> TurnClaim<'a> {
    TurnClaim {
        tenant: "acme",
        session,
        task_id: task,
        lease_token: token,
        lease_ttl: Duration::from_millis(300),
        max_attempts: 5,
        trace: None,
    }
}

fn final_result(session: &str, task: &str, answer: &str) -> FinalResult {
    FinalResult {
        v: PROTOCOL_VERSION,
        task_id: task.into(),
        tenant: "acme".into(),
        session: session.into(),
        status: TurnStatus::Completed,
        answer: Some(answer.into()),
        answer_ref: None,
        output: None,
        output_ref: false,
        failure: None,
        iterations: 1,
        limit_reached: false,
        usage: Default::default(),
        trace_id: None,
        spent: None,
    }
}

fn origin(session: &str, task: &str) -> TaskOrigin {
    TaskOrigin {
        task_id: task.into(),
        tenant: "acme".into(),
        user: "u".into(),
        session: session.into(),
        workspace: session.into(),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

fn recorded(call_id: &str, output: &str) -> ToolResult {
    ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call_id.into(),
        outcome: CallOutcome::ok(output),
        worker_id: "an-earlier-worker".into(),
        duration_ms: 1,
        attempts: 0,
    }
}

/// Lead A's lease expires and lead B takes the turn over: A's checkpoint and A's end of the turn
/// are refused, and B's progress stands.
#[tokio::test]
async fn a_stale_leads_checkpoint_and_completion_are_refused() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    let Ok(TurnStart::Started { session: a, .. }) =
        store.begin_turn(claim(&session, &task, "a")).await
    else {
        panic!("lead a starts");
    };
    tokio::time::sleep(Duration::from_millis(400)).await; // a's lease expires unrenewed
    let Ok(TurnStart::Started { .. }) = store.begin_turn(claim(&session, &task, "b")).await else {
        panic!("lead b takes over");
    };
    let progress = |step: u32| TurnCheckpoint {
        new_messages: Vec::new(),
        iterations: step,
        usage: Default::default(),
        loaded_skills: Vec::new(),
        compaction: None,
        plan: None,
        steered: 0,
        step_ends: Vec::new(),
    };
    assert!(store
        .save_checkpoint("acme", &session, &task, "b", &progress(2))
        .await
        .expect("b saves"));
    assert!(
        !store
            .save_checkpoint("acme", &session, &task, "a", &progress(1))
            .await
            .expect("answered"),
        "a stale lead's checkpoint is refused"
    );
    let stale_end = store
        .complete_turn(
            "a",
            a.version,
            Some(SessionState::default()),
            &final_result(&session, &task, "from a"),
            None,
        )
        .await;
    assert!(
        matches!(stale_end, Err(StoreError::LeaseLost)),
        "{stale_end:?}"
    );
    assert_eq!(
        store
            .final_result("acme", &session, &task)
            .await
            .expect("read"),
        None,
        "a stale lead stored no final result"
    );
    let Ok(TurnStart::Busy) = store.begin_turn(claim(&session, &task, "c")).await else {
        panic!("b still holds the lease");
    };
    // B dies too: the lead that takes the turn over next resumes from B's progress, not A's.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Ok(TurnStart::Started { checkpoint, .. }) =
        store.begin_turn(claim(&session, &task, "c")).await
    else {
        panic!("lead c takes over");
    };
    assert_eq!(
        checkpoint.map(|c| c.iterations),
        Some(2),
        "a resume reads the checkpoint of the lead that held the lease"
    );
}

/// A checkpoint, small or large, lands whole with its expiry in its writer's own field; a writer
/// without the lease is told so, and what it wrote is never resumed from: not while the holder
/// runs, not by the lead that takes the turn over next, which resumes from the holder's.
#[tokio::test]
async fn a_checkpoint_lands_whole_and_a_writer_without_the_lease_is_never_resumed_from() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let mut raw = raw_connection(&redis).await;
    let progress = |step: u32, bytes: usize| TurnCheckpoint {
        new_messages: vec![skein_common::protocol::message::Message::user(format!(
            "step {step} {}",
            "x".repeat(bytes)
        ))],
        iterations: step,
        ..TurnCheckpoint::default()
    };
    for bytes in [10_000, 100] {
        let (session, task) = (unique("s"), unique("t"));
        let (holder, intruder) = (format!("lead-a:{task}"), format!("lead-x:{task}"));
        let (holder, intruder) = (holder.as_str(), intruder.as_str());
        // The holder writes as a lead does, through its turn (which leaves the expiry the
        // turn's start set); the intruder as anyone could, setting the expiry too.
        let turn = store.turn(claim(&session, &task, holder));
        let Ok(TurnStart::Started { .. }) = turn.begin().await else {
            panic!("lead a starts");
        };
        for step in [1, 2] {
            assert!(
                turn.checkpoint(&progress(step, bytes))
                    .await
                    .expect("a saves"),
                "the lease holder's checkpoint of {bytes} bytes is written"
            );
            assert!(
                !store
                    .save_checkpoint("acme", &session, &task, intruder, &progress(9, bytes))
                    .await
                    .expect("answered"),
                "a writer without the lease is told so ({bytes} bytes)"
            );
        }
        let key = skein_common::store::keys::checkpoint("acme", &session, &task);
        let stored: String = redis::cmd("HGET")
            .arg(&key)
            .arg(holder)
            .query_async(&mut raw)
            .await
            .expect("read the checkpoint");
        let stored: TurnCheckpoint = serde_json::from_str(&stored).expect("a whole checkpoint");
        assert_eq!(
            stored,
            progress(2, bytes),
            "the holder's latest stands whole"
        );
        let ttl: i64 = redis::cmd("TTL")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .expect("ttl");
        assert!(ttl > 3600, "the checkpoint keeps its expiry ({ttl} s)");
        let (_, running) = store
            .running_turn("acme", &session)
            .await
            .expect("read")
            .expect("a turn runs");
        assert_eq!(
            running,
            Some(progress(2, bytes)),
            "the running turn's progress"
        );

        // The holder dies; the next lead resumes from its progress, and the intruder's write
        // is gone with every other field.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let Ok(TurnStart::Started { checkpoint, .. }) = store
            .begin_turn(claim(&session, &task, &format!("lead-b:{task}")))
            .await
        else {
            panic!("lead b takes over");
        };
        assert_eq!(checkpoint, Some(Box::new(progress(2, bytes))));
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .expect("fields");
        assert_eq!(
            fields.len(),
            2,
            "the new holder's name and its checkpoint, nothing else: {fields:?}"
        );
    }
}

/// A checkpoint written by an earlier version (one string per turn) is resumed from, and goes.
#[tokio::test]
async fn a_checkpoint_in_the_earlier_layout_is_resumed_from() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let mut raw = raw_connection(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    let progress = TurnCheckpoint {
        iterations: 3,
        ..TurnCheckpoint::default()
    };
    let legacy = skein_common::store::keys::legacy_checkpoint("acme", &session, &task);
    let () = redis::cmd("SET")
        .arg(&legacy)
        .arg(serde_json::to_string(&progress).expect("json"))
        .query_async(&mut raw)
        .await
        .expect("write the old layout");
    let Ok(TurnStart::Started { checkpoint, .. }) = store
        .begin_turn(claim(&session, &task, "lead-a:task"))
        .await
    else {
        panic!("lead a starts");
    };
    assert_eq!(checkpoint, Some(Box::new(progress)));
    let exists: bool = redis::cmd("EXISTS")
        .arg(&legacy)
        .query_async(&mut raw)
        .await
        .expect("exists");
    assert!(!exists, "the old key is dropped once carried over");
}

/// A session saved since it was loaded is not overwritten: a save or an end of turn with the
/// version it was loaded at is a conflict.
#[tokio::test]
async fn a_stale_version_is_refused_by_save_and_by_completion() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    let loaded = store.load("acme", &session).await.expect("load");
    let saved = store
        .save("acme", &session, loaded.version, &SessionState::default())
        .await
        .expect("first save");
    assert_eq!(saved, loaded.version + 1);
    let stale = store
        .save("acme", &session, loaded.version, &SessionState::default())
        .await;
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );

    let Ok(TurnStart::Started { .. }) = store.begin_turn(claim(&session, &task, "a")).await else {
        panic!("the turn starts");
    };
    let stale_end = store
        .complete_turn(
            "a",
            loaded.version,
            Some(SessionState::default()),
            &final_result(&session, &task, "stale"),
            None,
        )
        .await;
    assert!(
        matches!(stale_end, Err(StoreError::Conflict { .. })),
        "{stale_end:?}"
    );
}

/// A call that may have run before (a resumed turn) and whose result is recorded is answered
/// from the record by the dispatcher: nothing is published, no worker is needed.
#[tokio::test]
async fn the_dispatcher_answers_a_recorded_call_without_dispatching_it() {
    let (nats, redis) = (NatsServer::start(), RedisServer::start());
    let bus = bus(&nats).await;
    bus.ensure_streams().await.expect("streams");
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    store
        .record_result(
            "acme",
            &session,
            &call_key(&task, 2, "c1"),
            &recorded("c1", "from the record"),
        )
        .await
        .expect("recorded");
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    let dispatcher = Dispatcher::start(bus.clone(), store, "lead-x", &tracker, stop.clone())
        .await
        .expect("dispatcher");
    let route = CallRoute {
        pool: "nobody-serves-this",
        timeout: Duration::from_secs(1),
        may_have_run: true,
    };
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        dispatcher.call_tool(
            &origin(&session, &task).into(),
            2,
            "c1",
            "noop",
            json!({}),
            route,
        ),
    )
    .await
    .expect("answered at once, not after a dispatch timeout");
    assert_eq!(result.worker_id, "an-earlier-worker");
    assert_eq!(result.outcome.observation(), "from the record");
    stop.cancel();
}

/// A call is handed to the connection without waiting for the stream's ack; one the stream did
/// not store (here its stream did not exist yet, so the broker answered "no responders") is sent
/// again with the same id until it is stored, and its result still reaches the waiting call.
#[tokio::test]
async fn a_call_the_stream_did_not_store_is_sent_again_and_answered() {
    let (nats, redis) = (NatsServer::start(), RedisServer::start());
    let bus = bus(&nats).await;
    let (session, task) = (unique("s"), unique("t"));
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    let dispatcher = Dispatcher::start(
        bus.clone(),
        store(&redis).await,
        "lead-x",
        &tracker,
        stop.clone(),
    )
    .await
    .expect("dispatcher");
    let origin = std::sync::Arc::new(origin(&session, &task));
    let calling = tokio::spawn({
        let origin = origin.clone();
        async move {
            let route = CallRoute {
                pool: "default",
                timeout: Duration::from_secs(20),
                may_have_run: false,
            };
            dispatcher
                .call_tool(&origin, 0, "c1", "noop", json!({ "n": 1 }), route)
                .await
        }
    });
    // The first hand-over is refused by the broker; the stream appears a moment later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!calling.is_finished(), "the call waits for its result");
    bus.ensure_streams().await.expect("streams");
    // Acting as the worker: the task, once stored, is answered on its reply subject.
    let jetstream = async_nats::jetstream::new(bus.client().clone());
    let mut stream = jetstream
        .get_stream(subjects::work_stream(0))
        .await
        .expect("work stream");
    let stored = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if stream.info().await.expect("info").state.messages > 0 {
                break stream.get_raw_message(1).await.expect("the stored task");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the task was sent again and stored");
    let sent: ToolTask = serde_json::from_slice(&stored.payload).expect("a tool task");
    assert_eq!((sent.call_id.as_str(), sent.tool.as_str()), ("c1", "noop"));
    let answer = ToolResult {
        worker_id: "the-test".into(),
        ..recorded("c1", "answered after the second send")
    };
    bus.publish_reply(&sent.reply_to, &answer)
        .await
        .expect("reply");
    let result = tokio::time::timeout(Duration::from_secs(10), calling)
        .await
        .expect("answered once the reply came")
        .expect("the call ran");
    assert_eq!(result.worker_id, "the-test");
    assert_eq!(
        result.outcome.observation(),
        "answered after the second send"
    );
    assert_eq!(
        stream.info().await.expect("info").state.messages,
        1,
        "stored once"
    );
    stop.cancel();
}

/// A tool task whose result an earlier delivery recorded is answered by the worker from the
/// record: the tool does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_answers_a_recorded_call_without_running_it() {
    let cluster = TestCluster::start();
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    let store = cluster.store().await;
    let (session, task) = (unique("s"), unique("t"));
    let key = call_key(&task, 0, "c1");
    store
        .record_result("acme", &session, &key, &recorded("c1", "from the record"))
        .await
        .expect("recorded");
    let client = async_nats::connect(cluster.nats.url.as_str())
        .await
        .expect("connect");
    let mut replies = client
        .subscribe("skein.reply.tester.>")
        .await
        .expect("subscribe");
    let tool_task = ToolTask {
        v: PROTOCOL_VERSION,
        origin: origin(&session, &task).into(),
        call_id: "c1".into(),
        call_key: key,
        tool: "slow_effect".into(),
        arguments: json!({ "key": "must-not-run", "ms": 1 }),
        arguments_ref: None,
        reply_to: "skein.reply.tester.1".into(),
        timeout_ms: 10_000,
        first_dispatch: false,
    };
    async_nats::jetstream::new(client.clone())
        .publish(
            subjects::tool_task(0, "default", "slow_effect"),
            serde_json::to_vec(&tool_task).expect("encodes").into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
    let reply = tokio::time::timeout(Duration::from_secs(20), replies.next())
        .await
        .expect("a reply")
        .expect("subscription open");
    let result: ToolResult = serde_json::from_slice(&reply.payload).expect("a tool result");
    assert_eq!(result.outcome.observation(), "from the record");
    assert!(
        !read_effects(&cluster.effects_file()).contains_key("must-not-run"),
        "the tool did not run"
    );
}

/// A task submitted twice reaches the stream once: the client marks it with its id.
#[tokio::test]
async fn a_resubmitted_task_is_dropped_by_the_broker() {
    let nats = NatsServer::start();
    let bus = bus(&nats).await;
    bus.ensure_streams().await.expect("streams");
    let task = submission("acme", &unique("s"), "once");
    assert_eq!(bus.submit(&task).await.expect("first"), Stored::New);
    assert_eq!(bus.submit(&task).await.expect("second"), Stored::Duplicate);
    let mut stream = async_nats::jetstream::new(bus.client().clone())
        .get_stream(subjects::SUBMIT_STREAM)
        .await
        .expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 1);
}

/// The order look of a turn's start (`Bus::first_in_line`): a submission is in line only when no
/// older one of its session is unfinished. An in-line answer comes from a direct get alone; any
/// other is asked again of the stream's leader. On a submit stream without direct gets (as an
/// earlier build made it: the server leaves the request unanswered) the leader answers the same,
/// and the looks stop trying direct gets for a while.
#[tokio::test]
async fn a_turn_is_in_line_only_when_no_older_task_of_its_session_is_unfinished() {
    let nats = NatsServer::start();
    let bus = bus(&nats).await;
    bus.ensure_streams().await.expect("streams");
    let jetstream = async_nats::jetstream::new(bus.client().clone());
    // Copies of the requests the looks send: direct gets and gets through the stream API.
    let spy = async_nats::connect(nats.url.as_str()).await.expect("spy");
    let mut direct_gets = spy
        .subscribe(format!("$JS.API.DIRECT.GET.{}", subjects::SUBMIT_STREAM))
        .await
        .expect("subscribed");
    let mut api_gets = spy
        .subscribe(format!(
            "$JS.API.STREAM.MSG.GET.{}",
            subjects::SUBMIT_STREAM
        ))
        .await
        .expect("subscribed");
    spy.flush().await.expect("flushed");
    async fn count(requests: &mut async_nats::Subscriber) -> usize {
        let mut seen = 0;
        while let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(200), requests.next()).await
        {
            seen += 1;
        }
        seen
    }

    let session = unique("s");
    let subject = subjects::submit_in(0, "acme", &session);
    let place = |sequence| SubmissionPlace {
        partition: 0,
        sequence,
        stored_ns: 0,
    };
    let mut stored = Vec::new();
    for body in ["first", "second"] {
        let ack = jetstream
            .publish(subject.clone(), body.into())
            .await
            .expect("published")
            .await
            .expect("stored");
        stored.push(ack.sequence);
    }
    let (first, second) = (place(stored[0]), place(stored[1]));
    // Another session's submission in between changes nothing.
    jetstream
        .publish(subjects::submit_in(0, "acme", &unique("s")), "other".into())
        .await
        .expect("published")
        .await
        .expect("stored");
    let in_line = |own| {
        let (bus, session) = (&bus, &session);
        async move { bus.first_in_line("acme", session, own).await.expect("look") }
    };

    assert!(in_line(first).await);
    let seen = (count(&mut direct_gets).await, count(&mut api_gets).await);
    assert_eq!(
        seen,
        (1, 0),
        "in line: one direct get, nothing asked of the leader"
    );
    assert!(!in_line(second).await);
    let seen = (count(&mut direct_gets).await, count(&mut api_gets).await);
    assert_eq!(seen, (1, 1), "an older task is confirmed by the leader");

    // Direct gets off, as on a submit stream an earlier build made.
    let mut config = jetstream
        .get_stream(subjects::SUBMIT_STREAM)
        .await
        .expect("stream")
        .cached_info()
        .config
        .clone();
    config.allow_direct = false;
    jetstream.update_stream(config).await.expect("updated");
    assert!(in_line(first).await);
    let seen = (count(&mut direct_gets).await, count(&mut api_gets).await);
    assert_eq!(seen, (1, 1), "an unanswered direct get: the leader answers");
    assert!(!in_line(second).await);
    assert!(in_line(first).await);
    let seen = (count(&mut direct_gets).await, count(&mut api_gets).await);
    assert_eq!(
        seen,
        (0, 2),
        "after it, only the leader is asked for a while"
    );

    // The first task ends (its message leaves the work queue): the second is in line.
    jetstream
        .get_stream(subjects::SUBMIT_STREAM)
        .await
        .expect("stream")
        .delete_message(stored[0])
        .await
        .expect("removed");
    assert!(in_line(second).await);
}

/// Two calls of one step, the first slow and the second fast: the model observes them in its
/// own order, whatever order they finished in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_results_come_back_in_the_models_order() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [
            { "name": "slow_effect", "arguments": { "key": "first-slow", "ms": 700 } },
            { "name": "slow_effect", "arguments": { "key": "second-fast", "ms": 1 } }
        ] },
        { "answer": "{{observations}}" }
    ] }]));
    cluster.spawn_test_worker(cluster.worker_config(&["--concurrency", "4"]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &script]));
    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "order"))
        .await;
    let answer = result.answer.unwrap_or_default();
    let effects = read_effects(&cluster.effects_file());
    let (slow, fast) = (
        answer.find("first-slow").expect("the slow call observed"),
        answer.find("second-fast").expect("the fast call observed"),
    );
    assert!(slow < fast, "model order, not completion order: {answer}");
    assert!(
        effects.get("second-fast").is_some_and(|c| c.done == 1)
            && effects.get("first-slow").is_some_and(|c| c.done == 1),
        "{effects:?}"
    );
}
