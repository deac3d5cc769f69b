//! Thinking models: a DeepSeek thinking-mode stream written from its documentation, served by
//! the fake OpenAI server so the real provider code reads it, reaches a watcher as
//! `reasoning_delta` events, in the order they streamed, before the answer's `model_delta`
//! events; the reasoning stays off the answer and is kept on the assistant message of the
//! session's history.

use skein_common::protocol::message::Role;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

/// DeepSeek thinking mode, delta shape per api-docs.deepseek.com/guides/thinking_mode (the
/// provider's unit tests read the same fixture).
const DEEPSEEK_THINKING: &str =
    include_str!("../../common/src/agent/model/fixtures/deepseek_thinking_stream.sse");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_streams_as_its_own_events_before_the_answer() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::recorded(DEEPSEEK_THINKING)]).await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;

    let task = submission("acme", &unique("s"), "which is greater, 9.11 or 9.8?");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("9.8 is greater."));

    let streamed: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|event| match &event.event {
            EventKind::ReasoningDelta { text } => Some(("reasoning", text.as_str())),
            EventKind::ModelDelta { text } => Some(("answer", text.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        streamed,
        vec![
            ("reasoning", "Compare 9.11 and 9.8: "),
            ("reasoning", "0.8 > 0.11."),
            ("answer", "9.8 is greater."),
        ]
    );
    // Numbered in that order by the lead, too.
    let seqs: Vec<u64> = events
        .iter()
        .filter(|event| {
            matches!(
                event.event,
                EventKind::ReasoningDelta { .. } | EventKind::ModelDelta { .. }
            )
        })
        .map(|event| event.seq)
        .collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");

    let session = cluster
        .store()
        .await
        .load("acme", &task.session)
        .await
        .expect("the session loads");
    let assistant = session
        .state
        .history
        .iter()
        .rev()
        .find(|message| message.role == Role::Assistant)
        .expect("the answer is in the history");
    assert_eq!(
        assistant.reasoning.as_deref(),
        Some("Compare 9.11 and 9.8: 0.8 > 0.11.")
    );
    assert_eq!(assistant.content, "9.8 is greater.");
}
