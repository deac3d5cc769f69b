//! A fake OpenAI-compatible chat-completions server, so the real provider code (HTTP client, SSE
//! parsing, tool-call assembly) runs in tests. It serves `POST /v1/chat/completions` on a free
//! 127.0.0.1 port with a minimal hand-written HTTP/1.1 layer (one request per connection),
//! answers from a FIFO script of [`FakeReply`]s — whole JSON or server-sent events, as the request
//! asks — and records every request body and `Authorization` header.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// `usage.prompt_tokens` of every answer.
pub const FAKE_PROMPT_TOKENS: u64 = 11;
/// `usage.completion_tokens` of every answer.
pub const FAKE_COMPLETION_TOKENS: u64 = 7;

/// The text answered once the script is used up.
const EXHAUSTED: &str = "(script exhausted)";
/// Bound on reading one request and writing its answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound on a request's head (request line plus headers).
const MAX_HEAD_BYTES: u64 = 64 * 1024;

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
    /// whether or not the request asked for a stream: a recorded answer of a real server.
    Events(Vec<Value>),
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

    /// The events of a recorded server-sent-events body (its `data:` lines but `[DONE]`).
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

#[derive(Debug, Default)]
struct State {
    script: VecDeque<FakeReply>,
    requests: Vec<Value>,
    auth_headers: Vec<Option<String>>,
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
        self.lock().requests.clone()
    }

    /// The `Authorization` header of every request so far, in request order.
    pub fn auth_headers(&self) -> Vec<Option<String>> {
        self.lock().auth_headers.clone()
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

#[derive(Debug)]
struct HttpRequest {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// What to send back.
enum Answer {
    Whole {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    Events(Vec<Value>),
    /// `429 Too Many Requests` with this `Retry-After` (seconds).
    Refused {
        retry_after: u64,
    },
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
    let mut stream = reader.into_inner();
    match answer {
        Answer::Whole {
            status,
            content_type,
            body,
        } => {
            let head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                reason(status),
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        Answer::Refused { retry_after } => {
            let body = r#"{"error":{"message":"rate limited","type":"rate_limit_error"}}"#;
            let head = format!(
                "HTTP/1.1 429 {}\r\ncontent-type: application/json\r\nretry-after: {retry_after}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                reason(429),
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        Answer::Events(events) => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            stream.write_all(head.as_bytes()).await?;
            let data = events
                .iter()
                .map(Value::to_string)
                .chain(std::iter::once("[DONE]".to_owned()));
            for data in data {
                // One event per HTTP chunk, flushed separately, so the client really streams.
                let event = format!("data: {data}\n\n");
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                stream.write_all(chunk.as_bytes()).await?;
                stream.flush().await?;
            }
            stream.write_all(b"0\r\n\r\n").await?;
        }
    }
    stream.flush().await?;
    stream.shutdown().await
}

/// Reads one request; `None` when the client closed the connection without sending one.
async fn read_request<R: AsyncBufRead + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<HttpRequest>> {
    let mut head = String::new();
    let mut limited = reader.take(MAX_HEAD_BYTES);
    let mut lines = Vec::new();
    loop {
        head.clear();
        if limited.read_line(&mut head).await? == 0 {
            if lines.is_empty() {
                return Ok(None);
            }
            return Err(invalid("the request head ended early"));
        }
        let line = head.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            if lines.is_empty() {
                continue; // Tolerate stray blank lines before the request line.
            }
            break;
        }
        lines.push(line.to_owned());
    }
    let reader = limited.into_inner();
    let mut request_line = lines[0].split_whitespace();
    let method = request_line.next().unwrap_or_default().to_owned();
    let target = request_line.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines[1..]
        .iter()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let mut request = HttpRequest {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|value| value.to_ascii_lowercase().contains("chunked"));
    if chunked {
        request.body = read_chunked(reader).await?;
    } else if let Some(length) = request.header("content-length") {
        let length: usize = length
            .parse()
            .map_err(|_| invalid("a content-length that is not a number"))?;
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await?;
        request.body = body;
    }
    Ok(Some(request))
}

async fn read_chunked<R: AsyncBufRead + Unpin>(reader: &mut R) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await?;
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16).map_err(|_| invalid("a bad chunk size"))?;
        if size == 0 {
            // Skip trailers up to the closing blank line.
            loop {
                line.clear();
                if reader.read_line(&mut line).await? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).await?;
        line.clear();
        reader.read_line(&mut line).await?; // The CRLF after the chunk data.
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

fn json_answer(status: u16, body: &Value) -> Answer {
    Answer::Whole {
        status,
        content_type: "application/json",
        body: body.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Chat completions

/// Records `request` and builds its answer from the next scripted reply.
fn answer(request: &HttpRequest, state: &Mutex<State>) -> Answer {
    if request.method != "POST" || request.path != "/v1/chat/completions" {
        let error = json!({ "error": { "message": format!(
            "the fake OpenAI server only serves POST /v1/chat/completions, not {} {}",
            request.method, request.path
        ), "type": "invalid_request_error" } });
        return json_answer(404, &error);
    }
    let auth = request.header("authorization").map(str::to_owned);
    let mut state = lock(state);
    state.auth_headers.push(auth);
    let body: Value = match serde_json::from_slice(&request.body) {
        Ok(body) => body,
        Err(error) => {
            let text = String::from_utf8_lossy(&request.body).into_owned();
            state.requests.push(Value::String(text));
            let error = json!({ "error": {
                "message": format!("the request body is not JSON: {error}"),
                "type": "invalid_request_error",
            } });
            return json_answer(400, &error);
        }
    };
    state.requests.push(body.clone());
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
        FakeReply::Answer(text) if streamed => {
            Answer::Events(streamed_text(&completion_id, &model, &text))
        }
        FakeReply::Answer(text) => {
            let message = json!({ "role": "assistant", "content": text });
            json_answer(200, &whole(&completion_id, &model, message, "stop"))
        }
        FakeReply::ToolCalls(calls) => {
            let calls: Vec<(String, String, Value)> = calls
                .into_iter()
                .map(|(name, arguments)| (state.fresh_id("call"), name, arguments))
                .collect();
            if streamed {
                Answer::Events(streamed_tool_calls(&completion_id, &model, &calls))
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
                json_answer(200, &whole(&completion_id, &model, message, "tool_calls"))
            }
        }
    }
}

fn usage() -> Value {
    json!({
        "prompt_tokens": FAKE_PROMPT_TOKENS,
        "completion_tokens": FAKE_COMPLETION_TOKENS,
        "total_tokens": FAKE_PROMPT_TOKENS + FAKE_COMPLETION_TOKENS,
    })
}

/// A whole (non-streamed) completion.
fn whole(id: &str, model: &str, message: Value, finish_reason: &str) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason }],
        "usage": usage(),
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
fn usage_chunk(id: &str, model: &str) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [],
        "usage": usage(),
    })
}

fn streamed_text(id: &str, model: &str, text: &str) -> Vec<Value> {
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
    events.push(chunk(id, model, json!({}), Some("stop")));
    events.push(usage_chunk(id, model));
    events
}

fn streamed_tool_calls(id: &str, model: &str, calls: &[(String, String, Value)]) -> Vec<Value> {
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
    events.push(usage_chunk(id, model));
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
            messages: vec![Message::user("hello")],
            tools: Vec::new().into(),
            max_output_tokens: None,
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
}
