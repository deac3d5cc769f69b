//! Every Prometheus metric Skein exports, in one place: the metric names, their labels and their
//! buckets, behind typed events (`turn_finished`, `model_call`, `in_flight`, ...). Callers report
//! what happened; only this file knows how that becomes a series. [`Metrics::render`] produces the
//! OpenMetrics text served on `/metrics` by [`crate::admin`]; [`otlp`] turns the same text into
//! an OTLP export.
//!
//! The duration histograms keep exemplars: an observation made inside a span with OpenTelemetry
//! ids becomes its bucket's exemplar, with the span's `trace_id` and `span_id` and the time it was
//! made, so a slow bucket links to a trace. Outside such a span nothing is kept.

use std::fmt::{Debug, Write as _};
use std::hash::Hash;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanId, TraceId};
use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry, Unit};

pub mod otlp;
mod series_cache;

use series_cache::SeriesCache;

/// Prefix of every metric name.
const PREFIX: &str = "skein";

/// Longest label value kept; longer values are cut so a stray value cannot blow up a series name.
const MAX_LABEL_CHARS: usize = 64;

/// Upper bounds (seconds) of the duration histograms: 10 ms to 5 min, roughly ×2.5 per step.
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0,
];

/// Declares label sets: structs of `String` labels, encoded in field order.
macro_rules! label_sets {
    ($($name:ident { $($label:ident),+ })*) => {$(
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct $name { $($label: String),+ }
    )*};
}

label_sets! {
    OutcomeLabels { outcome }
    ToolLabels { tool }
    ToolOutcomeLabels { tool, outcome }
    ProviderLabels { provider }
    ProviderOutcomeLabels { provider, outcome }
    TokenLabels { provider, direction }
    KindLabels { kind }
    ConsumerLabels { consumer }
    SpendLabels { tenant, model }
    AgentLabels { agent }
}

/// A duration histogram whose buckets keep the trace of their latest observation.
type DurationHistogram = HistogramWithExemplars<TraceExemplar>;

type DurationFamily<S> = Family<S, DurationHistogram, fn() -> DurationHistogram>;

fn duration_histogram() -> DurationHistogram {
    HistogramWithExemplars::new(DURATION_BUCKETS.into_iter())
}

/// The exemplar of an observation: the span it was made in, as the labels `trace_id` and
/// `span_id` (lowercase hex, as W3C trace context writes them). Plain ids: keeping one allocates
/// nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TraceExemplar {
    trace_id: TraceId,
    span_id: SpanId,
}

impl TraceExemplar {
    /// The current span's ids, if it has valid OpenTelemetry ones.
    fn current() -> Option<Self> {
        let ids = crate::telemetry::current_span_context();
        ids.is_valid().then(|| Self {
            trace_id: ids.trace_id(),
            span_id: ids.span_id(),
        })
    }
}

impl EncodeLabelSet for TraceExemplar {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("trace_id", Id::Trace(self.trace_id)),
            ("span_id", Id::Span(self.span_id)),
        ]
        .encode(encoder)
    }
}

/// A trace or span id as a label value, in hex.
enum Id {
    Trace(TraceId),
    Span(SpanId),
}

impl EncodeLabelValue for Id {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Id::Trace(id) => write!(encoder, "{id}"),
            Id::Span(id) => write!(encoder, "{id}"),
        }
    }
}

/// Observes `duration`, keeping the current span as the bucket's exemplar when there is one.
fn observe(histogram: &DurationHistogram, duration: Duration) {
    let exemplar = TraceExemplar::current();
    let at = exemplar.as_ref().map(|_| SystemTime::now());
    histogram.observe(duration.as_secs_f64(), exemplar, at);
}

/// A label value as exported: at most [`MAX_LABEL_CHARS`] characters.
fn label(value: &str) -> String {
    match value.char_indices().nth(MAX_LABEL_CHARS) {
        Some((cut, _)) => value[..cut].to_owned(),
        None => value.to_owned(),
    }
}

fn kind(value: &str) -> KindLabels {
    KindLabels { kind: label(value) }
}

/// Label sets a family can be keyed by.
trait Labels: EncodeLabelSet + Clone + Hash + Eq + Debug + Send + Sync + 'static {}
impl<S: EncodeLabelSet + Clone + Hash + Eq + Debug + Send + Sync + 'static> Labels for S {}

/// A counter family (of whole counts, or of `f64` amounts); its name gets the `_total` suffix.
fn counter<S: Labels, C>(registry: &mut Registry, name: &str, help: &str) -> Family<S, C>
where
    C: Default,
    Family<S, C>: Metric + Clone,
{
    let family = Family::default();
    registry.register(name, help, family.clone());
    family
}

fn gauge<S: Labels>(registry: &mut Registry, name: &str, help: &str) -> Family<S, Gauge> {
    let family = Family::default();
    registry.register(name, help, family.clone());
    family
}

/// A duration histogram; its name gets the `_seconds` unit suffix.
fn seconds<S: Labels>(registry: &mut Registry, name: &str, help: &str) -> DurationFamily<S> {
    let family: DurationFamily<S> = Family::new_with_constructor(duration_histogram);
    registry.register_with_unit(name, help, Unit::Seconds, family.clone());
    family
}

/// The metric families; the registry holds clones of the same (shared) families.
struct Families {
    turns: Family<OutcomeLabels, Counter>,
    turn_duration: DurationFamily<OutcomeLabels>,
    tool_tasks: Family<ToolOutcomeLabels, Counter>,
    tool_duration: DurationFamily<ToolLabels>,
    model_calls: Family<ProviderOutcomeLabels, Counter>,
    model_call_duration: DurationFamily<ProviderLabels>,
    model_tokens: Family<TokenLabels, Counter>,
    model_spend_tokens: Family<SpendLabels, Counter>,
    model_spend_usd: Family<SpendLabels, Counter<f64, AtomicU64>>,
    in_flight: Family<KindLabels, Gauge>,
    redeliveries: Family<KindLabels, Counter>,
    waits_for_running_calls: Family<ToolLabels, Counter>,
    agent_slot_waits: Family<AgentLabels, Counter>,
    dead_letters: Family<KindLabels, Counter>,
    lease_conflicts: Family<KindLabels, Counter>,
    open_resources: Family<KindLabels, Gauge>,
    queue_pending: Family<ConsumerLabels, Gauge>,
    queue_ack_pending: Family<ConsumerLabels, Gauge>,
}

impl Families {
    /// Every family under its name and help, registered: the one list of what Skein exports.
    fn register(r: &mut Registry) -> Self {
        Self {
            turns: counter(r, "turns", "Agent turns finished, by outcome"),
            turn_duration: seconds(r, "turn_duration", "Duration of agent turns, by outcome"),
            tool_tasks: counter(r, "tool_tasks", "Tool tasks finished, by tool and outcome"),
            tool_duration: seconds(r, "tool_duration", "Duration of tool tasks, by tool"),
            model_calls: counter(r, "model_calls", "Model calls, by provider and outcome"),
            model_call_duration: seconds(
                r,
                "model_call_duration",
                "Duration of model calls, by provider",
            ),
            model_tokens: counter(
                r,
                "model_tokens",
                "Model tokens used, by provider and direction (input or output)",
            ),
            model_spend_tokens: counter(
                r,
                "model_spend_tokens",
                "Model tokens spent (prompt and completion), by tenant and model",
            ),
            model_spend_usd: counter(
                r,
                "model_spend_usd",
                "Cost of model calls in US dollars at the configured prices, by tenant and model",
            ),
            in_flight: gauge(r, "in_flight", "Work running in this process, by kind"),
            redeliveries: counter(r, "redeliveries", "Deliveries beyond the first, by kind"),
            waits_for_running_calls: counter(
                r,
                "waits_for_running_calls",
                "Deliveries of a call that waited for another run of it in progress, by tool",
            ),
            agent_slot_waits: counter(
                r,
                "agent_slot_waits",
                "Subagent tasks handed back to wait because their type ran at its max_concurrency, \
                 by agent",
            ),
            dead_letters: counter(r, "dead_letters", "Messages dead-lettered, by kind"),
            lease_conflicts: counter(
                r,
                "lease_conflicts",
                "Session leases found held by another lead (busy: a turn handed back) or lost \
                 mid-turn (lost), by kind",
            ),
            open_resources: gauge(r, "open_resources", "Resources held open, by kind"),
            queue_pending: gauge(
                r,
                "queue_pending",
                "Messages not yet delivered, by consumer",
            ),
            queue_ack_pending: gauge(
                r,
                "queue_ack_pending",
                "Messages delivered and not yet acknowledged, by consumer",
            ),
        }
    }
}

struct Inner {
    registry: Registry,
    families: Families,
    cached: CachedSeries,
}

/// A count and a duration of one series each.
struct CountedDuration {
    count: Counter,
    duration: DurationHistogram,
}

/// The series of one provider's model calls with one outcome.
struct ModelCallSeries {
    calls: Counter,
    duration: DurationHistogram,
    input_tokens: Counter,
    output_tokens: Counter,
}

/// The spend series of one tenant on one model.
struct SpendSeries {
    tokens: Counter,
    usd: Counter<f64, AtomicU64>,
}

/// The handles of the series a turn or a call records into, by their label values
/// ([`SeriesCache`]): recording builds no label set.
#[derive(Default)]
struct CachedSeries {
    /// By outcome.
    turns: SeriesCache<CountedDuration>,
    /// By tool, then outcome.
    tool_tasks: SeriesCache<SeriesCache<CountedDuration>>,
    /// By provider, then outcome.
    model_calls: SeriesCache<SeriesCache<ModelCallSeries>>,
    /// By tenant, then model.
    model_spend: SeriesCache<SeriesCache<SpendSeries>>,
    /// By kind.
    in_flight: SeriesCache<Gauge>,
}

/// The metrics of one process. Cheap to clone: every clone records into the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh set of metrics with its own registry (names prefixed `skein_`).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let families = Families::register(&mut registry);
        Self {
            inner: Arc::new(Inner {
                registry,
                families,
                cached: CachedSeries::default(),
            }),
        }
    }

    fn families(&self) -> &Families {
        &self.inner.families
    }

    /// The current values in the OpenMetrics text format (ends with `# EOF`).
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(error) =
            prometheus_client::encoding::text::encode(&mut text, &self.inner.registry)
        {
            // Writing into a String cannot fail; a failure here means an encoder bug.
            tracing::error!(%error, "cannot encode metrics");
        }
        text
    }

    /// An agent turn ended: `completed`, `failed`, `cancelled`, `budget_exhausted` or
    /// `dead_lettered`; or a task was `rejected` (its session busy, `multitask: reject`).
    pub fn turn_finished(&self, outcome: &str, duration: Duration) {
        let f = self.families();
        self.inner.cached.turns.with(
            outcome,
            || {
                let labels = OutcomeLabels {
                    outcome: label(outcome),
                };
                CountedDuration {
                    count: f.turns.get_or_create_owned(&labels),
                    duration: f.turn_duration.get_or_create_owned(&labels),
                }
            },
            |series| {
                series.count.inc();
                observe(&series.duration, duration);
            },
        );
    }

    /// A tool task ended: `outcome` is `ok` or the failure kind.
    pub fn tool_task_finished(&self, tool: &str, outcome: &str, duration: Duration) {
        let f = self.families();
        let make = || CountedDuration {
            count: f.tool_tasks.get_or_create_owned(&ToolOutcomeLabels {
                tool: label(tool),
                outcome: label(outcome),
            }),
            duration: f
                .tool_duration
                .get_or_create_owned(&ToolLabels { tool: label(tool) }),
        };
        let record = |series: &CountedDuration| {
            series.count.inc();
            observe(&series.duration, duration);
        };
        self.inner
            .cached
            .tool_tasks
            .with_pair((tool, outcome), make, record);
    }

    /// A model provider call ended: `outcome` is `ok` or the failure kind.
    pub fn model_call(
        &self,
        provider: &str,
        outcome: &str,
        duration: Duration,
        input_tokens: u64,
        output_tokens: u64,
    ) {
        let f = self.families();
        let tokens = |direction: &str| {
            f.model_tokens.get_or_create_owned(&TokenLabels {
                provider: label(provider),
                direction: direction.to_owned(),
            })
        };
        let make = || ModelCallSeries {
            calls: f.model_calls.get_or_create_owned(&ProviderOutcomeLabels {
                provider: label(provider),
                outcome: label(outcome),
            }),
            duration: f.model_call_duration.get_or_create_owned(&ProviderLabels {
                provider: label(provider),
            }),
            input_tokens: tokens("input"),
            output_tokens: tokens("output"),
        };
        let record = |series: &ModelCallSeries| {
            series.calls.inc();
            observe(&series.duration, duration);
            series.input_tokens.inc_by(input_tokens);
            series.output_tokens.inc_by(output_tokens);
        };
        self.inner
            .cached
            .model_calls
            .with_pair((provider, outcome), make, record);
    }

    /// A model call of `tenant` on `model` spent `tokens` costing `cost_usd`.
    pub fn model_spend(&self, tenant: &str, model: &str, tokens: u64, cost_usd: f64) {
        let f = self.families();
        let make = || {
            let labels = SpendLabels {
                tenant: label(tenant),
                model: label(model),
            };
            SpendSeries {
                tokens: f.model_spend_tokens.get_or_create_owned(&labels),
                usd: f.model_spend_usd.get_or_create_owned(&labels),
            }
        };
        let record = |series: &SpendSeries| {
            series.tokens.inc_by(tokens);
            series.usd.inc_by(cost_usd);
        };
        self.inner
            .cached
            .model_spend
            .with_pair((tenant, model), make, record);
    }

    /// One more unit of work (`turn`, `tool`, `subagent`) running until the guard drops.
    pub fn in_flight(&self, kind_name: &str) -> InFlight {
        let gauge = self.inner.cached.in_flight.with(
            kind_name,
            || {
                self.families()
                    .in_flight
                    .get_or_create_owned(&kind(kind_name))
            },
            Gauge::clone,
        );
        gauge.inc();
        InFlight { gauge }
    }

    /// A message of `kind` (`turn`, `tool`, `subagent`) was delivered again.
    pub fn redelivered(&self, kind_name: &str) {
        self.families()
            .redeliveries
            .get_or_create(&kind(kind_name))
            .inc();
    }

    /// A delivered call waited for another run of it, still in progress, instead of running.
    pub fn waited_for_running_call(&self, tool: &str) {
        self.families()
            .waits_for_running_calls
            .get_or_create(&ToolLabels { tool: label(tool) })
            .inc();
    }

    /// A subagent task was handed back to wait: its type ran at its `max_concurrency`.
    pub fn waited_for_agent_slot(&self, agent: &str) {
        self.families()
            .agent_slot_waits
            .get_or_create(&AgentLabels {
                agent: label(agent),
            })
            .inc();
    }

    /// A message of `kind` (`submit`, `tool`, `agent`) went to the dead-letter stream.
    pub fn dead_lettered(&self, kind_name: &str) {
        self.families()
            .dead_letters
            .get_or_create(&kind(kind_name))
            .inc();
    }

    /// A session's lease was held by another lead (`busy`: the turn is handed back) or was lost
    /// while a turn ran (`lost`).
    pub fn lease_conflict(&self, kind_name: &str) {
        self.families()
            .lease_conflicts
            .get_or_create(&kind(kind_name))
            .inc();
    }

    /// How many resources of `kind` (e.g. `scopes`) are open now.
    pub fn open_resources(&self, kind_name: &str, open: i64) {
        self.families()
            .open_resources
            .get_or_create(&kind(kind_name))
            .set(open);
    }

    /// The backlog of a consumer as last read from JetStream.
    pub fn queue_depth(&self, consumer: &str, pending: u64, ack_pending: u64) {
        let labels = ConsumerLabels {
            consumer: label(consumer),
        };
        let f = self.families();
        f.queue_pending
            .get_or_create(&labels)
            .set(saturating_i64(pending));
        f.queue_ack_pending
            .get_or_create(&labels)
            .set(saturating_i64(ack_pending));
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Counts one unit of work in `skein_in_flight` for as long as it lives.
#[must_use = "the work stops being counted as in flight when this guard drops"]
#[derive(Debug)]
pub struct InFlight {
    gauge: Gauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::*;

    #[test]
    fn events_render_as_series() {
        let metrics = Metrics::new();
        metrics.turn_finished("completed", Duration::from_millis(1500));
        metrics.tool_task_finished("shell", "ok", Duration::from_millis(20));
        metrics.tool_task_finished("shell", "timeout", Duration::from_secs(60));
        metrics.model_call("openai", "ok", Duration::from_secs(2), 120, 30);
        metrics.model_call("openai", "ok", Duration::from_secs(1), 10, 5);
        metrics.model_spend("acme", "gpt-4o", 18, 0.25);
        metrics.model_spend("acme", "gpt-4o", 2, 0.5);
        metrics.redelivered("tool");
        metrics.dead_lettered("submit");
        metrics.open_resources("scopes", 3);
        metrics.queue_depth("workers-tool", 7, 2);

        let text = metrics.clone().render();
        for expected in [
            "skein_turns_total{outcome=\"completed\"} 1\n",
            "skein_turn_duration_seconds_count{outcome=\"completed\"} 1\n",
            "skein_turn_duration_seconds_sum{outcome=\"completed\"} 1.5\n",
            "skein_tool_tasks_total{tool=\"shell\",outcome=\"ok\"} 1\n",
            "skein_tool_tasks_total{tool=\"shell\",outcome=\"timeout\"} 1\n",
            "skein_tool_duration_seconds_count{tool=\"shell\"} 2\n",
            "skein_model_calls_total{provider=\"openai\",outcome=\"ok\"} 2\n",
            "skein_model_call_duration_seconds_count{provider=\"openai\"} 2\n",
            "skein_model_tokens_total{provider=\"openai\",direction=\"input\"} 130\n",
            "skein_model_tokens_total{provider=\"openai\",direction=\"output\"} 35\n",
            "skein_model_spend_tokens_total{tenant=\"acme\",model=\"gpt-4o\"} 20\n",
            "skein_model_spend_usd_total{tenant=\"acme\",model=\"gpt-4o\"} 0.75\n",
            "skein_redeliveries_total{kind=\"tool\"} 1\n",
            "skein_dead_letters_total{kind=\"submit\"} 1\n",
            "skein_open_resources{kind=\"scopes\"} 3\n",
            "skein_queue_pending{consumer=\"workers-tool\"} 7\n",
            "skein_queue_ack_pending{consumer=\"workers-tool\"} 2\n",
            "# EOF\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn values_past_the_kept_handles_are_still_exported() {
        let metrics = Metrics::new();
        let tools = series_cache::MAX_CACHED_VALUES + 5;
        for round in 0..2 {
            for n in 0..tools {
                metrics.tool_task_finished(&format!("tool-{n}"), "ok", Duration::from_millis(5));
            }
            metrics.model_call("anthropic", "rate_limited", Duration::from_secs(1), 0, 0);
            metrics.model_call("anthropic", "ok", Duration::from_secs(1), 7, round);
        }
        let text = metrics.render();
        for n in 0..tools {
            let expected =
                format!("skein_tool_tasks_total{{tool=\"tool-{n}\",outcome=\"ok\"}} 2\n");
            assert!(text.contains(&expected), "missing {expected:?}");
        }
        for expected in [
            "skein_model_calls_total{provider=\"anthropic\",outcome=\"rate_limited\"} 2\n",
            "skein_model_calls_total{provider=\"anthropic\",outcome=\"ok\"} 2\n",
            "skein_model_call_duration_seconds_count{provider=\"anthropic\"} 4\n",
            "skein_model_tokens_total{provider=\"anthropic\",direction=\"input\"} 14\n",
            "skein_model_tokens_total{provider=\"anthropic\",direction=\"output\"} 1\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn histogram_buckets_span_ten_ms_to_five_minutes() {
        let metrics = Metrics::new();
        metrics.turn_finished("failed", Duration::from_millis(5));
        let text = metrics.render();
        for le in ["0.01", "300.0", "+Inf"] {
            let bucket =
                format!("skein_turn_duration_seconds_bucket{{le=\"{le}\",outcome=\"failed\"}} 1\n");
            assert!(text.contains(&bucket), "missing {bucket:?} in:\n{text}");
        }
    }

    /// Runs `body` under a subscriber that gives spans OpenTelemetry ids (nothing is exported).
    fn traced<T>(body: impl FnOnce() -> T) -> T {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, body)
    }

    #[test]
    fn durations_observed_in_a_span_link_their_bucket_to_its_trace() {
        let metrics = Metrics::new();
        let (trace_id, span_id) = traced(|| {
            let span = tracing::info_span!("process");
            let _entered = span.enter();
            metrics.turn_finished("completed", Duration::from_millis(1500));
            metrics.tool_task_finished("shell", "ok", Duration::from_millis(20));
            metrics.model_call("openai", "ok", Duration::from_millis(700), 1, 1);
            let cx = span.context();
            let ids = cx.span().span_context().clone();
            (ids.trace_id().to_string(), ids.span_id().to_string())
        });
        assert_eq!(trace_id.len(), 32);
        // Outside any span: counted, with no exemplar.
        metrics.turn_finished("failed", Duration::from_millis(5));

        let text = metrics.render();
        let exemplar = format!("# {{trace_id=\"{trace_id}\",span_id=\"{span_id}\"}}");
        for series in [
            format!("skein_turn_duration_seconds_bucket{{le=\"2.5\",outcome=\"completed\"}} 1 {exemplar} 1.5 "),
            format!("skein_tool_duration_seconds_bucket{{le=\"0.025\",tool=\"shell\"}} 1 {exemplar} 0.02 "),
            format!("skein_model_call_duration_seconds_bucket{{le=\"1.0\",provider=\"openai\"}} 1 {exemplar} 0.7 "),
        ] {
            assert!(text.contains(&series), "missing {series:?} in:\n{text}");
        }
        // Only the bucket the observation fell in keeps it.
        assert!(text
            .contains("skein_turn_duration_seconds_bucket{le=\"5.0\",outcome=\"completed\"} 1\n"));
        assert!(
            text.contains("skein_turn_duration_seconds_bucket{le=\"0.01\",outcome=\"failed\"} 1\n")
        );
    }

    #[test]
    fn in_flight_returns_to_zero_when_guards_drop() {
        let metrics = Metrics::new();
        let in_flight = |n: u32| format!("skein_in_flight{{kind=\"turn\"}} {n}\n");
        let first = metrics.in_flight("turn");
        let second = metrics.in_flight("turn");
        assert!(metrics.render().contains(&in_flight(2)));
        drop(first);
        assert!(metrics.render().contains(&in_flight(1)));
        drop(second);
        assert!(metrics.render().contains(&in_flight(0)));
    }

    #[test]
    fn long_label_values_are_truncated() {
        let metrics = Metrics::new();
        metrics.redelivered(&"é".repeat(100));
        let kept = "é".repeat(MAX_LABEL_CHARS);
        let series = format!("skein_redeliveries_total{{kind=\"{kept}\"}} 1\n");
        assert!(metrics.render().contains(&series), "{}", metrics.render());
    }
}
