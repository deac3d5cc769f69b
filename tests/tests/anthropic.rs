//! Anthropic's Messages API, natively: a lead whose provider is `anthropic`, pointed at the fake
//! Anthropic server, runs a turn in which the model thinks, calls two tools at once on a worker,
//! and answers. The real provider code sends the key and the API version, bounds the answer with
//! `max_tokens`, streams the thinking as reasoning, keeps it signed on the assistant message, and
//! sends it back, first, with the calls' results in the next request.

use std::collections::BTreeSet;

use serde_json::{json, Value};
use skein_common::protocol::message::Role;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::fake_anthropic::{
    blocks_of_type, cache_breakpoints, tool_results, AnthropicReply, FakeAnthropic,
    FAKE_CACHE_READ_TOKENS, FAKE_INPUT_TOKENS, FAKE_OUTPUT_TOKENS,
};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::unique;

/// Long enough to be masked in what tools and the model return (the lead refuses a shorter key).
const KEY: &str = "sk-ant-test-key";
const THINKING: &str = "Both effects are independent, so I can start them together.";
const SIGNATURE: &str = "EqQBCgIYAhIMfakeSignatureOfTheThinkingBlock";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_model_calls_two_tools_at_once_and_answers_through_the_messages_api() {
    let cluster = TestCluster::start();
    let model = FakeAnthropic::start(vec![
        AnthropicReply::tools(vec![
            ("slow_effect", json!({ "key": "north", "ms": 50 })),
            ("slow_effect", json!({ "key": "south", "ms": 50 })),
        ])
        .thinking(THINKING, SIGNATURE),
        AnthropicReply::answer("north and south are done"),
    ])
    .await;
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--model-provider",
        "anthropic",
        "--model-base-url",
        &model.base_url,
        "--model-api-key",
        KEY,
        "--model",
        "claude-sonnet-4-5",
        "--model-max-output-tokens",
        "2000",
        "--model-thinking-budget",
        "1024",
    ]));

    let task = submission("acme", &unique("s"), "do north and south");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("north and south are done"));

    // Both calls ran on the worker, once each.
    let effects = read_effects(&cluster.effects_file());
    for key in ["north", "south"] {
        let ran = effects.get(key).map(|count| (count.started, count.done));
        assert_eq!(ran, Some((1, 1)), "{key}: {effects:?}");
    }

    // The thinking reached the watcher as reasoning, apart from the answer.
    let reasoning: String = events
        .iter()
        .filter_map(|event| match &event.event {
            EventKind::ReasoningDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, THINKING);

    // Every request: the key, the API version, JSON, streamed, bounded, tools and system cached.
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(request.header("x-api-key"), Some(KEY));
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
        assert!(request.header("authorization").is_none());
        assert!(request
            .header("content-type")
            .is_some_and(|value| value.starts_with("application/json")));
        let body = &request.body;
        assert_eq!(body["model"], json!("claude-sonnet-4-5"));
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["max_tokens"], json!(2000), "{body}");
        assert_eq!(
            body["thinking"],
            json!({ "type": "enabled", "budget_tokens": 1024 }),
            "the configured thinking budget is asked for"
        );
        let system = body["system"].as_array().expect("a system prompt");
        assert_eq!(
            system.last().map(|block| &block["cache_control"]),
            Some(&json!({ "type": "ephemeral" }))
        );
        let tools = body["tools"].as_array().expect("tools are offered");
        assert!(tools
            .iter()
            .any(|tool| tool["name"] == "slow_effect" && tool["input_schema"]["type"] == "object"));
        assert_eq!(
            tools.last().map(|tool| &tool["cache_control"]),
            Some(&json!({ "type": "ephemeral" }))
        );
        // The conversation so far is cached too, at its last block: three breakpoints in all.
        let last_block = body["messages"]
            .as_array()
            .and_then(|messages| messages.last())
            .and_then(|message| message["content"].as_array())
            .and_then(|blocks| blocks.last())
            .expect("a last block");
        assert_eq!(last_block["cache_control"], json!({ "type": "ephemeral" }));
        assert_eq!(cache_breakpoints(body), 3);
    }

    // The second request carries the assistant's step as the model gave it: the signed thinking
    // first, then both calls; then one user message with both results.
    let second = &requests[1].body;
    let sent_ids = model.tool_use_ids();
    assert_eq!(sent_ids.len(), 2);
    let messages = second["messages"].as_array().expect("messages");
    let assistant = messages
        .iter()
        .find(|message| message["role"] == "assistant")
        .expect("the assistant's step is sent back");
    let blocks = assistant["content"].as_array().expect("content blocks");
    assert_eq!(
        blocks[0],
        json!({ "type": "thinking", "thinking": THINKING, "signature": SIGNATURE })
    );
    let calls: Vec<&Value> = blocks[1..].iter().collect();
    assert_eq!(
        calls
            .iter()
            .map(|block| block["id"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        sent_ids
    );
    assert!(calls.iter().all(|block| block["type"] == "tool_use"));
    assert_eq!(blocks_of_type(second, "thinking").len(), 1);
    let results = tool_results(second);
    let answered: BTreeSet<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    let asked: BTreeSet<&str> = sent_ids.iter().map(String::as_str).collect();
    assert_eq!(answered, asked);
    let outputs: String = results.iter().map(|(_, output)| output.as_str()).collect();
    assert!(outputs.contains("effect north done"), "{outputs}");
    assert!(outputs.contains("effect south done"), "{outputs}");
    let last = messages.last().expect("a last message");
    assert_eq!(last["role"], json!("user"));
    assert_eq!(
        last["content"]
            .as_array()
            .map(|blocks| blocks.iter().filter(|b| b["type"] == "tool_result").count()),
        Some(2),
        "both results in one user message: {last}"
    );

    // The thinking is kept, signed, in the session's history.
    let session = cluster
        .store()
        .await
        .load("acme", &task.session)
        .await
        .expect("the session loads");
    let step = session
        .state
        .history
        .iter()
        .find(|message| message.role == Role::Assistant && !message.tool_calls.is_empty())
        .expect("the step that called the tools is in the history");
    assert_eq!(step.reasoning.as_deref(), Some(THINKING));
    assert_eq!(step.reasoning_signature.as_deref(), Some(SIGNATURE));

    // Usage: the prompt counts the tokens read from the cache, which are also told apart.
    assert_eq!(
        result.usage.prompt_tokens,
        2 * (FAKE_INPUT_TOKENS + FAKE_CACHE_READ_TOKENS)
    );
    assert_eq!(result.usage.completion_tokens, 2 * FAKE_OUTPUT_TOKENS);
    assert_eq!(result.usage.cache_read_tokens, 2 * FAKE_CACHE_READ_TOKENS);
}
