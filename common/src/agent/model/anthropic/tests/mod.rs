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

const TEXT_ANSWER: &str = include_str!("../../fixtures/anthropic_text_answer.sse");
const PARALLEL_TOOL_USE: &str = include_str!("../../fixtures/anthropic_parallel_tool_use.sse");
const THINKING_TOOL_USE: &str = include_str!("../../fixtures/anthropic_thinking_tool_use.sse");
const MIDSTREAM_ERROR: &str = include_str!("../../fixtures/anthropic_midstream_error.sse");

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
        messages: std::sync::Arc::new(messages),
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

mod http;
mod request;
mod stream;
mod structured;

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
