//! The OpenAI-compatible provider's answer parsers (`agent::model::openai`): the server-sent
//! events reader and stream accumulator, and the whole-answer decoder. The parsers are private,
//! so they are reached as in production: an in-process HTTP server answers
//! `OpenAiClient::stream` / `complete` with the fuzz input.
//!
//! Input: the first byte picks the answer: `0` an event stream to `stream`, `1` a JSON answer to
//! `stream` (a server that ignores `stream: true`), `2` a JSON answer to `complete`, `3` an error
//! status with the input as its body. The rest is the body, cut into HTTP chunks at every `0xFF`
//! byte.
//!
//! Checks: no panic; a stream yields text deltas and ends with exactly one `Done` or error, its
//! last item; a `Done` answer's text is the deltas put together and carries at most
//! `MAX_TOOL_CALLS` calls; the token usage of two such answers adds up, as a turn's total does.

#![no_main]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use skein_common::agent::model::openai::{OpenAiClient, MAX_TOOL_CALLS};
use skein_common::agent::model::{ModelChunk, ModelClient, ModelRequest, ModelResponse};
use skein_common::protocol::message::{Message, Usage};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// What the fake server answers to the next request.
#[derive(Default)]
struct Answer {
    status: u16,
    content_type: &'static str,
    chunks: Vec<Vec<u8>>,
}

struct Harness {
    runtime: Runtime,
    client: OpenAiClient,
    answer: Arc<Mutex<Answer>>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let answer = Arc::new(Mutex::new(Answer::default()));
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let served = answer.clone();
        runtime.spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, served.clone()));
            }
        });
        let client = OpenAiClient::new(format!("http://{addr}/v1"), None, Duration::from_secs(5))
            .expect("a client");
        Harness {
            runtime,
            client,
            answer,
        }
    })
}

/// Answers requests on one keep-alive connection until the client closes it.
async fn serve(socket: TcpStream, answer: Arc<Mutex<Answer>>) {
    let mut reader = BufReader::new(socket);
    loop {
        let mut content_length = 0usize;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let response = {
            let answer = answer.lock().expect("answer lock");
            let mut out = format!(
                "HTTP/1.1 {} X\r\ncontent-type: {}\r\ntransfer-encoding: chunked\r\n\r\n",
                answer.status, answer.content_type
            )
            .into_bytes();
            for chunk in answer.chunks.iter().filter(|c| !c.is_empty()) {
                out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
            out
        };
        let socket = reader.get_mut();
        if socket.write_all(&response).await.is_err() || socket.flush().await.is_err() {
            return;
        }
    }
}

fn request() -> ModelRequest {
    ModelRequest {
        model: "m".into(),
        agent: "a".into(),
        messages: vec![Message::user("hi")],
        tools: Default::default(),
        max_output_tokens: None,
        output_schema: None,
    }
}

/// A turn adds up the usage of its model calls.
fn check_response(response: &ModelResponse) {
    assert!(response.message.tool_calls.len() <= MAX_TOOL_CALLS);
    let mut total = Usage::default();
    total.add(response.usage);
    total.add(response.usage);
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&mode, body)) = bytes.split_first() else {
        return;
    };
    let harness = harness();
    let (status, content_type) = match mode % 4 {
        0 => (200, "text/event-stream"),
        1 | 2 => (200, "application/json"),
        _ => (500, "text/plain"),
    };
    *harness.answer.lock().expect("answer lock") = Answer {
        status,
        content_type,
        chunks: body.split(|&b| b == 0xFF).map(<[u8]>::to_vec).collect(),
    };
    harness.runtime.block_on(async {
        if mode % 4 == 2 {
            if let Ok(response) = harness.client.complete(request()).await {
                check_response(&response);
            }
            return;
        }
        let Ok(stream) = harness.client.stream(request()).await else {
            return;
        };
        let items: Vec<_> = stream.collect().await;
        let (last, deltas) = items
            .split_last()
            .expect("a stream yields at least one item");
        let mut text = String::new();
        for item in deltas {
            match item {
                Ok(ModelChunk::Delta(piece)) => text.push_str(piece),
                other => panic!("only text deltas come before the end, got {other:?}"),
            }
        }
        match last {
            Ok(ModelChunk::Done(response)) => {
                assert_eq!(response.message.content, text);
                check_response(response);
            }
            Ok(ModelChunk::Delta(_)) => panic!("the stream ended on a delta"),
            Err(_) => {}
        }
    });
});
