//! Trace-context propagation over NATS message headers: W3C `traceparent`/`tracestate` written
//! from the current span on publish, read back on receipt to parent the handling span. Uses the
//! global text-map propagator, which [`super::init`] sets to W3C TraceContext.
//!
//! A message whose sender traced nothing carries no context. For a submission, the lead keeps the
//! `traceparent` of its first delivery's span with the task ([`traceparent`]), and a later
//! delivery continues it ([`set_parent_or_recorded`]): the recorded span is a real, exported
//! span, so the trace has no missing parent.

use std::collections::HashMap;
use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags};
use opentelemetry::Context;

/// The W3C field that names a span: version, trace id, span id, flags.
const TRACEPARENT: &str = "traceparent";
/// The W3C field of vendor-specific trace state.
const TRACESTATE: &str = "tracestate";
/// Length of a version-00 `traceparent`: `00-` 32 hex `-` 16 hex `-` 2 hex.
const TRACEPARENT_LEN: usize = 55;

/// Writes the current span's trace context into `headers` (nothing when there is none): its W3C
/// `traceparent`, and `tracestate` when the span carries one. Written directly rather than through
/// the global propagator, whose text-map round trip costs several allocations on every publish;
/// the fields are those of the W3C propagator [`super::init`] installs, which reads them back.
pub fn inject_current(headers: &mut HeaderMap) {
    let span_context = super::current_span_context();
    if !span_context.is_valid() {
        return;
    }
    headers.insert(
        HeaderName::from_static(TRACEPARENT),
        HeaderValue::from(w3c_traceparent(&span_context)),
    );
    let state = span_context.trace_state().header();
    if !state.is_empty() {
        if let Ok(state) = HeaderValue::from_str(&state) {
            headers.insert(HeaderName::from_static(TRACESTATE), state);
        }
    }
}

/// `00-{trace id}-{span id}-{flags}`: version 00 of the W3C format, sampled flag only. Written
/// as hex digits directly: every published message carries one.
fn w3c_traceparent(span_context: &SpanContext) -> String {
    let mut value = String::with_capacity(TRACEPARENT_LEN);
    let flags = span_context.trace_flags() & TraceFlags::SAMPLED;
    value.push_str("00-");
    crate::text::push_hex(&mut value, &span_context.trace_id().to_bytes());
    value.push('-');
    crate::text::push_hex(&mut value, &span_context.span_id().to_bytes());
    value.push('-');
    crate::text::push_hex(&mut value, &[flags.to_u8()]);
    value
}

/// The remote trace context carried by `headers`; an empty context when there are none or
/// they do not parse.
pub fn extract(headers: Option<&HeaderMap>) -> Context {
    let Some(headers) = headers else {
        return Context::new();
    };
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract_with_context(&Context::new(), &HeaderExtractor(headers))
    })
}

/// Makes `span` a child of the remote context in `headers`. Without a valid remote context the
/// span keeps its local parent. Call it before the span is first entered: once started, a span's
/// parent is fixed and this does nothing (likewise when telemetry is not initialised).
pub fn set_parent(span: &tracing::Span, headers: Option<&HeaderMap>) {
    let remote = extract(headers);
    if remote.span().span_context().is_valid() {
        super::set_span_parent(span, remote);
    }
}

/// Whether `headers` carry a valid trace context from the message's sender.
pub fn carries_context(headers: Option<&HeaderMap>) -> bool {
    extract(headers).span().span_context().is_valid()
}

/// [`set_parent`], or, when `headers` carry no valid context, makes `span` a child of the span
/// `recorded` names (a W3C `traceparent` kept with the task by an earlier delivery). Neither
/// valid: the span keeps its local parent (a delivery's span is then the root of a new trace).
pub fn set_parent_or_recorded(
    span: &tracing::Span,
    headers: Option<&HeaderMap>,
    recorded: Option<&str>,
) {
    let remote = extract(headers);
    let parent = if remote.span().span_context().is_valid() {
        remote
    } else {
        match recorded.map(from_traceparent) {
            Some(recorded) if recorded.span().span_context().is_valid() => recorded,
            _ => return,
        }
    };
    super::set_span_parent(span, parent);
}

/// The W3C `traceparent` of `span`, if it has a valid context (this starts the span's
/// OpenTelemetry side: set its parent first).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let span_context = super::span_context(span);
    span_context
        .is_valid()
        .then(|| w3c_traceparent(&span_context))
}

/// The remote context a `traceparent` names; an empty context when it does not parse.
fn from_traceparent(traceparent: &str) -> Context {
    let fields = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract_with_context(&Context::new(), &fields)
    })
}

/// Reads propagation fields from NATS headers (names are case-sensitive in NATS; the W3C
/// propagator asks for lowercase ones).
struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let name = HeaderName::from_str(key).ok()?;
        self.0.get(name).map(HeaderValue::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::telemetry::span_trace_id;

    /// Runs `body` under a subscriber with an OpenTelemetry layer (nothing is exported).
    fn traced<T>(body: impl FnOnce() -> T) -> T {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, body)
    }

    fn span_id(span: &tracing::Span) -> String {
        span.context().span().span_context().span_id().to_string()
    }

    #[test]
    fn context_round_trips_through_headers() {
        traced(|| {
            let sender = tracing::info_span!("publish");
            let mut headers = HeaderMap::new();
            {
                let _entered = sender.enter();
                inject_current(&mut headers);
            }
            let trace_id = span_trace_id(&sender).expect("sender has a trace");
            let traceparent = headers.get("traceparent").expect("traceparent set");
            assert_eq!(
                traceparent.as_str(),
                format!("00-{trace_id}-{}-01", span_id(&sender))
            );

            let remote = extract(Some(&headers));
            assert!(remote.span().span_context().is_remote());
            assert_eq!(
                remote.span().span_context().trace_id().to_string(),
                trace_id
            );

            let receiver = tracing::info_span!("handle");
            set_parent(&receiver, Some(&headers));
            let _entered = receiver.enter();
            assert_eq!(crate::telemetry::current_trace_id(), Some(trace_id));
            assert_ne!(span_id(&receiver), span_id(&sender));
        });
    }

    #[test]
    fn a_delivery_without_a_context_continues_the_recorded_span() {
        traced(|| {
            let first = tracing::info_span!("process");
            set_parent_or_recorded(&first, None, None);
            let recorded = traceparent(&first).expect("the first delivery's traceparent");
            let trace = span_trace_id(&first).expect("a trace");
            assert_eq!(recorded, format!("00-{trace}-{}-01", span_id(&first)));

            let again = tracing::info_span!("process");
            set_parent_or_recorded(&again, Some(&HeaderMap::new()), Some(&recorded));
            assert_eq!(span_trace_id(&again), Some(trace.clone()));
            assert_ne!(span_id(&again), span_id(&first));

            // Garbage recorded: a trace of its own.
            let lost = tracing::info_span!("process");
            set_parent_or_recorded(&lost, None, Some("not a traceparent"));
            assert!(span_trace_id(&lost).is_some_and(|t| t != trace));

            // A context the sender sent wins over the recorded one.
            let sender = tracing::info_span!("publish");
            let mut headers = HeaderMap::new();
            {
                let _entered = sender.enter();
                inject_current(&mut headers);
            }
            assert!(carries_context(Some(&headers)));
            assert!(!carries_context(None));
            let received = tracing::info_span!("process");
            set_parent_or_recorded(&received, Some(&headers), Some(&recorded));
            assert_eq!(span_trace_id(&received), span_trace_id(&sender));
        });
    }

    #[test]
    fn the_fields_written_are_those_the_w3c_propagator_writes() {
        traced(|| {
            // A remote parent with vendor trace state, which its children carry on.
            let mut incoming = HeaderMap::new();
            incoming.insert(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            );
            incoming.insert("tracestate", "vendor=opaque,other=1");
            let parent = tracing::info_span!("process");
            set_parent(&parent, Some(&incoming));
            let sender = parent.in_scope(|| tracing::info_span!("publish"));
            let mut written = HeaderMap::new();
            sender.in_scope(|| inject_current(&mut written));

            let mut expected = HashMap::new();
            let cx = sender.context();
            opentelemetry::global::get_text_map_propagator(|propagator| {
                propagator.inject_context(&cx, &mut expected);
            });
            for field in [TRACEPARENT, TRACESTATE] {
                assert_eq!(
                    written.get(field).map(HeaderValue::as_str),
                    expected.get(field).map(String::as_str),
                    "{field}"
                );
            }
            assert!(written
                .get(TRACEPARENT)
                .is_some_and(|v| v.as_str().contains("4bf92f3577b34da6a3ce929d0e0e4736")));

            // No trace state: no empty `tracestate` header.
            let plain = tracing::info_span!("publish");
            let mut headers = HeaderMap::new();
            plain.in_scope(|| inject_current(&mut headers));
            assert_eq!(
                headers.get(TRACEPARENT).map(|v| v.as_str().len()),
                Some(TRACEPARENT_LEN)
            );
            assert!(headers.get(TRACESTATE).is_none());
        });
    }

    #[test]
    fn nothing_is_injected_outside_a_span() {
        traced(|| {
            let mut headers = HeaderMap::new();
            inject_current(&mut headers);
            assert!(headers.get("traceparent").is_none());
            assert_eq!(crate::telemetry::current_trace_id(), None);
        });
    }

    #[test]
    fn missing_or_garbage_headers_give_an_empty_context() {
        traced(|| {
            assert!(!extract(None).span().span_context().is_valid());
            assert!(!extract(Some(&HeaderMap::new()))
                .span()
                .span_context()
                .is_valid());
            let mut garbage = HeaderMap::new();
            garbage.insert("traceparent", "00-zz-not-a-trace-01");
            garbage.insert("tracestate", "=,=");
            assert!(!extract(Some(&garbage)).span().span_context().is_valid());
            let mut upper = HeaderMap::new();
            upper.insert(
                "Traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            );
            assert!(!extract(Some(&upper)).span().span_context().is_valid());
        });
    }

    #[test]
    fn garbage_headers_keep_the_local_parent() {
        traced(|| {
            let parent = tracing::info_span!("turn");
            let _in_parent = parent.enter();
            let mut garbage = HeaderMap::new();
            garbage.insert("traceparent", "nonsense");
            let child = tracing::info_span!("call");
            set_parent(&child, Some(&garbage));
            set_parent(&child, None);
            assert_eq!(span_trace_id(&child), span_trace_id(&parent));
            assert!(span_trace_id(&child).is_some());
        });
    }
}
