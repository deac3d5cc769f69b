//! One trace from submit to every tool call, exported by real lead and worker processes to an
//! OTLP receiver; metrics scraped with their exemplars and pushed over OTLP; health endpoints
//! scraped; a dead collector does not stop a turn. (Every delivery of one task in one trace:
//! `trace_per_task.rs`.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::otlp::{OtlpReceiver, ReceivedPoint, ReceivedSpan};
use skein_tests::support::traced::{names, Exporting, MODEL_KEY};
use skein_tests::support::{
    eventually, free_port, unique, FakeOpenAi, FakeReply, FAKE_PROMPT_TOKENS,
};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// The latest point of `metric` from `service` whose attributes include `labels`.
fn latest_point<'a>(
    points: &'a [ReceivedPoint],
    service: &str,
    metric: &str,
    labels: &[(&str, &str)],
) -> Option<&'a ReceivedPoint> {
    points
        .iter()
        .filter(|p| p.service == service && p.metric == metric)
        .filter(|p| {
            labels
                .iter()
                .all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v))
        })
        .max_by_key(|p| p.time_unix_nano)
}

fn find<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.service == service && s.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} from {service}; got {:?}", names(spans)))
}

fn parent<'a>(spans: &'a [ReceivedSpan], child: &ReceivedSpan) -> &'a ReceivedSpan {
    spans
        .iter()
        .find(|s| s.span_id == child.parent_span_id)
        .unwrap_or_else(|| {
            panic!(
                "the parent of {} ({}) was not exported",
                child.name, child.service
            )
        })
}

fn attr<'a>(span: &'a ReceivedSpan, key: &str) -> &'a str {
    span.attributes
        .get(key)
        .map(String::as_str)
        .unwrap_or_else(|| {
            panic!(
                "{} has no attribute {key}: {:?}",
                span.name, span.attributes
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_covers_the_turn_its_tool_calls_and_its_subagent_across_processes() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    // The lead's first answer asks for a tool and a subagent; the subagent lists files and answers.
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            (
                "write_file".into(),
                json!({ "path": "a.txt", "content": "hello" }),
            ),
            (
                "spawn_agent".into(),
                json!({ "agent": "researcher", "task": "look around" }),
            ),
        ]),
        FakeReply::ToolCalls(vec![("list_files".into(), json!({}))]),
        FakeReply::Answer("the workspace has a.txt".into()),
        FakeReply::Answer("all done".into()),
    ])
    .await;
    let admin_port = free_port();
    let admin = format!("127.0.0.1:{admin_port}");
    let _w1 = Exporting::new(NODE, &cluster, &receiver.endpoint).process(
        "worker",
        &model.base_url,
        None,
        &["--concurrency", "1"],
        "w1.log",
    );
    let _w2 = Exporting::new(NODE, &cluster, &receiver.endpoint).process(
        "worker",
        &model.base_url,
        None,
        &["--concurrency", "1"],
        "w2.log",
    );
    let _lead = Exporting::new(NODE, &cluster, &receiver.endpoint).process(
        "lead",
        &model.base_url,
        Some(&admin),
        &[],
        "lead.log",
    );
    cluster.wait_for_workers(2).await;

    let task = submission("acme", &unique("s"), "note and research");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let trace_id = result
        .trace_id
        .clone()
        .expect("the final result names its trace");
    assert!(events.iter().any(
        |e| matches!(&e.event, EventKind::TurnStarted { trace_id: Some(t), .. } if *t == trace_id)
    ));

    let spans = eventually(
        "the subagent's spans to arrive",
        Duration::from_secs(30),
        || {
            let spans = receiver.spans();
            let trace_id = trace_id.clone();
            async move {
                let ours: Vec<_> = spans
                    .into_iter()
                    .filter(|s| s.trace_id == trace_id)
                    .collect();
                let done = ours.iter().any(|s| s.name == "invoke_agent researcher")
                    && ours.iter().any(|s| {
                        s.service == "skein-worker" && s.name == "execute_tool list_files"
                    })
                    && ours.iter().any(|s| s.name == "invoke_agent assistant");
                // Spans are exported as they end, and a parent ends after its children (the
                // delivery's span after the turn): wait until every parent has arrived too.
                let closed = ours.iter().all(|s| {
                    s.parent_span_id.is_empty()
                        || ours.iter().any(|p| p.span_id == s.parent_span_id)
                });
                (done && closed).then_some(ours)
            }
        },
    )
    .await;
    println!(
        "trace {trace_id}: {} spans: {:?}",
        spans.len(),
        names(&spans)
    );

    // One trace across processes: every span of the run, from both services, carries it.
    let everything = receiver.spans();
    let services: std::collections::BTreeSet<_> =
        spans.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(
        services,
        ["skein-lead", "skein-worker"].into_iter().collect()
    );
    for stray in everything
        .iter()
        .filter(|s| s.name.starts_with("execute_tool") || s.name.starts_with("invoke_agent"))
    {
        assert_eq!(
            stray.trace_id, trace_id,
            "{} is in another trace",
            stray.name
        );
    }

    // Parent links: turn under its delivery; tool execution under its dispatch; subagent turn
    // under its call.
    let turn = find(&spans, "skein-lead", "invoke_agent assistant");
    assert_eq!(
        parent(&spans, turn).name,
        format!("process skein.submit.acme.{}", task.session)
    );
    let call = find(&spans, "skein-lead", "execute_tool write_file");
    assert_eq!(parent(&spans, call).span_id, turn.span_id);
    let publish = find(
        &spans,
        "skein-lead",
        "publish skein.tool.default.write_file",
    );
    assert_eq!(parent(&spans, publish).span_id, call.span_id);
    let delivery = find(
        &spans,
        "skein-worker",
        "process skein.tool.default.write_file",
    );
    assert_eq!(
        delivery.parent_span_id, publish.span_id,
        "the worker's delivery is a child of the dispatch"
    );
    let execution = find(&spans, "skein-worker", "execute_tool write_file");
    assert_eq!(execution.parent_span_id, delivery.span_id);

    let spawn = find(&spans, "skein-lead", "execute_tool spawn_agent");
    let child_turn = find(&spans, "skein-worker", "invoke_agent researcher");
    let child_delivery = parent(&spans, child_turn);
    assert_eq!(
        child_delivery.name,
        "process skein.agent.default.researcher"
    );
    let child_publish = parent(&spans, child_delivery);
    assert_eq!(
        parent(&spans, child_publish).span_id,
        spawn.span_id,
        "the subagent turn is under its call"
    );
    let child_tool = find(&spans, "skein-worker", "execute_tool list_files");
    assert!(
        std::iter::successors(Some(child_tool), |s| spans
            .iter()
            .find(|p| p.span_id == s.parent_span_id))
        .any(|s| s.span_id == child_turn.span_id),
        "the subagent's own tool call is inside the subagent turn"
    );

    // Required attributes (GenAI and messaging conventions).
    let chat = spans
        .iter()
        .find(|s| s.service == "skein-lead" && s.name.starts_with("chat "))
        .expect("a chat span");
    assert_eq!(attr(chat, "gen_ai.operation.name"), "chat");
    assert_eq!(attr(chat, "gen_ai.provider.name"), "openai");
    assert_eq!(attr(chat, "gen_ai.request.model"), "gpt-4o-mini");
    assert_eq!(
        attr(chat, "gen_ai.usage.input_tokens"),
        FAKE_PROMPT_TOKENS.to_string()
    );
    assert!(!attr(chat, "gen_ai.response.finish_reasons").is_empty());
    assert_eq!(attr(call, "gen_ai.tool.name"), "write_file");
    assert!(!attr(call, "gen_ai.tool.call.id").is_empty());
    assert_eq!(attr(turn, "gen_ai.agent.name"), "assistant");
    assert_eq!(attr(publish, "messaging.system"), "nats");
    assert_eq!(
        attr(publish, "messaging.destination.name"),
        "skein.tool.default.write_file"
    );
    assert!(!attr(publish, "messaging.message.id").is_empty());
    assert!(!attr(turn, "resource.service.instance.id").is_empty());

    // No secret, and no content (not enabled), anywhere.
    for span in &everything {
        for (key, value) in &span.attributes {
            assert!(
                !value.contains(MODEL_KEY),
                "{}: {key} leaks the API key",
                span.name
            );
            assert!(
                !value.contains("note and research"),
                "{}: {key} records the prompt",
                span.name
            );
        }
    }

    // `skein trace` finds the trace of the task and links it in Jaeger.
    let traced_cli = std::process::Command::new(NODE)
        .args([
            "trace",
            "--nats-url",
            &cluster.nats.url,
            "--tenant",
            "acme",
            "--jaeger-ui",
            "http://jaeger.example:16686/",
        ])
        .arg(&task.task_id)
        .output()
        .expect("skein trace runs");
    let printed = String::from_utf8_lossy(&traced_cli.stdout);
    assert!(
        traced_cli.status.success(),
        "{}",
        String::from_utf8_lossy(&traced_cli.stderr)
    );
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [
            trace_id.clone(),
            format!("http://jaeger.example:16686/trace/{trace_id}")
        ]
    );

    // Metrics and health of the lead after the turn.
    let http = reqwest::Client::new();
    let metrics = http
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    let series: BTreeMap<&str, &str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .collect();
    println!("lead metrics: {} series", series.len());
    assert_eq!(
        series.get("skein_turns_total{outcome=\"completed\"}"),
        Some(&"1"),
        "{metrics}"
    );
    assert_eq!(
        series.get("skein_model_calls_total{provider=\"openai\",outcome=\"ok\"}"),
        Some(&"2"),
        "{metrics}"
    );
    assert_eq!(
        series.get("skein_in_flight{kind=\"turn\"}"),
        Some(&"0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("skein_turn_duration_seconds_count{outcome=\"completed\"} 1"),
        "{metrics}"
    );
    // The turn's bucket links to its trace (an OpenMetrics exemplar).
    let exemplar = format!("trace_id=\"{trace_id}\"");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("skein_turn_duration_seconds_bucket{")
                && l.contains("outcome=\"completed\"")
                && l.contains(&exemplar)),
        "{metrics}"
    );

    // The same metrics reach the collector over OTLP, with the exemplars.
    let points = eventually(
        "the turn's metrics over OTLP",
        Duration::from_secs(30),
        || {
            let points = receiver.points();
            let trace_id = trace_id.clone();
            async move {
                let turn = latest_point(
                    &points,
                    "skein-lead",
                    "skein_turn_duration_seconds",
                    &[("outcome", "completed")],
                )?;
                let tool = latest_point(
                    &points,
                    "skein-worker",
                    "skein_tool_duration_seconds",
                    &[("tool", "write_file")],
                )?;
                (turn.exemplar_traces.contains(&trace_id)
                    && tool.exemplar_traces.contains(&trace_id))
                .then_some(points)
            }
        },
    )
    .await;
    let turns = latest_point(
        &points,
        "skein-lead",
        "skein_turns",
        &[("outcome", "completed")],
    )
    .expect("skein_turns over OTLP");
    assert_eq!((turns.kind, turns.value), ("sum", 1.0), "{turns:?}");
    let turn = latest_point(
        &points,
        "skein-lead",
        "skein_turn_duration_seconds",
        &[("outcome", "completed")],
    )
    .expect("the turn's duration over OTLP");
    assert_eq!(
        (turn.kind, turn.count, turn.unit.as_str()),
        ("histogram", 1, "s")
    );
    let calls = latest_point(
        &points,
        "skein-lead",
        "skein_model_calls",
        &[("provider", "openai"), ("outcome", "ok")],
    )
    .expect("skein_model_calls over OTLP");
    assert_eq!(calls.value, 2.0, "{calls:?}");
    let in_flight = latest_point(
        &points,
        "skein-lead",
        "skein_in_flight",
        &[("kind", "turn")],
    )
    .expect("skein_in_flight over OTLP");
    assert_eq!(in_flight.kind, "gauge", "{in_flight:?}");
    let ready = http
        .get(format!("http://{admin}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    let live = http
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(live.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_does_not_stop_a_turn() {
    let cluster = TestCluster::start();
    let dead = format!("http://127.0.0.1:{}", free_port());
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![("list_files".into(), json!({}))]),
        FakeReply::Answer("listed".into()),
    ])
    .await;
    let _worker = Exporting::new(NODE, &cluster, &dead).process(
        "worker",
        &model.base_url,
        None,
        &[],
        "worker.log",
    );
    let _lead = Exporting::new(NODE, &cluster, &dead).process(
        "lead",
        &model.base_url,
        None,
        &[],
        "lead.log",
    );
    cluster.wait_for_workers(1).await;
    let started = Instant::now();
    let (result, _) = cluster.run(&submission("acme", &unique("s"), "list")).await;
    println!("dead collector: turn completed in {:?}", started.elapsed());
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("listed"));
}

/// A lead that exports nothing still carries the task's trace to its workers (it opens no span of
/// its own for a call it publishes; the call carries the ids of the span it was made in): the
/// exporting worker's spans join the trace the turn started, under a parent the lead did not
/// export, and the lead exports nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_that_exports_nothing_keeps_its_calls_in_the_turns_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![("list_files".into(), json!({}))]),
        FakeReply::Answer("listed".into()),
    ])
    .await;
    let _worker = Exporting::new(NODE, &cluster, &receiver.endpoint).process(
        "worker",
        &model.base_url,
        None,
        &[],
        "worker.log",
    );
    // An empty endpoint exports nothing.
    let _lead =
        Exporting::new(NODE, &cluster, "").process("lead", &model.base_url, None, &[], "lead.log");
    cluster.wait_for_workers(1).await;
    let (result, _) = cluster.run(&submission("acme", &unique("s"), "list")).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let trace_id = result
        .trace_id
        .clone()
        .expect("the final result names its trace");

    let tool = eventually(
        "the worker's span of the call",
        Duration::from_secs(30),
        || {
            let spans = receiver.spans();
            async move {
                spans
                    .into_iter()
                    .find(|s| s.service == "skein-worker" && s.name.ends_with(".list_files"))
            }
        },
    )
    .await;
    assert_eq!(tool.trace_id, trace_id, "{tool:?}");
    assert!(!tool.parent_span_id.is_empty(), "{tool:?}");
    let spans = receiver.spans();
    assert!(
        spans.iter().all(|s| s.service != "skein-lead"),
        "the lead exported: {:?}",
        names(&spans)
    );
}
