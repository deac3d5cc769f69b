//! Trace-context propagation over NATS message headers: W3C `traceparent`/`tracestate` written
//! from the current span on publish, read back on receipt to parent the handling span. Uses the
//! global text-map propagator, which [`super::init`] sets to W3C TraceContext.
//!
//! A message whose sender traced nothing (a client without OpenTelemetry) carries no context; its
//! handling span is then parented by one derived from the message's subject and id
//! ([`set_parent_or_derived`]), so every delivery of it (a task handed back and run again, a turn
//! resumed after an approval, a lead's failover) continues one trace. That parent is a span id
//! no one exports: trace viewers show the first span under a missing parent.

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Writes the current span's trace context into `headers` (nothing when there is none).
pub fn inject_current(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&cx, &mut HeaderInjector(headers));
    });
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
        // The only failures are "already started", "span disabled" and "no OpenTelemetry layer";
        // in each the span simply keeps its local parent.
        let _ = span.set_parent(remote);
    }
}

/// [`set_parent`], or, when `headers` carry no valid context, makes `span` a child of the context
/// [`derived`] from the key `key` gives (a message's subject and id; asked only then): every
/// delivery of the message continues one trace.
pub fn set_parent_or_derived(
    span: &tracing::Span,
    headers: Option<&HeaderMap>,
    key: impl FnOnce() -> Option<String>,
) {
    let remote = extract(headers);
    let parent = if remote.span().span_context().is_valid() {
        remote
    } else if let Some(key) = key() {
        derived(&key)
    } else {
        return;
    };
    // As in `set_parent`: a failure leaves the span with its local parent.
    let _ = span.set_parent(parent);
}

/// A sampled remote context whose trace and span ids are the SHA-256 of `key`: the same key
/// always gives the same trace.
pub fn derived(key: &str) -> Context {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let mut trace = [0u8; 16];
    let mut span = [0u8; 8];
    trace.copy_from_slice(&digest[..16]);
    span.copy_from_slice(&digest[16..24]);
    let context = SpanContext::new(
        TraceId::from_bytes(trace),
        SpanId::from_bytes(span),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    Context::new().with_remote_span_context(context)
}

/// Writes propagation fields as NATS headers; names or values NATS would reject are skipped.
struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_str(key), HeaderValue::from_str(&value)) {
            self.0.insert(name, value);
        }
    }
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
    fn a_message_without_a_context_continues_the_trace_its_key_derives() {
        traced(|| {
            let key = "skein.submit.acme.s1\nt1";
            let first = tracing::info_span!("process");
            set_parent_or_derived(&first, None, || Some(key.to_owned()));
            let again = tracing::info_span!("process");
            set_parent_or_derived(&again, Some(&HeaderMap::new()), || Some(key.to_owned()));
            let other = tracing::info_span!("process");
            set_parent_or_derived(&other, None, || Some("skein.submit.acme.s1\nt2".to_owned()));
            let trace = span_trace_id(&first).expect("a trace");
            assert_eq!(span_trace_id(&again), Some(trace.clone()));
            assert_ne!(span_trace_id(&other), Some(trace.clone()));
            assert_eq!(
                derived(key).span().span_context().trace_id().to_string(),
                trace
            );

            // A context the sender sent wins over the derived one.
            let sender = tracing::info_span!("publish");
            let mut headers = HeaderMap::new();
            {
                let _entered = sender.enter();
                inject_current(&mut headers);
            }
            let received = tracing::info_span!("process");
            set_parent_or_derived(&received, Some(&headers), || panic!("not asked for"));
            assert_eq!(span_trace_id(&received), span_trace_id(&sender));
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
