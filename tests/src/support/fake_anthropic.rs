//! A fake Anthropic Messages server, so the real Anthropic provider code (headers, request
//! mapping, event-stream parsing, tool-use and thinking assembly) runs in tests. It serves
//! `POST /v1/messages` on a free 127.0.0.1 port and answers each request from a FIFO script of
//! [`AnthropicReply`]s: an assistant message streamed as server-sent events in the documented
//! format (`message_start`, `ping`, each content block's start, deltas and stop, `message_delta`,
//! `message_stop`), or a refusal with a status, an error body and `retry-after`.
//!
//! It records every request (path, headers, JSON body), and refuses with 400
//! `invalid_request_error`, as the real API does, a body without `max_tokens`, whose messages do
//! not alternate starting with a user message, whose tool results do not answer the
//! `tool_use` blocks of the assistant message just before them, one for one, or that marks more
//! than four blocks (tools, system and messages together) with `cache_control`.

use std::collections::{BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

/// `usage.input_tokens` of every answer (the tokens not read from the cache).
pub const FAKE_INPUT_TOKENS: u64 = 21;
/// `usage.cache_read_input_tokens` of every answer.
pub const FAKE_CACHE_READ_TOKENS: u64 = 13;
/// `usage.output_tokens` of every answer.
pub const FAKE_OUTPUT_TOKENS: u64 = 9;

/// The text answered once the script is used up.
const EXHAUSTED: &str = "(script exhausted)";

/// One scripted answer of the fake server.
#[derive(Debug, Clone, PartialEq)]
pub enum AnthropicReply {
    /// An assistant message: a signed thinking block `(thinking, signature)` if any, a text
    /// block if the text is not empty, then one `tool_use` block per `(name, input)`, in order
    /// (several are parallel calls).
    Message {
        thinking: Option<(String, String)>,
        text: String,
        tool_uses: Vec<(String, Value)>,
    },
    /// A refusal: this status, an error body of this `type`, and `retry-after` (seconds) if set.
    Refusal {
        status: u16,
        error_type: String,
        retry_after: Option<u64>,
    },
}

impl AnthropicReply {
    /// A text answer.
    pub fn answer(text: impl Into<String>) -> Self {
        AnthropicReply::Message {
            thinking: None,
            text: text.into(),
            tool_uses: Vec::new(),
        }
    }

    /// Calls of these tools, `(name, input)`, in one message.
    pub fn tools(calls: Vec<(&str, Value)>) -> Self {
        AnthropicReply::Message {
            thinking: None,
            text: String::new(),
            tool_uses: calls
                .into_iter()
                .map(|(name, input)| (name.to_owned(), input))
                .collect(),
        }
    }

    /// The same message, thinking first: `thinking`, signed with `signature`.
    ///
    /// # Panics
    /// On a refusal, which has no message to think in.
    pub fn thinking(self, thinking: impl Into<String>, signature: impl Into<String>) -> Self {
        match self {
            AnthropicReply::Message {
                text, tool_uses, ..
            } => AnthropicReply::Message {
                thinking: Some((thinking.into(), signature.into())),
                text,
                tool_uses,
            },
            AnthropicReply::Refusal { .. } => panic!("a refusal has no message to think in"),
        }
    }

    /// A refusal with `status` (429 rate limited, 529 overloaded, ...), `error_type` and
    /// `retry-after`.
    pub fn refusal(status: u16, error_type: &str, retry_after: Option<u64>) -> Self {
        AnthropicReply::Refusal {
            status,
            error_type: error_type.to_owned(),
            retry_after,
        }
    }
}

/// A request the fake server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub path: String,
    /// Header names in lower case, with their values.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (a body that is not JSON is a JSON string of its text).
    pub body: Value,
}

impl RecordedRequest {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

#[derive(Debug, Default)]
struct ScriptState {
    script: VecDeque<AnthropicReply>,
    requests: Vec<RecordedRequest>,
    /// The ids of the `tool_use` blocks sent, in order.
    tool_use_ids: Vec<String>,
    next_id: u64,
}

impl ScriptState {
    fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        let random = uuid::Uuid::new_v4().simple().to_string();
        format!("{prefix}_{}_{}", self.next_id, &random[..8])
    }
}

type Shared = Arc<Mutex<ScriptState>>;

/// A running fake server; it stops when dropped.
#[derive(Debug)]
pub struct FakeAnthropic {
    /// `http://127.0.0.1:PORT`: the base URL to configure the provider with.
    pub base_url: String,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl FakeAnthropic {
    /// Starts a fake server answering from `script` (first reply first).
    ///
    /// # Panics
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start(script: Vec<AnthropicReply>) -> Self {
        let state: Shared = Arc::new(Mutex::new(ScriptState {
            script: script.into(),
            ..ScriptState::default()
        }));
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1 can be bound for the fake Anthropic server");
        let port = listener
            .local_addr()
            .expect("a bound listener has a local address")
            .port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base_url: format!("http://127.0.0.1:{port}"),
            state,
            task,
        }
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: AnthropicReply) {
        self.lock().script.push_back(reply);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// The ids of the `tool_use` blocks the server sent, in order.
    pub fn tool_use_ids(&self) -> Vec<String> {
        self.lock().tool_use_ids.clone()
    }

    /// How many scripted replies are still unused.
    pub fn remaining(&self) -> usize {
        self.lock().script.len()
    }

    fn lock(&self) -> MutexGuard<'_, ScriptState> {
        lock(&self.state)
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<ScriptState>) -> MutexGuard<'_, ScriptState> {
    // No code panics while holding the lock, and the state stays consistent regardless.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn messages(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let headers = headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();
    let mut state = lock(&state);
    state.requests.push(RecordedRequest {
        path: "/v1/messages".to_owned(),
        headers,
        body: body.clone(),
    });
    if let Err(reason) = check(&body) {
        return error_response(400, "invalid_request_error", &reason, None);
    }
    let reply = state
        .script
        .pop_front()
        .unwrap_or_else(|| AnthropicReply::answer(EXHAUSTED));
    match reply {
        AnthropicReply::Refusal {
            status,
            error_type,
            retry_after,
        } => error_response(status, &error_type, "refused by the script", retry_after),
        AnthropicReply::Message {
            thinking,
            text,
            tool_uses,
        } => {
            let model = body["model"].as_str().unwrap_or("fake-claude").to_owned();
            let message_id = state.fresh_id("msg");
            let tool_uses: Vec<(String, String, Value)> = tool_uses
                .into_iter()
                .map(|(name, input)| (state.fresh_id("toolu"), name, input))
                .collect();
            state
                .tool_use_ids
                .extend(tool_uses.iter().map(|(id, _, _)| id.clone()));
            let events = message_events(&message_id, &model, thinking, &text, &tool_uses);
            event_stream(events)
        }
    }
}

/// What the real API refuses and a test should hear of: see the module header.
fn check(body: &Value) -> Result<(), String> {
    if !body["max_tokens"].is_u64() {
        return Err("max_tokens: Field required".to_owned());
    }
    let breakpoints = cache_breakpoints(body);
    if breakpoints > MAX_CACHE_BREAKPOINTS {
        return Err(format!(
            "A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}."
        ));
    }
    let messages = body["messages"]
        .as_array()
        .ok_or("messages: Field required")?;
    let mut expected_role = "user";
    let mut pending_calls = BTreeSet::new();
    for (position, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if role != expected_role {
            return Err(format!(
                "messages.{position}: expected role {expected_role}, got {role:?}: roles must alternate, starting with user"
            ));
        }
        let blocks = message["content"].as_array().cloned().unwrap_or_default();
        let of_type = |kind: &str| -> Vec<Value> {
            blocks
                .iter()
                .filter(|block| block["type"] == kind)
                .cloned()
                .collect()
        };
        if role == "user" {
            let answered: BTreeSet<String> = of_type("tool_result")
                .iter()
                .map(|block| block["tool_use_id"].as_str().unwrap_or_default().to_owned())
                .collect();
            if answered != pending_calls {
                return Err(format!(
                    "messages.{position}: tool_result blocks {answered:?} do not answer the tool_use blocks {pending_calls:?} of the message before"
                ));
            }
            expected_role = "assistant";
        } else {
            pending_calls = of_type("tool_use")
                .iter()
                .map(|block| block["id"].as_str().unwrap_or_default().to_owned())
                .collect();
            for thinking in of_type("thinking") {
                if !thinking["signature"].is_string() {
                    return Err(format!(
                        "messages.{position}: a thinking block without its signature"
                    ));
                }
            }
            expected_role = "user";
        }
    }
    Ok(())
}

/// The most blocks a request may mark with `cache_control`.
const MAX_CACHE_BREAKPOINTS: usize = 4;

/// The blocks of `body` (tools, system blocks, message blocks) that carry `cache_control`.
pub fn cache_breakpoints(body: &Value) -> usize {
    let marked = |blocks: &Value| {
        blocks.as_array().map_or(0, |blocks| {
            blocks
                .iter()
                .filter(|block| block.get("cache_control").is_some())
                .count()
        })
    };
    let in_messages: usize = body["messages"].as_array().map_or(0, |messages| {
        messages.iter().map(|m| marked(&m["content"])).sum()
    });
    marked(&body["tools"]) + marked(&body["system"]) + in_messages
}

fn error_response(
    status: u16,
    error_type: &str,
    message: &str,
    retry_after: Option<u64>,
) -> Response {
    let body = json!({ "type": "error", "error": { "type": error_type, "message": message } });
    let mut response = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json");
    if let Some(seconds) = retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    response
        .body(Body::from(body.to_string()))
        .expect("a response of a valid status and headers builds")
}

/// The events, each written as `event: {type}` and `data: {json}`, one HTTP chunk each.
fn event_stream(events: Vec<Value>) -> Response {
    let chunks = events.into_iter().map(|event| {
        let kind = event["type"].as_str().unwrap_or("unknown").to_owned();
        Ok::<_, Infallible>(Bytes::from(format!("event: {kind}\ndata: {event}\n\n")))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .expect("a streamed response builds")
}

/// The documented event sequence of one assistant message.
fn message_events(
    id: &str,
    model: &str,
    thinking: Option<(String, String)>,
    text: &str,
    tool_uses: &[(String, String, Value)],
) -> Vec<Value> {
    let mut events = vec![
        json!({ "type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "content": [], "model": model,
            "stop_reason": null, "stop_sequence": null,
            "usage": {
                "input_tokens": FAKE_INPUT_TOKENS,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": FAKE_CACHE_READ_TOKENS,
                "output_tokens": 1,
            },
        } }),
        json!({ "type": "ping" }),
    ];
    let mut index = 0;
    let mut block = |start: Value, deltas: Vec<Value>, events: &mut Vec<Value>| {
        events
            .push(json!({ "type": "content_block_start", "index": index, "content_block": start }));
        for delta in deltas {
            events.push(json!({ "type": "content_block_delta", "index": index, "delta": delta }));
        }
        events.push(json!({ "type": "content_block_stop", "index": index }));
        index += 1;
    };
    if let Some((thinking, signature)) = thinking {
        let mut deltas: Vec<Value> = split_text(&thinking, 2)
            .into_iter()
            .map(|piece| json!({ "type": "thinking_delta", "thinking": piece }))
            .collect();
        deltas.push(json!({ "type": "signature_delta", "signature": signature }));
        block(
            json!({ "type": "thinking", "thinking": "" }),
            deltas,
            &mut events,
        );
    }
    if !text.is_empty() {
        let deltas = split_text(text, 3)
            .into_iter()
            .map(|piece| json!({ "type": "text_delta", "text": piece }))
            .collect();
        block(json!({ "type": "text", "text": "" }), deltas, &mut events);
    }
    for (call_id, name, input) in tool_uses {
        // The API opens every input with an empty piece, then sends the JSON in parts.
        let mut deltas = vec![json!({ "type": "input_json_delta", "partial_json": "" })];
        deltas.extend(
            split_text(&input.to_string(), 3)
                .into_iter()
                .map(|piece| json!({ "type": "input_json_delta", "partial_json": piece })),
        );
        block(
            json!({ "type": "tool_use", "id": call_id, "name": name, "input": {} }),
            deltas,
            &mut events,
        );
    }
    let stop_reason = if tool_uses.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    events.push(json!({
        "type": "message_delta",
        "delta": { "stop_reason": stop_reason, "stop_sequence": null },
        "usage": { "output_tokens": FAKE_OUTPUT_TOKENS },
    }));
    events.push(json!({ "type": "message_stop" }));
    events
}

/// Splits `text` at character boundaries into up to `parts` non-empty pieces of similar length;
/// an empty text gives one empty piece.
fn split_text(text: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let parts = parts.clamp(1, chars.len().max(1));
    (0..parts)
        .map(|part| {
            let start = part * chars.len() / parts;
            let end = (part + 1) * chars.len() / parts;
            chars[start..end].iter().collect()
        })
        .collect()
}

/// The `tool_result` blocks of `request`'s messages, `(tool_use_id, content)`, in order.
pub fn tool_results(request: &Value) -> Vec<(String, String)> {
    blocks_of_type(request, "tool_result")
        .into_iter()
        .map(|block| {
            (
                block["tool_use_id"].as_str().unwrap_or_default().to_owned(),
                block["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Every content block of type `kind` in `request`'s messages, in order.
pub fn blocks_of_type(request: &Value, kind: &str) -> Vec<Value> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|message| message["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == kind)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use skein_common::agent::model::anthropic::AnthropicClient;
    use skein_common::agent::model::{
        retry_after, ModelChunk, ModelClient, ModelError, ModelRequest,
    };
    use skein_common::protocol::message::Message;

    use super::*;

    fn client(fake: &FakeAnthropic) -> AnthropicClient {
        AnthropicClient::new(
            fake.base_url.clone(),
            Some("sk-ant-fake-key".to_owned()),
            Duration::from_secs(10),
            1000,
        )
        .expect("the client builds")
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "claude-fake".to_owned(),
            agent: "tester".to_owned(),
            messages: std::sync::Arc::new(messages),
            tools: Vec::new().into(),
            max_output_tokens: None,
            output_schema: None,
        }
    }

    #[test]
    fn split_text_keeps_every_character() {
        assert_eq!(split_text("", 3), vec![String::new()]);
        let pieces = split_text("héllo wörld", 3);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.concat(), "héllo wörld");
    }

    #[test]
    fn the_checks_refuse_what_the_api_refuses() {
        let ok = json!({"max_tokens": 10, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "t", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]},
        ]});
        assert_eq!(check(&ok), Ok(()));
        let mut no_max = ok.clone();
        if let Some(body) = no_max.as_object_mut() {
            body.remove("max_tokens");
        }
        assert!(check(&no_max).is_err());
        let mut unanswered = ok.clone();
        unanswered["messages"][2]["content"] = json!([{"type": "text", "text": "?"}]);
        assert!(check(&unanswered).is_err());
        let mut two_users = ok.clone();
        two_users["messages"][1]["role"] = json!("user");
        assert!(check(&two_users).is_err());
    }

    /// The real provider client reads the fake's thinking, parallel tool uses and answers.
    #[tokio::test]
    async fn the_real_anthropic_client_reads_the_fake() {
        let fake = FakeAnthropic::start(vec![
            AnthropicReply::tools(vec![
                ("one", json!({ "x": 1 })),
                ("two", json!({ "y": "zz" })),
            ])
            .thinking("Two calls.", "sig-1"),
            AnthropicReply::answer("streamed reply"),
        ])
        .await;
        let client = client(&fake);
        let first = client
            .complete(request(vec![Message::user("hello")]))
            .await
            .expect("the first answer");
        assert_eq!(first.message.reasoning.as_deref(), Some("Two calls."));
        assert_eq!(first.message.reasoning_signature.as_deref(), Some("sig-1"));
        let calls = &first.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), &calls[0].arguments),
            ("one", &json!({ "x": 1 }))
        );
        assert_eq!(
            (calls[1].name.as_str(), &calls[1].arguments),
            ("two", &json!({ "y": "zz" }))
        );
        assert_eq!(
            calls.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
            fake.tool_use_ids()
        );
        assert_eq!(
            first.usage.prompt_tokens,
            FAKE_INPUT_TOKENS + FAKE_CACHE_READ_TOKENS
        );
        assert_eq!(first.usage.completion_tokens, FAKE_OUTPUT_TOKENS);

        let mut conversation = vec![Message::user("hello"), first.message.clone()];
        for call in calls {
            conversation.push(Message::tool_result(&call.id, "done"));
        }
        let mut stream = client
            .stream(request(conversation))
            .await
            .expect("the stream opens");
        let mut deltas = String::new();
        let mut done = None;
        while let Some(item) = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("each chunk arrives within 10 s")
        {
            match item.expect("each chunk parses") {
                ModelChunk::Delta(text) => deltas.push_str(&text),
                ModelChunk::Reasoning(_) => {}
                ModelChunk::Done(response) => done = Some(response),
            }
        }
        assert_eq!(deltas, "streamed reply");
        assert_eq!(
            done.expect("the stream ends with the whole response")
                .message
                .content,
            "streamed reply"
        );
        let requests = fake.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(tool_results(&requests[1].body).len(), 2);
        assert_eq!(
            blocks_of_type(&requests[1].body, "thinking"),
            vec![json!({"type": "thinking", "thinking": "Two calls.", "signature": "sig-1"})]
        );
        assert!(requests
            .iter()
            .all(|r| r.header("x-api-key") == Some("sk-ant-fake-key")));
    }

    #[tokio::test]
    async fn a_scripted_overload_reaches_the_client_with_its_retry_after() {
        let fake = FakeAnthropic::start(vec![AnthropicReply::refusal(
            529,
            "overloaded_error",
            Some(3),
        )])
        .await;
        let error = client(&fake)
            .complete(request(vec![Message::user("hello")]))
            .await
            .expect_err("refused");
        assert!(
            matches!(&error, ModelError::Status { status: 529, .. }),
            "{error:?}"
        );
        let failure = error.to_failure();
        assert!(failure.retryable);
        assert_eq!(retry_after(&failure), Some(Duration::from_secs(3)));
        assert_eq!(fake.remaining(), 0);
    }
}
