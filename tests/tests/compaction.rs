//! Compaction: a session whose history outgrows the model's context is summarised by the model,
//! its later turns carry the summary and only their recent turns verbatim, the session stores the
//! summary (and loads only what it does not stand for), and a model that refuses a request as too
//! long gets it once more, compacted. The real OpenAI provider talks to the fake server.

use serde_json::{json, Value};
use skein_common::agent::compaction::SUMMARY_INSTRUCTIONS;
use skein_common::protocol::{EventKind, FailureKind, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

/// The text of every message of a recorded request, by role.
fn messages(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .expect("a request has messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn is_summary_request(request: &Value) -> bool {
    messages(request)
        .first()
        .is_some_and(|(role, text)| role == "system" && text == SUMMARY_INSTRUCTIONS)
}

fn compactions(events: &[skein_common::protocol::TurnEvent]) -> Vec<(u64, String, u64, u64)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::Compacted {
                messages,
                trigger,
                tokens_before,
                tokens_after,
            } => Some((*messages, trigger.clone(), *tokens_before, *tokens_after)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_session_is_compacted_and_its_later_turns_carry_the_summary() {
    const TURNS: usize = 8;
    let cluster = TestCluster::start();
    // Every reply is distinct, so the one that served as the summary can be recognised.
    let replies = (0..TURNS + 4)
        .map(|i| FakeReply::answer(format!("R{i} {}", "y".repeat(1200))))
        .collect();
    let model = FakeOpenAi::start(replies).await;
    let mut flags = model_flags(&model.base_url).to_vec();
    // A model the tokenizer does not know, with a small context: ~600 tokens a turn fill 75% of
    // 4,096 after a few turns.
    flags.extend(["--model", "small-local-model", "--context-tokens", "4096"]);
    cluster.start_nodes(0, &flags).await;

    let session = unique("s");
    let mut all_events = Vec::new();
    for turn in 0..TURNS {
        let task = submission("acme", &session, &format!("Q{turn} {}", "x".repeat(1200)));
        let (result, events) = cluster.run(&task).await;
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
        all_events.extend(events);
    }

    let compacted = compactions(&all_events);
    assert!(!compacted.is_empty(), "the session was never compacted");
    for (messages, trigger, before, after) in &compacted {
        assert_eq!(trigger, "tokens");
        assert!(*messages > 0);
        assert!(
            after < before,
            "compacting shrank nothing: {before} -> {after}"
        );
        assert!(
            *before > 4096 * 75 / 100,
            "compacted under the threshold: {before}"
        );
    }

    let requests = model.requests();
    let summary_requests: Vec<usize> = (0..requests.len())
        .filter(|&i| is_summary_request(&requests[i]))
        .collect();
    assert_eq!(summary_requests.len(), compacted.len());
    // The first summary request holds the first turn; the reply it got is the summary.
    let first = summary_requests[0];
    let transcript = &messages(&requests[first])[1].1;
    assert!(transcript.contains("user: Q0 "), "{transcript:.200}");
    // Replies go out in request order: the latest summary is the reply to the last such request.
    let latest = *summary_requests.last().expect("one at least");
    let summary = format!("R{latest} ");

    let last = messages(requests.last().expect("requests were made"));
    let (role, system) = &last[0];
    assert_eq!(role, "system");
    assert!(
        system.contains("Summary of the earlier conversation"),
        "{system:.400}"
    );
    assert!(
        system.contains(&summary),
        "the last turn's prompt carries the latest summary {summary}: {system:.400}"
    );
    assert!(
        !last.iter().any(|(_, text)| text.starts_with("Q0 ")),
        "the first turn is no longer sent verbatim"
    );
    let last_question = format!("Q{} ", TURNS - 1);
    assert!(last
        .iter()
        .any(|(_, text)| text.starts_with(&last_question)));
    // Every request stays well inside the context (bytes bound tokens).
    for request in requests.iter().filter(|r| !is_summary_request(r)) {
        let bytes: usize = messages(request).iter().map(|(_, t)| t.len()).sum();
        assert!(bytes < 4096 * 4, "a request of {bytes} bytes");
    }

    // The session keeps every message, stores the summary, and loads only what follows it.
    let store = cluster.store().await;
    let loaded = store.load("acme", &session).await.expect("load");
    let stored_summary = loaded
        .state
        .summary
        .expect("the session stores its summary");
    assert!(stored_summary.messages > 0);
    assert!(loaded.state.history.len() < 2 * TURNS);
    assert_eq!(
        stored_summary.messages as usize + loaded.state.history.len(),
        2 * TURNS,
        "summary and loaded history account for every message"
    );
    assert_eq!(loaded.state.turns, TURNS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_refuses_a_request_as_too_long_gets_it_again_compacted() {
    let cluster = TestCluster::start();
    let overflow = json!({"error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages \
                    resulted in 9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded"
    }})
    .to_string();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer("first answer"),
        FakeReply::answer("second answer"),
        FakeReply::Status(400, overflow.clone()),
        FakeReply::answer("- the user asked two questions"),
        FakeReply::answer("third answer"),
        // A first turn of a new session has nothing to compact: the overflow ends it.
        FakeReply::Status(400, overflow),
    ])
    .await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;

    let session = unique("s");
    for input in ["first question", "second question"] {
        let (result, _) = cluster.run(&submission("acme", &session, input)).await;
        assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    }
    let (result, events) = cluster
        .run(&submission("acme", &session, "third question"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("third answer"));
    let compacted = compactions(&events);
    assert_eq!(compacted.len(), 1, "{events:?}");
    assert_eq!(compacted[0].1, "overflow");
    assert_eq!(compacted[0].0, 4, "both earlier turns summarised");

    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    assert!(is_summary_request(&requests[3]));
    let retried = messages(&requests[4]);
    assert!(retried[0].1.contains("- the user asked two questions"));
    assert!(!retried.iter().any(|(_, t)| t == "first question"));
    assert_eq!(
        retried.last().map(|(_, t)| t.as_str()),
        Some("third question")
    );

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "a first question"))
        .await;
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let failure = result.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::ContextOverflow, "{failure:?}");
    assert_eq!(
        model.requests().len(),
        6,
        "no retry without anything to compact"
    );
}
