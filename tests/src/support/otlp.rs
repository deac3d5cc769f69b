//! An OTLP/HTTP receiver for tests: accepts `POST /v1/traces` with a protobuf
//! `ExportTraceServiceRequest` (decoded with the real OpenTelemetry protocol types) and keeps every
//! span, flattened, so a test can check what lead and worker processes exported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One received span.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
}

/// A running receiver; stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT` — what `OTEL_EXPORTER_OTLP_ENDPOINT` should be.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a free port");
        let port = listener.local_addr().expect("bound address").port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stored = spans.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve_connection(socket, stored.clone()));
            }
        });
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            spans,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves HTTP/1.1 requests on one connection until it closes.
async fn serve_connection(mut socket: TcpStream, spans: Arc<Mutex<Vec<ReceivedSpan>>>) {
    let mut buffer = Vec::new();
    loop {
        let Some(header_end) = read_until_headers(&mut socket, &mut buffer).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buffer[..header_end]).to_string();
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let body_start = header_end + 4;
        while buffer.len() < body_start + length {
            let mut chunk = vec![0u8; 64 * 1024];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let body = buffer[body_start..body_start + length].to_vec();
        buffer.drain(..body_start + length);
        let status = if head.starts_with("POST /v1/traces") {
            match ExportTraceServiceRequest::decode(body.as_slice()) {
                Ok(request) => {
                    if let Ok(mut stored) = spans.lock() {
                        stored.extend(flatten(request));
                    }
                    "200 OK"
                }
                Err(_) => "400 Bad Request",
            }
        } else {
            "404 Not Found"
        };
        let response = format!("HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n");
        if socket.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads until the end of the request head; returns its position.
async fn read_until_headers(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(end);
        }
        let mut chunk = vec![0u8; 16 * 1024];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let mut attrs = attributes(&span.attributes);
                for (key, value) in &resource {
                    attrs
                        .entry(format!("resource.{key}"))
                        .or_insert_with(|| value.clone());
                }
                out.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    attributes: attrs,
                });
            }
        }
    }
    out
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::ArrayValue(a)) => {
            a.values.iter().map(text).collect::<Vec<_>>().join(",")
        }
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
