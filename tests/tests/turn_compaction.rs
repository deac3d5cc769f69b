//! A turn that outgrows its context compacts itself: when its own tool results fill the context,
//! its older steps are summarised by the model, the latest step is sent verbatim with the
//! summary in the system prompt, and the turn goes on to answer; the session still stores the
//! turn whole. A single result larger than the context, which the model refuses, fails the turn
//! `context_overflow`, saying so, without sending it again. Real lead, worker, NATS and Redis; the real OpenAI provider talks to
//! the fake server.

use std::path::PathBuf;

use serde_json::{json, Value};
use skein_common::agent::compaction::STEPS_SUMMARY_INSTRUCTIONS;
use skein_common::protocol::{EventKind, FailureKind, TurnStatus};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{unique, FakeOpenAi, FakeReply};

/// The agent's context: a model the tokenizer does not know (estimated at four bytes a token).
const CONTEXT: &str = "8192";

/// Agents whose tools are all allowed (no approval asked).
fn unguarded_agents(cluster: &TestCluster) -> PathBuf {
    let dir = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&dir).expect("agents dir");
    std::fs::write(
        dir.join("AGENTS.md"),
        "+++\ntools = [\"*\"]\n[permissions]\nmode = \"bypass\"\n+++\nYou read pages.\n",
    )
    .expect("AGENTS.md written");
    dir
}

/// A worker on a volume workspace and a lead whose model is the fake server with a context of
/// [`CONTEXT`] tokens.
async fn start(cluster: &TestCluster, model: &FakeOpenAi) {
    cluster.spawn_worker(cluster.worker_config(&["--workspace", "volume"]));
    let agents = unguarded_agents(cluster);
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend([
        "--model",
        "small-local-model",
        "--context-tokens",
        CONTEXT,
        "--agents-dir",
        agents.to_str().expect("utf-8 path"),
    ]);
    cluster.spawn_lead(cluster.lead_config(&flags));
    cluster.wait_for_workers(1).await;
}

/// Writes `page{k}.txt` of `bytes` bytes into `session`'s workspace, for each `k` of `pages`.
fn write_pages(cluster: &TestCluster, session: &str, pages: std::ops::Range<u64>, bytes: usize) {
    let dir = cluster.dir.join("workspaces").join("acme").join(session);
    std::fs::create_dir_all(&dir).expect("session dir");
    for k in pages {
        std::fs::write(dir.join(format!("page{k}.txt")), page(k, bytes)).expect("page written");
    }
}

fn page(k: u64, bytes: usize) -> String {
    let head = format!("page {k}: ");
    let fill = "x".repeat(bytes - head.len());
    head + &fill
}

fn read(k: u64) -> FakeReply {
    FakeReply::tool("read_file", json!({ "path": format!("page{k}.txt") }))
}

fn messages(request: &Value) -> &[Value] {
    request["messages"]
        .as_array()
        .map(Vec::as_slice)
        .expect("a request has messages")
}

fn content(message: &Value) -> &str {
    message["content"].as_str().unwrap_or_default()
}

/// Every tool result follows the assistant message whose calls it answers, and every call is
/// answered before the next assistant or user message.
fn assert_calls_and_results_paired(messages: &[Value]) {
    let mut open: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        match message["role"].as_str() {
            Some("tool") => {
                let id = message["tool_call_id"].as_str().unwrap_or_default();
                let at = open.iter().position(|c| c == id);
                assert!(at.is_some(), "a result without its call at {i}: {id}");
                open.retain(|c| c != id);
            }
            _ => {
                assert!(
                    open.is_empty(),
                    "calls left unanswered before {i}: {open:?}"
                );
                open = message["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                            .collect()
                    })
                    .unwrap_or_default();
            }
        }
    }
}

/// The text of the tool results `request` carries, in order.
fn results(request: &Value) -> Vec<&str> {
    messages(request)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(content)
        .collect()
}

fn is_steps_summary(request: &Value) -> bool {
    messages(request)
        .first()
        .is_some_and(|m| content(m) == STEPS_SUMMARY_INSTRUCTIONS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_results_outgrow_the_context_summarises_its_older_steps_and_answers() {
    let cluster = TestCluster::start();
    // Pages of 8,000 bytes (~2,000 tokens): with the prompt and the tool specs, two fit under
    // 75% of 8,192 tokens, three do not; a compaction keeps the latest (30% of the context).
    let session = unique("s");
    write_pages(&cluster, &session, 0..5, 8_000);
    let first = "- pages 0 and 1 hold only x";
    let second = "- pages 0 to 3 hold only x";
    let model = FakeOpenAi::start(vec![
        read(0),
        read(1),
        read(2),
        FakeReply::answer(first),
        read(3),
        read(4),
        FakeReply::answer(second),
        FakeReply::answer("read five pages"),
    ])
    .await;
    start(&cluster, &model).await;

    let (result, events) = cluster
        .run(&submission("acme", &session, "read the pages"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("read five pages"));
    let compacted: Vec<(u64, String)> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::Compacted {
                messages, trigger, ..
            } => Some((*messages, trigger.clone())),
            _ => None,
        })
        .collect();
    // Twice two steps, a call and its result each.
    assert_eq!(
        compacted,
        [(4, "tokens".to_owned()), (4, "tokens".to_owned())]
    );

    let requests = model.requests();
    assert_eq!(requests.len(), 8);
    let summaries: Vec<usize> = (0..requests.len())
        .filter(|&i| is_steps_summary(&requests[i]))
        .collect();
    assert_eq!(summaries, [3, 6]);
    // The first summary request: the turn's input, the first two steps, each call with its
    // arguments and its result; not the third, the latest.
    let transcript = content(&messages(&requests[3])[1]);
    assert!(transcript.contains("read the pages"), "{transcript:.300}");
    assert!(transcript.contains("called read_file"), "{transcript:.300}");
    for k in 0..2 {
        assert!(
            transcript.contains(&format!("page{k}.txt")),
            "{transcript:.300}"
        );
        assert!(
            transcript.contains(&format!("page {k}: ")),
            "{transcript:.300}"
        );
    }
    assert!(!transcript.contains("page 2: "), "{transcript:.300}");
    // The second folds the first summary in, with the next two steps.
    let transcript = content(&messages(&requests[6])[1]);
    assert!(
        transcript.contains(&format!("Earlier summary of its steps:\n{first}")),
        "{transcript:.300}"
    );
    assert!(transcript.contains("page 2: ") && transcript.contains("page 3: "));
    assert!(!transcript.contains("page 4: "), "{transcript:.300}");

    // After each: the summary in the system prompt, the input, then the latest step verbatim;
    // nothing of the summarised steps.
    for (at, summary, latest) in [(4, first, 2), (7, second, 4)] {
        let sent = messages(&requests[at]);
        assert!(content(&sent[0]).contains("Summary of your earlier steps in this turn"));
        assert!(content(&sent[0]).contains(summary));
        assert_eq!(content(&sent[1]), "read the pages");
        assert_eq!(results(&requests[at]), [page(latest, 8_000).as_str()]);
    }
    assert!(!content(&messages(&requests[7])[0]).contains(first));
    for request in requests.iter().filter(|r| !is_steps_summary(r)) {
        assert_calls_and_results_paired(&messages(request)[1..]);
        let bytes: usize = messages(request).iter().map(|m| content(m).len()).sum();
        assert!(bytes < 8_192 * 3, "a request of {bytes} bytes");
    }

    // The session stores the turn whole, and no summary of its own: the steps' summary stays
    // with the turn.
    let store = cluster.store().await;
    let loaded = store.load("acme", &session).await.expect("load");
    assert_eq!(loaded.state.summary, None);
    let history = &loaded.state.history;
    assert_eq!(history.len(), 1 + 5 * 2 + 1, "{history:?}");
    for k in 0..5 {
        assert!(
            history.iter().any(|m| m.content == page(k, 8_000)),
            "page {k} is stored whole"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_larger_than_the_context_fails_the_turn_context_overflow() {
    let cluster = TestCluster::start();
    let session = unique("s");
    // ~10,000 tokens, in a context of 8,192.
    write_pages(&cluster, &session, 0..1, 40_000);
    // The model refuses the request that carries the page, as a real one would.
    let overflow = serde_json::json!({"error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages \
                    resulted in 10000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded"
    }})
    .to_string();
    let model = FakeOpenAi::start(vec![
        read(0),
        FakeReply::Status(400, overflow),
        FakeReply::answer("never asked for"),
    ])
    .await;
    start(&cluster, &model).await;

    let (result, events) = cluster
        .run(&submission("acme", &session, "read the page"))
        .await;
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let failure = result.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::ContextOverflow, "{failure:?}");
    assert!(
        failure
            .message
            .contains("more than the model's context of 8192")
            && failure
                .message
                .contains("its largest result, from read_file, is 40000 bytes"),
        "{}",
        failure.message
    );
    assert_eq!(
        model.requests().len(),
        2,
        "the refused request is not sent again, and nothing is summarised that could not help"
    );
    assert!(!events
        .iter()
        .any(|e| matches!(e.event, EventKind::Compacted { .. })));
}
