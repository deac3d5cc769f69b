//! One trace from submit to every tool call, exported by real lead and worker processes to an
//! OTLP receiver; one trace for every delivery of a task its client did not trace (handed back by
//! a stopping lead, resumed after an approval or a pause); metrics scraped with their exemplars
//! and pushed over OTLP; health endpoints scraped; a dead collector does not stop a turn.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use skein_common::protocol::{EventKind, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::otlp::{OtlpReceiver, ReceivedPoint, ReceivedSpan};
use skein_tests::support::test_tools::read_effects;
use skein_tests::support::{
    eventually, free_port, unique, ChildProcess, FakeOpenAi, FakeReply, FAKE_PROMPT_TOKENS,
};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");
const SECRET: &str = "sk-test-secret-do-not-leak";

/// A lead or worker process exporting traces to `endpoint`, using the fake model.
fn traced(
    cluster: &TestCluster,
    role: &str,
    endpoint: &str,
    model: &str,
    admin: Option<&str>,
    extra: &[&str],
    log: &str,
) -> ChildProcess {
    let mut args = cluster.process_args(role);
    if let Some(admin) = admin {
        let at = args
            .iter()
            .position(|a| a == "--admin-addr")
            .expect("process args name an admin address");
        args[at + 1] = admin.to_owned();
    }
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(args)
        .args(["--model-provider", "openai", "--model-base-url", model])
        .args(extra)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
        .env("SKEIN_MODEL_API_KEY", SECRET);
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

/// A worker process with the test tools (`slow_effect`), exporting traces to `endpoint`.
fn traced_test_worker(cluster: &TestCluster, endpoint: &str, log: &str) -> ChildProcess {
    let mut args = cluster.process_args("worker");
    args[0] = "test-worker".into();
    let mut cmd = std::process::Command::new(NODE);
    cmd.args(args)
        .env("SKEIN_TEST_EFFECTS", cluster.effects_file())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    ChildProcess::spawn(cmd, cluster.dir.join(log))
}

fn effect_starts(cluster: &TestCluster, key: &str) -> usize {
    read_effects(&cluster.effects_file())
        .get(key)
        .map_or(0, |count| count.started)
}

/// Waits until the processes have exported the spans `enough` asks for, each with its parent;
/// then checks that every span they exported is in `trace_id`. Returns them.
async fn whole_trace(
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
fn started_traces(events: &[skein_common::protocol::TurnEvent]) -> Vec<Option<String>> {
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
fn one_trace_for_every_start(
    result: &skein_common::protocol::FinalResult,
    events: &[skein_common::protocol::TurnEvent],
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
fn deliveries<'a>(spans: &'a [ReceivedSpan], session: &str) -> Vec<&'a ReceivedSpan> {
    let name = format!("process skein.submit.acme.{session}");
    spans.iter().filter(|s| s.name == name).collect()
}

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

fn names(spans: &[ReceivedSpan]) -> Vec<String> {
    spans
        .iter()
        .map(|s| format!("{}:{}", s.service, s.name))
        .collect()
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
    let _w1 = traced(
        &cluster,
        "worker",
        &receiver.endpoint,
        &model.base_url,
        None,
        &["--concurrency", "1"],
        "w1.log",
    );
    let _w2 = traced(
        &cluster,
        "worker",
        &receiver.endpoint,
        &model.base_url,
        None,
        &["--concurrency", "1"],
        "w2.log",
    );
    let _lead = traced(
        &cluster,
        "lead",
        &receiver.endpoint,
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
                !value.contains(SECRET),
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
    let _worker = traced(
        &cluster,
        "worker",
        &dead,
        &model.base_url,
        None,
        &[],
        "worker.log",
    );
    let _lead = traced(
        &cluster,
        "lead",
        &dead,
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

/// A task its client sent without trace context, handed back by a lead told to stop in the middle
/// of a slow call and finished by another lead: both deliveries, and everything under them, are
/// one trace, and every span's parent was exported (the second delivery continues the first
/// delivery's span, which its lead exported as it stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_handed_back_by_a_stopping_lead_stays_in_one_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let key = unique("slow");
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({ "key": key, "ms": 3000 })),
        FakeReply::answer("done after the hand-back"),
    ])
    .await;
    let _worker = traced_test_worker(&cluster, &receiver.endpoint, "worker.log");
    cluster.wait_for_workers(1).await;
    let flags = ["--ack-wait", "2s", "--lease-ttl", "2s", "--grace", "1s"];
    let lead = |log| {
        traced(
            &cluster,
            "lead",
            &receiver.endpoint,
            &model.base_url,
            None,
            &flags,
            log,
        )
    };
    let mut first = lead("lead1.log");

    let task = submission("acme", &unique("s"), "take your time");
    let running = cluster.run(&task);
    let stopping = async {
        eventually(
            "the slow call to start",
            Duration::from_secs(30),
            || async { (effect_starts(&cluster, &key) > 0).then_some(()) },
        )
        .await;
        first.sigterm();
        let exit = first.wait_exit(Duration::from_secs(30)).await;
        assert!(
            exit.is_some_and(|s| s.success()),
            "the lead stopped: {exit:?}"
        );
        lead("lead2.log")
    };
    let ((result, events), _second) = tokio::join!(running, stopping);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let trace_id =
        one_trace_for_every_start(&result, &events, 2, "started, handed back, started again");

    let spans = whole_trace(&receiver, &trace_id, |spans| {
        deliveries(spans, &task.session).len() >= 2
            && spans
                .iter()
                .filter(|s| s.name == "invoke_agent assistant")
                .count()
                >= 2
    })
    .await;
    let delivered = deliveries(&spans, &task.session);
    let root = delivered
        .iter()
        .find(|s| s.parent_span_id.is_empty())
        .expect("the first delivery starts the trace");
    assert!(
        delivered
            .iter()
            .filter(|s| s.span_id != root.span_id)
            .all(|s| s.parent_span_id == root.span_id),
        "every later delivery continues the first: {delivered:?}"
    );
    let services: std::collections::BTreeSet<_> =
        spans.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(
        services,
        ["skein-lead", "skein-worker"].into_iter().collect()
    );
}

/// A call that waits for a person suspends the turn (its delivery ends and the message is held);
/// `skein approve` answers, and the turn resumes on a later delivery: the suspended and the
/// resumed delivery, and the approved call the worker runs, are one trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_then_resumed_turn_stays_in_one_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({ "key": unique("deploy"), "ms": 10 })),
        FakeReply::answer("deployed after approval"),
    ])
    .await;
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nask = [\"slow_effect\"]\n+++\nYou are careful.\n",
    )
    .expect("AGENTS.md written");
    let _worker = traced_test_worker(&cluster, &receiver.endpoint, "worker.log");
    cluster.wait_for_workers(1).await;
    let _lead = traced(
        &cluster,
        "lead",
        &receiver.endpoint,
        &model.base_url,
        None,
        &["--agents-dir", agents.to_str().expect("utf-8 path")],
        "lead.log",
    );

    let task = submission("acme", &unique("s"), "deploy it");
    let running = cluster.run(&task);
    let approving = async {
        let store = cluster.store().await;
        eventually("the approval request", Duration::from_secs(30), || {
            let store = store.clone();
            let task_id = task.task_id.clone();
            async move {
                store
                    .approval_request("acme", &task_id)
                    .await
                    .ok()
                    .flatten()
            }
        })
        .await;
        let approved = std::process::Command::new(NODE)
            .args(["approve", &task.task_id, "--tenant", "acme", "--by", "ann"])
            .args([
                "--redis-url",
                &cluster.redis.url,
                "--nats-url",
                &cluster.nats.url,
            ])
            .output()
            .expect("skein approve runs");
        assert!(
            approved.status.success(),
            "{}",
            String::from_utf8_lossy(&approved.stderr)
        );
    };
    let ((result, events), ()) = tokio::join!(running, approving);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("deployed after approval"));
    let trace_id = one_trace_for_every_start(&result, &events, 2, "asked, then resumed");

    let spans = whole_trace(&receiver, &trace_id, |spans| {
        deliveries(spans, &task.session).len() >= 2
            && spans
                .iter()
                .any(|s| s.service == "skein-worker" && s.name == "execute_tool slow_effect")
    })
    .await;
    let delivered = deliveries(&spans, &task.session);
    assert_eq!(
        delivered
            .iter()
            .filter(|s| s.parent_span_id.is_empty())
            .count(),
        1,
        "one delivery starts the trace, the others continue it: {delivered:?}"
    );
}

/// A turn paused while its call runs parks (its delivery ends; no lead holds it) and `skein
/// resume` lets a later delivery continue it: the parked and the resumed delivery, and both calls
/// the worker runs, are one trace, every span's parent exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_then_resumed_turn_stays_in_one_trace() {
    let cluster = TestCluster::start();
    let receiver = OtlpReceiver::start().await;
    let (first, second) = (unique("before-pause"), unique("after-resume"));
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("slow_effect", json!({ "key": first, "ms": 1500 })),
        FakeReply::tool("slow_effect", json!({ "key": second, "ms": 10 })),
        FakeReply::answer("done after the pause"),
    ])
    .await;
    let _worker = traced_test_worker(&cluster, &receiver.endpoint, "worker.log");
    cluster.wait_for_workers(1).await;
    let _lead = traced(
        &cluster,
        "lead",
        &receiver.endpoint,
        &model.base_url,
        None,
        &[],
        "lead.log",
    );

    let session = unique("s");
    let task = submission("acme", &session, "work, then wait");
    let running = cluster.run(&task);
    let controlling = async {
        eventually(
            "the first call running",
            Duration::from_secs(30),
            || async { (effect_starts(&cluster, &first) > 0).then_some(()) },
        )
        .await;
        let control = |args: &[&str]| {
            let output = std::process::Command::new(NODE)
                .args(args)
                .args(["--nats-url", &cluster.nats.url, "--tenant", "acme"])
                .output()
                .expect("skein runs");
            assert!(
                output.status.success(),
                "skein {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        control(&["pause", &task.task_id]);
        let store = cluster.store().await;
        eventually("the turn parked", Duration::from_secs(30), || {
            let (store, session) = (store.clone(), session.clone());
            async move {
                store
                    .running_turn("acme", &session)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            }
        })
        .await;
        control(&["resume", &task.task_id, "--session", &session]);
    };
    let ((result, events), ()) = tokio::join!(running, controlling);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("done after the pause"));
    let trace_id = one_trace_for_every_start(&result, &events, 2, "paused, then resumed");

    let spans = whole_trace(&receiver, &trace_id, |spans| {
        deliveries(spans, &session).len() >= 2
            && spans
                .iter()
                .filter(|s| s.service == "skein-worker" && s.name == "execute_tool slow_effect")
                .count()
                >= 2
    })
    .await;
    let delivered = deliveries(&spans, &session);
    assert_eq!(
        delivered
            .iter()
            .filter(|s| s.parent_span_id.is_empty())
            .count(),
        1,
        "one delivery starts the trace, the others continue it: {delivered:?}"
    );
}
