//! Lead and worker processes that export their traces to an OTLP receiver, and what tests read
//! back from it: the whole trace of a task (every span with its parent exported), the trace each
//! start of a task names, and the deliveries of its submission.

use std::time::Duration;

use skein_common::protocol::{EventKind, FinalResult, TurnEvent};

use super::cluster::TestCluster;
use super::otlp::{OtlpReceiver, ReceivedSpan};
use super::{eventually, ChildProcess};

/// The model key the traced processes are given (no span or log may show it).
pub const MODEL_KEY: &str = "sk-test-secret-do-not-leak";

/// Processes of one cluster that export their traces to one OTLP endpoint.
pub struct Exporting<'a> {
    /// The `skein-node` binary.
    node: &'a str,
    cluster: &'a TestCluster,
    endpoint: &'a str,
}

impl<'a> Exporting<'a> {
    pub fn new(node: &'a str, cluster: &'a TestCluster, endpoint: &'a str) -> Self {
        Self {
            node,
            cluster,
            endpoint,
        }
    }

    /// A process of `role` (`lead` or `worker`) using the fake model at `model`, its admin server
    /// on `admin` when given.
    pub fn process(
        &self,
        role: &str,
        model: &str,
        admin: Option<&str>,
        extra: &[&str],
        log: &str,
    ) -> ChildProcess {
        let mut args = self.cluster.process_args(role);
        if let Some(admin) = admin {
            let at = args
                .iter()
                .position(|a| a == "--admin-addr")
                .expect("process args name an admin address");
            args[at + 1] = admin.to_owned();
        }
        let mut cmd = std::process::Command::new(self.node);
        cmd.args(args)
            .args(["--model-provider", "openai", "--model-base-url", model])
            .args(extra)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
            .env("SKEIN_MODEL_API_KEY", MODEL_KEY);
        ChildProcess::spawn(cmd, self.cluster.dir.join(log))
    }

    /// A worker process with the test tools (`slow_effect`).
    pub fn test_worker(&self, log: &str) -> ChildProcess {
        let mut args = self.cluster.process_args("worker");
        args[0] = "test-worker".into();
        let mut cmd = std::process::Command::new(self.node);
        cmd.args(args)
            .env("SKEIN_TEST_EFFECTS", self.cluster.effects_file())
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100");
        ChildProcess::spawn(cmd, self.cluster.dir.join(log))
    }
}

/// Waits until the processes have exported the spans `enough` asks for, each with its parent;
/// then checks that every span they exported is in `trace_id`. Returns them.
pub async fn whole_trace(
    receiver: &OtlpReceiver,
    trace_id: &str,
    enough: impl Fn(&[ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    let spans = eventually(
        "every span of the task, with its parent",
        Duration::from_secs(30),
        || {
            let spans = receiver.spans();
            let closed = spans.iter().all(|s| {
                s.parent_span_id.is_empty() || spans.iter().any(|p| p.span_id == s.parent_span_id)
            });
            let done = enough(&spans) && closed;
            async move { done.then_some(spans) }
        },
    )
    .await;
    println!(
        "trace {trace_id}: {} spans: {:?}",
        spans.len(),
        names(&spans)
    );
    for span in &spans {
        assert_eq!(
            span.trace_id, trace_id,
            "{} ({}) is in another trace",
            span.name, span.service
        );
    }
    spans
}

/// The trace ids the task's `turn_started` events name, in order.
pub fn started_traces(events: &[TurnEvent]) -> Vec<Option<String>> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::TurnStarted { trace_id, .. } => Some(trace_id.clone()),
            _ => None,
        })
        .collect()
}

/// The trace the task's result names, after checking that the task started at least `starts`
/// times (`what` says why) and that every start was in that trace.
pub fn one_trace_for_every_start(
    result: &FinalResult,
    events: &[TurnEvent],
    starts: usize,
    what: &str,
) -> String {
    let trace_id = result.trace_id.clone().expect("the result names its trace");
    let started = started_traces(events);
    assert!(started.len() >= starts, "{what}: {started:?}");
    assert!(
        started
            .iter()
            .all(|t| t.as_deref() == Some(trace_id.as_str())),
        "every start in the task's trace: {started:?}"
    );
    trace_id
}

/// The deliveries of the task's submission, by their `process` spans.
pub fn deliveries<'a>(spans: &'a [ReceivedSpan], session: &str) -> Vec<&'a ReceivedSpan> {
    let name = format!("process skein.submit.acme.{session}");
    spans.iter().filter(|s| s.name == name).collect()
}

/// `service:name` of each span, for messages.
pub fn names(spans: &[ReceivedSpan]) -> Vec<String> {
    spans
        .iter()
        .map(|s| format!("{}:{}", s.service, s.name))
        .collect()
}

/// Checks that exactly one of the task's deliveries starts its trace, the others continuing it.
pub fn one_root_delivery(spans: &[ReceivedSpan], session: &str) {
    let delivered = deliveries(spans, session);
    assert_eq!(
        delivered
            .iter()
            .filter(|s| s.parent_span_id.is_empty())
            .count(),
        1,
        "one delivery starts the trace, the others continue it: {delivered:?}"
    );
}
