//! Session history stored incrementally: a turn appends its messages to the session's history
//! list instead of rewriting the session, so what a save sends to Redis does not grow with the
//! session; sessions saved before history lists are read as they were and moved on their next
//! save.

use skein_common::config::RedisConfig;
use skein_common::protocol::message::Message;
use skein_common::protocol::{FinalResult, PROTOCOL_VERSION};
use skein_common::store::{keys, SessionStore, TurnClaim, TurnStart};
use skein_tests::support::servers::{NatsServer, RedisServer};
use skein_tests::support::unique;

/// Bytes Redis has received so far.
async fn bytes_received(redis: &redis::Client) -> u64 {
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable");
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_input_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_net_input_bytes")
}

#[tokio::test]
async fn a_save_sends_only_the_new_messages_however_long_the_session() {
    let server = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig::local(server.url.clone()))
        .await
        .expect("redis reachable");
    let client = redis::Client::open(server.url.as_str()).expect("url");
    let session = unique("s");
    let mut sent = Vec::new();
    for turn in 1..=300u64 {
        let loaded = store.load("acme", &session).await.expect("load");
        assert_eq!(loaded.state.history.len() as u64, 2 * (turn - 1));
        let mut state = loaded.state;
        state
            .history
            .push(Message::user(format!("question {turn}")));
        state.history.push(Message::assistant(format!(
            "answer {turn} {}",
            "x".repeat(500)
        )));
        state.turns += 1;
        let before = bytes_received(&client).await;
        store
            .save("acme", &session, loaded.version, &state)
            .await
            .expect("saved");
        sent.push(bytes_received(&client).await - before);
    }
    let loaded = store.load("acme", &session).await.expect("load");
    assert_eq!(loaded.state.turns, 300);
    assert_eq!(loaded.state.history.len(), 600);
    assert!(loaded.state.history[599].content.starts_with("answer 300"));
    // Turn 1 writes the session whole (and may send the script itself); from turn 2 on a save
    // sends two messages and the session's small state, at turn 300 as at turn 2.
    let (second, last) = (sent[1], sent[299]);
    println!("bytes sent by a save: turn 2 {second}, turn 300 {last}");
    assert!(
        last < second + 200,
        "a save grows with the session: {second} bytes at turn 2, {last} at turn 300"
    );
}

/// Messages are appended to the history list 512 to a command: a save and a turn's end that add
/// more than one command takes keep every message, in order.
#[tokio::test]
async fn more_messages_than_one_command_appends_are_all_kept_in_order() {
    let server = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig::local(server.url.clone()))
        .await
        .expect("redis reachable");
    let session = unique("s");
    let mut state = store.load("acme", &session).await.expect("load").state;
    state
        .history
        .extend((0..1_300).map(|i| Message::user(format!("m{i}"))));
    let version = store
        .save("acme", &session, 0, &state)
        .await
        .expect("saved");

    // A turn's end appends through the end script: 1,100 more under the turn's lease.
    let task = unique("t");
    let claim = TurnClaim {
        tenant: "acme",
        session: &session,
        task_id: &task,
        lease_token: "lead-a",
        lease_ttl: std::time::Duration::from_secs(30),
        max_attempts: 3,
        trace: None,
    };
    let TurnStart::Started {
        session: loaded, ..
    } = store.begin_turn(claim).await.expect("begin")
    else {
        panic!("the session starts");
    };
    assert_eq!(loaded.version, version);
    assert_eq!(loaded.state.history.len(), 1_300);
    let mut state = loaded.state;
    state
        .history
        .extend((1_300..2_400).map(|i| Message::user(format!("m{i}"))));
    let result: FinalResult = serde_json::from_value(serde_json::json!({
        "v": PROTOCOL_VERSION, "task_id": task, "tenant": "acme", "session": session,
        "status": "completed", "answer": "done", "iterations": 1, "limit_reached": false,
    }))
    .expect("a final result");
    store
        .complete_turn("lead-a", version, Some(state), &result, None)
        .await
        .expect("completed");

    let history = store
        .load("acme", &session)
        .await
        .expect("load")
        .state
        .history;
    let contents: Vec<&str> = history.iter().map(|m| m.content.as_str()).collect();
    let expected: Vec<String> = (0..2_400).map(|i| format!("m{i}")).collect();
    assert_eq!(contents, expected, "every message, in order");
}

#[tokio::test]
async fn a_session_saved_with_its_history_inline_is_read_and_moved_to_the_list() {
    let server = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig::local(server.url.clone()))
        .await
        .expect("redis reachable");
    let client = redis::Client::open(server.url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable");
    let session = unique("s");
    let old = serde_json::json!({
        "history": [Message::user("old question"), Message::assistant("old answer")],
        "turns": 1
    });
    let () = redis::cmd("HSET")
        .arg(keys::session("acme", &session))
        .arg("version")
        .arg(1)
        .arg("state")
        .arg(old.to_string())
        .query_async(&mut conn)
        .await
        .expect("planted");

    let loaded = store.load("acme", &session).await.expect("load");
    assert_eq!(loaded.state.history.len(), 2);
    let mut state = loaded.state;
    state.history.push(Message::user("new question"));
    state.turns += 1;
    store
        .save("acme", &session, loaded.version, &state)
        .await
        .expect("saved");

    let listed: Vec<String> = redis::cmd("LRANGE")
        .arg(keys::history("acme", &session))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("list");
    assert_eq!(listed.len(), 3, "the whole history moved to the list");
    let inline: String = redis::cmd("HGET")
        .arg(keys::session("acme", &session))
        .arg("state")
        .query_async(&mut conn)
        .await
        .expect("state");
    assert!(!inline.contains("old question"), "{inline}");
    let loaded = store.load("acme", &session).await.expect("load");
    assert_eq!(loaded.state.history.len(), 3);
    assert_eq!(loaded.state.turns, 2);
}

#[tokio::test]
async fn an_idle_session_expires_after_the_configured_time() {
    let server = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig {
        session_ttl: Some(std::time::Duration::from_secs(3600)),
        ..RedisConfig::local(server.url.clone())
    })
    .await
    .expect("redis reachable");
    let client = redis::Client::open(server.url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable");
    let session = unique("s");
    let loaded = store.load("acme", &session).await.expect("load");
    let mut state = loaded.state;
    state.history.push(Message::user("hello"));
    store
        .save("acme", &session, loaded.version, &state)
        .await
        .expect("saved");
    for key in [
        keys::session("acme", &session),
        keys::history("acme", &session),
    ] {
        let ttl: i64 = redis::cmd("TTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("TTL");
        assert!((3500..=3600).contains(&ttl), "{key}: ttl {ttl}");
    }
}

/// `skein sessions` as an operator runs it.
fn skein(redis: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_skein-node"))
        .arg("sessions")
        .args(["--redis-url", redis, "--tenant", "acme"])
        .args(args)
        .output()
        .expect("skein runs")
}

#[tokio::test]
async fn an_operator_lists_shows_and_removes_sessions() {
    let server = RedisServer::start();
    // `rm` removes the session's workspace files too, in NATS.
    let nats = NatsServer::start();
    let store = SessionStore::connect(&RedisConfig::local(server.url.clone()))
        .await
        .expect("redis reachable");
    let (kept, removed) = (unique("kept"), unique("gone"));
    for session in [&kept, &removed] {
        let loaded = store.load("acme", session).await.expect("load");
        let mut state = loaded.state;
        state
            .history
            .push(Message::user(format!("hello from {session}")));
        state.turns = 1;
        store
            .save("acme", session, loaded.version, &state)
            .await
            .expect("saved");
    }
    let listed = skein(&server.url, &["ls"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(text.contains(&kept) && text.contains(&removed), "{text}");
    assert!(text.contains("1 turns\t1 messages\tkept"), "{text}");

    let shown = skein(&server.url, &["show", &kept]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains(&format!("hello from {kept}")), "{text}");

    // A turn holds the lease: refused.
    assert!(store
        .try_lease(
            "acme",
            &removed,
            "lead-a",
            std::time::Duration::from_secs(60)
        )
        .await
        .expect("lease"));
    let refused = skein(&server.url, &["rm", "--nats-url", &nats.url, &removed]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("a turn is running"));
    store
        .release_lease("acme", &removed, "lead-a")
        .await
        .expect("released");

    let gone = skein(&server.url, &["rm", "--nats-url", &nats.url, &removed]);
    assert!(gone.status.success(), "{gone:?}");
    let listed = skein(&server.url, &["ls"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains(&kept) && !text.contains(&removed), "{text}");
    let again = skein(&server.url, &["rm", "--nats-url", &nats.url, &removed]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("no session"));
}

/// A history list's length, as stored.
async fn stored_length(client: &redis::Client, session: &str) -> u64 {
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable");
    redis::cmd("LLEN")
        .arg(keys::history("acme", session))
        .query_async(&mut conn)
        .await
        .expect("LLEN")
}

#[tokio::test]
async fn a_compacted_session_loads_only_what_its_summary_does_not_stand_for_and_stays_capped() {
    use skein_common::agent::runtime::{Compaction, Summary};
    let server = RedisServer::start();
    let store = SessionStore::connect(&RedisConfig {
        session_max_messages: 30,
        ..RedisConfig::local(server.url.clone())
    })
    .await
    .expect("redis reachable");
    let client = redis::Client::open(server.url.as_str()).expect("url");
    let session = unique("s");
    let mut summarised = 0u64;
    for turn in 1..=40u64 {
        let loaded = store.load("acme", &session).await.expect("load");
        let mut state = loaded.state;
        // Every 10 turns, all but the last 4 messages are summarised (as a turn's compaction).
        if turn % 10 == 0 {
            let compacted = state.history.len() - 4;
            summarised += compacted as u64;
            state.compact(&Compaction {
                summary: Some(Summary {
                    text: format!("summary at turn {turn}"),
                    messages: summarised,
                }),
                compacted,
                steps: None,
            });
        }
        state
            .history
            .push(Message::user(format!("question {turn}")));
        state
            .history
            .push(Message::assistant(format!("answer {turn}")));
        state.turns += 1;
        store
            .save("acme", &session, loaded.version, &state)
            .await
            .expect("saved");
        assert!(
            stored_length(&client, &session).await <= 30 || summarised == 0,
            "turn {turn}: the list outgrew its cap with summarised messages to drop"
        );
    }
    let loaded = store.load("acme", &session).await.expect("load");
    let summary = loaded.state.summary.expect("a summary");
    assert_eq!(summary.text, "summary at turn 40");
    // Compacted at turn 40: 4 messages of turn 38 and 39 kept, then turn 40's two.
    let history: Vec<&str> = loaded
        .state
        .history
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        history,
        [
            "question 38",
            "answer 38",
            "question 39",
            "answer 39",
            "question 40",
            "answer 40"
        ]
    );
    assert_eq!(summary.messages + history.len() as u64, 80);
    // The list keeps the most recent summarised messages up to the cap, the loaded ones after.
    assert_eq!(stored_length(&client, &session).await, 30);
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable");
    let last: Vec<String> = redis::cmd("LRANGE")
        .arg(keys::history("acme", &session))
        .arg(-1)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("LRANGE");
    assert!(last[0].contains("answer 40"), "{last:?}");
    // Turn start loads the same window.
    let started = store
        .begin_turn(skein_common::store::TurnClaim {
            tenant: "acme",
            session: &session,
            task_id: "t-next",
            lease_token: "lead-a",
            lease_ttl: std::time::Duration::from_secs(30),
            max_attempts: 3,
            trace: None,
        })
        .await
        .expect("begin");
    match started {
        skein_common::store::TurnStart::Started { session, .. } => {
            assert_eq!(session.state.history.len(), 6);
            assert_eq!(
                session.state.summary.map(|s| s.text).as_deref(),
                Some("summary at turn 40")
            );
        }
        other => panic!("{other:?}"),
    }
}
