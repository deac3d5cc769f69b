//! A model stream that fails after its first tokens (OpenRouter's mid-stream `error` chunk with
//! `finish_reason: "error"`, served by the fake OpenAI server so the real provider reads it) is
//! retried like a failure before any output: the watcher sees the partial delta, then
//! `output_discarded`, then the retried answer's deltas; the final answer and the session's
//! history hold the retried answer only; a streamed chat completion marks where its text was
//! discarded.

use serde_json::{json, Value};
use skein_common::protocol::message::Role;
use skein_common::protocol::{EventKind, FailureKind, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::gateway::{chat, gateway_with_lead, KEY};
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

/// OpenRouter's stream that breaks off: "The answer is", then an error chunk (the provider's
/// unit tests read the same fixture).
const OPENROUTER_MIDSTREAM_ERROR: &str =
    include_str!("../../common/src/agent/model/fixtures/openrouter_midstream_error.sse");

const GOOD: &str = "The answer is 42.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_broke_off_is_discarded_and_retried_and_only_the_retry_is_kept() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::recorded(OPENROUTER_MIDSTREAM_ERROR),
        FakeReply::answer(GOOD),
    ])
    .await;
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;

    let task = submission("acme", &unique("s"), "what is the answer?");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some(GOOD));
    assert_eq!(model.requests().len(), 2, "the broken call was made again");

    // The lead's streamed text in stretches (consecutive deltas joined), and its discards.
    let mut streamed: Vec<String> = Vec::new();
    for event in events.iter().filter(|event| event.source == "lead") {
        match &event.event {
            EventKind::ModelDelta { text } => match streamed.last_mut() {
                Some(stretch) if stretch.starts_with('+') => stretch.push_str(text),
                _ => streamed.push(format!("+{text}")),
            },
            EventKind::OutputDiscarded { failure } => {
                assert_eq!(failure.kind, FailureKind::ModelFailed, "{failure:?}");
                assert!(failure.retryable, "{failure:?}");
                assert!(
                    failure
                        .message
                        .contains("Provider disconnected unexpectedly"),
                    "{failure:?}"
                );
                streamed.push("discarded".to_owned());
            }
            _ => {}
        }
    }
    assert_eq!(
        streamed,
        ["+The answer is", "discarded", &format!("+{GOOD}")]
    );

    let session = cluster
        .store()
        .await
        .load("acme", &task.session)
        .await
        .expect("the session loads");
    let answers: Vec<&str> = session
        .state
        .history
        .iter()
        .filter(|message| message.role == Role::Assistant)
        .map(|message| message.content.as_str())
        .collect();
    assert_eq!(answers, [GOOD]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_completion_marks_the_text_it_cannot_take_back() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::recorded(OPENROUTER_MIDSTREAM_ERROR),
        FakeReply::answer(GOOD),
    ])
    .await;
    let addr = gateway_with_lead(&cluster, &model_flags(&model.base_url), &[]).await;

    let response = reqwest::Client::new()
        .post(chat(addr))
        .bearer_auth(KEY)
        .json(&json!({ "model": "assistant", "stream": true,
            "messages": [ { "role": "user", "content": "what is the answer?" } ] }))
        .send()
        .await
        .expect("answered");
    assert!(response.status().is_success(), "{response:?}");
    let text = response.text().await.expect("the stream");
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON chunk"))
        .collect();
    let content = |chunks: &[Value]| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect()
    };
    let marks: Vec<usize> = chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.get("skein_output_discarded").is_some())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(marks.len(), 1, "{text}");
    let mark = &chunks[marks[0]];
    assert_eq!(
        mark["skein_output_discarded"]["failure"]["kind"], "model_failed",
        "{mark}"
    );
    let note = mark["choices"][0]["delta"]["content"]
        .as_str()
        .expect("the mark is text");
    assert!(note.contains("output discarded"), "{note}");
    assert_eq!(content(&chunks[..marks[0]]), "The answer is");
    assert_eq!(content(&chunks[marks[0] + 1..]), GOOD);
    assert_eq!(model.requests().len(), 2);
}
