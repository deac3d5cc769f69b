//! Telemetry set-up shared by every binary: the global `tracing` subscriber (logs, see [`logs`]),
//! OpenTelemetry traces exported over OTLP when an endpoint is configured, metrics pushed over
//! OTLP as well ([`metrics_export`]), W3C trace-context propagation over NATS headers
//! ([`propagation`]), and the guard that flushes traces on exit.
//!
//! Spans always get OpenTelemetry ids, export or not, so trace context crosses processes and log
//! lines carry a `trace_id` even when nothing is sent to a collector. Without an exporter they keep
//! nothing else ([`unexported`]).
//!
//! Export runs on the SDK's batch thread, off every caller's path. The OTLP clients (async
//! reqwest, tonic) need a tokio reactor, which that thread lacks, so the exporter owns a small
//! tokio runtime of its own: exports neither depend on nor block the application's runtime.

mod json_fields;
mod json_lines;
mod logs;
mod metrics_export;
pub mod propagation;
mod unexported;

pub use metrics_export::export_metrics;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::{ENV_K8S_NAMESPACE, ENV_K8S_POD, ENV_TRACE_CONTENT};

/// OTLP over HTTP with protobuf bodies.
const PROTOCOL_HTTP: &str = "http/protobuf";
/// OTLP over gRPC.
const PROTOCOL_GRPC: &str = "grpc";
/// Where OTLP/HTTP takes traces, under the endpoint.
const TRACES_PATH: &str = "/v1/traces";
/// Longest one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest the guard waits for the last traces to leave.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);

static INSTALLED: AtomicBool = AtomicBool::new(false);
static RECORD_CONTENT: AtomicBool = AtomicBool::new(false);
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Where traces go, and what spans may record.
#[derive(Debug, Clone, clap::Args)]
pub struct TelemetryConfig {
    /// OTLP endpoint (collector/Jaeger), e.g. http://jaeger:4318 (http/protobuf) or
    /// http://jaeger:4317 (grpc). Unset: no export.
    #[arg(
        id = "otlp_endpoint",
        long = "otlp-endpoint",
        env = "OTEL_EXPORTER_OTLP_ENDPOINT"
    )]
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    #[arg(
        id = "otlp_protocol",
        long = "otlp-protocol",
        env = "OTEL_EXPORTER_OTLP_PROTOCOL"
    )]
    #[arg(default_value = PROTOCOL_HTTP)]
    pub otlp_protocol: String,
    /// Turns trace export off.
    #[arg(
        id = "otel_disabled",
        long = "otel-disabled",
        env = "OTEL_SDK_DISABLED"
    )]
    #[arg(default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub disabled: bool,
    /// Record prompt and tool contents in spans (off by default; never secrets).
    #[arg(id = "trace_content", long = "trace-content", env = ENV_TRACE_CONTENT)]
    #[arg(default_value_t = false, action = clap::ArgAction::Set)]
    pub record_content: bool,
    /// Where metrics go besides `/metrics`, comma-separated: `otlp` (pushed to the OTLP
    /// endpoint), `prometheus` (scraped from `/metrics` only) or `none`.
    #[arg(
        id = "metrics_exporter",
        long = "otel-metrics-exporter",
        env = "OTEL_METRICS_EXPORTER"
    )]
    #[arg(default_value = "otlp")]
    pub metrics_exporter: String,
    /// Milliseconds between two OTLP metric exports.
    #[arg(
        id = "metric_export_interval",
        long = "otel-metric-export-interval",
        env = "OTEL_METRIC_EXPORT_INTERVAL"
    )]
    #[arg(default_value_t = 60_000)]
    pub metric_export_interval_ms: u64,
    /// Where OTLP metrics go (OTLP/HTTP, used as given), e.g.
    /// http://collector:4318/v1/metrics. Unset: `{endpoint}/v1/metrics`.
    #[arg(
        id = "otlp_metrics_endpoint",
        long = "otlp-metrics-endpoint",
        env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
    )]
    pub otlp_metrics_endpoint: Option<String>,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Http,
    Grpc,
}

impl TelemetryConfig {
    /// No export, no content recording.
    pub fn off() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_protocol: PROTOCOL_HTTP.to_owned(),
            disabled: true,
            record_content: false,
            metrics_exporter: "none".to_owned(),
            metric_export_interval_ms: 60_000,
            otlp_metrics_endpoint: None,
        }
    }

    /// Checks values clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        self.transport()?;
        if let Some(endpoint) = self.endpoint() {
            check_endpoint(endpoint)?;
        }
        metrics_export::validate(self)
    }

    fn transport(&self) -> Result<Transport, String> {
        match self.otlp_protocol.as_str() {
            PROTOCOL_HTTP => Ok(Transport::Http),
            PROTOCOL_GRPC => Ok(Transport::Grpc),
            other => Err(format!(
                "OTLP protocol {other:?} is not supported (use {PROTOCOL_HTTP} or {PROTOCOL_GRPC})"
            )),
        }
    }

    /// The endpoint to export to, if export is on.
    fn endpoint(&self) -> Option<&str> {
        self.otlp_endpoint
            .as_deref()
            .map(str::trim)
            .filter(|endpoint| !endpoint.is_empty())
    }
}

/// Checks that `endpoint` is an `http://` or `https://` URL with a host.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(endpoint)
        .map_err(|e| format!("OTLP endpoint {endpoint:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "OTLP endpoint {endpoint:?} must be http:// or https://"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("OTLP endpoint {endpoint:?} has no host"));
    }
    Ok(())
}

/// Why trace export could not be set up (the process then runs without it).
#[derive(Debug, thiserror::Error)]
enum ExportSetupError {
    #[error("{0}")]
    Config(String),
    #[error("cannot start the export runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Installs the global subscriber and, when `cfg` asks for it, trace export; sets the W3C
/// propagator. A second call is a no-op (the first configuration stays) that still returns a
/// guard. Export set-up failures are logged; the process carries on without export.
pub fn init(service: &str, instance: &str, cfg: &TelemetryConfig) -> TelemetryGuard {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return TelemetryGuard { provider: None };
    }
    RECORD_CONTENT.store(cfg.record_content, Ordering::Relaxed);
    let exporter = cfg.endpoint().filter(|_| !cfg.disabled).map(|endpoint| {
        let transport = cfg.transport().map_err(ExportSetupError::Config)?;
        RuntimeExporter::new(transport, endpoint)
    });
    let (exporter, export_error) = match exporter.transpose() {
        Ok(exporter) => (exporter, None),
        Err(e) => (None, Some(e)),
    };
    let resource = resource(service, instance);
    let metrics_export = metrics_export::MetricsExport::from_config(cfg, &resource);
    let exporting = exporter.is_some();
    let provider = tracer_provider(resource, exporter);
    let scope = InstrumentationScope::builder("skein")
        .with_version(crate::VERSION)
        .build();
    let tracer = provider.tracer_with_scope(scope);
    let (filter, format) = (logs::LogFilter::from_env(), logs::LogFormat::from_env());
    let installed = if exporting {
        let spans = logs::exported_spans(tracer);
        let subscriber = logs::subscriber(filter, spans, format, std::io::stderr);
        tracing::subscriber::set_global_default(subscriber)
    } else {
        let spans = unexported::SpanIdsLayer::new(tracer);
        match (filter, format) {
            // The default: no layer behind a filter of its own (`json_lines`).
            (logs::LogFilter::ByTarget(logged), logs::LogFormat::Json) => {
                let traced = logs::traced_targets();
                let subscriber = json_lines::subscriber(logged, traced, spans, std::io::stderr);
                tracing::subscriber::set_global_default(subscriber)
            }
            (filter, format) => {
                let subscriber = logs::subscriber(filter, spans, format, std::io::stderr);
                tracing::subscriber::set_global_default(subscriber)
            }
        }
    };
    if installed.is_err() {
        // Someone else owns the global subscriber; nothing of ours would ever see a span.
        return TelemetryGuard { provider: None };
    }
    EXPORTING.store(exporting, Ordering::Relaxed);
    tracing::debug!(
        service,
        instance,
        export = cfg.endpoint(),
        "telemetry initialised"
    );
    if let Some(e) = export_error {
        tracing::warn!(service, error = %e, "trace export disabled");
    }
    // Metrics are exported by the process's own metrics task (`export_metrics`).
    if let Some(export) = metrics_export {
        export.install();
    }
    TelemetryGuard {
        provider: Some(provider),
    }
}

/// Logs only, for commands that export nothing: [`init`] with [`TelemetryConfig::off`].
pub fn init_logs(service: &str) -> TelemetryGuard {
    init(service, service, &TelemetryConfig::off())
}

/// Flushes and shuts trace export down when dropped (kept by `main` for the life of the
/// process). Dropping never takes much longer than 5 s, even with the collector down.
#[must_use = "traces are flushed when the guard drops"]
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // The flush blocks; a helper thread lets us stop waiting when the budget is spent.
        let (done, finished) = std::sync::mpsc::channel();
        let flusher = std::thread::Builder::new()
            .name("skein-otel-shutdown".into())
            .spawn(move || {
                let started = Instant::now();
                let _ = provider.force_flush();
                let left = SHUTDOWN_BUDGET.saturating_sub(started.elapsed());
                let _ = provider.shutdown_with_timeout(left.max(Duration::from_millis(100)));
                let _ = done.send(());
            });
        if flusher.is_ok() {
            let _ = finished.recv_timeout(SHUTDOWN_BUDGET);
        }
    }
}

/// Whether spans may record prompt and tool contents (set by [`init`]; off until then).
pub fn record_content() -> bool {
    RECORD_CONTENT.load(Ordering::Relaxed)
}

/// Whether this process sends its spans to a collector (set by [`init`]; off until then). Without
/// export, a span that would only stand between its parent and the next hop is not made: the
/// parent's ids travel in its place (see `Bus::publish_traced`).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The 32-hex trace id of the current span, if it has a valid one.
pub fn current_trace_id() -> Option<String> {
    trace_id_hex(&current_span_context())
}

/// The 32-hex trace id of `span`, if it has a valid one. This starts the span's OpenTelemetry
/// side, fixing its parent: set a remote parent first.
pub fn span_trace_id(span: &tracing::Span) -> Option<String> {
    trace_id_hex(&span_context(span))
}

/// The 32-hex trace id of `span_context`, if it is valid.
fn trace_id_hex(span_context: &SpanContext) -> Option<String> {
    span_context.is_valid().then(|| {
        let mut hex = String::with_capacity(32);
        crate::text::push_hex(&mut hex, &span_context.trace_id().to_bytes());
        hex
    })
}

/// The OpenTelemetry context of `span` (ids, flags, trace state), whichever layer keeps it;
/// empty when it has none. With export this starts the span's OpenTelemetry side, fixing its
/// parent: set a remote parent first.
pub(crate) fn span_context(span: &tracing::Span) -> SpanContext {
    unexported::span_context(span).unwrap_or_else(|| span.context().span().span_context().clone())
}

/// [`span_context`] of the current span; without export, read without taking a handle on it.
pub(crate) fn current_span_context() -> SpanContext {
    unexported::current_span_context().unwrap_or_else(|| span_context(&tracing::Span::current()))
}

/// Makes `parent` (a remote context) the parent of `span`, whichever layer keeps its context.
/// Does nothing to a span already started with export, or disabled, or without telemetry.
pub(crate) fn set_span_parent(span: &tracing::Span, parent: Context) {
    if unexported::set_parent(span, &parent).is_none() {
        // The only failures are "already started", "span disabled" and "no OpenTelemetry layer";
        // in each the span simply keeps its local parent.
        let _ = span.set_parent(parent);
    }
}

/// Who is reporting: service, version, instance, pod; plus `OTEL_RESOURCE_ATTRIBUTES`.
fn resource(service: &str, instance: &str) -> Resource {
    let mut attributes = vec![
        KeyValue::new("service.version", crate::VERSION),
        KeyValue::new("service.instance.id", instance.to_owned()),
    ];
    for (key, var) in [
        ("k8s.pod.name", ENV_K8S_POD),
        ("k8s.namespace.name", ENV_K8S_NAMESPACE),
    ] {
        if let Some(value) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
            attributes.push(KeyValue::new(key, value));
        }
    }
    Resource::builder()
        .with_service_name(service.to_owned())
        .with_attributes(attributes)
        .build()
}

/// Spans get ids either way; with an exporter they are batched (`OTEL_BSP_*` apply) and sent.
fn tracer_provider(resource: Resource, exporter: Option<RuntimeExporter>) -> SdkTracerProvider {
    let builder = SdkTracerProvider::builder().with_resource(resource);
    match exporter {
        Some(exporter) => {
            builder.with_span_processor(BatchSpanProcessor::builder(exporter).build())
        }
        // Nothing is exported: spans keep their ids and nothing more.
        None => builder.with_span_limits(unexported::limits()),
    }
    .build()
}

/// The OTLP/HTTP URL for traces: `endpoint` + `/v1/traces` unless it already ends so.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// An OTLP exporter driven on its own single-worker tokio runtime, so the SDK's batch thread
/// can export with async clients and exports never wait on the application's runtime.
#[derive(Debug)]
struct RuntimeExporter {
    inner: opentelemetry_otlp::SpanExporter,
    /// Taken on drop to shut down without blocking.
    runtime: Option<tokio::runtime::Runtime>,
}

impl RuntimeExporter {
    fn new(transport: Transport, endpoint: &str) -> Result<Self, ExportSetupError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("skein-otel-export")
            .enable_all()
            .build()
            .map_err(ExportSetupError::Runtime)?;
        // The gRPC channel spawns its worker on the runtime current while it is built.
        let in_runtime = runtime.enter();
        let inner = match transport {
            Transport::Http => {
                let client = reqwest::Client::builder()
                    .timeout(EXPORT_TIMEOUT)
                    .build()
                    .map_err(ExportSetupError::HttpClient)?;
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(traces_url(endpoint))
                    .with_timeout(EXPORT_TIMEOUT)
                    .build()?
            }
            Transport::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()?,
        };
        drop(in_runtime);
        Ok(Self {
            inner,
            runtime: Some(runtime),
        })
    }

    fn export_blocking(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let Some(runtime) = &self.runtime else {
            return Err(OTelSdkError::AlreadyShutdown);
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking on our runtime from inside another would panic.
            return Err(OTelSdkError::InternalFailure(
                "span export must run on the batch processor's thread".into(),
            ));
        }
        runtime.block_on(async {
            tokio::time::timeout(EXPORT_TIMEOUT, self.inner.export(batch))
                .await
                .unwrap_or(Err(OTelSdkError::Timeout(EXPORT_TIMEOUT)))
        })
    }
}

impl SpanExporter for RuntimeExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.export_blocking(batch)
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl Drop for RuntimeExporter {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    use opentelemetry::trace::Tracer as _;

    use super::*;

    fn exporting_to(endpoint: &str, protocol: &str) -> TelemetryConfig {
        TelemetryConfig {
            otlp_endpoint: Some(endpoint.to_owned()),
            otlp_protocol: protocol.to_owned(),
            ..TelemetryConfig::off()
        }
    }

    #[test]
    fn validate_checks_protocol_and_endpoint() {
        assert_eq!(TelemetryConfig::off().validate(), Ok(()));
        for (endpoint, protocol) in [
            ("http://jaeger:4318", PROTOCOL_HTTP),
            ("https://otel.example/", PROTOCOL_HTTP),
            ("http://jaeger:4317", PROTOCOL_GRPC),
            ("  ", PROTOCOL_HTTP),
        ] {
            assert_eq!(exporting_to(endpoint, protocol).validate(), Ok(()));
        }
        for (endpoint, protocol) in [
            ("http://jaeger:4318", "http/json"),
            ("http://jaeger:4318", ""),
            ("jaeger:4318", PROTOCOL_HTTP),
            ("ftp://jaeger", PROTOCOL_HTTP),
            ("http://", PROTOCOL_GRPC),
            ("not a url", PROTOCOL_HTTP),
        ] {
            let verdict = exporting_to(endpoint, protocol).validate();
            assert!(verdict.is_err(), "{endpoint} {protocol} accepted");
        }
    }

    #[test]
    fn http_traces_url_appends_the_signal_path_once() {
        for endpoint in ["http://j:4318", "http://j:4318/", "http://j:4318/v1/traces"] {
            assert_eq!(traces_url(endpoint), "http://j:4318/v1/traces");
        }
        assert_eq!(traces_url("http://j/otlp"), "http://j/otlp/v1/traces");
    }

    /// A one-request collector on a plain thread: it answers 200 when `answer`, else holds the
    /// connection open without a word. Returns its endpoint and the request it received (head
    /// and body, lossily as text).
    fn fake_collector(answer: bool) -> (String, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let endpoint = format!("http://{}", listener.local_addr().expect("local addr"));
        let (received, requests) = mpsc::channel();
        std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            if !answer {
                return std::thread::sleep(Duration::from_secs(10));
            }
            // The client sends the whole request, then waits: a pause means it is all here.
            let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
            let (mut bytes, mut chunk) = (Vec::new(), [0u8; 4096]);
            while let Ok(n @ 1..) = stream.read(&mut chunk) {
                bytes.extend_from_slice(&chunk[..n]);
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
            let _ = received.send(String::from_utf8_lossy(&bytes).into_owned());
        });
        (endpoint, requests)
    }

    /// Exports one span named `span` and drops the guard; how long the drop took.
    fn export_one_span(endpoint: &str, transport: Transport, span: &'static str) -> Duration {
        let exporter = RuntimeExporter::new(transport, endpoint).expect("an exporter");
        let provider = tracer_provider(resource("skein-test", "test-1"), Some(exporter));
        provider.tracer("test").in_span(span, |_| {});
        let started = Instant::now();
        drop(TelemetryGuard {
            provider: Some(provider),
        });
        started.elapsed()
    }

    // A current-thread test runtime: export must not need the caller's runtime to make progress.
    #[tokio::test]
    async fn spans_are_exported_over_http_when_the_guard_drops() {
        let (endpoint, requests) = fake_collector(true);
        assert!(export_one_span(&endpoint, Transport::Http, "exported-span") < SHUTDOWN_BUDGET);
        let request = requests
            .recv_timeout(Duration::from_secs(1))
            .expect("the collector got a request");
        assert!(request.starts_with("POST /v1/traces "), "{request}");
        assert!(request.to_lowercase().contains("application/x-protobuf"));
        for expected in ["exported-span", "skein-test", "test-1", crate::VERSION] {
            assert!(request.contains(expected), "{expected} missing");
        }
    }

    #[tokio::test]
    async fn a_silent_collector_does_not_hold_up_the_exit() {
        let (endpoint, _requests) = fake_collector(false);
        let waited = export_one_span(&endpoint, Transport::Http, "stuck-span");
        assert!(
            waited < SHUTDOWN_BUDGET + Duration::from_millis(500),
            "{waited:?}"
        );
    }

    #[test]
    fn grpc_export_to_a_closed_port_shuts_down_quickly() {
        let waited = export_one_span("http://127.0.0.1:9", Transport::Grpc, "unsent-span");
        assert!(waited < SHUTDOWN_BUDGET, "{waited:?}");
    }
}
