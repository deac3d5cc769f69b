//! The tracer of a process that exports no spans: each span still gets its ids, its parent and
//! its sampling decision, as with an exporter, so trace context crosses every hop and log lines
//! carry trace ids; nothing else about it is kept. With no exporter, a span's name, attributes,
//! events and links would be held until the span ends, only to be dropped: for a turn in flight,
//! several KiB in its long-lived spans.

use opentelemetry::trace::{SpanBuilder, Tracer};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{SdkTracer, SpanLimits};

/// What a span built by [`Unexported`] may gain after it starts (attributes recorded later, log
/// lines as events, links): nothing.
pub(super) fn limits() -> SpanLimits {
    SpanLimits {
        max_events_per_span: 0,
        max_attributes_per_span: 0,
        max_links_per_span: 0,
        max_attributes_per_event: 0,
        max_attributes_per_link: 0,
    }
}

/// An SDK tracer whose spans start with their ids, kind and sampling only (its provider has no
/// processor, and limits every span to [`limits`]).
#[derive(Debug, Clone)]
pub(super) struct Unexported(pub(super) SdkTracer);

impl Tracer for Unexported {
    type Span = opentelemetry_sdk::trace::Span;

    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> Self::Span {
        let ids_only = SpanBuilder {
            trace_id: builder.trace_id,
            span_id: builder.span_id,
            span_kind: builder.span_kind,
            sampling_result: builder.sampling_result,
            start_time: builder.start_time,
            ..SpanBuilder::from_name("")
        };
        self.0.build_with_context(ids_only, parent_cx)
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SamplingDecision, SamplingResult, Span as _, SpanId, SpanKind, TraceContextExt,
        TracerProvider as _,
    };
    use opentelemetry::KeyValue;
    use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

    use super::*;

    fn tracer(sampler: Sampler) -> Unexported {
        let provider = SdkTracerProvider::builder()
            .with_span_limits(limits())
            .with_sampler(sampler)
            .build();
        Unexported(provider.tracer("test"))
    }

    #[test]
    fn a_span_keeps_its_ids_and_its_parent_and_nothing_else() {
        let tracer = tracer(Sampler::AlwaysOn);
        let parent = tracer.start("parent");
        let parent_context = parent.span_context().clone();
        let parent_cx = Context::current_with_span(parent);
        let mut builder = SpanBuilder::from_name("execute_tool noop")
            .with_kind(SpanKind::Client)
            .with_attributes([KeyValue::new("gen_ai.tool.name", "noop")]);
        builder.span_id = Some(SpanId::from(7));
        let mut child = tracer.build_with_context(builder, &parent_cx);
        child.set_attribute(KeyValue::new("skein.task_id", "t1"));
        child.add_event("permission", vec![KeyValue::new("verdict", "allowed")]);
        let context = child.span_context().clone();
        assert!(context.is_valid());
        assert!(context.is_sampled());
        assert_eq!(context.trace_id(), parent_context.trace_id());
        assert_eq!(context.span_id(), SpanId::from(7));
        let kept = child.exported_data().expect("a recording span");
        assert_eq!(kept.name, "");
        assert_eq!(kept.span_kind, SpanKind::Client);
        assert_eq!(kept.parent_span_id, parent_context.span_id());
        assert!(kept.attributes.is_empty(), "{:?}", kept.attributes);
        assert_eq!(kept.events.len(), 0);
    }

    #[test]
    fn the_sampling_decision_is_the_samplers() {
        let tracer = tracer(Sampler::AlwaysOff);
        let span = tracer.build_with_context(SpanBuilder::from_name("turn"), &Context::new());
        assert!(!span.span_context().is_sampled());
        // A decision made before the span starts is kept.
        let mut builder = SpanBuilder::from_name("turn");
        builder.sampling_result = Some(SamplingResult {
            decision: SamplingDecision::RecordAndSample,
            attributes: Vec::new(),
            trace_state: Default::default(),
        });
        let span = tracer.build_with_context(builder, &Context::new());
        assert!(span.span_context().is_sampled());
    }
}
