//! The tracer of a process that exports no spans: each span still gets its ids and its sampling
//! decision, as with an exporter, so trace context crosses every hop and log lines carry trace
//! ids; nothing else about it is kept. With no exporter, a span's name, attributes, events and
//! links would be held until the span ends, only to be dropped: for a turn in flight, several
//! KiB in its long-lived spans.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Span, SpanBuilder, SpanContext, Status, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SpanLimits};

/// What an SDK span of an unexported process may gain after it starts (attributes recorded
/// later, log lines as events, links): nothing. Its spans are [`IdsOnly`], which have nowhere to
/// keep them; the limits hold for any SDK span made another way.
pub(super) fn limits() -> SpanLimits {
    SpanLimits {
        max_events_per_span: 0,
        max_attributes_per_span: 0,
        max_links_per_span: 0,
        max_attributes_per_event: 0,
        max_attributes_per_link: 0,
    }
}

/// An SDK tracer (whose provider has no processor) that chooses each span's ids and sampling, and
/// keeps of the span only those: an [`IdsOnly`].
#[derive(Debug, Clone)]
pub(super) struct Unexported(pub(super) SdkTracer);

impl Tracer for Unexported {
    type Span = IdsOnly;

    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> IdsOnly {
        let ids_only = SpanBuilder {
            trace_id: builder.trace_id,
            span_id: builder.span_id,
            span_kind: builder.span_kind,
            sampling_result: builder.sampling_result,
            start_time: builder.start_time,
            ..SpanBuilder::from_name("")
        };
        let span = self.0.build_with_context(ids_only, parent_cx);
        IdsOnly(span.span_context().clone())
    }
}

/// A span of which only its context (trace id, span id, flags, trace state) is kept: what its
/// children and the next hop need of it. Nothing recorded on it is kept; an SDK span would hold
/// several hundred bytes more for as long as it is open.
#[derive(Debug)]
pub(super) struct IdsOnly(SpanContext);

impl Span for IdsOnly {
    fn add_event_with_timestamp<T>(&mut self, _: T, _: SystemTime, _: Vec<KeyValue>)
    where
        T: Into<Cow<'static, str>>,
    {
    }

    fn span_context(&self) -> &SpanContext {
        &self.0
    }

    fn is_recording(&self) -> bool {
        false
    }

    fn set_attribute(&mut self, _: KeyValue) {}

    fn set_status(&mut self, _: Status) {}

    fn update_name<T>(&mut self, _: T)
    where
        T: Into<Cow<'static, str>>,
    {
    }

    fn add_link(&mut self, _: SpanContext, _: Vec<KeyValue>) {}

    fn end_with_timestamp(&mut self, _: SystemTime) {}
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SamplingDecision, SamplingResult, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId,
        TracerProvider as _,
    };
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
    fn a_span_keeps_its_ids_in_its_parents_trace_and_nothing_else() {
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
        child.update_name("renamed");
        let context = child.span_context().clone();
        assert!(context.is_valid());
        assert!(context.is_sampled());
        assert!(!context.is_remote());
        assert_eq!(context.trace_id(), parent_context.trace_id());
        assert_eq!(context.span_id(), SpanId::from(7));
        assert!(!child.is_recording());
        // Nothing but the context has a place in it.
        assert_eq!(
            std::mem::size_of::<IdsOnly>(),
            std::mem::size_of::<SpanContext>()
        );
        child.end();
        assert_eq!(child.span_context(), &context);
    }

    #[test]
    fn the_sampling_decision_is_the_samplers() {
        let off = tracer(Sampler::AlwaysOff);
        let span = off.build_with_context(SpanBuilder::from_name("turn"), &Context::new());
        assert!(!span.span_context().is_sampled());
        // A decision made before the span starts is kept.
        let mut builder = SpanBuilder::from_name("turn");
        builder.sampling_result = Some(SamplingResult {
            decision: SamplingDecision::RecordAndSample,
            attributes: Vec::new(),
            trace_state: Default::default(),
        });
        let span = off.build_with_context(builder, &Context::new());
        assert!(span.span_context().is_sampled());
        // The parent's decision reaches a sampler that follows it.
        let follows = tracer(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)));
        let sampled_parent = Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(1),
            SpanId::from(2),
            TraceFlags::SAMPLED,
            true,
            Default::default(),
        ));
        let span = follows.build_with_context(SpanBuilder::from_name("turn"), &sampled_parent);
        assert!(span.span_context().is_sampled());
        assert_eq!(span.span_context().trace_id(), TraceId::from(1));
    }
}
