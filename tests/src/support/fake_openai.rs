//! A fake OpenAI-compatible chat-completions server, so the real provider code (HTTP client, SSE
//! parsing, tool-call assembly) runs in tests. It serves `POST /v1/chat/completions` (OpenAI's
//! path) and `POST /openai/deployments/{deployment}/chat/completions` (Azure OpenAI's) on a free
//! 127.0.0.1 port with a minimal hand-written HTTP/1.1 layer (one request per connection),
//! answers from a FIFO script of [`FakeReply`]s — whole JSON or server-sent events, as the request
//! asks — and records every request: its path, query, headers and body ([`FakeOpenAi::received`]).
//!
//! It obeys an answer bound as a real server does: a request that carries `max_tokens` or
//! `max_completion_tokens` gets an answer of at most that many completion tokens (cut, with
//! finish reason `length`, when the scripted answer is longer), and its usage says so; a request
//! that carries both is refused with 400, as OpenAI does. Its tokens: a text or tool-call reply
//! counts [`FAKE_COMPLETION_TOKENS`] whatever its length, a [`FakeReply::Long`] answer one per
//! word. Its prompt counts [`FAKE_PROMPT_TOKENS`], or, after [`FakeOpenAi::count_prompt_bytes`],
//! one token per byte of the request's messages and tools (the most any tokenizer could make of
//! them). [`FakeReply::Events`] are sent as scripted, bound or not.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

mod http;

use http::{json_answer, read_request, write_answer, Answer, HttpRequest};

/// `usage.prompt_tokens` of every answer (unless the prompt is counted in bytes).
pub const FAKE_PROMPT_TOKENS: u64 = 11;
/// `usage.completion_tokens` of every text or tool-call answer (unless a bound cuts it).
pub const FAKE_COMPLETION_TOKENS: u64 = 7;
/// The word a [`FakeReply::Long`] answer repeats.
pub const LONG_ANSWER_WORD: &str = "lorem";

/// The text answered once the script is used up.
const EXHAUSTED: &str = "(script exhausted)";
/// Bound on reading one request and writing its answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// One scripted answer of the fake server.
#[derive(Debug, Clone, PartialEq)]
pub enum FakeReply {
    /// The assistant calls these tools: `(name, arguments)`, in order.
    ToolCalls(Vec<(String, Value)>),
    /// The assistant answers with this text.
    Answer(String),
    /// The server fails with this HTTP status and body.
    Status(u16, String),
    /// The server streams exactly these chunks (the JSON of each `data:` event, `[DONE]` added),
    /// whether or not the request asked for a stream: an answer in a real server's shape.
    Events(Vec<Value>),
    /// The assistant answers at length: this many words ([`LONG_ANSWER_WORD`]), one token each,
    /// unless the request's bound cuts it short.
    Long(u64),
}

impl FakeReply {
    /// A single tool call.
    pub fn tool(name: impl Into<String>, arguments: Value) -> Self {
        FakeReply::ToolCalls(vec![(name.into(), arguments)])
    }

    /// A text answer.
    pub fn answer(text: impl Into<String>) -> Self {
        FakeReply::Answer(text.into())
    }

    /// The events of a server-sent-events body, such as a fixture of
    /// `common/src/agent/model/fixtures/` (its `data:` lines but `[DONE]`; comment lines, which
    /// start with `:`, are left out).
    ///
    /// # Panics
    /// When a `data:` line is not JSON.
    pub fn recorded(sse: &str) -> Self {
        let events = sse
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).expect("a recorded event is JSON"))
            .collect();
        FakeReply::Events(events)
    }
}

/// One request the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedRequest {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string (after `?`), if any.
    pub query: Option<String>,
    /// Every header, names lower-cased, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (a body that is not JSON is a JSON string holding its text).
    pub body: Value,
}

impl ReceivedRequest {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The value of query parameter `name`, if sent (undecoded).
    pub fn query_param(&self, name: &str) -> Option<&str> {
        self.query.as_deref()?.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == name).then_some(value)
        })
    }
}

/// The answer bound a request body carries: `max_completion_tokens` or `max_tokens`.
pub fn answer_bound(body: &Value) -> Option<u64> {
    body.get("max_completion_tokens")
        .and_then(Value::as_u64)
        .or_else(|| body.get("max_tokens").and_then(Value::as_u64))
}

#[derive(Debug, Default)]
struct State {
    script: VecDeque<FakeReply>,
    received: Vec<ReceivedRequest>,
    /// Whether prompts are counted one token per byte (else [`FAKE_PROMPT_TOKENS`]).
    prompt_in_bytes: bool,
    next_id: u64,
    /// While set, each request waits for a permit before it is answered.
    gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Requests received, answered or still held.
    arrived: usize,
    /// Requests received whose answer has not started.
    in_flight: usize,
    /// The most requests ever in flight at once.
    most_in_flight: usize,
    /// Requests still to refuse with 429 and `Retry-After`, before the script is read.
    refusals_left: usize,
    /// The `Retry-After` (seconds) of those refusals.
    refusal_retry_after: u64,
    /// Requests refused so far.
    refused: usize,
}

impl State {
    /// A fresh id with `prefix`: a counter plus a random suffix, so ids never repeat.
    fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        let random = uuid::Uuid::new_v4().simple().to_string();
        format!("{prefix}_{}_{}", self.next_id, &random[..8])
    }
}

/// A running fake server; it stops when dropped.
#[derive(Debug)]
pub struct FakeOpenAi {
    /// `http://127.0.0.1:PORT/v1`: the base URL to configure a provider with.
    pub base_url: String,
    /// `http://127.0.0.1:PORT`: the endpoint to configure an Azure OpenAI provider with.
    pub root_url: String,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

/// Starts a fake server answering from `script` (first reply first).
///
/// # Panics
/// When no port on 127.0.0.1 can be bound.
pub async fn start(script: Vec<FakeReply>) -> FakeOpenAi {
    FakeOpenAi::start(script).await
}

impl FakeOpenAi {
    /// Starts a fake server answering from `script` (first reply first).
    ///
    /// # Panics
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start(script: Vec<FakeReply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1 can be bound for the fake OpenAI server");
        let port = listener
            .local_addr()
            .expect("a bound listener has a local address")
            .port();
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            ..State::default()
        }));
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Self {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            root_url: format!("http://127.0.0.1:{port}"),
            state,
            task,
        }
    }

    /// The full endpoint URL, `{base_url}/chat/completions`.
    pub fn chat_url(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: FakeReply) {
        self.lock().script.push_back(reply);
    }

    /// From now on each request waits, before it is answered, for a permit the test adds to the
    /// returned semaphore (`add_permits(1)` lets one request through).
    pub fn hold(&self) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        self.lock().gate = Some(Arc::clone(&gate));
        gate
    }

    /// How many requests have arrived, answered or held.
    pub fn arrived(&self) -> usize {
        self.lock().arrived
    }

    /// The most requests the server ever had in flight at once: received, and not yet being
    /// answered (held ones included).
    pub fn most_in_flight(&self) -> usize {
        self.lock().most_in_flight
    }

    /// Refuses the next `times` requests with `429 Too Many Requests` and
    /// `Retry-After: {retry_after_secs}`, before answering from the script again.
    pub fn refuse(&self, times: usize, retry_after_secs: u64) {
        let mut state = self.lock();
        state.refusals_left = times;
        state.refusal_retry_after = retry_after_secs;
    }

    /// How many requests were refused with 429 so far.
    pub fn refused(&self) -> usize {
        self.lock().refused
    }

    /// How many scripted replies are still unused.
    pub fn remaining(&self) -> usize {
        self.lock().script.len()
    }

    /// Every request body so far, parsed as JSON (a body that is not JSON is recorded as a JSON
    /// string holding its text).
    pub fn requests(&self) -> Vec<Value> {
        self.lock()
            .received
            .iter()
            .map(|r| r.body.clone())
            .collect()
    }

    /// The `Authorization` header of every request so far, in request order.
    pub fn auth_headers(&self) -> Vec<Option<String>> {
        self.lock()
            .received
            .iter()
            .map(|r| r.header("authorization").map(str::to_owned))
            .collect()
    }

    /// Every request so far, whole: path, query, headers and body.
    pub fn received(&self) -> Vec<ReceivedRequest> {
        self.lock().received.clone()
    }

    /// The answer bound ([`answer_bound`]) of every request so far, in request order.
    pub fn answer_bounds(&self) -> Vec<Option<u64>> {
        self.lock()
            .received
            .iter()
            .map(|r| answer_bound(&r.body))
            .collect()
    }

    /// From now on, reports each request's prompt tokens as the bytes of its messages (content,
    /// reasoning, tool calls' names and arguments, tool-call ids) and tool specs (names,
    /// descriptions, parameter schemas): the most any tokenizer could make of them.
    pub fn count_prompt_bytes(&self) {
        self.lock().prompt_in_bytes = true;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts open connections too.
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // No code panics while holding the lock, and the state stays consistent regardless.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// HTTP

async fn accept_loop(listener: TcpListener, state: Arc<Mutex<State>>) {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((stream, _)) => {
                let state = Arc::clone(&state);
                connections.spawn(async move {
                    // A connection that errors or stalls is simply dropped.
                    let _ = tokio::time::timeout(CONNECTION_TIMEOUT, serve(stream, state)).await;
                });
            }
            // Out of file descriptors or the like: back off briefly.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Counts a request in flight until it is dropped (its answer starts, or the connection ends).
struct InFlight(Arc<Mutex<State>>);

impl InFlight {
    fn enter(state: &Arc<Mutex<State>>) -> Self {
        let mut locked = lock(state);
        locked.in_flight += 1;
        locked.most_in_flight = locked.most_in_flight.max(locked.in_flight);
        Self(Arc::clone(state))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.0).in_flight -= 1;
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    let Some(request) = read_request(&mut reader).await? else {
        return Ok(());
    };
    let gate = {
        let mut state = lock(&state);
        state.arrived += 1;
        state.gate.clone()
    };
    let in_flight = InFlight::enter(&state);
    if let Some(gate) = gate {
        if let Ok(permit) = gate.acquire().await {
            permit.forget();
        }
    }
    let answer = answer(&request, &state);
    // The answer starts now: a client sees its end only after this.
    drop(in_flight);
    write_answer(reader.into_inner(), answer).await
}

// ---------------------------------------------------------------------------------------------
// Chat completions

/// Whether `path` is a chat-completions endpoint: OpenAI's, or an Azure OpenAI deployment's.
fn is_chat_path(path: &str) -> bool {
    if path == "/v1/chat/completions" {
        return true;
    }
    path.strip_prefix("/openai/deployments/")
        .and_then(|rest| rest.strip_suffix("/chat/completions"))
        .is_some_and(|deployment| !deployment.is_empty() && !deployment.contains('/'))
}

/// Records `request` and builds its answer from the next scripted reply.
fn answer(request: &HttpRequest, state: &Mutex<State>) -> Answer {
    if request.method != "POST" || !is_chat_path(&request.path) {
        let error = json!({ "error": { "message": format!(
            "the fake OpenAI server only serves POST /v1/chat/completions and \
             /openai/deployments/{{deployment}}/chat/completions, not {} {}",
            request.method, request.path
        ), "type": "invalid_request_error" } });
        return json_answer(404, &error);
    }
    let mut state = lock(state);
    let parsed: Result<Value, _> = serde_json::from_slice(&request.body);
    let recorded = match &parsed {
        Ok(body) => body.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(&request.body).into_owned()),
    };
    state.received.push(ReceivedRequest {
        method: request.method.clone(),
        path: request.path.clone(),
        query: request.query.clone(),
        headers: request
            .headers
            .iter()
            .map(|(key, value)| (key.to_ascii_lowercase(), value.clone()))
            .collect(),
        body: recorded,
    });
    let body = match parsed {
        Ok(body) => body,
        Err(error) => {
            let error = json!({ "error": {
                "message": format!("the request body is not JSON: {error}"),
                "type": "invalid_request_error",
            } });
            return json_answer(400, &error);
        }
    };
    if body.get("max_tokens").is_some() && body.get("max_completion_tokens").is_some() {
        // OpenAI's answer to a request that sets both.
        let error = json!({ "error": {
            "message": "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "invalid_parameter_combination",
        } });
        return json_answer(400, &error);
    }
    if state.refusals_left > 0 {
        state.refusals_left -= 1;
        state.refused += 1;
        return Answer::Refused {
            retry_after: state.refusal_retry_after,
        };
    }
    let reply = state
        .script
        .pop_front()
        .unwrap_or_else(|| FakeReply::Answer(EXHAUSTED.to_owned()));
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake-model")
        .to_owned();
    let streamed = body.get("stream").and_then(Value::as_bool) == Some(true);
    let completion_id = state.fresh_id("chatcmpl");
    let usage = Usage {
        prompt: if state.prompt_in_bytes {
            prompt_bytes(&body)
        } else {
            FAKE_PROMPT_TOKENS
        },
        bound: answer_bound(&body),
    };
    let reply = match (reply, usage.bound) {
        // A reply the bound cuts short: its first `bound` tokens.
        (FakeReply::Long(words), Some(bound)) if words > bound => {
            return cut_answer(
                &completion_id,
                &model,
                streamed,
                long_text(bound),
                usage,
                bound,
            );
        }
        (FakeReply::Answer(text), Some(bound)) if bound < FAKE_COMPLETION_TOKENS => {
            let cut: String = text.chars().take(bound as usize).collect();
            return cut_answer(&completion_id, &model, streamed, cut, usage, bound);
        }
        (FakeReply::ToolCalls(_), Some(bound)) if bound < FAKE_COMPLETION_TOKENS => {
            return cut_answer(
                &completion_id,
                &model,
                streamed,
                String::new(),
                usage,
                bound,
            );
        }
        (reply, _) => reply,
    };
    match reply {
        FakeReply::Status(status, body) => {
            let content_type = if serde_json::from_str::<Value>(&body).is_ok() {
                "application/json"
            } else {
                "text/plain"
            };
            Answer::Whole {
                status,
                content_type,
                body,
            }
        }
        FakeReply::Events(events) => Answer::Events(events),
        FakeReply::Long(words) => {
            let done = usage.of(words);
            text_answer(
                &completion_id,
                &model,
                streamed,
                long_text(words),
                "stop",
                done,
            )
        }
        FakeReply::Answer(text) => {
            let done = usage.of(FAKE_COMPLETION_TOKENS);
            text_answer(&completion_id, &model, streamed, text, "stop", done)
        }
        FakeReply::ToolCalls(calls) => {
            let done = usage.of(FAKE_COMPLETION_TOKENS);
            let calls: Vec<(String, String, Value)> = calls
                .into_iter()
                .map(|(name, arguments)| (state.fresh_id("call"), name, arguments))
                .collect();
            if streamed {
                Answer::Events(streamed_tool_calls(&completion_id, &model, &calls, done))
            } else {
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .map(|(id, name, arguments)| {
                        json!({
                            "id": id,
                            "type": "function",
                            "function": { "name": name, "arguments": arguments.to_string() },
                        })
                    })
                    .collect();
                let message =
                    json!({ "role": "assistant", "content": null, "tool_calls": tool_calls });
                json_answer(
                    200,
                    &whole(&completion_id, &model, message, "tool_calls", done),
                )
            }
        }
    }
}

/// What a request is charged: its prompt's tokens, and the bound on its answer, if any.
#[derive(Debug, Clone, Copy)]
struct Usage {
    prompt: u64,
    bound: Option<u64>,
}

impl Usage {
    /// The `usage` object of an answer of `completion` tokens.
    fn of(self, completion: u64) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": completion,
            "total_tokens": self.prompt + completion,
        })
    }
}

/// `words` words of a long answer.
fn long_text(words: u64) -> String {
    vec![LONG_ANSWER_WORD; usize::try_from(words).unwrap_or(usize::MAX)].join(" ")
}

/// An answer cut at the request's `bound`: `text`, finish reason `length`, `bound` completion
/// tokens.
fn cut_answer(
    id: &str,
    model: &str,
    streamed: bool,
    text: String,
    usage: Usage,
    bound: u64,
) -> Answer {
    text_answer(id, model, streamed, text, "length", usage.of(bound))
}

/// A text answer, whole or streamed as the request asked.
fn text_answer(
    id: &str,
    model: &str,
    streamed: bool,
    text: String,
    finish_reason: &str,
    usage: Value,
) -> Answer {
    if streamed {
        Answer::Events(streamed_text(id, model, &text, finish_reason, usage))
    } else {
        let message = json!({ "role": "assistant", "content": text });
        json_answer(200, &whole(id, model, message, finish_reason, usage))
    }
}

/// The bytes of a request's messages and tool specs: what [`FakeOpenAi::count_prompt_bytes`]
/// counts as its prompt tokens.
fn prompt_bytes(body: &Value) -> u64 {
    let text = |value: &Value| value.as_str().map_or(0, str::len) as u64;
    let messages: u64 = body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| {
                    let calls: u64 = m["tool_calls"]
                        .as_array()
                        .map(|calls| {
                            calls
                                .iter()
                                .map(|c| {
                                    text(&c["function"]["name"]) + text(&c["function"]["arguments"])
                                })
                                .sum()
                        })
                        .unwrap_or(0);
                    text(&m["content"])
                        + text(&m["reasoning_content"])
                        + text(&m["tool_call_id"])
                        + calls
                })
                .sum()
        })
        .unwrap_or(0);
    let tools: u64 = body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| {
                    let function = &t["function"];
                    text(&function["name"])
                        + text(&function["description"])
                        + function["parameters"].to_string().len() as u64
                })
                .sum()
        })
        .unwrap_or(0);
    messages + tools
}

/// A whole (non-streamed) completion.
fn whole(id: &str, model: &str, message: Value, finish_reason: &str, usage: Value) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason }],
        "usage": usage,
    })
}

/// One streamed chunk with a single choice.
fn chunk(id: &str, model: &str, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
    })
}

/// The closing usage chunk.
fn usage_chunk(id: &str, model: &str, usage: Value) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [],
        "usage": usage,
    })
}

fn streamed_text(
    id: &str,
    model: &str,
    text: &str,
    finish_reason: &str,
    usage: Value,
) -> Vec<Value> {
    let mut events: Vec<Value> = split_text(text, 3)
        .into_iter()
        .enumerate()
        .map(|(position, piece)| {
            let delta = if position == 0 {
                json!({ "role": "assistant", "content": piece })
            } else {
                json!({ "content": piece })
            };
            chunk(id, model, delta, None)
        })
        .collect();
    events.push(chunk(id, model, json!({}), Some(finish_reason)));
    events.push(usage_chunk(id, model, usage));
    events
}

fn streamed_tool_calls(
    id: &str,
    model: &str,
    calls: &[(String, String, Value)],
    usage: Value,
) -> Vec<Value> {
    let mut events = Vec::new();
    for (index, (call_id, name, arguments)) in calls.iter().enumerate() {
        let opening = json!({ "tool_calls": [{
            "index": index,
            "id": call_id,
            "type": "function",
            "function": { "name": name, "arguments": "" },
        }] });
        let opening = if index == 0 {
            let mut with_role = opening;
            with_role["role"] = json!("assistant");
            with_role
        } else {
            opening
        };
        events.push(chunk(id, model, opening, None));
        for piece in split_text(&arguments.to_string(), 2) {
            let delta = json!({ "tool_calls": [{
                "index": index,
                "function": { "arguments": piece },
            }] });
            events.push(chunk(id, model, delta, None));
        }
    }
    events.push(chunk(id, model, json!({}), Some("tool_calls")));
    events.push(usage_chunk(id, model, usage));
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

/// The tool results the model saw in `request`, in order.
pub fn tool_messages(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("a reqwest client builds")
    }

    /// The `data:` payloads of an SSE body, in order.
    fn sse_data(body: &str) -> Vec<String> {
        body.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn split_text_keeps_every_character() {
        assert_eq!(split_text("", 3), vec![String::new()]);
        assert_eq!(split_text("a", 3), vec!["a".to_owned()]);
        let pieces = split_text("héllo wörld", 3);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.concat(), "héllo wörld");
    }

    #[tokio::test]
    async fn whole_answers_follow_the_script_and_requests_are_recorded() {
        let fake = FakeOpenAi::start(vec![
            FakeReply::tool("read_file", json!({ "path": "a.txt" })),
            FakeReply::answer("done"),
            FakeReply::Status(429, r#"{"error":{"message":"slow down"}}"#.to_owned()),
        ])
        .await;
        let http = client();
        let url = fake.chat_url();
        let body = json!({ "model": "m1", "messages": [{ "role": "user", "content": "hi" }] });

        let first: Value = http
            .post(&url)
            .bearer_auth("sk-test")
            .json(&body)
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        assert_eq!(first["choices"][0]["finish_reason"], "tool_calls");
        let call = &first["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "read_file");
        let arguments: Value = serde_json::from_str(
            call["function"]["arguments"]
                .as_str()
                .expect("arguments are JSON text"),
        )
        .expect("arguments decode");
        assert_eq!(arguments, json!({ "path": "a.txt" }));
        assert_eq!(first["usage"]["prompt_tokens"], FAKE_PROMPT_TOKENS);

        let second: Value = http
            .post(&url)
            .json(&body)
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        assert_eq!(second["choices"][0]["message"]["content"], "done");

        let third = http
            .post(&url)
            .json(&body)
            .send()
            .await
            .expect("the fake server answers");
        assert_eq!(third.status().as_u16(), 429);

        let fourth: Value = http
            .post(&url)
            .json(&body)
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        assert_eq!(fourth["choices"][0]["message"]["content"], EXHAUSTED);

        assert_eq!(fake.requests().len(), 4);
        assert_eq!(fake.requests()[0], body);
        assert_eq!(
            fake.auth_headers(),
            vec![Some("Bearer sk-test".to_owned()), None, None, None]
        );
    }

    #[tokio::test]
    async fn streamed_answers_use_openai_chunks() {
        let fake = FakeOpenAi::start(vec![
            FakeReply::answer("Hello, streaming world"),
            FakeReply::ToolCalls(vec![
                ("one".to_owned(), json!({ "x": 1 })),
                ("two".to_owned(), json!({ "y": "zz" })),
            ]),
        ])
        .await;
        let http = client();
        let body = json!({ "model": "m2", "messages": [], "stream": true });

        let response = http
            .post(fake.chat_url())
            .json(&body)
            .send()
            .await
            .expect("the fake server answers");
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|value| value.to_str().ok()),
            Some("text/event-stream")
        );
        let data = sse_data(&response.text().await.expect("the stream is read"));
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|text| serde_json::from_str(text).expect("each event is JSON"))
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello, streaming world");
        let content_chunks = chunks
            .iter()
            .filter(|chunk| chunk["choices"][0]["delta"]["content"].is_string())
            .count();
        assert_eq!(content_chunks, 3);
        assert!(chunks
            .iter()
            .any(|chunk| chunk["choices"][0]["finish_reason"] == "stop"));
        let last = chunks.last().expect("there are chunks");
        assert_eq!(last["usage"]["completion_tokens"], FAKE_COMPLETION_TOKENS);

        let response = http
            .post(fake.chat_url())
            .json(&body)
            .send()
            .await
            .expect("the fake server answers");
        let data = sse_data(&response.text().await.expect("the stream is read"));
        let mut assembled: Vec<(String, String, String)> = Vec::new();
        let mut finish = None;
        for text in data.iter().filter(|text| *text != "[DONE]") {
            let chunk: Value = serde_json::from_str(text).expect("each event is JSON");
            if let Some(reason) = chunk["choices"][0]["finish_reason"].as_str() {
                finish = Some(reason.to_owned());
            }
            let Some(deltas) = chunk["choices"][0]["delta"]["tool_calls"].as_array() else {
                continue;
            };
            for delta in deltas {
                let index = delta["index"].as_u64().expect("deltas carry an index") as usize;
                if assembled.len() <= index {
                    assembled.resize(index + 1, Default::default());
                }
                let call = &mut assembled[index];
                if let Some(id) = delta["id"].as_str() {
                    call.0 = id.to_owned();
                }
                if let Some(name) = delta["function"]["name"].as_str() {
                    call.1 = name.to_owned();
                }
                if let Some(piece) = delta["function"]["arguments"].as_str() {
                    call.2.push_str(piece);
                }
            }
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        assert_eq!(assembled.len(), 2);
        assert_eq!(assembled[0].1, "one");
        assert_eq!(assembled[1].1, "two");
        assert_ne!(assembled[0].0, assembled[1].0);
        let first_args: Value = serde_json::from_str(&assembled[0].2).expect("arguments decode");
        let second_args: Value = serde_json::from_str(&assembled[1].2).expect("arguments decode");
        assert_eq!(first_args, json!({ "x": 1 }));
        assert_eq!(second_args, json!({ "y": "zz" }));

        assert_eq!(fake.requests(), vec![body.clone(), body]);
        assert_eq!(fake.remaining(), 0);
    }

    /// The real provider client understands the fake's whole and streamed answers.
    #[tokio::test]
    async fn the_real_openai_client_reads_the_fake() {
        use futures::StreamExt;
        use skein_common::agent::model::openai::OpenAiClient;
        use skein_common::agent::model::{ModelChunk, ModelClient, ModelRequest};
        use skein_common::protocol::message::Message;

        let fake = FakeOpenAi::start(vec![
            FakeReply::tool("echo", json!({ "text": "hi" })),
            FakeReply::answer("streamed reply"),
        ])
        .await;
        let client = OpenAiClient::new(
            fake.base_url.clone(),
            Some("sk-real".to_owned()),
            Duration::from_secs(10),
        )
        .expect("the client builds");
        let request = ModelRequest {
            model: "m".to_owned(),
            agent: "tester".to_owned(),
            messages: std::sync::Arc::new(vec![Message::user("hello")]),
            tools: Vec::new().into(),
            max_output_tokens: None,
            output_schema: None,
        };

        let whole = client
            .complete(request.clone())
            .await
            .expect("the whole answer parses");
        assert_eq!(whole.message.tool_calls.len(), 1);
        assert_eq!(whole.message.tool_calls[0].name, "echo");
        assert_eq!(
            whole.message.tool_calls[0].arguments,
            json!({ "text": "hi" })
        );

        let mut stream = client.stream(request).await.expect("the stream opens");
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
        let done = done.expect("the stream ends with the whole response");
        assert_eq!(deltas, "streamed reply");
        assert_eq!(done.message.content, "streamed reply");
        assert_eq!(done.usage.completion_tokens, FAKE_COMPLETION_TOKENS);
        assert_eq!(
            fake.auth_headers(),
            vec![Some("Bearer sk-real".to_owned()); 2]
        );
    }

    fn long_request(stream: bool, bound: Option<(&str, u64)>) -> Value {
        let mut body = json!({
            "model": "m",
            "messages": [{ "role": "user", "content": "tell me everything" }],
            "stream": stream,
        });
        if let Some((field, bound)) = bound {
            body[field] = json!(bound);
        }
        body
    }

    #[tokio::test]
    async fn an_answer_never_exceeds_the_requests_bound_and_its_usage_says_so() {
        let fake = FakeOpenAi::start(vec![
            FakeReply::Long(500),
            FakeReply::Long(500),
            FakeReply::Long(3),
            FakeReply::answer("a short answer"),
            FakeReply::tool("echo", json!({ "text": "hi" })),
        ])
        .await;
        let http = client();

        // Whole, bounded by `max_tokens`: cut at 40 words.
        let whole: Value = http
            .post(fake.chat_url())
            .json(&long_request(false, Some(("max_tokens", 40))))
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        let text = whole["choices"][0]["message"]["content"]
            .as_str()
            .expect("a text answer");
        assert_eq!(text.split_whitespace().count(), 40);
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
        assert_eq!(whole["usage"]["completion_tokens"], 40);
        assert_eq!(whole["usage"]["prompt_tokens"], FAKE_PROMPT_TOKENS);

        // Streamed, bounded by `max_completion_tokens`: cut at 25 words.
        let response = http
            .post(fake.chat_url())
            .json(&long_request(true, Some(("max_completion_tokens", 25))))
            .send()
            .await
            .expect("the fake server answers");
        let chunks: Vec<Value> = sse_data(&response.text().await.expect("the stream is read"))
            .iter()
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).expect("each event is JSON"))
            .collect();
        let text: String = chunks
            .iter()
            .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text.split_whitespace().count(), 25);
        assert!(chunks
            .iter()
            .any(|chunk| chunk["choices"][0]["finish_reason"] == "length"));
        let usage = &chunks.last().expect("a usage chunk")["usage"];
        assert_eq!(usage["completion_tokens"], 25);

        // Shorter than its bound: whole, and counted as it is.
        let short: Value = http
            .post(fake.chat_url())
            .json(&long_request(false, Some(("max_tokens", 40))))
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        assert_eq!(
            short["choices"][0]["message"]["content"],
            "lorem lorem lorem"
        );
        assert_eq!(short["choices"][0]["finish_reason"], "stop");
        assert_eq!(short["usage"]["completion_tokens"], 3);

        // Text and tool calls cost FAKE_COMPLETION_TOKENS: a smaller bound cuts them.
        for _ in 0..2 {
            let cut: Value = http
                .post(fake.chat_url())
                .json(&long_request(false, Some(("max_tokens", 2))))
                .send()
                .await
                .expect("the fake server answers")
                .json()
                .await
                .expect("the answer is JSON");
            assert_eq!(cut["choices"][0]["finish_reason"], "length", "{cut}");
            assert_eq!(cut["usage"]["completion_tokens"], 2);
            assert!(cut["choices"][0]["message"].get("tool_calls").is_none());
            let text = cut["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default();
            assert!(text.chars().count() <= 2, "{text}");
        }
        assert_eq!(
            fake.answer_bounds(),
            vec![Some(40), Some(25), Some(40), Some(2), Some(2)]
        );
    }

    #[tokio::test]
    async fn both_bound_fields_at_once_are_refused_as_openai_refuses_them() {
        let fake = FakeOpenAi::start(vec![FakeReply::answer("never sent")]).await;
        let mut body = long_request(false, Some(("max_tokens", 10)));
        body["max_completion_tokens"] = json!(10);
        let response = client()
            .post(fake.chat_url())
            .json(&body)
            .send()
            .await
            .expect("the fake server answers");
        assert_eq!(response.status().as_u16(), 400);
        let error: Value = response.json().await.expect("an error body");
        assert_eq!(error["error"]["code"], "invalid_parameter_combination");
        assert_eq!(fake.remaining(), 1, "the script was not read");
    }

    #[tokio::test]
    async fn prompts_counted_in_bytes_count_every_byte_of_messages_and_tools() {
        let fake = FakeOpenAi::start(vec![FakeReply::answer("ok")]).await;
        fake.count_prompt_bytes();
        let body = json!({
            "model": "m",
            "messages": [
                { "role": "user", "content": "12345" },
                { "role": "assistant", "content": null, "tool_calls": [
                    { "id": "c1", "type": "function",
                      "function": { "name": "echo", "arguments": "{\"a\":1}" } } ] },
                { "role": "tool", "tool_call_id": "c1", "content": "xy" },
            ],
            "tools": [{ "type": "function", "function": {
                "name": "echo", "description": "Echo.", "parameters": { "type": "object" } } }],
        });
        let answer: Value = client()
            .post(fake.chat_url())
            .json(&body)
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        // 5 + (4 + 7) + (2 + 2) + (4 + 5 + 17)
        assert_eq!(answer["usage"]["prompt_tokens"], 46);
    }

    #[tokio::test]
    async fn azure_deployment_paths_are_served_and_recorded_whole() {
        let fake = FakeOpenAi::start(vec![FakeReply::answer("from azure")]).await;
        let url = format!(
            "{}/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21",
            fake.root_url
        );
        let answer: Value = client()
            .post(&url)
            .header("api-key", "azure-key")
            .json(&long_request(false, None))
            .send()
            .await
            .expect("the fake server answers")
            .json()
            .await
            .expect("the answer is JSON");
        assert_eq!(answer["choices"][0]["message"]["content"], "from azure");
        let received = fake.received();
        assert_eq!(received.len(), 1);
        let request = &received[0];
        assert_eq!(request.method, "POST");
        assert_eq!(
            request.path,
            "/openai/deployments/gpt-4o-prod/chat/completions"
        );
        assert_eq!(request.query_param("api-version"), Some("2024-10-21"));
        assert_eq!(request.header("API-Key"), Some("azure-key"));
        assert_eq!(request.header("authorization"), None);
        assert_eq!(fake.auth_headers(), vec![None]);
        for wrong in [
            "/openai/deployments//chat/completions",
            "/openai/deployments/a/b/chat/completions",
            "/chat/completions",
        ] {
            let response = client()
                .post(format!("{}{wrong}", fake.root_url))
                .json(&long_request(false, None))
                .send()
                .await
                .expect("the fake server answers");
            assert_eq!(response.status().as_u16(), 404, "{wrong}");
        }
        assert_eq!(fake.received().len(), 1, "refused paths are not recorded");
    }

    /// The real provider sends the bound it is given and reads the cut answer.
    #[tokio::test]
    async fn the_real_openai_client_sends_the_bound_and_reads_a_cut_answer() {
        use skein_common::agent::model::openai::OpenAiClient;
        use skein_common::agent::model::{ModelClient, ModelRequest};
        use skein_common::protocol::message::Message;

        let fake = FakeOpenAi::start(vec![FakeReply::Long(1000)]).await;
        let client = OpenAiClient::new(fake.base_url.clone(), None, Duration::from_secs(10))
            .expect("the client builds");
        let request = ModelRequest {
            model: "m".to_owned(),
            agent: "tester".to_owned(),
            messages: std::sync::Arc::new(vec![Message::user("hello")]),
            tools: Vec::new().into(),
            max_output_tokens: Some(12),
            output_schema: None,
        };
        let whole = client.complete(request).await.expect("the answer parses");
        assert_eq!(whole.message.content.split_whitespace().count(), 12);
        assert_eq!(whole.finish_reason.as_deref(), Some("length"));
        assert_eq!(whole.usage.completion_tokens, 12);
        let body = &fake.requests()[0];
        assert_eq!(body["max_tokens"], json!(12));
        assert!(body.get("max_completion_tokens").is_none(), "{body}");
    }
}
