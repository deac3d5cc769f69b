//! Starting a turn in one store trip (`SessionStore::begin_turn`), against a real redis-server:
//! the lease is exclusive and waiting for it counts nothing, attempts are bounded, a checkpoint
//! and the session come back with the lease, a completed turn releases the lease and answers
//! later starts with its final result; the start reads what was asked of the task (pause,
//! steer, interrupt) and takes the delivery's event epoch.

use std::time::Duration;

use skein_common::config::RedisConfig;
use skein_common::protocol::{ControlAction, FinalResult, TurnStatus, PROTOCOL_VERSION};
use skein_common::store::control::Controls;
use skein_common::store::{
    Ended, SessionState, SessionStore, TurnCheckpoint, TurnClaim, TurnStart,
};
use skein_tests::support::servers::RedisServer;
use skein_tests::support::unique;

async fn store(redis: &RedisServer) -> SessionStore {
    SessionStore::connect(&RedisConfig::local(redis.url.clone()))
        .await
        .expect("redis reachable")
}

fn claim<'a>(session: &'a str, task_id: &'a str, token: &'a str, max: u64) -> TurnClaim<'a> {
    TurnClaim {
        tenant: "acme",
        session,
        task_id,
        lease_token: token,
        lease_ttl: Duration::from_secs(30),
        max_attempts: max,
        trace: None,
    }
}

fn answer(session: &str, task_id: &str) -> FinalResult {
    FinalResult {
        v: PROTOCOL_VERSION,
        task_id: task_id.to_owned(),
        tenant: "acme".to_owned(),
        session: session.to_owned(),
        status: TurnStatus::Completed,
        answer: Some("done".to_owned()),
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

#[tokio::test]
async fn the_lease_is_exclusive_and_a_completed_turn_releases_it_and_answers_later_starts() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));

    let TurnStart::Started {
        attempt,
        session: loaded,
        checkpoint,
        controls,
    } = store
        .begin_turn(claim(&session, &task, "lead-a", 3))
        .await
        .expect("begin")
    else {
        panic!("a fresh session starts");
    };
    assert_eq!(attempt, 1);
    assert_eq!(loaded.version, 0);
    assert_eq!(loaded.state, SessionState::default());
    assert_eq!(checkpoint, None);
    assert_eq!(
        controls,
        Controls::default(),
        "nothing was asked of the task"
    );

    // Another lead (or a second run of the same task) waits, and waiting counts nothing.
    for token in ["lead-b", "lead-b", "lead-a"] {
        let start = store
            .begin_turn(claim(&session, &task, token, 3))
            .await
            .expect("begin");
        assert_eq!(start, TurnStart::Busy, "{token}");
    }

    let state = SessionState {
        turns: 1,
        ..Default::default()
    };
    store
        .complete_turn("lead-a", 0, Some(state), &answer(&session, &task), None)
        .await
        .expect("complete");

    // The lease went with the completion: another task of the session starts at once, and sees
    // the saved session.
    let next = unique("t");
    match store
        .begin_turn(claim(&session, &next, "lead-b", 3))
        .await
        .expect("begin")
    {
        TurnStart::Started {
            attempt,
            session: loaded,
            ..
        } => {
            assert_eq!(attempt, 1, "the busy looks were not counted for any task");
            assert_eq!(loaded.version, 1);
            assert_eq!(loaded.state.turns, 1);
        }
        other => panic!("expected a start, got {other:?}"),
    }
    // The completed task answers with its final result, without taking the lease.
    match store
        .begin_turn(claim(&session, &task, "lead-c", 3))
        .await
        .expect("begin")
    {
        TurnStart::Finished(result) => assert_eq!(result.answer.as_deref(), Some("done")),
        other => panic!("expected the final result, got {other:?}"),
    }
}

#[tokio::test]
async fn attempts_are_bounded_and_a_checkpoint_comes_back_with_the_lease() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));

    let first = store
        .begin_turn(claim(&session, &task, "lead-a", 2))
        .await
        .expect("begin");
    assert!(
        matches!(first, TurnStart::Started { attempt: 1, .. }),
        "{first:?}"
    );
    let progress = TurnCheckpoint {
        iterations: 1,
        ..Default::default()
    };
    assert!(store
        .save_checkpoint("acme", &session, &task, "lead-a", &progress)
        .await
        .expect("checkpoint"));
    // The lead dies; its lease is released (as it would expire).
    store
        .release_lease("acme", &session, "lead-a")
        .await
        .expect("release");

    match store
        .begin_turn(claim(&session, &task, "lead-b", 2))
        .await
        .expect("begin")
    {
        TurnStart::Started {
            attempt,
            checkpoint,
            ..
        } => {
            assert_eq!(attempt, 2);
            assert_eq!(checkpoint, Some(Box::new(progress)));
        }
        other => panic!("expected a resumable start, got {other:?}"),
    }
    store
        .release_lease("acme", &session, "lead-b")
        .await
        .expect("release");

    // Over the limit: counted, refused, and the lease is not taken.
    let third = store
        .begin_turn(claim(&session, &task, "lead-c", 2))
        .await
        .expect("begin");
    assert_eq!(third, TurnStart::Exhausted(3));
    assert!(store
        .try_lease("acme", &session, "lead-d", Duration::from_secs(5))
        .await
        .expect("lease"));
}

/// A session whose stored version is garbage, or at the top of its range, starts and ends no turn
/// and panics nowhere: the store answers with an error naming the bad value.
#[tokio::test]
async fn a_corrupt_or_exhausted_version_is_an_error_not_a_wrap() {
    use skein_common::store::{keys, StoreError};
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let client = redis::Client::open(redis.url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connects");

    let session = unique("s");
    let () = redis::cmd("HSET")
        .arg(keys::session("acme", &session))
        .arg("version")
        .arg("garbage")
        .query_async(&mut conn)
        .await
        .expect("set");
    let started = store
        .begin_turn(claim(&session, &unique("t"), "lead-a", 3))
        .await;
    assert!(
        matches!(&started, Err(StoreError::BadNumber { text, .. }) if text == "garbage"),
        "{started:?}"
    );

    let session = unique("s");
    let () = redis::cmd("HSET")
        .arg(keys::session("acme", &session))
        .arg("version")
        .arg(u64::MAX.to_string())
        .query_async(&mut conn)
        .await
        .expect("set");
    let task = unique("t");
    let Ok(TurnStart::Started {
        session: loaded, ..
    }) = store.begin_turn(claim(&session, &task, "lead-a", 3)).await
    else {
        panic!("the turn starts");
    };
    assert_eq!(loaded.version, u64::MAX);
    let ended = store
        .complete_turn(
            "lead-a",
            loaded.version,
            Some(SessionState::default()),
            &answer(&session, &task),
            None,
        )
        .await;
    assert!(
        matches!(ended, Err(StoreError::BadNumber { .. })),
        "{ended:?}"
    );
    let saved = store
        .save("acme", &session, u64::MAX, &SessionState::default())
        .await;
    assert!(
        matches!(saved, Err(StoreError::BadNumber { .. })),
        "{saved:?}"
    );
}

/// A session whose stored state (or checkpoint) is corrupt: the start script takes the lease
/// before the reply is read, so a start that fails to read it must leave no lease behind, or
/// every later turn of the session waits out the lease's time to live.
#[tokio::test]
async fn a_start_that_cannot_read_the_session_leaves_no_lease_behind() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let mut conn = redis::Client::open(redis.url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    for (key_of, field_or_value) in [("session", "state"), ("checkpoint", "")] {
        let (session, task) = (unique("s"), unique("t"));
        if key_of == "session" {
            let key = skein_common::store::keys::session("acme", &session);
            let () = redis::cmd("HSET")
                .arg(&key)
                .arg("version")
                .arg("1")
                .arg(field_or_value)
                .arg("{not json")
                .query_async(&mut conn)
                .await
                .expect("corrupt session planted");
        } else {
            // The checkpoint of the lead that held the turn before, as that lead wrote it.
            let key = skein_common::store::keys::checkpoint("acme", &session, &task);
            let () = redis::cmd("HSET")
                .arg(&key)
                .arg("")
                .arg("lead-z")
                .arg("lead-z")
                .arg("{not json")
                .query_async(&mut conn)
                .await
                .expect("corrupt checkpoint planted");
        }
        let turn = store.turn(claim(&session, &task, "lead-a", 3));
        let start = turn.begin().await;
        assert!(
            start.is_err(),
            "{key_of}: a corrupt value is an error: {start:?}"
        );
        let lease: Option<String> = redis::cmd("GET")
            .arg(skein_common::store::keys::lease("acme", &session))
            .query_async(&mut conn)
            .await
            .expect("lease read");
        assert_eq!(lease, None, "{key_of}: the lease was released");
    }
}

/// A delivery's event epoch is taken by its turn's first start, in the same trip, whatever the
/// start finds; a later start of the same delivery keeps it, and the next delivery's is higher
/// (also when that one only finds the task finished), counted with the epochs other paths take.
#[tokio::test]
async fn each_delivery_takes_the_next_event_epoch_with_its_first_start() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));

    let first = store.turn(claim(&session, &task, "lead-a", 3));
    assert_eq!(first.event_epoch(), None, "nothing is taken before a start");
    let start = first.begin().await.expect("begin");
    assert!(matches!(start, TurnStart::Started { .. }), "{start:?}");
    assert_eq!(first.event_epoch(), Some(1));
    // A second start of the same delivery (the lease is held: busy) keeps its epoch and takes
    // none: the counter is still at 1, so the next one taken is 2.
    assert_eq!(first.begin().await.expect("begin"), TurnStart::Busy);
    assert_eq!(first.event_epoch(), Some(1));
    assert_eq!(
        store
            .next_event_epoch("acme", &session, &task)
            .await
            .expect("epoch"),
        2
    );

    // Another delivery that finds the session busy takes the next one all the same.
    let waiting = store.turn(claim(&session, &task, "lead-b", 3));
    assert_eq!(waiting.begin().await.expect("begin"), TurnStart::Busy);
    assert_eq!(waiting.event_epoch(), Some(3));

    first
        .complete(0, None, &answer(&session, &task), None)
        .await
        .expect("complete");
    // A delivery after the end finds the final result, and still takes an epoch above every
    // earlier one, so the final it publishes again orders after theirs.
    let after = store.turn(claim(&session, &task, "lead-c", 3));
    match after.begin().await.expect("begin") {
        TurnStart::Finished(result) => assert_eq!(result.answer.as_deref(), Some("done")),
        other => panic!("expected the final result, got {other:?}"),
    }
    assert_eq!(after.event_epoch(), Some(4));
}

/// A task's final result is written once: a later store (a resubmit refused for another agent,
/// a cancel on a redelivery) or a turn that ends after another path ended the task leaves the
/// first standing, and gets it back.
#[tokio::test]
async fn a_final_result_is_written_once() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    let first = answer(&session, &task);
    assert_eq!(
        store.store_final(&first).await.expect("store"),
        Ended::Stored
    );
    let mut refused = answer(&session, &task);
    refused.status = TurnStatus::Failed;
    refused.answer = None;
    assert_eq!(
        store.store_final(&refused).await.expect("store"),
        Ended::Earlier(Box::new(first.clone())),
        "the first final stands"
    );
    assert_eq!(
        store
            .final_result("acme", &session, &task)
            .await
            .expect("read"),
        Some(first.clone())
    );

    // A turn that held the lease while another path ended the task saves nothing.
    let (session, task) = (unique("s"), unique("t"));
    let Ok(TurnStart::Started { .. }) = store.begin_turn(claim(&session, &task, "lead-a", 3)).await
    else {
        panic!("the turn starts");
    };
    let mut cancelled = answer(&session, &task);
    cancelled.status = TurnStatus::Cancelled;
    assert_eq!(
        store.store_final(&cancelled).await.expect("store"),
        Ended::Stored
    );
    let state = SessionState {
        turns: 1,
        ..Default::default()
    };
    let ended = store
        .complete_turn("lead-a", 0, Some(state), &answer(&session, &task), None)
        .await
        .expect("complete");
    assert_eq!(ended, Ended::Earlier(Box::new(cancelled)));
    let loaded = store.load("acme", &session).await.expect("load");
    assert_eq!(loaded.version, 0, "the turn's history was not saved");
    let start = store
        .begin_turn(claim(&session, &unique("t"), "lead-b", 3))
        .await
        .expect("begin");
    assert!(
        matches!(start, TurnStart::Started { .. }),
        "the lease was released: {start:?}"
    );
}

#[tokio::test]
async fn the_turn_start_reads_what_was_asked_of_the_task() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    for (action, text) in [
        (ControlAction::Steer, "first"),
        (ControlAction::Pause, ""),
        (ControlAction::Steer, "second"),
    ] {
        store
            .record_control("acme", &session, &task, action, text)
            .await
            .expect("recorded");
    }
    store
        .request_interrupt("acme", &session, &task, "later")
        .await
        .expect("recorded");
    let Ok(TurnStart::Started { controls, .. }) =
        store.begin_turn(claim(&session, &task, "lead-a", 3)).await
    else {
        panic!("the turn starts");
    };
    assert_eq!(
        controls,
        Controls {
            paused: true,
            was_paused: true,
            interrupted_by: Some("later".into()),
            steered: 2,
        }
    );
    let (_, steer) = store
        .controls("acme", &session, &task, 1)
        .await
        .expect("read");
    assert_eq!(steer, ["second"], "messages after the ones taken");
    store
        .record_control("acme", &session, &task, ControlAction::Resume, "")
        .await
        .expect("recorded");
    store
        .clear_was_paused("acme", &session, &task)
        .await
        .expect("cleared");
    let (controls, _) = store
        .controls("acme", &session, &task, 2)
        .await
        .expect("read");
    assert!(!controls.paused && !controls.was_paused, "{controls:?}");
}

/// The start keeps the trace of a task submitted without one: the first trace given is kept (also
/// when the session is busy), later starts do not replace it, and it expires as the attempts do.
#[tokio::test]
async fn the_turn_start_keeps_the_first_trace_it_is_given() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    let first = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let later = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
    assert_eq!(
        store
            .task_trace("acme", &session, &task)
            .await
            .expect("read"),
        None
    );

    // Another task holds the session: nothing is counted, but the trace is kept.
    let holder = unique("t");
    let started = store
        .begin_turn(claim(&session, &holder, "lead-a", 3))
        .await
        .expect("begin");
    assert!(matches!(started, TurnStart::Started { .. }), "{started:?}");
    let busy = store
        .begin_turn(TurnClaim {
            trace: Some(first),
            ..claim(&session, &task, "lead-b", 3)
        })
        .await
        .expect("begin");
    assert_eq!(busy, TurnStart::Busy);
    assert_eq!(
        store
            .task_trace("acme", &session, &task)
            .await
            .expect("read")
            .as_deref(),
        Some(first)
    );
    assert_eq!(
        store
            .task_trace("acme", &session, &holder)
            .await
            .expect("read"),
        None,
        "a start without a trace keeps none"
    );

    // A later delivery (its span a child of the first) does not replace it.
    store
        .release_lease("acme", &session, "lead-a")
        .await
        .expect("release");
    let started = store
        .begin_turn(TurnClaim {
            trace: Some(later),
            ..claim(&session, &task, "lead-b", 3)
        })
        .await
        .expect("begin");
    assert!(matches!(started, TurnStart::Started { .. }), "{started:?}");
    assert_eq!(
        store
            .task_trace("acme", &session, &task)
            .await
            .expect("read")
            .as_deref(),
        Some(first)
    );
    let mut conn = redis::Client::open(redis.url.as_str())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let ttl: i64 = redis::cmd("TTL")
        .arg(skein_common::store::keys::task_trace(
            "acme", &session, &task,
        ))
        .query_async(&mut conn)
        .await
        .expect("TTL");
    assert!(ttl > 24 * 3600, "expires as the attempts do: {ttl}");

    // A dead letter's replay forgets it with the rest of the turn.
    store
        .forget_turn("acme", &session, &task)
        .await
        .expect("forget");
    assert_eq!(
        store
            .task_trace("acme", &session, &task)
            .await
            .expect("read"),
        None
    );
}

/// A server that lost its script cache (restarted, failed over to a replica, flushed) is given
/// each script again on its next call: the start and the end of a turn go through as before.
#[tokio::test]
async fn scripts_a_server_forgot_are_given_to_it_again() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let (session, task) = (unique("s"), unique("t"));
    let flush = || async {
        let client = redis::Client::open(redis.url.as_str()).expect("redis url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis reachable");
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("script flush");
    };

    flush().await;
    let start = store
        .begin_turn(claim(&session, &task, "lead-a", 3))
        .await
        .expect("the start after a flush");
    assert!(
        matches!(start, TurnStart::Started { attempt: 1, .. }),
        "{start:?}"
    );

    flush().await;
    let state = SessionState {
        turns: 1,
        history: vec![skein_common::protocol::message::Message::user("kept")],
        ..Default::default()
    };
    store
        .complete_turn(
            "lead-a",
            0,
            Some(state.clone()),
            &answer(&session, &task),
            None,
        )
        .await
        .expect("the end after a flush");

    flush().await;
    match store
        .begin_turn(claim(&session, &unique("t"), "lead-b", 3))
        .await
        .expect("the next start after a flush")
    {
        TurnStart::Started {
            session: loaded, ..
        } => {
            assert_eq!(loaded.version, 1, "the end was saved");
            assert_eq!(loaded.state.history, state.history);
        }
        other => panic!("expected a start, got {other:?}"),
    }
}
