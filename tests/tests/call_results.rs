//! Recorded call results against a real redis-server: the first write wins, a session's results
//! expire a while after its last call instead of living forever, and a call's run in progress
//! keeps its copies waiting.

use std::time::Duration;

use skein_common::config::RedisConfig;
use skein_common::protocol::{CallOutcome, ToolResult, PROTOCOL_VERSION};
use skein_common::store::{keys, RunMarker, SessionStore};
use skein_tests::support::servers::RedisServer;
use skein_tests::support::{eventually, unique};

fn result(output: &str) -> ToolResult {
    ToolResult {
        v: PROTOCOL_VERSION,
        call_id: "c1".to_owned(),
        outcome: CallOutcome::ok(output.to_owned()),
        worker_id: "w".to_owned(),
        duration_ms: 1,
        attempts: 0,
    }
}

#[tokio::test]
async fn the_first_result_wins_and_a_sessions_results_expire_after_its_last_call() {
    let redis = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig::local(redis.url.clone()))
        .await
        .expect("redis reachable");
    let session = unique("s");

    assert!(store
        .record_result("acme", &session, "t:0:c1", &result("first"))
        .await
        .expect("recorded"));
    assert!(!store
        .record_result("acme", &session, "t:0:c1", &result("second"))
        .await
        .expect("answered"));
    assert_eq!(
        store
            .recorded_result("acme", &session, "t:0:c1")
            .await
            .expect("read"),
        Some(result("first"))
    );

    let client = redis::Client::open(redis.url.as_str()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let ttl: i64 = redis::cmd("TTL")
        .arg(keys::results("acme", &session, "t:0:c1"))
        .query_async(&mut conn)
        .await
        .expect("ttl");
    assert!(
        (6 * 24 * 3600..=7 * 24 * 3600).contains(&ttl),
        "results expire about 7 days after the last call, not never: ttl {ttl}"
    );

    // A later task of the session keeps its results under its own key: the first task's results
    // are not kept alive by the session's later calls, and expire on their own.
    assert!(store
        .record_result("acme", &session, "u:0:c1", &result("later task"))
        .await
        .expect("recorded"));
    for (key, held) in [("t:0:c1", 1), ("u:0:c1", 1)] {
        let len: i64 = redis::cmd("HLEN")
            .arg(keys::results("acme", &session, key))
            .query_async(&mut conn)
            .await
            .expect("hlen");
        assert_eq!(len, held, "{key}");
    }
    assert_ne!(
        keys::results("acme", &session, "t:0:c1"),
        keys::results("acme", &session, "u:0:c1")
    );
}

/// Attempt counting around the first delivery of a first dispatch, which runs uncounted: a later
/// delivery after it left no trace (its worker crashed) learns that nothing was counted before;
/// after it was handed back (noted, not uncounted), the later delivery is the first attempt.
#[tokio::test]
async fn a_handed_back_uncounted_first_delivery_is_no_attempt() {
    use skein_common::store::CallAdmission;
    let redis = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig::local(redis.url.clone()))
        .await
        .expect("redis reachable");
    let session = unique("s");

    // Crashed first delivery: nothing in the store; the redelivery is the first count.
    let admitted = store.admit_call("acme", &session, "t:0:crashed", RUN).await;
    assert!(
        matches!(
            admitted,
            Ok(CallAdmission::Attempt {
                count: 1,
                first_count: true
            })
        ),
        "{admitted:?}"
    );

    // Handed-back first delivery: noted; the redelivery is counted 1, not the first count.
    store
        .note_uncounted_hand_back("acme", &session, "t:0:handed")
        .await
        .expect("noted");
    let admitted = store.admit_call("acme", &session, "t:0:handed", RUN).await;
    assert!(
        matches!(
            admitted,
            Ok(CallAdmission::Attempt {
                count: 1,
                first_count: false
            })
        ),
        "{admitted:?}"
    );
    // A note never takes back a count that exists.
    store
        .note_uncounted_hand_back("acme", &session, "t:0:handed")
        .await
        .expect("noted");
    let admitted = store.admit_call("acme", &session, "t:0:handed", RUN).await;
    assert!(
        matches!(admitted, Ok(CallAdmission::Attempt { count: 2, .. })),
        "{admitted:?}"
    );
}

/// One run's marker, for tests that admit calls as the same run.
const RUN: RunMarker<'static> = RunMarker {
    owner: "worker-a/run-1",
    ttl: Duration::from_secs(30),
};

#[tokio::test]
async fn a_call_running_elsewhere_keeps_its_copies_waiting_until_its_result_or_its_marker_goes() {
    use skein_common::store::CallAdmission;
    let redis = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig::local(redis.url.clone()))
        .await
        .expect("redis reachable");
    let session = unique("s");
    let other = RunMarker {
        owner: "worker-b/run-2",
        ttl: Duration::from_secs(30),
    };

    // The first run takes the marker; a copy of the call finds it held and is not counted.
    let first = store.admit_call("acme", &session, "t:0:c", RUN).await;
    assert!(
        matches!(first, Ok(CallAdmission::Attempt { count: 1, .. })),
        "{first:?}"
    );
    let copy = store.admit_call("acme", &session, "t:0:c", other).await;
    assert!(
        matches!(copy, Ok(CallAdmission::RunningElsewhere { ref owner }) if owner == RUN.owner),
        "{copy:?}"
    );
    assert!(!store
        .claim_call("acme", &session, "t:0:c", other)
        .await
        .expect("asked"));
    assert!(store
        .claim_call("acme", &session, "t:0:c", RUN)
        .await
        .expect("renewed"));

    // Its result recorded, the copy gets it.
    let result = ToolResult {
        v: PROTOCOL_VERSION,
        call_id: "c".into(),
        outcome: CallOutcome::ok("done once"),
        worker_id: "worker-a".into(),
        duration_ms: 1,
        attempts: 0,
    };
    assert!(store
        .record_result("acme", &session, "t:0:c", &result)
        .await
        .expect("recorded"));
    let copy = store.admit_call("acme", &session, "t:0:c", other).await;
    assert!(
        matches!(copy, Ok(CallAdmission::Recorded(ref r)) if *r == result),
        "{copy:?}"
    );

    // A run handed back releases its marker: the copy runs (and only the holder can release it).
    store
        .admit_call("acme", &session, "t:0:d", RUN)
        .await
        .expect("admitted");
    store
        .release_call("acme", &session, "t:0:d", other.owner)
        .await
        .expect("asked");
    let copy = store.admit_call("acme", &session, "t:0:d", other).await;
    assert!(
        matches!(copy, Ok(CallAdmission::RunningElsewhere { .. })),
        "{copy:?}"
    );
    store
        .release_call("acme", &session, "t:0:d", RUN.owner)
        .await
        .expect("released");
    let copy = store.admit_call("acme", &session, "t:0:d", other).await;
    assert!(
        matches!(copy, Ok(CallAdmission::Attempt { count: 2, .. })),
        "{copy:?}"
    );

    // A run whose worker died stops renewing: its marker expires and the copy runs.
    let short = RunMarker {
        owner: "worker-c/run-3",
        ttl: Duration::from_millis(300),
    };
    store
        .admit_call("acme", &session, "t:0:e", short)
        .await
        .expect("admitted");
    let copy = store.admit_call("acme", &session, "t:0:e", other).await;
    assert!(
        matches!(copy, Ok(CallAdmission::RunningElsewhere { .. })),
        "{copy:?}"
    );
    eventually(
        "the dead run's marker to expire",
        Duration::from_secs(10),
        || async {
            match store.admit_call("acme", &session, "t:0:e", other).await {
                Ok(CallAdmission::Attempt { .. }) => Some(()),
                _ => None,
            }
        },
    )
    .await;
}
