//! OTLP export of a process's metrics: what [`super::init`] decides from the `OTEL_*` settings
//! ([`MetricsExport::from_config`]), and the background task that pushes the metrics
//! ([`export_metrics`]).
//!
//! Export follows the OpenTelemetry conventions: on when `OTEL_METRICS_EXPORTER` lists `otlp`
//! (the default) and an endpoint is known, every `OTEL_METRIC_EXPORT_INTERVAL` milliseconds
//! (default 60 000), once more when the process stops. The body is protobuf over HTTP
//! (`POST {OTEL_EXPORTER_OTLP_ENDPOINT}/v1/metrics`, or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` as
//! given); with `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` only a metrics endpoint of its own is used.
//! Each export renders the registry once ([`crate::metrics::otlp`]), off every caller's path; an
//! export that fails is logged (once while failures last) and the next one sends the values again
//! (they are cumulative).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{TelemetryConfig, Transport, EXPORT_TIMEOUT};
use crate::metrics::{otlp, Metrics};

/// Where OTLP/HTTP takes metrics, under the endpoint.
const METRICS_PATH: &str = "/v1/metrics";

/// `OTEL_METRICS_EXPORTER` values.
const EXPORTER_OTLP: &str = "otlp";
const EXPORTER_PROMETHEUS: &str = "prometheus";
const EXPORTER_NONE: &str = "none";

/// The export [`super::init`] configured, if any.
static CONFIGURED: OnceLock<MetricsExport> = OnceLock::new();

/// Where and how often metrics go, and who reports them.
#[derive(Debug, Clone)]
pub(super) struct MetricsExport {
    url: String,
    every: Duration,
    resource: Vec<KeyValue>,
}

impl MetricsExport {
    /// The export `cfg` asks for (none when it is off or no endpoint takes metrics); `resource`
    /// names the process.
    pub(super) fn from_config(
        cfg: &TelemetryConfig,
        resource: &opentelemetry_sdk::Resource,
    ) -> Option<Self> {
        if cfg.disabled || !exporters(&cfg.metrics_exporter).any(|e| e == EXPORTER_OTLP) {
            return None;
        }
        let own = non_empty(cfg.otlp_metrics_endpoint.as_deref());
        let url = match (own, cfg.endpoint(), cfg.transport()) {
            (Some(own), ..) => own.to_owned(),
            (None, Some(endpoint), Ok(Transport::Http)) => metrics_url(endpoint),
            (None, Some(_), _) => {
                tracing::warn!(
                    "metrics are pushed over http/protobuf only: set \
                     OTEL_EXPORTER_OTLP_METRICS_ENDPOINT to the collector's OTLP/HTTP receiver; \
                     metrics are not exported"
                );
                return None;
            }
            (None, None, _) => return None,
        };
        Some(Self {
            url,
            every: Duration::from_millis(cfg.metric_export_interval_ms.max(1)),
            resource: resource
                .iter()
                .map(|(key, value)| KeyValue {
                    key: key.to_string(),
                    value: Some(AnyValue {
                        value: Some(match value {
                            opentelemetry::Value::Bool(b) => any_value::Value::BoolValue(*b),
                            opentelemetry::Value::I64(i) => any_value::Value::IntValue(*i),
                            opentelemetry::Value::F64(f) => any_value::Value::DoubleValue(*f),
                            other => any_value::Value::StringValue(other.to_string()),
                        }),
                    }),
                })
                .collect(),
        })
    }

    /// Makes this the process's export (the first one set stays).
    pub(super) fn install(self) {
        let _ = CONFIGURED.set(self);
    }
}

/// Checks `OTEL_METRICS_EXPORTER`, `OTEL_METRIC_EXPORT_INTERVAL` and the metrics endpoint.
pub(super) fn validate(cfg: &TelemetryConfig) -> Result<(), String> {
    for exporter in exporters(&cfg.metrics_exporter) {
        if ![EXPORTER_OTLP, EXPORTER_PROMETHEUS, EXPORTER_NONE].contains(&exporter) {
            return Err(format!(
                "metrics exporter {exporter:?} is not supported (use {EXPORTER_OTLP}, \
                 {EXPORTER_PROMETHEUS} or {EXPORTER_NONE})"
            ));
        }
    }
    if cfg.metric_export_interval_ms == 0 {
        return Err("the metric export interval must be above 0 ms".into());
    }
    if let Some(endpoint) = non_empty(cfg.otlp_metrics_endpoint.as_deref()) {
        super::check_endpoint(endpoint)?;
    }
    Ok(())
}

/// Pushes `metrics` over OTLP every interval, and once more when `stop` fires, if [`super::init`]
/// configured an export; the task goes into `tracker`. Without one this does nothing.
pub fn export_metrics(metrics: &Metrics, tracker: &TaskTracker, stop: CancellationToken) {
    let Some(export) = CONFIGURED.get().cloned() else {
        return;
    };
    let client = match reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "cannot build the HTTP client; metrics are not exported");
            return;
        }
    };
    let metrics = metrics.clone();
    tracker.spawn(async move {
        let started = unix_nanos();
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + export.every, export.every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::debug!(url = %export.url, every = ?export.every, "exporting metrics");
        // A collector that takes no metrics (Jaeger) is said once, not at every push.
        let mut failing = false;
        loop {
            let last = tokio::select! {
                _ = stop.cancelled() => true,
                _ = ticks.tick() => false,
            };
            match send(&client, &export, &metrics, started).await {
                Ok(()) if failing => {
                    tracing::info!(url = %export.url, "metrics export works again");
                    failing = false;
                }
                Ok(()) => {}
                Err(error) if failing => {
                    tracing::debug!(url = %export.url, %error, "metrics export failed again");
                }
                Err(error) => {
                    tracing::warn!(url = %export.url, %error, "metrics export failed; trying again every interval");
                    failing = true;
                }
            }
            if last {
                break;
            }
        }
    });
}

/// One export of the metrics as they are now.
async fn send(
    client: &reqwest::Client,
    export: &MetricsExport,
    metrics: &Metrics,
    started: u64,
) -> Result<(), reqwest::Error> {
    let request = otlp::request(
        &metrics.render(),
        export.resource.clone(),
        started,
        unix_nanos(),
    );
    client
        .post(&export.url)
        .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map(drop)
}

/// The entries of an `OTEL_METRICS_EXPORTER` list (comma-separated), trimmed.
fn exporters(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|e| !e.is_empty())
}

fn non_empty(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// The OTLP/HTTP URL for metrics: `endpoint` + `/v1/metrics`.
fn metrics_url(endpoint: &str) -> String {
    format!("{}{METRICS_PATH}", endpoint.trim_end_matches('/'))
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: Option<&str>, exporter: &str) -> TelemetryConfig {
        TelemetryConfig {
            otlp_endpoint: endpoint.map(str::to_owned),
            disabled: false,
            metrics_exporter: exporter.to_owned(),
            ..TelemetryConfig::off()
        }
    }

    fn url(cfg: &TelemetryConfig) -> Option<String> {
        let resource = opentelemetry_sdk::Resource::builder_empty().build();
        MetricsExport::from_config(cfg, &resource).map(|export| export.url)
    }

    #[test]
    fn metrics_follow_the_otlp_endpoint_unless_told_otherwise() {
        let on = config(Some("http://collector:4318/"), "otlp");
        assert_eq!(
            url(&on).as_deref(),
            Some("http://collector:4318/v1/metrics")
        );
        assert_eq!(validate(&on), Ok(()));
        for off in ["none", "prometheus", ""] {
            assert_eq!(
                url(&config(Some("http://collector:4318"), off)),
                None,
                "{off}"
            );
        }
        assert_eq!(url(&config(None, "otlp")), None);
        let disabled = TelemetryConfig {
            disabled: true,
            ..on.clone()
        };
        assert_eq!(url(&disabled), None);

        let own = TelemetryConfig {
            otlp_metrics_endpoint: Some("http://metrics:9000/otlp".into()),
            otlp_protocol: super::super::PROTOCOL_GRPC.into(),
            ..config(Some("http://collector:4317"), "prometheus,otlp")
        };
        assert_eq!(url(&own).as_deref(), Some("http://metrics:9000/otlp"));
        let grpc = TelemetryConfig {
            otlp_metrics_endpoint: None,
            ..own.clone()
        };
        assert_eq!(url(&grpc), None, "gRPC metrics are not pushed");
    }

    #[test]
    fn bad_exporters_intervals_and_endpoints_are_refused() {
        assert!(validate(&config(None, "otlp,jaeger")).is_err());
        let never = TelemetryConfig {
            metric_export_interval_ms: 0,
            ..config(None, "otlp")
        };
        assert!(validate(&never).is_err());
        let nowhere = TelemetryConfig {
            otlp_metrics_endpoint: Some("collector:4318".into()),
            ..config(None, "otlp")
        };
        assert!(validate(&nowhere).is_err());
    }
}
