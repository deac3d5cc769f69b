//! The Anthropic client over event streams written from the API's documented format
//! (`model/fixtures/anthropic_*.sse`), its request bodies, and its HTTP steps against a one-shot
//! local server.

use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stream::{parse_whole, sse_answer, BodyError, MessageAccumulator, Progress};
use super::*;
use crate::protocol::message::{Message, Role, ToolCall, Usage};
use crate::protocol::{FailureKind, ToolSpec};

const TEXT_ANSWER: &str = include_str!("../fixtures/anthropic_text_answer.sse");
const PARALLEL_TOOL_USE: &str = include_str!("../fixtures/anthropic_parallel_tool_use.sse");
const THINKING_TOOL_USE: &str = include_str!("../fixtures/anthropic_thinking_tool_use.sse");
const MIDSTREAM_ERROR: &str = include_str!("../fixtures/anthropic_midstream_error.sse");

type SseBody = BoxStream<'static, Result<Vec<u8>, BodyError>>;

fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(60)
}

/// The body cut into its events, each a separate read.
fn by_event(raw: &str) -> SseBody {
    let pieces: Vec<_> = raw
        .split_inclusive("\n\n")
        .map(|piece| Ok(piece.as_bytes().to_vec()))
        .collect();
    futures::stream::iter(pieces).boxed()
}

/// The body cut into reads of `size` bytes, wherever they fall.
fn by_bytes(raw: &str, size: usize) -> SseBody {
    let pieces: Vec<_> = raw
        .as_bytes()
        .chunks(size)
        .map(|piece| Ok(piece.to_vec()))
        .collect();
    futures::stream::iter(pieces).boxed()
}

async fn read_all(body: SseBody) -> Vec<Result<ModelChunk, ModelError>> {
    sse_answer(body, Duration::from_secs(5), far(), false)
        .collect()
        .await
}

fn done_of(items: &[Result<ModelChunk, ModelError>]) -> &ModelResponse {
    match items.last() {
        Some(Ok(ModelChunk::Done(response))) => response,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn pieces_of(items: &[Result<ModelChunk, ModelError>]) -> Vec<(&'static str, &str)> {
    items
        .iter()
        .filter_map(|item| match item {
            Ok(ModelChunk::Reasoning(text)) => Some(("reasoning", text.as_str())),
            Ok(ModelChunk::Delta(text)) => Some(("text", text.as_str())),
            _ => None,
        })
        .collect()
}

fn request(messages: Vec<Message>, tools: Vec<ToolSpec>) -> ModelRequest {
    ModelRequest {
        model: "claude-test".to_owned(),
        agent: "assistant".to_owned(),
        messages,
        tools: tools.into(),
        max_output_tokens: None,
        output_schema: None,
    }
}

fn tool(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("The {name} tool."),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        concurrency_safe: true,
        effects: Default::default(),
    }
}

fn client(base_url: &str) -> AnthropicClient {
    AnthropicClient::new(
        base_url,
        Some("sk-ant-unit-test-key".to_owned()),
        Duration::from_secs(5),
        4096,
    )
    .expect("the client builds")
}

fn assistant_calling(calls: &[(&str, &str, Value)]) -> Message {
    let mut message = Message::assistant("");
    message.tool_calls = calls
        .iter()
        .map(|(id, name, arguments)| ToolCall {
            id: (*id).to_owned(),
            name: (*name).to_owned(),
            arguments: arguments.clone(),
        })
        .collect();
    message
}

// ---------------------------------------------------------------------------------------------
// Streams

#[tokio::test]
async fn a_text_answer_streams_its_deltas_and_counts_cached_prompt_tokens() {
    let items = read_all(by_event(TEXT_ANSWER)).await;
    assert_eq!(
        pieces_of(&items),
        vec![("text", "Hello"), ("text", ", world!")]
    );
    let response = done_of(&items);
    assert_eq!(response.message.role, Role::Assistant);
    assert_eq!(response.message.content, "Hello, world!");
    assert!(response.message.tool_calls.is_empty());
    assert_eq!(response.message.reasoning, None);
    assert_eq!(response.finish_reason.as_deref(), Some("end_turn"));
    // `input_tokens` leaves the cached tokens out; the prompt is all of them. The output count
    // is message_delta's (cumulative), not message_start's.
    assert_eq!(
        response.usage,
        Usage {
            prompt_tokens: 25 + 1200 + 3400,
            completion_tokens: 15,
            cache_read_tokens: 3400,
            cache_write_tokens: 1200,
        }
    );
}

#[tokio::test]
async fn parallel_tool_uses_are_assembled_from_input_json_split_over_deltas_and_reads() {
    for (how, body) in [
        ("by event", by_event(PARALLEL_TOOL_USE)),
        ("by 7 bytes", by_bytes(PARALLEL_TOOL_USE, 7)),
        ("by 1 byte", by_bytes(PARALLEL_TOOL_USE, 1)),
    ] {
        let items = read_all(body).await;
        assert_eq!(
            pieces_of(&items),
            vec![("text", "I'll look up both.")],
            "{how}"
        );
        let response = done_of(&items);
        assert_eq!(response.finish_reason.as_deref(), Some("tool_use"), "{how}");
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall {
                    id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".to_owned(),
                    name: "get_weather".to_owned(),
                    arguments: json!({"location": "San Francisco, CA", "unit": "celsius"}),
                },
                ToolCall {
                    id: "toolu_01VfZq8VhUqQX2bJzLw7pJ2R".to_owned(),
                    name: "get_time".to_owned(),
                    arguments: json!({"timezone": "America/Los_Angeles"}),
                },
            ],
            "{how}"
        );
        assert_eq!(response.usage.prompt_tokens, 472, "{how}");
        assert_eq!(response.usage.completion_tokens, 89, "{how}");
        assert_eq!(response.usage.cache_read_tokens, 0, "{how}");
    }
}

#[tokio::test]
async fn thinking_is_streamed_kept_with_its_signature_and_sent_back_first() {
    let items = read_all(by_event(THINKING_TOOL_USE)).await;
    assert_eq!(
        pieces_of(&items),
        vec![
            ("reasoning", "The user wants the weather. "),
            ("reasoning", "I should call get_weather."),
        ]
    );
    let response = done_of(&items);
    let thinking = "The user wants the weather. I should call get_weather.";
    let signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";
    assert_eq!(response.message.reasoning.as_deref(), Some(thinking));
    assert_eq!(
        response.message.reasoning_signature.as_deref(),
        Some(signature)
    );
    assert_eq!(response.message.content, "");
    let call_id = response.message.tool_calls[0].id.clone();

    // The next step of the turn sends the thinking back, signed, before the call.
    let next = request(
        vec![
            Message::system("be brief"),
            Message::user("weather in Paris?"),
            response.message.clone(),
            Message::tool_result(&call_id, "sunny"),
        ],
        vec![tool("get_weather")],
    );
    let body = conversation(client("http://localhost").request_body(&next));
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": thinking, "signature": signature},
                {"type": "tool_use", "id": call_id, "name": "get_weather",
                 "input": {"location": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": "sunny"},
            ]},
        ])
    );
}

#[test]
fn thinking_without_a_signature_or_from_several_blocks_is_not_sent_back() {
    // Reasoning of another provider (no signature) cannot be a thinking block.
    let mut unsigned = Message::assistant("hi");
    unsigned.reasoning = Some("hmm".to_owned());
    let body = conversation(
        client("http://localhost")
            .request_body(&request(vec![Message::user("hi"), unsigned], Vec::new())),
    );
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"type": "text", "text": "hi"}])
    );

    // Two thinking blocks: their joined text is kept, no signature fits it.
    let mut accumulator = MessageAccumulator::default();
    for event in [
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "a", "signature": "s1"}}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "redacted_thinking", "data": "EncryptedBytes"}}),
        json!({"type": "content_block_start", "index": 2,
               "content_block": {"type": "thinking", "thinking": "b", "signature": "s2"}}),
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "signature_delta", "signature": "ignored"}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
    ] {
        let event = serde_json::from_value(event).expect("an event");
        accumulator.absorb(event).expect("absorbed");
    }
    let message = accumulator.finish().message;
    assert_eq!(message.reasoning.as_deref(), Some("ab"));
    assert_eq!(message.reasoning_signature, None);
}

#[tokio::test]
async fn a_mid_stream_error_event_is_a_retryable_server_error_not_an_answer() {
    let items = read_all(by_event(MIDSTREAM_ERROR)).await;
    assert!(
        matches!(items.first(), Some(Ok(ModelChunk::Delta(text))) if text == "Partial"),
        "{items:?}"
    );
    let Some(Err(error)) = items.last() else {
        panic!("expected an error, got {items:?}");
    };
    assert!(
        matches!(error, ModelError::ServerError { message, retryable: true }
            if message.contains("Overloaded") && message.contains("overloaded_error")),
        "{error:?}"
    );
    assert!(error.to_failure().retryable);
    assert_eq!(items.iter().filter(|item| item.is_err()).count(), 1);

    // The client's own mistakes are not worth trying again.
    let invalid = MIDSTREAM_ERROR.replace("overloaded_error", "invalid_request_error");
    let items = read_all(by_event(&invalid)).await;
    assert!(
        matches!(
            items.last(),
            Some(Err(ModelError::ServerError {
                retryable: false,
                ..
            }))
        ),
        "{items:?}"
    );
}

#[tokio::test]
async fn a_stream_cut_before_its_stop_is_interrupted_and_unknown_events_are_ignored() {
    let cut = TEXT_ANSWER
        .split("event: message_delta")
        .next()
        .expect("a head")
        .to_owned();
    let items = read_all(by_event(&cut)).await;
    assert!(
        matches!(items.last(), Some(Err(ModelError::Interrupted(_)))),
        "{items:?}"
    );
    assert!(items
        .last()
        .is_some_and(|item| item.as_ref().is_err_and(|e| e.to_failure().retryable)));

    // A body that ends after its stop reason, without message_stop, is whole; an event type
    // this client does not know (the API may add some) changes nothing.
    let unknown = "event: brand_new\ndata: {\"type\": \"brand_new\", \"x\": 1}\n\n";
    let without_stop = TEXT_ANSWER
        .replace("event: ping", &format!("{unknown}event: ping"))
        .split("event: message_stop")
        .next()
        .expect("a head")
        .to_owned();
    let items = read_all(by_event(&without_stop)).await;
    assert_eq!(done_of(&items).message.content, "Hello, world!");
}

#[test]
fn deltas_that_do_not_fit_their_block_are_bad_responses() {
    let mut accumulator = MessageAccumulator::default();
    let orphan = serde_json::from_value(json!({"type": "content_block_delta", "index": 3,
        "delta": {"type": "text_delta", "text": "x"}}))
    .expect("an event");
    assert!(matches!(
        accumulator.absorb(orphan),
        Err(ModelError::BadResponse(_))
    ));
    let start = serde_json::from_value(json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}}}))
    .expect("an event");
    assert_eq!(
        accumulator.absorb(start).expect("starts"),
        Progress::Nothing
    );
    let wrong = serde_json::from_value(json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "x"}}))
    .expect("an event");
    let error = accumulator
        .absorb(wrong)
        .expect_err("a text delta for a tool_use block");
    assert!(error.to_string().contains("text_delta"), "{error}");
}

#[test]
fn text_a_block_starts_with_is_streamed_like_a_delta() {
    let mut accumulator = MessageAccumulator::default();
    let start = serde_json::from_value(json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": "Hi"}}))
    .expect("an event");
    assert_eq!(
        accumulator.absorb(start).expect("starts"),
        Progress::Text("Hi".to_owned())
    );
    let delta = serde_json::from_value(json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": " there"}}))
    .expect("an event");
    assert_eq!(
        accumulator.absorb(delta).expect("a delta"),
        Progress::Text(" there".to_owned())
    );
    assert_eq!(accumulator.finish().message.content, "Hi there");
}

#[test]
fn tool_input_cut_short_is_kept_as_text_for_the_call_to_be_refused() {
    let mut accumulator = MessageAccumulator::default();
    for event in [
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "t1", "name": "write", "input": {}}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"a"}}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "tool_use", "id": "t2", "name": "list", "input": {}}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}),
    ] {
        accumulator
            .absorb(serde_json::from_value(event).expect("an event"))
            .expect("absorbed");
    }
    let calls = accumulator.finish().message.tool_calls;
    assert_eq!(calls[0].arguments, json!("{\"path\": \"a"));
    // No input at all is an empty object.
    assert_eq!(calls[1].arguments, json!({}));
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_times_out_between_events() {
    let head = TEXT_ANSWER.split("event: ping").next().expect("a head");
    let body: SseBody = futures::stream::iter(vec![Ok(head.as_bytes().to_vec())])
        .chain(futures::stream::pending())
        .boxed();
    let items: Vec<_> = sse_answer(body, Duration::from_secs(2), far(), false)
        .collect()
        .await;
    assert!(
        matches!(items.last(), Some(Err(ModelError::TimedOut(_)))),
        "{items:?}"
    );
}

#[test]
fn a_whole_json_answer_is_read_as_one_and_an_error_body_as_the_servers_error() {
    let whole = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "Think.", "signature": "sig"},
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"location": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 6},
    });
    let response = parse_whole(whole.to_string().as_bytes(), false).expect("parses");
    assert_eq!(response.message.content, "Calling.");
    assert_eq!(response.message.reasoning.as_deref(), Some("Think."));
    assert_eq!(response.message.reasoning_signature.as_deref(), Some("sig"));
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!({"location": "Oslo"})
    );
    assert_eq!(response.usage.prompt_tokens, 16);
    assert_eq!(response.usage.cache_read_tokens, 6);
    assert_eq!(response.usage.cache_write_tokens, 0);

    let error =
        br#"{"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}"#;
    assert!(matches!(
        parse_whole(error, false),
        Err(ModelError::ServerError {
            retryable: true,
            ..
        })
    ));
}

// ---------------------------------------------------------------------------------------------
// Request bodies

#[test]
fn the_request_maps_system_tools_and_alternating_turns_with_cache_breakpoints() {
    let steer = Message::user("also check b.txt");
    let req = request(
        vec![
            Message::system("You are terse."),
            Message::system("Workspace: /w"),
            Message::user("read a.txt"),
            Message::user(""),
            assistant_calling(&[
                ("toolu_a", "read_file", json!({"path": "a.txt"})),
                ("toolu_b", "read_file", json!("{broken")),
            ]),
            Message::tool_result("toolu_a", "alpha"),
            Message::tool_result("toolu_b", ""),
            steer,
            Message::assistant("a.txt says alpha"),
            Message::system("Answer now."),
        ],
        vec![tool("read_file"), tool("list_dir")],
    );
    let body = client("http://localhost").request_body(&req);
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "stream": true,
            "system": [
                {"type": "text", "text": "You are terse."},
                {"type": "text", "text": "Workspace: /w"},
                {"type": "text", "text": "Answer now.", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [
                {"name": "read_file", "description": "The read_file tool.",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
                {"name": "list_dir", "description": "The list_dir tool.",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                 "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "read a.txt"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_a", "name": "read_file",
                     "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {}},
                ]},
                // Both results, then the steering text, in one user message.
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "alpha"},
                    {"type": "tool_result", "tool_use_id": "toolu_b"},
                    {"type": "text", "text": "also check b.txt"},
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "a.txt says alpha",
                    "cache_control": {"type": "ephemeral"}}]},
            ],
        })
    );
}

#[test]
fn results_come_before_text_in_a_merged_user_message_and_max_tokens_follows_the_request() {
    let mut req = request(
        vec![
            Message::user("first"),
            assistant_calling(&[("toolu_x", "list_dir", json!({}))]),
            Message::user("typed while the call ran"),
            Message::tool_result("toolu_x", "[]"),
        ],
        Vec::new(),
    );
    req.max_output_tokens = Some(256);
    let body = conversation(client("http://localhost").request_body(&req));
    assert_eq!(body["max_tokens"], json!(256));
    assert!(body.get("tools").is_none());
    assert!(body.get("system").is_none());
    assert!(body.get("thinking").is_none());
    assert_eq!(
        body["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "[]"},
            {"type": "text", "text": "typed while the call ran"},
        ])
    );
    let roles: Vec<_> = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(roles, vec!["user", "assistant", "user"]);
}

#[test]
fn a_thinking_budget_is_asked_for_within_the_calls_output_tokens() {
    let thinking = client("http://localhost")
        .with_thinking_budget(2048)
        .expect("a budget under 4096");
    let mut req = request(vec![Message::user("hi")], Vec::new());
    assert_eq!(
        thinking.request_body(&req)["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    req.max_output_tokens = Some(1500);
    assert_eq!(
        thinking.request_body(&req)["thinking"],
        json!({"type": "enabled", "budget_tokens": 1499})
    );
    req.max_output_tokens = Some(1000);
    assert!(thinking.request_body(&req).get("thinking").is_none());

    for refused in [512, 4096, 10_000] {
        assert!(matches!(
            client("http://localhost").with_thinking_budget(refused),
            Err(ModelError::Misconfigured(_))
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Structured answers

fn answer_schema() -> crate::protocol::OutputSchema {
    crate::protocol::OutputSchema {
        name: "forecast".to_owned(),
        description: "Tomorrow's weather.".to_owned(),
        schema: json!({
            "type": "object",
            "properties": {"sky": {"type": "string"}, "high": {"type": "number"}},
            "required": ["sky", "high"],
        }),
        strict: None,
    }
}

fn structured(mut req: ModelRequest) -> ModelRequest {
    req.output_schema = Some(std::sync::Arc::new(answer_schema()));
    req
}

#[test]
fn an_output_schema_is_a_tool_the_model_must_call() {
    let plain = client("http://localhost");
    // Alone: that very tool is forced.
    let body = plain.request_body(&structured(request(
        vec![Message::system("Be brief."), Message::user("weather?")],
        Vec::new(),
    )));
    assert_eq!(
        body["tools"],
        json!([{
            "name": ANSWER_TOOL,
            "description": "Gives your final answer (forecast): its input is the answer. Call it \
                            once you are done. The answer: Tomorrow's weather.",
            "input_schema": answer_schema().schema,
            "cache_control": {"type": "ephemeral"},
        }])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "final_answer"})
    );
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]),
        "no instruction is needed when the tool is forced"
    );

    // Beside the agent's tools: some tool must be called, the answer tool last; an agent's tool
    // of the same name is left out.
    let body = plain.request_body(&structured(request(
        vec![Message::user("weather?")],
        vec![tool("read_file"), tool(ANSWER_TOOL)],
    )));
    let names: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["read_file", ANSWER_TOOL]);
    assert_eq!(body["tools"][1]["input_schema"], answer_schema().schema);
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    // Without a schema, a tool of that name is the agent's own.
    let body = plain.request_body(&request(vec![Message::user("hi")], vec![tool(ANSWER_TOOL)]));
    assert_eq!(
        body["tools"][0]["description"],
        json!("The final_answer tool.")
    );
    assert!(body.get("tool_choice").is_none());

    // Thinking: the API refuses a forced tool, so the model is asked, and told.
    let thinking = client("http://localhost")
        .with_thinking_budget(2048)
        .expect("a budget under 4096");
    let body = thinking.request_body(&structured(request(
        vec![Message::system("Be brief."), Message::user("weather?")],
        Vec::new(),
    )));
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert_eq!(body["thinking"]["type"], json!("enabled"));
    assert_eq!(
        body["system"],
        json!([
            {"type": "text", "text": "Be brief."},
            {"type": "text", "text": ANSWER_TOOL_INSTRUCTION,
             "cache_control": {"type": "ephemeral"}},
        ])
    );
}

/// The events of one message whose blocks are `blocks` (each `(start, deltas)`).
fn message_sse(blocks: &[(Value, Vec<Value>)], stop_reason: &str) -> String {
    let mut events = vec![json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "model": "claude-test", "usage": {"input_tokens": 5, "output_tokens": 1}}})];
    for (index, (start, deltas)) in blocks.iter().enumerate() {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        for delta in deltas {
            events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    events.push(
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason},
                       "usage": {"output_tokens": 12}}),
    );
    events.push(json!({"type": "message_stop"}));
    events
        .iter()
        .map(|event| {
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn answer_use(id: &str, pieces: &[&str]) -> (Value, Vec<Value>) {
    let mut deltas = vec![json!({"type": "input_json_delta", "partial_json": ""})];
    deltas.extend(
        pieces
            .iter()
            .map(|piece| json!({"type": "input_json_delta", "partial_json": piece})),
    );
    (
        json!({"type": "tool_use", "id": id, "name": ANSWER_TOOL, "input": {}}),
        deltas,
    )
}

#[tokio::test]
async fn the_answer_tools_call_is_the_answers_text_streamed_as_it_comes() {
    let raw = message_sse(
        &[answer_use(
            "toolu_9",
            &["{\"sky\": \"cl", "ear\", \"high\"", ": 21}"],
        )],
        "tool_use",
    );
    let items: Vec<_> = sse_answer(by_bytes(&raw, 7), Duration::from_secs(5), far(), true)
        .collect()
        .await;
    let response = done_of(&items);
    assert_eq!(response.message.content, r#"{"sky": "clear", "high": 21}"#);
    assert!(
        response.message.tool_calls.is_empty(),
        "not a call to dispatch"
    );
    assert_eq!(response.finish_reason.as_deref(), Some("end_turn"));
    let streamed: String = pieces_of(&items)
        .into_iter()
        .map(|(kind, text)| {
            assert_eq!(kind, "text");
            text
        })
        .collect();
    assert_eq!(streamed, response.message.content);

    // Asked without a schema, the same events are an ordinary call.
    let items = read_all(by_event(&raw)).await;
    let response = done_of(&items);
    assert_eq!(response.message.content, "");
    assert_eq!(response.message.tool_calls[0].name, ANSWER_TOOL);
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!({"sky": "clear", "high": 21})
    );
}

#[tokio::test]
async fn an_answer_given_beside_calls_or_after_text_is_the_text_and_the_calls_stand() {
    let read = (
        json!({"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}),
        vec![json!({"type": "input_json_delta", "partial_json": "{\"path\": \"a\"}"})],
    );
    let preamble = (
        json!({"type": "text", "text": ""}),
        vec![json!({"type": "text_delta", "text": "Here it is:"})],
    );
    let raw = message_sse(
        &[
            preamble,
            read,
            answer_use("toolu_2", &["{\"sky\":\"rain\",\"high\":9}"]),
        ],
        "tool_use",
    );
    let items: Vec<_> = sse_answer(by_event(&raw), Duration::from_secs(5), far(), true)
        .collect()
        .await;
    let response = done_of(&items);
    assert_eq!(response.message.content, r#"{"sky":"rain","high":9}"#);
    assert_eq!(response.message.tool_calls.len(), 1);
    assert_eq!(response.message.tool_calls[0].name, "read_file");
    assert_eq!(response.finish_reason.as_deref(), Some("tool_use"));

    // A whole (unstreamed) answer carries the input at the block's start.
    let whole = json!({
        "content": [{"type": "tool_use", "id": "toolu_3", "name": ANSWER_TOOL,
                     "input": {"sky": "fog", "high": 4}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 2},
    });
    let response = parse_whole(whole.to_string().as_bytes(), true).expect("parses");
    assert_eq!(
        serde_json::from_str::<Value>(&response.message.content).expect("JSON"),
        json!({"sky": "fog", "high": 4})
    );
    assert!(response.message.tool_calls.is_empty());
}

#[test]
fn the_base_url_is_anthropics_unless_another_is_configured() {
    for left_at_default in [
        "https://api.openai.com/v1",
        "https://api.openai.com/v1/",
        "",
    ] {
        assert_eq!(base_url_for(left_at_default), DEFAULT_BASE_URL);
    }
    assert_eq!(
        base_url_for("http://127.0.0.1:8080"),
        "http://127.0.0.1:8080"
    );
    assert_eq!(
        client(DEFAULT_BASE_URL).messages_url(),
        "https://api.anthropic.com/v1/messages"
    );
    assert_eq!(
        client("https://gateway.example/anthropic/v1/").messages_url(),
        "https://gateway.example/anthropic/v1/messages"
    );
}

#[test]
fn debug_output_redacts_the_key_and_a_zero_max_tokens_is_refused() {
    let printed = format!("{:?}", client("http://localhost"));
    assert!(!printed.contains("sk-ant-unit-test-key"), "{printed}");
    assert!(printed.contains("<redacted>"));
    assert!(matches!(
        AnthropicClient::new("http://localhost", None, Duration::from_secs(1), 0),
        Err(ModelError::Misconfigured(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// HTTP, against a one-shot local server

/// Serves one connection: reads its request (head and `content-length` body), answers with
/// `response` as is, and gives back the request's text.
async fn serve_once(response: String) -> (String, tokio::task::JoinHandle<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port on 127.0.0.1");
    let base_url = format!("http://{}", listener.local_addr().expect("a bound address"));
    let served = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("a connection");
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let read = stream.read(&mut buffer).await.expect("the request reads");
            seen.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&seen);
            if let Some(head_end) = text.find("\r\n\r\n") {
                let length = text[..head_end]
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if seen.len() >= head_end + 4 + length || read == 0 {
                    break;
                }
            } else if read == 0 {
                break;
            }
        }
        stream
            .write_all(response.as_bytes())
            .await
            .expect("the answer writes");
        let _ = stream.shutdown().await;
        String::from_utf8_lossy(&seen).into_owned()
    });
    (base_url, served)
}

fn refusal(status: u16, reason: &str, retry_after: u64, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nretry-after: {retry_after}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn rate_limits_and_overloads_are_retryable_and_carry_retry_after() {
    for (status, reason, kind) in [
        (429, "Too Many Requests", "rate_limit_error"),
        (529, "Overloaded", "overloaded_error"),
    ] {
        let body = format!(
            r#"{{"type": "error", "error": {{"type": "{kind}", "message": "slow down"}}}}"#
        );
        let (base_url, served) = serve_once(refusal(status, reason, 7, &body)).await;
        let error = client(&base_url)
            .complete(request(vec![Message::user("hi")], Vec::new()))
            .await
            .expect_err("refused");
        served.await.expect("served");
        assert!(
            matches!(&error, ModelError::Status { status: s, retry_after: Some(wait), body: b }
                if *s == status && *wait == Duration::from_secs(7) && b.contains(kind)),
            "{error:?}"
        );
        let failure = error.to_failure();
        assert_eq!(failure.kind, FailureKind::ModelFailed);
        assert!(failure.retryable, "{status}");
        assert_eq!(
            super::super::retry_after(&failure),
            Some(Duration::from_secs(7))
        );
    }
}

#[tokio::test]
async fn a_prompt_too_long_refusal_is_a_context_overflow() {
    let body = r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 214513 tokens > 200000 maximum"}}"#;
    let (base_url, served) = serve_once(refusal(400, "Bad Request", 0, body)).await;
    let error = client(&base_url)
        .complete(request(vec![Message::user("hi")], Vec::new()))
        .await
        .expect_err("refused");
    served.await.expect("served");
    assert!(
        matches!(
            error,
            ModelError::Status {
                status: 400,
                retry_after: None,
                ..
            }
        ),
        "{error:?}"
    );
    let failure = error.to_failure();
    assert_eq!(failure.kind, FailureKind::ContextOverflow);
    assert!(!failure.retryable);
}

#[tokio::test]
async fn a_call_posts_to_v1_messages_with_the_key_and_version_and_reads_the_stream() {
    let events = TEXT_ANSWER;
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{events}",
        events.len()
    );
    let (base_url, served) = serve_once(response).await;
    let answer = client(&base_url)
        .complete(request(vec![Message::user("hi")], vec![tool("read_file")]))
        .await
        .expect("an answer");
    assert_eq!(answer.message.content, "Hello, world!");
    let seen = served.await.expect("served");
    let (head, body) = seen.split_once("\r\n\r\n").expect("a head and a body");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("post /v1/messages http/1.1"), "{head}");
    assert!(
        head.contains("\r\nx-api-key: sk-ant-unit-test-key"),
        "{head}"
    );
    assert!(head.contains("\r\nanthropic-version: 2023-06-01"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: application/json"),
        "{head}"
    );
    assert!(!head.contains("authorization"), "{head}");
    let body: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["max_tokens"], json!(4096));
    assert_eq!(body["model"], json!("claude-test"));
}

// ---------------------------------------------------------------------------------------------
// Images

#[test]
fn a_users_images_become_image_blocks_after_its_text() {
    use crate::protocol::ImagePart;
    let images = vec![
        ImagePart::Base64 {
            media_type: "image/png".to_owned(),
            data: "aGVsbG8=".to_owned(),
        },
        ImagePart::Url {
            url: "https://example.com/cat.jpg".to_owned(),
        },
    ];
    let body = conversation(client("http://127.0.0.1:9").request_body(&request(
        vec![Message::user("what is this?").with_images(images)],
        Vec::new(),
    )));
    assert_eq!(
        body["messages"],
        json!([{ "role": "user", "content": [
            { "type": "text", "text": "what is this?" },
            { "type": "image", "source":
                { "type": "base64", "media_type": "image/png", "data": "aGVsbG8=" } },
            { "type": "image", "source": { "type": "url", "url": "https://example.com/cat.jpg" } }
        ] }])
    );
}

#[test]
fn a_tool_results_images_go_inside_its_tool_result_block() {
    use crate::protocol::ImagePart;
    let shot = ImagePart::Base64 {
        media_type: "image/jpeg".to_owned(),
        data: "/9j/".to_owned(),
    };
    let body = conversation(client("http://127.0.0.1:9").request_body(&request(
        vec![
            Message::user("screenshot both"),
            assistant_calling(&[("c1", "shot", json!({})), ("c2", "shot", json!({}))]),
            Message::tool_result("c1", "[image 1: image/jpeg, 3 bytes]").with_images(vec![shot]),
            Message::tool_result("c2", "no screen"),
        ],
        vec![tool("shot")],
    )));
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(
        messages[2]["content"],
        json!([
            { "type": "tool_result", "tool_use_id": "c1", "content": [
                { "type": "text", "text": "[image 1: image/jpeg, 3 bytes]" },
                { "type": "image", "source":
                    { "type": "base64", "media_type": "image/jpeg", "data": "/9j/" } }
            ] },
            { "type": "tool_result", "tool_use_id": "c2", "content": "no screen" }
        ])
    );
}

#[tokio::test]
async fn a_client_configured_without_images_fails_a_request_with_images_before_sending() {
    use crate::protocol::ImagePart;
    // No server listens: a request that went out would fail as unreachable instead.
    let client = client("http://127.0.0.1:9").with_images(false);
    let shown = request(
        vec![Message::user("look").with_images(vec![ImagePart::Url {
            url: "https://example.com/a.png".to_owned(),
        }])],
        Vec::new(),
    );
    let error = client.complete(shown).await.expect_err("refused");
    assert!(matches!(error, ModelError::ImagesRefused(_)), "{error:?}");
    let failure = error.to_failure();
    assert_eq!(failure.kind, FailureKind::InvalidInput);
    assert!(
        failure
            .message
            .contains("model claude-test of provider anthropic"),
        "{}",
        failure.message
    );
}

/// `body` with the conversation's cache breakpoint checked and taken off its last block, for
/// tests whose subject is the mapping of the messages.
fn conversation(mut body: Value) -> Value {
    let last_block = body["messages"]
        .as_array_mut()
        .and_then(|messages| messages.last_mut())
        .and_then(|message| message["content"].as_array_mut())
        .and_then(|blocks| blocks.last_mut())
        .expect("a conversation with a last block");
    let breakpoint = last_block
        .as_object_mut()
        .and_then(|block| block.remove("cache_control"));
    assert_eq!(
        breakpoint,
        Some(json!({ "type": "ephemeral" })),
        "the conversation's last block is a cache breakpoint"
    );
    body
}
