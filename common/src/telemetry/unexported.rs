//! Spans of a process that exports none: each still gets its ids and its sampling decision, as
//! with an exporter, so trace context crosses every hop and log lines carry trace ids; nothing
//! else about it is kept.
//!
//! [`SpanIdsLayer`] stands in for the OpenTelemetry layer there. That layer keeps a span's
//! builder (336 bytes, with every field recorded as an attribute) and then a started span behind
//! an OpenTelemetry context for as long as the span is open, and makes that context the current
//! one on every enter, that is on every poll of an instrumented future: for a turn in flight,
//! several KiB in its long-lived spans and work on every poll, only to be dropped. Here a span
//! keeps its [`SpanContext`] (64 bytes), chosen when it opens. [`span_context`] and
//! [`set_parent`] read and re-parent it where the OpenTelemetry layer's span extension would.

use opentelemetry::trace::{SamplingDecision, SpanContext, SpanKind, TraceContextExt, TraceFlags};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{SdkTracer, SpanLimits};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context as LayerContext, Filter};
use tracing_subscriber::registry::{Extensions, LookupSpan, SpanRef};
use tracing_subscriber::{Layer, Registry};

/// What an SDK span of an unexported process may gain after it starts (attributes recorded
/// later, log lines as events, links): nothing. [`SpanIdsLayer`] makes no SDK spans; the limits
/// hold for any made another way (a tracer taken from the provider directly).
pub(super) fn limits() -> SpanLimits {
    SpanLimits {
        max_events_per_span: 0,
        max_attributes_per_span: 0,
        max_links_per_span: 0,
        max_attributes_per_event: 0,
        max_attributes_per_link: 0,
    }
}

/// What a span keeps of OpenTelemetry under [`SpanIdsLayer`]: its context.
#[derive(Debug)]
struct SpanIds(SpanContext);

/// The layer of a process that exports no spans: every span it traces gets its context when it
/// opens, from the span's parent (the parent given, else the current span, else OpenTelemetry's
/// current context) through the tracer, and keeps only that.
#[derive(Debug)]
pub(super) struct SpanIdsLayer {
    /// The SDK's tracer (its provider has no processor): its id generator and its sampler
    /// choose each span's context.
    tracer: SdkTracer,
    /// Which spans it traces, when it filters them itself (as a layer without a filter of the
    /// subscriber's); without, every span it hears of.
    traced: Option<Targets>,
}

impl SpanIdsLayer {
    pub(super) fn new(tracer: SdkTracer) -> Self {
        Self {
            tracer,
            traced: None,
        }
    }

    /// The layer tracing only the spans `traced` enables, which it checks itself as each span
    /// opens: with no per-layer filter around it, nothing looks its spans up as they are
    /// entered and left.
    pub(super) fn tracing_only(self, traced: Targets) -> Self {
        Self {
            traced: Some(traced),
            ..self
        }
    }

    /// The context of a span named `name` under `parent`: its ids from the tracer's id
    /// generator, in the parent's trace when there is one, and the sampler's decision and trace
    /// state, as the SDK's tracer would give a span it starts, without making that span (it
    /// would be dropped at once). The tracer's `id_generator` and `should_sample` are public for
    /// layers that sample before a span starts.
    fn context_under(&self, name: &'static str, parent: &Context) -> SpanContext {
        let ids = self.tracer.id_generator();
        let parent_span = parent.span();
        let parent_ids = parent_span.span_context();
        let trace_id = if parent_ids.is_valid() {
            parent_ids.trace_id()
        } else {
            ids.new_trace_id()
        };
        let span_id = ids.new_span_id();
        let sampling = self.tracer.should_sample().should_sample(
            Some(parent),
            trace_id,
            name,
            &SpanKind::Internal,
            &[],
            &[],
        );
        let flags = match sampling.decision {
            SamplingDecision::RecordAndSample => parent_ids.trace_flags().with_sampled(true),
            SamplingDecision::RecordOnly => parent_ids.trace_flags().with_sampled(false),
            SamplingDecision::Drop => TraceFlags::default(),
        };
        SpanContext::new(trace_id, span_id, flags, false, sampling.trace_state)
    }
}

impl<S> Layer<S> for SpanIdsLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.traced
            .as_ref()
            .and_then(<Targets as Filter<S>>::max_level_hint)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let metadata = attrs.metadata();
        if let Some(traced) = &self.traced {
            if !traced.would_enable(metadata.target(), metadata.level()) {
                return;
            }
        }
        let Some(span) = ctx.span(id) else {
            return;
        };
        let parent = if let Some(parent) = attrs.parent() {
            ctx.span(parent).and_then(nearest_ids)
        } else if attrs.is_contextual() {
            ctx.lookup_current().and_then(nearest_ids)
        } else {
            None
        };
        let parent = match parent {
            Some(parent) => Context::new().with_remote_span_context(parent),
            None if attrs.is_contextual() => Context::current(),
            None => Context::new(),
        };
        let ids = SpanIds(self.context_under(metadata.name(), &parent));
        span.extensions_mut().insert(ids);
    }
}

/// The context of `span` or, when it has none of its own (a span the layer's filter left out),
/// of its nearest ancestor that has one.
fn nearest_ids<R>(span: SpanRef<'_, R>) -> Option<SpanContext>
where
    R: for<'a> LookupSpan<'a>,
{
    span.scope()
        .find_map(|span| kept_context(&span.extensions()))
}

/// Runs `f` on `span`'s entry in the registry when [`SpanIdsLayer`] is the subscriber's; `None`
/// when it is not (an exporting process, or another subscriber), or `span` is disabled.
fn with_layer<T>(
    span: &tracing::Span,
    f: impl FnOnce(&SpanIdsLayer, SpanRef<'_, Registry>) -> T,
) -> Option<T> {
    span.with_subscriber(|(id, dispatch)| {
        let layer = dispatch.downcast_ref::<SpanIdsLayer>()?;
        let registry = dispatch.downcast_ref::<Registry>()?;
        Some(f(layer, registry.span(id)?))
    })
    .flatten()
}

/// `span`'s context under [`SpanIdsLayer`] (an empty one when the span and its ancestors have
/// none); `None` when that layer is not the subscriber's.
pub(super) fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    with_layer(span, |_, entry| {
        nearest_ids(entry).unwrap_or_else(SpanContext::empty_context)
    })
}

/// The current span's context under [`SpanIdsLayer`], as [`span_context`] gives it for
/// `Span::current()`, read without taking a handle on the span (a handle is a reference count
/// taken and dropped in the registry, on every message published); `None` when that layer is not
/// the subscriber's or no span is current.
pub(super) fn current_span_context() -> Option<SpanContext> {
    tracing::dispatcher::get_default(|dispatch| {
        dispatch.downcast_ref::<SpanIdsLayer>()?;
        let registry = dispatch.downcast_ref::<Registry>()?;
        let current = dispatch.current_span();
        let entry = registry.span(current.id()?)?;
        Some(nearest_ids(entry).unwrap_or_else(SpanContext::empty_context))
    })
}

/// Gives `span` a context under `parent` (new ids in the parent's trace) under [`SpanIdsLayer`];
/// `None` when that layer is not the subscriber's. Spans opened under `span` before keep the
/// context they were given: set a parent before opening children, as with the OpenTelemetry
/// layer.
pub(super) fn set_parent(span: &tracing::Span, parent: &Context) -> Option<()> {
    with_layer(span, |layer, entry| {
        // Chosen before the span's extensions are locked: nothing the tracer does can wait on them.
        let context = layer.context_under(entry.name(), parent);
        if let Some(ids) = entry.extensions_mut().get_mut::<SpanIds>() {
            ids.0 = context;
        }
    })
}

/// The context a span's extensions keep under [`SpanIdsLayer`], if any (for log lines).
pub(super) fn kept_context(extensions: &Extensions<'_>) -> Option<SpanContext> {
    extensions.get::<SpanIds>().map(|ids| ids.0.clone())
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    fn tracer(sampler: Sampler) -> SdkTracer {
        let provider = SdkTracerProvider::builder()
            .with_span_limits(limits())
            .with_sampler(sampler)
            .build();
        provider.tracer("test")
    }

    /// Ids counted up from one, so a test can tell where they came from.
    #[derive(Debug, Default)]
    struct Counting(std::sync::atomic::AtomicU64);

    impl opentelemetry_sdk::trace::IdGenerator for Counting {
        fn new_trace_id(&self) -> TraceId {
            TraceId::from(u128::from(self.next()) << 64)
        }
        fn new_span_id(&self) -> SpanId {
            SpanId::from(self.next())
        }
    }

    impl Counting {
        fn next(&self) -> u64 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
        }
    }

    #[test]
    fn under_the_layer_ids_come_from_the_providers_generator() {
        let provider = SdkTracerProvider::builder()
            .with_span_limits(limits())
            .with_id_generator(Counting::default())
            .build();
        let layer = SpanIdsLayer::new(provider.tracer("test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            // A root takes a trace id (1), then a span id (2); its child a span id only (3).
            let turn = tracing::info_span!("turn");
            let child = tracing::info_span!(parent: &turn, "call");
            assert_eq!(ids(&turn).trace_id(), TraceId::from(1u128 << 64));
            assert_eq!(ids(&turn).span_id(), SpanId::from(2));
            assert_eq!(ids(&child).span_id(), SpanId::from(3));
            assert_eq!(ids(&child).trace_id(), ids(&turn).trace_id());
            assert!(ids(&turn).is_sampled() && ids(&child).is_sampled());
        });
    }

    #[test]
    fn under_the_layer_the_sampling_decision_is_the_samplers() {
        under_layer(Sampler::AlwaysOff, || {
            let turn = tracing::info_span!("turn");
            assert!(ids(&turn).is_valid());
            assert!(!ids(&turn).is_sampled());
        });
    }

    /// Runs `body` under a registry with a [`SpanIdsLayer`] of `sampler`'s tracer.
    fn under_layer<T>(sampler: Sampler, body: impl FnOnce() -> T) -> T {
        let subscriber = tracing_subscriber::registry().with(SpanIdsLayer::new(tracer(sampler)));
        tracing::subscriber::with_default(subscriber, body)
    }

    fn ids(span: &tracing::Span) -> SpanContext {
        span_context(span).expect("the layer is the subscriber's")
    }

    #[test]
    fn under_the_layer_a_span_is_in_its_parents_trace_with_ids_of_its_own() {
        under_layer(Sampler::AlwaysOn, || {
            let turn = tracing::info_span!("turn");
            let (contextual, explicit) = {
                let _entered = turn.enter();
                let root = tracing::info_span!(parent: None, "root");
                (
                    tracing::info_span!("call"),
                    (tracing::info_span!(parent: &turn, "publish"), root),
                )
            };
            let (explicit, root) = explicit;
            let turn = ids(&turn);
            assert!(turn.is_valid() && turn.is_sampled());
            for child in [ids(&contextual), ids(&explicit)] {
                assert!(child.is_valid());
                assert_eq!(child.trace_id(), turn.trace_id());
                assert_ne!(child.span_id(), turn.span_id());
            }
            assert_ne!(ids(&contextual).span_id(), ids(&explicit).span_id());
            // A span opened with no parent starts a trace of its own.
            assert!(ids(&root).is_valid());
            assert_ne!(ids(&root).trace_id(), turn.trace_id());
            // What a span keeps is its context and nothing more.
            assert_eq!(
                std::mem::size_of::<SpanIds>(),
                std::mem::size_of::<SpanContext>()
            );
        });
    }

    #[test]
    fn under_the_layer_a_remote_parent_brings_its_trace_and_its_sampling() {
        // A root is not sampled; a span under a sampled remote parent is.
        under_layer(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)), || {
            let received = tracing::info_span!("process");
            assert!(!ids(&received).is_sampled());
            let remote = SpanContext::new(
                TraceId::from(0xabc),
                SpanId::from(0xdef),
                TraceFlags::SAMPLED,
                true,
                Default::default(),
            );
            let parent = Context::new().with_remote_span_context(remote);
            assert_eq!(set_parent(&received, &parent), Some(()));
            let moved = ids(&received);
            assert_eq!(moved.trace_id(), TraceId::from(0xabc));
            assert_ne!(moved.span_id(), SpanId::from(0xdef));
            assert!(moved.is_sampled() && !moved.is_remote());
            // Its children follow it there.
            let _entered = received.enter();
            let child = tracing::info_span!("execute_tool");
            assert_eq!(ids(&child).trace_id(), TraceId::from(0xabc));
            assert!(ids(&child).is_sampled());
        });
    }

    fn not_transport() -> Targets {
        Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target("hyper", LevelFilter::OFF)
    }

    /// A span `subscriber` leaves out of its [`SpanIdsLayer`] (another layer, as the log layer,
    /// keeps it open in the registry) reads its nearest traced ancestor's ids.
    fn a_left_out_span_reads_its_nearest_traced_ancestor(
        subscriber: impl Subscriber + Send + Sync + 'static,
    ) {
        tracing::subscriber::with_default(subscriber, || {
            let turn = tracing::info_span!("turn");
            let _entered = turn.enter();
            let transport = tracing::info_span!(target: "hyper::client", "connect");
            assert!(!transport.is_disabled());
            assert_eq!(ids(&transport), ids(&turn));
            // A span under it is still in the turn's trace, under the turn.
            let _inside = transport.enter();
            let call = tracing::info_span!("call");
            assert_eq!(ids(&call).trace_id(), ids(&turn).trace_id());
            assert_ne!(ids(&call).span_id(), ids(&turn).span_id());
        });
    }

    #[test]
    fn a_span_the_layers_filter_leaves_out_reads_its_nearest_traced_ancestor() {
        let filtered = SpanIdsLayer::new(tracer(Sampler::AlwaysOn)).with_filter(not_transport());
        let logs = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
        a_left_out_span_reads_its_nearest_traced_ancestor(
            tracing_subscriber::registry().with(filtered).with(logs),
        );
        // The same, the layer filtering for itself with no filter around it.
        let unfiltered = SpanIdsLayer::new(tracer(Sampler::AlwaysOn)).tracing_only(not_transport());
        let logs = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
        a_left_out_span_reads_its_nearest_traced_ancestor(
            tracing_subscriber::registry().with(unfiltered).with(logs),
        );
    }

    #[test]
    fn the_current_spans_context_is_that_of_the_span_entered_last() {
        under_layer(Sampler::AlwaysOn, || {
            assert_eq!(current_span_context(), None, "no span is current");
            let turn = tracing::info_span!("turn");
            let call = tracing::info_span!(parent: &turn, "call");
            {
                let _turn = turn.enter();
                assert_eq!(current_span_context(), Some(ids(&turn)));
                let _call = call.enter();
                assert_eq!(current_span_context(), Some(ids(&call)));
                assert_eq!(
                    current_span_context(),
                    span_context(&tracing::Span::current())
                );
            }
            assert_eq!(current_span_context(), None);
        });
    }

    #[test]
    fn without_the_layer_nothing_is_read_or_set_through_it() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("turn");
            assert_eq!(span_context(&span), None);
            assert_eq!(set_parent(&span, &Context::new()), None);
            let _entered = span.enter();
            assert_eq!(current_span_context(), None);
        });
    }
}
