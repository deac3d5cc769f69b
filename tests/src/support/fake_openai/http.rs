//! The fake server's HTTP/1.1 layer: reading one request (its head bounded by
//! [`MAX_HEAD_BYTES`], its body by length or chunks) and writing one answer, whole or as
//! server-sent events, each event its own flushed chunk so the client really streams.

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upper bound on a request's head (request line plus headers).
const MAX_HEAD_BYTES: u64 = 64 * 1024;

/// One request as read off the wire.
#[derive(Debug)]
pub(super) struct HttpRequest {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: Option<String>,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
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
pub(super) enum Answer {
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

/// Writes `answer` on `stream` and closes it.
pub(super) async fn write_answer(mut stream: TcpStream, answer: Answer) -> std::io::Result<()> {
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
pub(super) async fn read_request<R: AsyncBufRead + Unpin>(
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
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path.to_owned(), Some(query.to_owned())),
        None => (target.to_owned(), None),
    };
    let headers: Vec<(String, String)> = lines[1..]
        .iter()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let mut request = HttpRequest {
        method,
        path,
        query,
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

pub(super) fn json_answer(status: u16, body: &Value) -> Answer {
    Answer::Whole {
        status,
        content_type: "application/json",
        body: body.to_string(),
    }
}
