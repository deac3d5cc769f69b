//! An OTLP/HTTP receiver for tests: accepts `POST /v1/traces` with a protobuf
//! `ExportTraceServiceRequest` and `POST /v1/metrics` with an `ExportMetricsServiceRequest`
//! (decoded with the real OpenTelemetry protocol types) and keeps every span and every metric data
//! point, flattened, so a test can check what lead and worker processes exported.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
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

/// One received metric data point (a sum's or gauge's value, or a histogram's count and sum).
#[derive(Debug, Clone)]
pub struct ReceivedPoint {
    pub service: String,
    /// The metric's name (`skein_turns`, `skein_turn_duration_seconds`, ...).
    pub metric: String,
    /// `sum`, `gauge` or `histogram`.
    pub kind: &'static str,
    pub unit: String,
    pub attributes: BTreeMap<String, String>,
    /// A sum's or gauge's value; a histogram's sum.
    pub value: f64,
    /// A histogram's count (0 otherwise).
    pub count: u64,
    /// The trace ids of a histogram's exemplars.
    pub exemplar_traces: Vec<String>,
    /// When the point was read (Unix nanoseconds): later exports carry later points.
    pub time_unix_nano: u64,
}

/// What the receiver keeps.
#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    points: Vec<ReceivedPoint>,
}

/// A running receiver; stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT` — what `OTEL_EXPORTER_OTLP_ENDPOINT` should be.
    pub endpoint: String,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a free port");
        let port = listener.local_addr().expect("bound address").port();
        let received = Arc::new(Mutex::new(Received::default()));
        let stored = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve_connection(socket, stored.clone()));
            }
        });
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            received,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received
            .lock()
            .map(|r| r.spans.clone())
            .unwrap_or_default()
    }

    /// Every metric data point received so far, oldest first.
    pub fn points(&self) -> Vec<ReceivedPoint> {
        self.received
            .lock()
            .map(|r| r.points.clone())
            .unwrap_or_default()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves HTTP/1.1 requests on one connection until it closes.
async fn serve_connection(mut socket: TcpStream, received: Arc<Mutex<Received>>) {
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
                    if let Ok(mut stored) = received.lock() {
                        stored.spans.extend(flatten(request));
                    }
                    "200 OK"
                }
                Err(_) => "400 Bad Request",
            }
        } else if head.starts_with("POST /v1/metrics") {
            match ExportMetricsServiceRequest::decode(body.as_slice()) {
                Ok(request) => {
                    if let Ok(mut stored) = received.lock() {
                        stored.points.extend(flatten_metrics(request));
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

fn flatten_metrics(request: ExportMetricsServiceRequest) -> Vec<ReceivedPoint> {
    let mut out = Vec::new();
    for resource_metrics in request.resource_metrics {
        let resource = resource_metrics
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_metrics.scope_metrics {
            for metric in scope.metrics {
                let point = |kind, attributes: &[KeyValue], time_unix_nano| ReceivedPoint {
                    service: service.clone(),
                    metric: metric.name.clone(),
                    kind,
                    unit: metric.unit.clone(),
                    attributes: self::attributes(attributes),
                    value: 0.0,
                    count: 0,
                    exemplar_traces: Vec::new(),
                    time_unix_nano,
                };
                let number = |value: &Option<number_data_point::Value>| match value {
                    Some(number_data_point::Value::AsInt(i)) => *i as f64,
                    Some(number_data_point::Value::AsDouble(d)) => *d,
                    None => f64::NAN,
                };
                match &metric.data {
                    Some(metric::Data::Sum(sum)) => {
                        for p in &sum.data_points {
                            out.push(ReceivedPoint {
                                value: number(&p.value),
                                ..point("sum", &p.attributes, p.time_unix_nano)
                            });
                        }
                    }
                    Some(metric::Data::Gauge(gauge)) => {
                        for p in &gauge.data_points {
                            out.push(ReceivedPoint {
                                value: number(&p.value),
                                ..point("gauge", &p.attributes, p.time_unix_nano)
                            });
                        }
                    }
                    Some(metric::Data::Histogram(histogram)) => {
                        for p in &histogram.data_points {
                            out.push(ReceivedPoint {
                                value: p.sum.unwrap_or(f64::NAN),
                                count: p.count,
                                exemplar_traces: p
                                    .exemplars
                                    .iter()
                                    .map(|e| hex(&e.trace_id))
                                    .collect(),
                                ..point("histogram", &p.attributes, p.time_unix_nano)
                            });
                        }
                    }
                    _ => {}
                }
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
