//! The subscriber of a process that exports no spans and logs JSON lines filtered by target (the
//! default: `SKEIN_LOG` of targets and levels, `SKEIN_LOG_FORMAT=json` or stderr not a terminal,
//! no OTLP endpoint): the registry, [`SpanIdsLayer`] and [`JsonLines`], neither of them behind a
//! per-layer filter.
//!
//! The stock stack puts each of its two layers behind a filter of its own, and a layer behind a
//! filter is looked up in the registry every time one of its spans is entered or left, to ask
//! whether that filter let it through: four lookups per poll of every instrumented future, though
//! neither layer does anything there. Here each layer checks the span's target and level itself
//! when the span opens, and the one callsite interest both need is [`JsonLines`]'s to give: a
//! callsite neither layer wants is never enabled, as before.
//!
//! Lines are what the stock JSON format writes (flattened event fields, the current span and
//! the span list with their fields, the OpenTelemetry ids added by the log layer), with one
//! difference: a line's ids come from the nearest traced span, logged or not, so a `warn` line
//! inside an `info` span carries its trace id when `SKEIN_LOG=warn`.

use std::fmt::{self, Write as _};
use std::io::Write as _;

use tracing::subscriber::Interest;
use tracing::{span, Event, Metadata, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::{Layer, Registry};

use super::json_fields::{add_members, write_json_string, write_members, write_new_object};
use super::unexported::{kept_context, SpanIdsLayer};

/// The subscriber: spans traced by `spans` as `traced` allows, lines and span fields as `logged`
/// allows, written to `writer`.
pub(super) fn subscriber<W>(
    logged: Targets,
    traced: Targets,
    spans: SpanIdsLayer,
    writer: W,
) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let lines = JsonLines {
        logged,
        traced: traced.clone(),
        writer,
    };
    Registry::default()
        .with(spans.tracing_only(traced))
        .with(lines)
}

/// Writes JSON lines of the events `logged` enables, with the fields of the spans it enables
/// around them (see the module header).
struct JsonLines<W> {
    logged: Targets,
    /// What the span layer beside it traces: a span either layer wants stays enabled.
    traced: Targets,
    writer: W,
}

/// A logged span's fields, as one JSON object's text (`json_fields`): written when the span
/// opens, added to when a field is recorded later.
struct LoggedFields(String);

impl<W> JsonLines<W> {
    fn logs(&self, metadata: &Metadata<'_>) -> bool {
        self.logged
            .would_enable(metadata.target(), metadata.level())
    }

    /// Whether either layer wants `metadata`'s spans or events.
    fn wants(&self, metadata: &Metadata<'_>) -> bool {
        self.logs(metadata)
            || metadata.is_span()
                && self
                    .traced
                    .would_enable(metadata.target(), metadata.level())
    }
}

impl<S, W> Layer<S> for JsonLines<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.wants(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.wants(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        let logged = <Targets as Filter<S>>::max_level_hint(&self.logged)?;
        let traced = <Targets as Filter<S>>::max_level_hint(&self.traced)?;
        Some(logged.max(traced))
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if !self.logs(attrs.metadata()) {
            return;
        }
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut text = String::new();
        if write_new_object(&mut text, attrs).is_ok() {
            span.extensions_mut().insert(LoggedFields(text));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        if let Some(LoggedFields(text)) = extensions.get_mut::<LoggedFields>() {
            let _ = add_members(text, values);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let metadata = event.metadata();
        if !self.logs(metadata) {
            return;
        }
        let mut line = String::with_capacity(256);
        if write_line(&mut line, event, &ctx).is_ok() {
            // A line that cannot be written has nowhere to be reported.
            let _ = self
                .writer
                .make_writer_for(metadata)
                .write_all(line.as_bytes());
        }
    }
}

/// `event` as one JSON line, ending in a newline.
fn write_line<S>(line: &mut String, event: &Event<'_>, ctx: &Context<'_, S>) -> fmt::Result
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let metadata = event.metadata();
    line.push_str(r#"{"timestamp":""#);
    SystemTime.format_time(&mut Writer::new(line))?;
    line.push_str(r#"","level":""#);
    line.push_str(metadata.level().as_str());
    line.push('"');
    write_members(line, event, false)?;
    line.push_str(r#","target":"#);
    write_json_string(line, metadata.target())?;
    let scope: Vec<SpanRef<'_, S>> = ctx.event_scope(event).into_iter().flatten().collect();
    let mut logged = scope
        .iter()
        .filter(|span| span.extensions().get::<LoggedFields>().is_some());
    if let Some(current) = logged.next() {
        line.push_str(r#","span":"#);
        write_span(line, current)?;
        line.push_str(r#","spans":["#);
        let from_root: Vec<&SpanRef<'_, S>> = std::iter::once(current).chain(logged).collect();
        for (at, span) in from_root.into_iter().rev().enumerate() {
            if at > 0 {
                line.push(',');
            }
            write_span(line, span)?;
        }
        line.push(']');
    }
    let ids = scope
        .iter()
        .find_map(|span| kept_context(&span.extensions()));
    if let Some(ids) = ids.filter(|ids| ids.is_valid()) {
        write!(
            line,
            r#","trace_id":"{}","span_id":"{}""#,
            ids.trace_id(),
            ids.span_id()
        )?;
    }
    line.push_str("}\n");
    Ok(())
}

/// A logged span as the stock format writes it: its fields (the later value of a field recorded
/// twice, in the order of their names), then its name.
fn write_span<S>(line: &mut String, span: &SpanRef<'_, S>) -> fmt::Result
where
    S: for<'a> LookupSpan<'a>,
{
    line.push('{');
    let extensions = span.extensions();
    if let Some(LoggedFields(text)) = extensions.get::<LoggedFields>() {
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|_| fmt::Error)?;
        for (name, value) in &fields {
            write_json_string(line, name)?;
            line.push(':');
            line.push_str(&value.to_string());
            line.push(',');
        }
    }
    line.push_str(r#""name":"#);
    write_json_string(line, span.name())?;
    line.push('}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;
    use crate::telemetry::logs::tests::{unexported_tracer, Buffer};
    use crate::telemetry::logs::{self, LogFilter, LogFormat};
    use crate::telemetry::span_trace_id;

    fn unfiltered(logged: &str, buffer: &Buffer) -> impl Subscriber + Send + Sync + 'static {
        subscriber(
            logged.parse().expect("targets"),
            logs::traced_targets(),
            SpanIdsLayer::new(unexported_tracer()),
            buffer.clone(),
        )
    }

    /// Lines of every shape: outside spans, inside nested spans with fields recorded later and
    /// twice, inside a span that is logged but not traced, with every kind of event field; and
    /// an event and a span that are not logged. Returns the trace id of the turn span.
    fn log_lines() -> Option<String> {
        tracing::info!(count = 3_u64, delta = -2_i64, "outside");
        tracing::debug!("not logged");
        let turn = tracing::info_span!("turn", session = "s1", status = tracing::field::Empty);
        let _turn = turn.enter();
        turn.record("status", "started");
        turn.record("status", "running");
        let quiet = tracing::debug_span!("quiet", hidden = true);
        let _quiet = quiet.enter();
        let call = tracing::info_span!("call", tool = "noop", odd = "quote \" and \\ and \n");
        let _call = call.enter();
        tracing::warn!(
            ratio = 0.5_f64,
            yes = true,
            debug = ?Some("x"),
            error = &std::fmt::Error as &(dyn std::error::Error + 'static),
            "slow"
        );
        let transport = tracing::info_span!(target: "hyper::client", "connect", host = "h");
        let _transport = transport.enter();
        tracing::info!(target: "hyper::client", "connected");
        span_trace_id(&turn)
    }

    /// The lines `log_lines` writes under `subscriber`, parsed, with their timestamps checked and
    /// taken out; and the turn's trace id.
    fn lines_under(
        subscriber: impl Subscriber + Send + Sync + 'static,
        buffer: &Buffer,
    ) -> (Vec<serde_json::Value>, String) {
        let turn = tracing::subscriber::with_default(subscriber, log_lines);
        let lines = buffer
            .lines()
            .iter()
            .map(|line| {
                let mut line: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
                let stamp = line["timestamp"].as_str().expect("a timestamp").to_owned();
                assert!(stamp.ends_with('Z') && stamp.len() >= 20, "{stamp}");
                line.as_object_mut().expect("an object").remove("timestamp");
                line
            })
            .collect();
        (lines, turn.expect("the turn has a trace id"))
    }

    #[test]
    fn lines_are_what_the_stock_stack_writes() {
        let (stock, unfiltered_buffer) = (Buffer::default(), Buffer::default());
        let stock_stack = logs::subscriber(
            LogFilter::parse("info").expect("a filter"),
            SpanIdsLayer::new(unexported_tracer()),
            LogFormat::Json,
            stock.clone(),
        );
        let (mut expected, stock_turn) = lines_under(stock_stack, &stock);
        let (mut ours, turn) =
            lines_under(unfiltered("info", &unfiltered_buffer), &unfiltered_buffer);
        assert_eq!(ours.len(), 3, "{ours:?}");
        // Ids differ from run to run: each line inside the turn carries the turn's trace.
        for (lines, turn) in [(&mut expected, stock_turn), (&mut ours, turn)] {
            assert!(lines[0].get("trace_id").is_none(), "{:?}", lines[0]);
            for line in &mut lines[1..] {
                let line = line.as_object_mut().expect("an object");
                assert_eq!(line.remove("trace_id"), Some(turn.clone().into()));
                let span_id = line.remove("span_id").expect("a span id");
                assert_eq!(span_id.as_str().map(str::len), Some(16), "{span_id}");
            }
        }
        assert_eq!(ours, expected);
        assert_eq!(ours[0]["count"], 3);
        assert_eq!(ours[1]["span"]["odd"], "quote \" and \\ and \n");
        assert_eq!(ours[1]["spans"][0]["status"], "running", "the later value");
        assert_eq!(
            ours[1]["error"],
            "an error occurred when formatting an argument"
        );
        assert_eq!(ours[2]["span"]["name"], "connect");
    }

    #[test]
    fn a_callsite_is_enabled_when_either_layer_wants_it() {
        let buffer = Buffer::default();
        tracing::subscriber::with_default(unfiltered("warn,chosen=debug", &buffer), || {
            assert!(tracing::event_enabled!(Level::WARN));
            assert!(tracing::event_enabled!(target: "chosen", Level::DEBUG));
            assert!(!tracing::event_enabled!(Level::INFO), "neither wants it");
            assert!(tracing::span_enabled!(Level::INFO), "traced, not logged");
            assert!(tracing::span_enabled!(target: "chosen", Level::DEBUG));
            assert!(!tracing::span_enabled!(Level::DEBUG));
            assert!(!tracing::span_enabled!(target: "hyper::client", Level::INFO));
        });
    }

    #[test]
    fn a_line_inside_spans_that_are_traced_but_not_logged_carries_their_trace() {
        let buffer = Buffer::default();
        let turn = tracing::subscriber::with_default(unfiltered("warn", &buffer), || {
            let turn = tracing::info_span!("turn", session = "s1");
            let _turn = turn.enter();
            tracing::info!("not logged");
            tracing::warn!("careful");
            span_trace_id(&turn)
        });
        let lines = buffer.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line: serde_json::Value = serde_json::from_str(&lines[0]).expect("a JSON line");
        assert_eq!(line["message"], "careful");
        assert!(line.get("span").is_none() && line.get("spans").is_none());
        assert_eq!(line["trace_id"].as_str(), turn.as_deref());
    }
}
