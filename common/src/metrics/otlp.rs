//! Skein's metrics as OTLP: [`request`] reads the OpenMetrics text [`super::Metrics::render`]
//! produces (the one snapshot of the registry, the same `/metrics` serves) and builds the
//! `ExportMetricsServiceRequest` of it. Reading the text, rather than the registry, keeps recording
//! untouched: an export costs one render, and an observation costs nothing more when nothing is
//! exported.
//!
//! How families map: a counter becomes a cumulative monotonic sum named without `_total`
//! (`skein_turns`), a gauge a gauge, a histogram a cumulative explicit-bucket histogram (per-bucket
//! counts from the cumulative `_bucket` series, bounds without `+Inf`) whose buckets' exemplars
//! keep their trace and span ids; the unit `seconds` becomes UCUM `s`. Other family types, and
//! lines this reader does not understand, are left out.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    exemplar, metric, number_data_point, AggregationTemporality, Exemplar, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// The export of `text` (OpenMetrics, as [`super::Metrics::render`] writes it) from the process
/// `resource` describes: cumulative values since `start_ns`, read at `now_ns` (Unix nanoseconds).
pub fn request(
    text: &str,
    resource: Vec<KeyValue>,
    start_ns: u64,
    now_ns: u64,
) -> ExportMetricsServiceRequest {
    let times = Times { start_ns, now_ns };
    let metrics = families(text)
        .iter()
        .filter_map(|family| family.to_metric(times))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "skein".to_owned(),
                    version: crate::VERSION.to_owned(),
                    ..Default::default()
                }),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// A string attribute.
pub fn attribute(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

#[derive(Debug, Clone, Copy)]
struct Times {
    start_ns: u64,
    now_ns: u64,
}

/// A family's type, from its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    Other,
}

/// One metric family of the text.
#[derive(Debug)]
struct Family {
    name: String,
    kind: Kind,
    unit: String,
    help: String,
    samples: Vec<Sample>,
}

/// One sample line: its name's suffix after the family name (`_total`, `_bucket`, ...), labels,
/// value, and exemplar.
#[derive(Debug)]
struct Sample {
    suffix: String,
    labels: Vec<(String, String)>,
    value: String,
    exemplar: Option<TextExemplar>,
}

#[derive(Debug)]
struct TextExemplar {
    labels: Vec<(String, String)>,
    value: f64,
    /// Seconds since the Unix epoch.
    at: Option<f64>,
}

/// The families of `text`, in order. A family's metadata lines (`# HELP`, `# TYPE`, `# UNIT`)
/// come together, before its samples.
fn families(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (Some(what), Some(name)) = (parts.next(), parts.next()) else {
                continue;
            };
            let rest = parts.next().unwrap_or_default();
            if families.last().is_none_or(|last| last.name != name) {
                families.push(Family {
                    name: name.to_owned(),
                    kind: Kind::Other,
                    unit: String::new(),
                    help: String::new(),
                    samples: Vec::new(),
                });
            }
            let Some(family) = families.last_mut() else {
                continue;
            };
            match what {
                "TYPE" => {
                    family.kind = match rest {
                        "counter" => Kind::Counter,
                        "gauge" => Kind::Gauge,
                        "histogram" => Kind::Histogram,
                        _ => Kind::Other,
                    }
                }
                "HELP" => family.help = unescape(rest),
                "UNIT" => family.unit = rest.to_owned(),
                _ => {}
            }
            continue;
        }
        let Some((name, sample)) = sample(line) else {
            continue;
        };
        if let Some(family) = families
            .last_mut()
            .filter(|family| name.starts_with(family.name.as_str()))
        {
            family.samples.push(Sample {
                suffix: name[family.name.len()..].to_owned(),
                ..sample
            });
        }
    }
    families
}

/// A sample line's metric name and its sample (suffix not yet known).
fn sample(line: &str) -> Option<(&str, Sample)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if rest.starts_with('{') {
        let (parsed, after) = label_set(rest)?;
        labels = parsed;
        rest = after;
    }
    let rest = rest.strip_prefix(' ')?;
    let (value, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let exemplar = rest.strip_prefix("# ").and_then(|exemplar| {
        let (labels, after) = label_set(exemplar)?;
        let mut fields = after.split_whitespace();
        let value = fields.next()?.parse().ok()?;
        let at = fields.next().and_then(|at| at.parse().ok());
        Some(TextExemplar { labels, value, at })
    });
    Some((
        name,
        Sample {
            suffix: String::new(),
            labels,
            value: value.to_owned(),
            exemplar,
        },
    ))
}

/// Reads `{key="value",...}` at the start of `text`; the labels and what follows the `}`.
fn label_set(text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut rest = text.strip_prefix('{')?;
    let mut labels = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after_key) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after_key.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim_start_matches(',').to_owned(), value));
        rest = after_key[end + 1..].trim_start_matches(',');
    }
}

/// A `# HELP` text with its escapes (`\\`, `\n`, `\"`) undone.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(escaped) => out.push(escaped),
            None => out.push('\\'),
        }
    }
    out
}

impl Family {
    fn to_metric(&self, times: Times) -> Option<Metric> {
        let data = match self.kind {
            Kind::Counter => metric::Data::Sum(Sum {
                data_points: self.number_points("_total", times),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            }),
            Kind::Gauge => metric::Data::Gauge(Gauge {
                data_points: self.number_points("", times),
            }),
            Kind::Histogram => metric::Data::Histogram(Histogram {
                data_points: self.histogram_points(times),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
            }),
            Kind::Other => return None,
        };
        Some(Metric {
            name: self.name.clone(),
            description: self.help.clone(),
            unit: match self.unit.as_str() {
                "seconds" => "s".to_owned(),
                other => other.to_owned(),
            },
            metadata: Vec::new(),
            data: Some(data),
        })
    }

    fn number_points(&self, suffix: &str, times: Times) -> Vec<NumberDataPoint> {
        self.samples
            .iter()
            .filter(|s| s.suffix == suffix)
            .filter_map(|s| {
                // Whole-number series are written without a point: keep them integers.
                let value = match s.value.parse::<i64>() {
                    Ok(whole) => number_data_point::Value::AsInt(whole),
                    Err(_) => number_data_point::Value::AsDouble(s.value.parse().ok()?),
                };
                Some(NumberDataPoint {
                    attributes: attributes(&s.labels, None),
                    start_time_unix_nano: times.start_ns,
                    time_unix_nano: times.now_ns,
                    value: Some(value),
                    ..Default::default()
                })
            })
            .collect()
    }

    fn histogram_points(&self, times: Times) -> Vec<HistogramDataPoint> {
        let mut series: Vec<HistogramSeries> = Vec::new();
        for s in &self.samples {
            let labels: Vec<(String, String)> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "le")
                .cloned()
                .collect();
            let at = match series.iter().position(|known| known.labels == labels) {
                Some(at) => at,
                None => {
                    series.push(HistogramSeries {
                        point: HistogramDataPoint {
                            attributes: attributes(&labels, None),
                            start_time_unix_nano: times.start_ns,
                            time_unix_nano: times.now_ns,
                            ..Default::default()
                        },
                        labels,
                        below: 0,
                    });
                    series.len() - 1
                }
            };
            let HistogramSeries { point, below, .. } = &mut series[at];
            match s.suffix.as_str() {
                "_sum" => point.sum = s.value.parse().ok(),
                "_count" => point.count = s.value.parse().unwrap_or(0),
                "_bucket" => {
                    let Ok(cumulative) = s.value.parse::<u64>() else {
                        continue;
                    };
                    point.bucket_counts.push(cumulative.saturating_sub(*below));
                    *below = cumulative;
                    let bound = s.labels.iter().find(|(k, _)| k == "le");
                    if let Some(bound) = bound
                        .and_then(|(_, le)| le.parse::<f64>().ok())
                        .filter(|le| le.is_finite())
                    {
                        point.explicit_bounds.push(bound);
                    }
                    if let Some(e) = &s.exemplar {
                        point.exemplars.push(to_exemplar(e, times));
                    }
                }
                _ => {}
            }
        }
        series.into_iter().map(|known| known.point).collect()
    }
}

/// One series of a histogram while its samples are read: its labels (without `le`), its point,
/// and the cumulative count of the buckets read so far.
struct HistogramSeries {
    labels: Vec<(String, String)>,
    point: HistogramDataPoint,
    below: u64,
}

fn attributes(labels: &[(String, String)], skip: Option<&[&str]>) -> Vec<KeyValue> {
    labels
        .iter()
        .filter(|(k, _)| skip.is_none_or(|skip| !skip.contains(&k.as_str())))
        .map(|(k, v)| attribute(k, v.clone()))
        .collect()
}

/// An exemplar's `trace_id` and `span_id` labels become its ids; the rest stay attributes.
fn to_exemplar(e: &TextExemplar, times: Times) -> Exemplar {
    let id = |key: &str| {
        e.labels
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, hex)| from_hex(hex))
            .unwrap_or_default()
    };
    Exemplar {
        filtered_attributes: attributes(&e.labels, Some(&["trace_id", "span_id"])),
        time_unix_nano: e
            .at
            .map_or(times.now_ns, |secs| (secs * 1e9).max(0.0) as u64),
        span_id: id("span_id"),
        trace_id: id("trace_id"),
        value: Some(exemplar::Value::AsDouble(e.value)),
    }
}

fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP skein_turns Agent turns finished, by outcome.
# TYPE skein_turns counter
skein_turns_total{outcome=\"completed\"} 2
# HELP skein_model_spend_usd Cost \\\\ of calls.
# TYPE skein_model_spend_usd counter
skein_model_spend_usd_total{tenant=\"a \\\"b\\\"\",model=\"m\"} 0.75
# HELP skein_turn_duration_seconds Duration of agent turns, by outcome.
# TYPE skein_turn_duration_seconds histogram
# UNIT skein_turn_duration_seconds seconds
skein_turn_duration_seconds_sum{outcome=\"completed\"} 3.5
skein_turn_duration_seconds_count{outcome=\"completed\"} 2
skein_turn_duration_seconds_bucket{le=\"1.0\",outcome=\"completed\"} 0
skein_turn_duration_seconds_bucket{le=\"2.5\",outcome=\"completed\"} 1 # {trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\",span_id=\"00f067aa0ba902b7\"} 1.5 1733390000.5
skein_turn_duration_seconds_bucket{le=\"+Inf\",outcome=\"completed\"} 2
# HELP skein_in_flight Work running in this process, by kind.
# TYPE skein_in_flight gauge
skein_in_flight{kind=\"turn\"} 0
# EOF
";

    fn by_name<'a>(request: &'a ExportMetricsServiceRequest, name: &str) -> &'a Metric {
        request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    #[test]
    fn counters_gauges_and_histograms_become_otlp_metrics() {
        let request = request(TEXT, vec![attribute("service.name", "skein-lead")], 10, 20);
        let names: Vec<&str> = request.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "skein_turns",
                "skein_model_spend_usd",
                "skein_turn_duration_seconds",
                "skein_in_flight"
            ]
        );

        let turns = by_name(&request, "skein_turns");
        assert_eq!(turns.description, "Agent turns finished, by outcome.");
        let Some(metric::Data::Sum(sum)) = &turns.data else {
            panic!("a sum: {turns:?}")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let point = &sum.data_points[0];
        assert_eq!(point.value, Some(number_data_point::Value::AsInt(2)));
        assert_eq!(point.attributes, [attribute("outcome", "completed")]);
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (10, 20));

        let spend = by_name(&request, "skein_model_spend_usd");
        assert_eq!(spend.description, "Cost \\ of calls.");
        let Some(metric::Data::Sum(sum)) = &spend.data else {
            panic!("a sum")
        };
        assert_eq!(
            sum.data_points[0].value,
            Some(number_data_point::Value::AsDouble(0.75))
        );
        assert_eq!(
            sum.data_points[0].attributes[0],
            attribute("tenant", "a \"b\"")
        );

        let duration = by_name(&request, "skein_turn_duration_seconds");
        assert_eq!(duration.unit, "s");
        let Some(metric::Data::Histogram(histogram)) = &duration.data else {
            panic!("a histogram")
        };
        let point = &histogram.data_points[0];
        assert_eq!(point.attributes, [attribute("outcome", "completed")]);
        assert_eq!((point.count, point.sum), (2, Some(3.5)));
        assert_eq!(point.explicit_bounds, [1.0, 2.5]);
        assert_eq!(point.bucket_counts, [0, 1, 1]);
        let exemplar = &point.exemplars[0];
        assert_eq!(
            from_hex("4bf92f3577b34da6a3ce929d0e0e4736"),
            Some(exemplar.trace_id.clone())
        );
        assert_eq!(exemplar.span_id.len(), 8);
        assert_eq!(exemplar.value, Some(exemplar::Value::AsDouble(1.5)));
        assert_eq!(exemplar.time_unix_nano / 1_000_000, 1_733_390_000_500);
        assert!(exemplar.filtered_attributes.is_empty());

        let Some(metric::Data::Gauge(gauge)) = &by_name(&request, "skein_in_flight").data else {
            panic!("a gauge")
        };
        assert_eq!(
            gauge.data_points[0].value,
            Some(number_data_point::Value::AsInt(0))
        );
    }

    #[test]
    fn what_the_registry_renders_reads_back() {
        let metrics = super::super::Metrics::new();
        metrics.turn_finished("completed", std::time::Duration::from_millis(1500));
        metrics.model_spend("acme", "gpt-4o", 18, 0.25);
        let request = request(&metrics.render(), Vec::new(), 0, 1);
        let duration = by_name(&request, "skein_turn_duration_seconds");
        let Some(metric::Data::Histogram(histogram)) = &duration.data else {
            panic!("a histogram")
        };
        let point = &histogram.data_points[0];
        assert_eq!((point.count, point.sum), (1, Some(1.5)));
        assert_eq!(point.explicit_bounds.len(), 14);
        assert_eq!(point.bucket_counts.len(), 15);
        assert_eq!(point.bucket_counts.iter().sum::<u64>(), 1);
        let tokens = by_name(&request, "skein_model_spend_tokens");
        let Some(metric::Data::Sum(sum)) = &tokens.data else {
            panic!("a sum")
        };
        assert_eq!(
            sum.data_points[0].value,
            Some(number_data_point::Value::AsInt(18))
        );
    }

    #[test]
    fn lines_it_does_not_understand_are_left_out() {
        let request = request(
            "# TYPE a counter\na_total{x=\"unterminated} 1\nnot a sample\n# TYPE b info\nb_info 1\n",
            Vec::new(),
            0,
            1,
        );
        let metrics = &request.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(metrics.len(), 1, "{metrics:?}");
        let Some(metric::Data::Sum(sum)) = &metrics[0].data else {
            panic!("a sum")
        };
        assert!(sum.data_points.is_empty());
    }
}
