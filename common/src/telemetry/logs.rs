//! The log side of telemetry: the stock `tracing` subscriber stack (registry + the log filter + one
//! fmt layer + the trace layer: OpenTelemetry's with export, `SpanIdsLayer` without), used with
//! export, a human format or directives that name spans (the default set-up's is `json_lines`),
//! and the event formats. `SKEIN_LOG` filters (default `info`; by target, or through an
//! `EnvFilter` when it names spans or fields); `SKEIN_LOG_FORMAT=json` (the default when stderr is
//! not a terminal) writes JSON lines, anything else a compact human format. Every line written
//! inside a span carries the OTel trace id (JSON lines also the span id) so logs and traces join
//! up.

use std::fmt;
use std::io::IsTerminal;

use opentelemetry::trace::{SpanId, TraceId};
use tracing::subscriber::Interest;
use tracing::{span, Event, Metadata, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::json_fields::JsonSpanFields;
use crate::config::{ENV_LOG, ENV_LOG_FORMAT};

/// Crates whose spans never go to the trace exporter: the exporter's own transport would
/// otherwise trace its exports (and those traces' exports, and so on).
const TRANSPORT_TARGETS: &[&str] = &[
    "h2",
    "hyper",
    "tonic",
    "tower",
    "reqwest",
    "rustls",
    "opentelemetry",
];

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// One JSON object a line, event fields flattened.
    Json,
    /// Compact text, coloured when `ansi`.
    Human { ansi: bool },
}

impl LogFormat {
    /// From `SKEIN_LOG_FORMAT`, else JSON unless stderr is a terminal.
    pub(crate) fn from_env() -> Self {
        let terminal = std::io::stderr().is_terminal();
        let json = match std::env::var(ENV_LOG_FORMAT) {
            Ok(format) => format == "json",
            Err(_) => !terminal,
        };
        if json {
            Self::Json
        } else {
            Self::Human {
                ansi: terminal && std::env::var_os("NO_COLOR").is_none(),
            }
        }
    }
}

/// What `SKEIN_LOG` lets through. Directives of targets and levels alone (`info`,
/// `warn,skein_common=debug`) make a filter by target, which keeps nothing about spans; a
/// directive that names spans or fields (`skein_lead[invoke_agent{gen_ai.conversation.id=s1}]=debug`)
/// needs an `EnvFilter`, which notes the spans it matches and looks each one up whenever it is
/// entered, left or closed: at `info`, on every poll of an instrumented future.
#[derive(Debug)]
pub(crate) enum LogFilter {
    ByTarget(Targets),
    BySpan(Box<EnvFilter>),
}

impl LogFilter {
    /// `directives` in `EnvFilter`'s syntax, or why they are not.
    pub(crate) fn parse(directives: &str) -> Result<Self, String> {
        let names_spans = directives.contains(['[', '{']);
        if names_spans || directives.trim().is_empty() {
            return EnvFilter::try_new(directives)
                .map(|filter| Self::BySpan(Box::new(filter)))
                .map_err(|e| e.to_string());
        }
        directives
            .parse::<Targets>()
            .map(Self::ByTarget)
            .map_err(|e| e.to_string())
    }

    /// The filter from `SKEIN_LOG`, `info` when unset or unparsable.
    pub(crate) fn from_env() -> Self {
        std::env::var(ENV_LOG)
            .ok()
            .and_then(|directives| Self::parse(&directives).ok())
            .unwrap_or_else(|| Self::ByTarget(Targets::new().with_default(LevelFilter::INFO)))
    }
}

impl<S> Filter<S> for LogFilter
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        match self {
            Self::ByTarget(targets) => Filter::<S>::enabled(targets, meta, cx),
            Self::BySpan(filter) => Filter::<S>::enabled(&**filter, meta, cx),
        }
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        match self {
            Self::ByTarget(targets) => Filter::<S>::callsite_enabled(targets, meta),
            Self::BySpan(filter) => Filter::<S>::callsite_enabled(&**filter, meta),
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        match self {
            Self::ByTarget(targets) => Filter::<S>::max_level_hint(targets),
            Self::BySpan(filter) => Filter::<S>::max_level_hint(&**filter),
        }
    }

    // A filter by target keeps nothing about spans; only an `EnvFilter` hears of them.

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, cx: Context<'_, S>) {
        if let Self::BySpan(filter) = self {
            Filter::<S>::on_new_span(&**filter, attrs, id, cx);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, cx: Context<'_, S>) {
        if let Self::BySpan(filter) = self {
            Filter::<S>::on_record(&**filter, id, values, cx);
        }
    }

    fn on_enter(&self, id: &span::Id, cx: Context<'_, S>) {
        if let Self::BySpan(filter) = self {
            Filter::<S>::on_enter(&**filter, id, cx);
        }
    }

    fn on_exit(&self, id: &span::Id, cx: Context<'_, S>) {
        if let Self::BySpan(filter) = self {
            Filter::<S>::on_exit(&**filter, id, cx);
        }
    }

    fn on_close(&self, id: span::Id, cx: Context<'_, S>) {
        if let Self::BySpan(filter) = self {
            Filter::<S>::on_close(&**filter, id, cx);
        }
    }
}

/// The spans that are traced: `info` and above whatever `SKEIN_LOG` says (the log filter decides
/// what is logged, not what is traced), except the exporter's transport's.
pub(crate) fn traced_targets() -> Targets {
    TRANSPORT_TARGETS.iter().fold(
        Targets::new().with_default(LevelFilter::INFO),
        |t, target| t.with_target(*target, LevelFilter::OFF),
    )
}

/// The OpenTelemetry layer of a process that exports its spans, sending them to `tracer`.
pub(crate) fn exported_spans<T>(tracer: T) -> impl Layer<Registry> + Send + Sync + 'static
where
    T: opentelemetry::trace::Tracer + Send + Sync + 'static,
    T::Span: Send + Sync,
{
    // A span carries the attributes Skein gives it, none of the layer's defaults: its code
    // location and target (its name says what it is), the thread that opened it (a task moves
    // between threads), busy and idle times (two more clock reads on every poll of every
    // instrumented future). Each would be kept with every open span, that is with every turn in
    // flight. (Entering a span still makes its context the current one: that starts the span,
    // and a log line inside it reads the trace id from the started span.)
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
}

/// The full subscriber: `filter` gates everything, spans (minus the exporter's transport) go to
/// `spans` (the OpenTelemetry layer, or `SpanIdsLayer` without export), events are written to
/// `writer` in `format`.
pub(crate) fn subscriber<L, W>(
    filter: LogFilter,
    spans: L,
    format: LogFormat,
    writer: W,
) -> impl Subscriber + Send + Sync + 'static
where
    L: Layer<Registry> + Send + Sync + 'static,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let spans = spans.with_filter(traced_targets());
    let (json, human) = match format {
        LogFormat::Json => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_ansi(false)
                    .fmt_fields(JsonSpanFields)
                    .event_format(WithTraceIds {
                        inner: tracing_subscriber::fmt::format().json().flatten_event(true),
                        style: IdStyle::Json,
                    })
                    .with_filter(filter),
            ),
            None,
        ),
        LogFormat::Human { ansi } => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_ansi(ansi)
                    .event_format(WithTraceIds {
                        inner: tracing_subscriber::fmt::format().compact().with_ansi(ansi),
                        style: IdStyle::Human,
                    })
                    .with_filter(filter),
            ),
        ),
    };
    Registry::default().with(spans).with(json).with(human)
}

/// Where the ids go in a line.
#[derive(Debug, Clone, Copy)]
enum IdStyle {
    /// `"trace_id"` and `"span_id"` members added to the object.
    Json,
    /// ` trace_id=…` appended to the line.
    Human,
}

/// Wraps a stock event format, adding the OTel ids of the event's span to each line.
struct WithTraceIds<F> {
    inner: F,
    style: IdStyle,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = otel_ids(ctx) else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.trim_end_matches('\n');
        match self.style {
            IdStyle::Json => match body.strip_suffix('}') {
                Some(open) => writeln!(
                    writer,
                    r#"{open},"trace_id":"{trace_id}","span_id":"{span_id}"}}"#
                ),
                None => writeln!(writer, "{body}"),
            },
            IdStyle::Human => writeln!(writer, "{body} trace_id={trace_id}"),
        }
    }
}

/// The ids of the nearest enclosing span the trace layer knows, when its trace id is valid: kept
/// from its opening without export, once it has started (entering it starts it) with export.
fn otel_ids<S, N>(ctx: &FmtContext<'_, S, N>) -> Option<(TraceId, SpanId)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let scope = ctx.event_scope()?;
    for span in scope {
        let extensions = span.extensions();
        if let Some(kept) = super::unexported::kept_context(&extensions) {
            return kept.is_valid().then(|| (kept.trace_id(), kept.span_id()));
        }
        let Some(data) = extensions.get::<OtelData>() else {
            continue;
        };
        let trace_id = data.trace_id().filter(|id| *id != TraceId::INVALID)?;
        let span_id = data.span_id()?;
        return Some((trace_id, span_id));
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use serde_json::json;

    use super::*;
    use crate::telemetry::span_trace_id;

    /// Collects written log bytes.
    #[derive(Clone, Default)]
    pub(in crate::telemetry) struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        pub(in crate::telemetry) fn lines(&self) -> Vec<String> {
            let bytes = self.0.lock().expect("buffer lock").clone();
            String::from_utf8(bytes)
                .expect("utf-8 log output")
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    impl io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("buffer lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn log_with(
        format: LogFormat,
        emit: impl FnOnce() -> Option<String>,
    ) -> (Vec<String>, Option<String>) {
        log_filtered("info", format, emit)
    }

    fn log_filtered(
        directives: &str,
        format: LogFormat,
        emit: impl FnOnce() -> Option<String>,
    ) -> (Vec<String>, Option<String>) {
        let buffer = Buffer::default();
        let provider = SdkTracerProvider::builder().build();
        let subscriber = subscriber(
            LogFilter::parse(directives).expect("a filter"),
            exported_spans(provider.tracer("test")),
            format,
            buffer.clone(),
        );
        let trace_id = tracing::subscriber::with_default(subscriber, emit);
        (buffer.lines(), trace_id)
    }

    fn is_hex(s: &str, len: usize) -> bool {
        s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit())
    }

    #[test]
    fn directives_of_targets_and_levels_filter_by_target_and_others_through_an_env_filter() {
        let kind = |directives: &str| match LogFilter::parse(directives) {
            Ok(LogFilter::ByTarget(_)) => "by target",
            Ok(LogFilter::BySpan(_)) => "by span",
            Err(_) => "refused",
        };
        assert_eq!(kind("info"), "by target");
        assert_eq!(kind("warn,skein_common=debug,async_nats=off"), "by target");
        assert_eq!(kind("skein_lead[invoke_agent]=debug"), "by span");
        assert_eq!(kind("warn,[turn{session=s1}]=debug"), "by span");
        assert_eq!(
            kind(""),
            "by span",
            "an empty filter means what it means to EnvFilter"
        );
        assert_eq!(kind("info,skein=loud"), "refused");
        assert_eq!(kind("[turn=debug"), "refused");
    }

    /// The messages of the lines `directives` lets through, of events at several targets and
    /// levels, inside and outside a span named `turn`.
    fn messages_through(directives: &str) -> Vec<String> {
        let (lines, _) = log_filtered(directives, LogFormat::Json, || {
            tracing::debug!(target: "chosen", "chosen debug");
            tracing::info!(target: "other", "other info");
            tracing::warn!(target: "other", "other warn");
            let turn = tracing::info_span!("turn", session = "s1");
            let _entered = turn.enter();
            tracing::debug!(target: "other", "other debug in turn");
            None
        });
        lines
            .iter()
            .map(|line| {
                let line: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
                line["message"].as_str().expect("a message").to_owned()
            })
            .collect()
    }

    #[test]
    fn either_filter_lets_through_what_its_directives_say() {
        assert_eq!(messages_through("info"), ["other info", "other warn"]);
        assert_eq!(
            messages_through("warn,chosen=debug"),
            ["chosen debug", "other warn"]
        );
        assert_eq!(
            messages_through("warn,[turn]=debug"),
            ["other warn", "other debug in turn"]
        );
        assert_eq!(
            messages_through("warn,[turn{session=s2}]=debug"),
            ["other warn"]
        );
    }

    #[test]
    fn json_lines_carry_the_span_ids() {
        let (lines, trace_id) = log_with(LogFormat::Json, || {
            let span = tracing::info_span!("turn", session = "s1");
            let _entered = span.enter();
            tracing::info!(step = 3, "hello");
            span_trace_id(&span)
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line: serde_json::Value = serde_json::from_str(&lines[0]).expect("a JSON line");
        assert_eq!(line["message"], "hello");
        assert_eq!(line["step"], 3);
        assert_eq!(line["span"]["session"], "s1");
        let logged = line["trace_id"].as_str().expect("trace_id");
        assert!(is_hex(logged, 32), "{logged}");
        assert_eq!(Some(logged.to_owned()), trace_id);
        assert!(is_hex(line["span_id"].as_str().expect("span_id"), 16));
    }

    #[test]
    fn json_lines_carry_span_fields_recorded_after_the_span_opened() {
        let (lines, _) = log_with(LogFormat::Json, || {
            let turn = tracing::info_span!("turn", session = "s1", status = tracing::field::Empty);
            let _turn = turn.enter();
            let call = tracing::info_span!("call", tool = "noop", attempt = 1_u64);
            call.record("attempt", 2_u64);
            turn.record("status", "running");
            let _call = call.enter();
            tracing::warn!("slow");
            None
        });
        let line: serde_json::Value = serde_json::from_str(&lines[0]).expect("a JSON line");
        assert_eq!(
            line["span"],
            json!({"name": "call", "tool": "noop", "attempt": 2})
        );
        assert_eq!(
            line["spans"],
            json!([
                {"name": "turn", "session": "s1", "status": "running"},
                {"name": "call", "tool": "noop", "attempt": 2},
            ])
        );
    }

    /// The trace ids of a turn span, of a child opened under it and of a span given a remote
    /// parent, under `subscriber`.
    fn ids_without_export(
        subscriber: impl Subscriber + Send + Sync + 'static,
    ) -> (String, Option<String>, Option<String>) {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let (turn, call, remote) = tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("turn", session = "s1");
            let _entered = span.enter();
            tracing::info!("hello");
            let child = tracing::info_span!("call");
            let call = span_trace_id(&child);
            // A remote parent (a message's `traceparent`) is continued as with export.
            let received = tracing::info_span!("process");
            let remote = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("traceparent", remote);
            crate::telemetry::propagation::set_parent_or_recorded(&received, Some(&headers), None);
            (span_trace_id(&span), call, span_trace_id(&received))
        });
        (turn.expect("the turn span has a trace id"), call, remote)
    }

    /// A provider as a process that exports nothing has.
    pub(in crate::telemetry) fn unexported_tracer() -> opentelemetry_sdk::trace::SdkTracer {
        SdkTracerProvider::builder()
            .with_span_limits(crate::telemetry::unexported::limits())
            .build()
            .tracer("test")
    }

    #[test]
    fn without_export_spans_keep_their_ids_and_their_parents() {
        let (filtered, unfiltered) = (Buffer::default(), Buffer::default());
        let runs = [
            (
                ids_without_export(subscriber(
                    LogFilter::parse("info").expect("a filter"),
                    crate::telemetry::unexported::SpanIdsLayer::new(unexported_tracer()),
                    LogFormat::Json,
                    filtered.clone(),
                )),
                filtered,
            ),
            (
                ids_without_export(crate::telemetry::json_lines::subscriber(
                    "info".parse().expect("targets"),
                    traced_targets(),
                    crate::telemetry::unexported::SpanIdsLayer::new(unexported_tracer()),
                    unfiltered.clone(),
                )),
                unfiltered,
            ),
        ];
        for ((turn, call, remote), buffer) in runs {
            assert_eq!(
                call.as_deref(),
                Some(turn.as_str()),
                "the child is in its parent's trace"
            );
            assert_eq!(remote.as_deref(), Some("0af7651916cd43dd8448eb211c80319c"));
            let lines = buffer.lines();
            let line: serde_json::Value = serde_json::from_str(&lines[0]).expect("a JSON line");
            assert_eq!(line["trace_id"].as_str(), Some(turn.as_str()));
        }
    }

    #[test]
    fn json_lines_outside_spans_have_no_ids() {
        let (lines, _) = log_with(LogFormat::Json, || {
            tracing::info!("no span");
            None
        });
        let line: serde_json::Value = serde_json::from_str(&lines[0]).expect("a JSON line");
        assert_eq!(line["message"], "no span");
        assert!(line.get("trace_id").is_none());
        assert!(line.get("span_id").is_none());
    }

    #[test]
    fn human_lines_end_with_the_trace_id() {
        let (lines, trace_id) = log_with(LogFormat::Human { ansi: false }, || {
            let span = tracing::info_span!("turn");
            let _entered = span.enter();
            tracing::warn!("careful");
            span_trace_id(&span)
        });
        let trace_id = trace_id.expect("a valid trace id");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("careful"), "{}", lines[0]);
        assert!(
            lines[0].ends_with(&format!(" trace_id={trace_id}")),
            "{}",
            lines[0]
        );
    }

    /// Keeps the spans it is given.
    #[derive(Clone, Debug, Default)]
    struct Kept(Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

    impl opentelemetry_sdk::trace::SpanExporter for Kept {
        async fn export(
            &self,
            batch: Vec<opentelemetry_sdk::trace::SpanData>,
        ) -> opentelemetry_sdk::error::OTelSdkResult {
            self.0.lock().expect("kept spans").extend(batch);
            Ok(())
        }
    }

    #[test]
    fn a_span_carries_its_own_attributes_and_none_of_the_layers_defaults() {
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .build();
        let subscriber = subscriber(
            LogFilter::parse("info").expect("a filter"),
            exported_spans(provider.tracer("test")),
            LogFormat::Json,
            Buffer::default(),
        );
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("execute_tool", "gen_ai.tool.name" = "noop");
            // Entered and left twice, as an instrumented future is polled, with a child opened
            // inside.
            drop(span.enter());
            let _entered = span.enter();
            let child = tracing::info_span!("publish");
            drop(child.enter());
        });
        let spans = kept.0.lock().expect("kept spans");
        assert_eq!(spans.len(), 2, "{spans:?}");
        let (child, parent) = (&spans[0], &spans[1]);
        assert_eq!((&*child.name, &*parent.name), ("publish", "execute_tool"));
        let keys: Vec<&str> = parent.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["gen_ai.tool.name"]);
        assert!(child.attributes.is_empty(), "{:?}", child.attributes);
        // The child is in its parent's trace, under it.
        let parent_context = &parent.span_context;
        assert_eq!(child.span_context.trace_id(), parent_context.trace_id());
        assert_eq!(child.parent_span_id, parent_context.span_id());
    }

    #[test]
    fn transport_spans_are_not_traced() {
        let (_, trace_id) = log_with(LogFormat::Json, || {
            let span = tracing::info_span!(target: "hyper::client", "connect");
            let _entered = span.enter();
            span_trace_id(&span)
        });
        assert_eq!(trace_id, None);
    }
}
