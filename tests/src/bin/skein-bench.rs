//! `skein-bench`: measures Skein against the floor of its own infrastructure, in one run on one
//! machine. It starts its own `nats-server` and `redis-server` on free ports and real lead and
//! worker processes (this binary re-run as `skein-bench node ...`), then prints a table of
//! figures and Skein/floor ratios (and writes them as JSON with `--json FILE`).
//!
//! Run on demand (it is not a test): `cargo run --release -p skein-tests --bin skein-bench`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::bus::Bus;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::dispatch::{CallRoute, Dispatcher};
use skein_common::protocol::{
    CallOutcome, EventKind, TaskOrigin, TaskSubmission, TurnEvent, PROTOCOL_VERSION,
};
use skein_common::store::{SessionStore, TurnCheckpoint};
use skein_tests::support::servers::{NatsServer, RedisServer};
use skein_tests::support::{unique, ChildProcess};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, Parser)]
#[command(
    name = "skein-bench",
    about = "Skein against the floor of NATS and Redis, in one run"
)]
struct Args {
    /// Samples per latency figure.
    #[arg(long, default_value_t = 2000)]
    samples: usize,
    /// Calls per throughput figure.
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// Concurrent sessions of the burst.
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also measure the Celery peer (benches/peers) on the same Redis; needs python3 and PyPI.
    #[arg(long)]
    celery: bool,
    /// Run the lead under this profiler command (e.g. "heaptrack -o lead"); its RSS figures
    /// then describe the profiler, not the lead.
    #[arg(long)]
    wrap_lead: Option<String>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        // The processes the bench starts: `node <skein command...>` and `responder <nats url>`.
        Some("node") => {
            let rest = std::iter::once("skein".to_owned()).chain(args[2..].iter().cloned());
            return skein_tests::support::node::main_from(rest.collect());
        }
        Some("responder") => return responder(args.get(2).cloned().unwrap_or_default()),
        _ => {}
    }
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("skein-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skein-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

type Failed = Box<dyn std::error::Error + Send + Sync>;

/// Figures of one run, in the order they are printed.
#[derive(Default)]
struct Report {
    rows: Vec<(String, f64, String)>,
}

impl Report {
    fn add(&mut self, name: &str, value: f64, unit: &str) {
        eprintln!("  {name}: {value:.1} {unit}");
        self.rows.push((name.to_owned(), value, unit.to_owned()));
    }

    fn get(&self, name: &str) -> f64 {
        self.rows
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| *v)
            .unwrap_or(f64::NAN)
    }
}

async fn run(args: Args) -> Result<(), Failed> {
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(unique("skein-bench"));
    std::fs::create_dir_all(&dir)?;
    let mut report = Report::default();
    eprintln!("floor");
    floor_request_reply(&nats.url, args.samples, args.calls, &mut report).await?;
    floor_jetstream(&nats.url, args.samples, args.calls, &mut report).await?;
    let blob = session_blob();
    floor_redis_set(&redis.url, &blob, args.samples, &mut report).await?;

    eprintln!("skein");
    let cluster = Nodes {
        nats: nats.url.clone(),
        redis: redis.url.clone(),
        dir: dir.clone(),
        wrap_lead: args.wrap_lead.clone(),
    };
    checkpoint_cost(&redis.url, &blob, args.samples, &mut report).await?;
    let bus = Bus::connect(
        &NatsConfig::local(nats.url.clone()),
        "bench",
        skein_common::bus::DEFAULT_MAX_PAYLOAD,
    )
    .await?;
    bus.ensure_streams().await?;
    let store = SessionStore::connect(&RedisConfig::local(redis.url.clone())).await?;
    let ready = start_to_ready(&cluster, &store, &mut report).await?;
    let mut first = cluster.worker("worker-1");
    wait_workers(&store, 1).await?;
    noop_calls(&bus, &store, args.samples, args.calls, 1, &mut report).await?;
    let mut second = cluster.worker("worker-2");
    wait_workers(&store, 2).await?;
    noop_calls(&bus, &store, 0, args.calls, 2, &mut report).await?;
    let scenario = dir.join("scenario.json");
    std::fs::write(
        &scenario,
        json!({ "agents": { "assistant": { "turns": [ { "steps": [
            { "tool_calls": [ { "name": "noop", "arguments": {} }, { "name": "noop", "arguments": {} } ] },
            { "answer": "done" }
        ] } ] } } })
        .to_string(),
    )?;
    let lead_admin = format!("127.0.0.1:{}", skein_tests::support::free_port());
    let mut lead = cluster.lead(&scenario, &lead_admin);
    tokio::time::sleep(Duration::from_millis(500)).await;
    report.add(
        "lead idle RSS",
        rss_kib(lead.id(), "VmRSS")? / 1024.0,
        "MiB",
    );
    report.add(
        "worker idle RSS",
        rss_kib(first.id(), "VmRSS")? / 1024.0,
        "MiB",
    );
    whole_turns(&nats.url, args.samples.min(500), &mut report).await?;
    burst(
        &nats.url,
        &store,
        args.burst,
        lead.id(),
        &lead_admin,
        &mut report,
    )
    .await?;
    let _ = ready;
    lead.kill();
    first.kill();
    second.kill();
    if args.celery {
        eprintln!("peer: celery");
        celery_peer(
            &redis.url,
            &dir,
            args.samples.min(1000),
            args.calls,
            &mut report,
        )
        .await?;
    }
    print_table(&report);
    if let Some(path) = args.json {
        let rows: Vec<Value> = report
            .rows
            .iter()
            .map(|(name, value, unit)| json!({ "name": name, "value": value, "unit": unit }))
            .collect();
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json!({ "figures": rows, "ratios": ratios(&report) }))?,
        )?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The lead and worker processes of the bench.
struct Nodes {
    nats: String,
    redis: String,
    dir: PathBuf,
    /// A profiler command the lead runs under.
    wrap_lead: Option<String>,
}

impl Nodes {
    /// `admin` is the node's admin address, or `off`.
    fn command(&self, role: &str, id: &str, admin: &str) -> std::process::Command {
        let exe = std::env::current_exe().unwrap_or_else(|_| "skein-bench".into());
        let wrapper: Vec<&str> = match (&self.wrap_lead, role) {
            (Some(wrapper), "lead") => wrapper.split_whitespace().collect(),
            _ => Vec::new(),
        };
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = std::process::Command::new(program);
                cmd.args(args).arg(exe);
                cmd
            }
            None => std::process::Command::new(exe),
        };
        cmd.args([
            "node",
            role,
            "--nats-url",
            &self.nats,
            "--redis-url",
            &self.redis,
        ])
        .args(["--instance-id", id, "--admin-addr", admin])
        .env("SKEIN_LOG", "warn");
        cmd
    }

    fn worker(&self, id: &str) -> ChildProcess {
        let mut cmd = self.command("test-worker", id, "off");
        cmd.args(["--concurrency", "64", "--subagents", "false"])
            .args([
                "--workspace-root",
                &self.dir.join("ws").display().to_string(),
            ]);
        ChildProcess::spawn(cmd, self.dir.join(format!("{id}.log")))
    }

    /// The lead, with its admin server on `admin` (its metrics tell the turns in flight).
    fn lead(&self, scenario: &std::path::Path, admin: &str) -> ChildProcess {
        let mut cmd = self.command("lead", "bench-lead", admin);
        cmd.args([
            "--concurrency",
            "1000",
            "--scenario",
            &scenario.display().to_string(),
        ]);
        ChildProcess::spawn(cmd, self.dir.join("lead.log"))
    }
}

fn percentile(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e6
}

fn latencies(report: &mut Report, name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    report.add(&format!("{name} p50"), percentile(&samples, 50), "µs");
    report.add(&format!("{name} p99"), percentile(&samples, 99), "µs");
}

/// A session-sized blob: the JSON of a history of 40 messages.
fn session_blob() -> String {
    let history: Vec<Value> = (0..40)
        .map(|i| json!({ "role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "x".repeat(180) }))
        .collect();
    json!({ "history": history, "turns": 20 }).to_string()
}

/// The process that answers core requests for the floor.
fn responder(url: String) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => return ExitCode::FAILURE,
    };
    runtime.block_on(async move {
        let Ok(client) = async_nats::connect(url.as_str()).await else {
            return ExitCode::FAILURE;
        };
        let Ok(mut requests) = client.subscribe("bench.echo").await else {
            return ExitCode::FAILURE;
        };
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = client.publish(reply, request.payload).await;
            }
        }
        ExitCode::SUCCESS
    })
}

async fn floor_request_reply(
    url: &str,
    samples: usize,
    calls: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["responder", url]);
    let _responder = ChildProcess::spawn(cmd, std::env::temp_dir().join(unique("responder")));
    let client = async_nats::connect(url).await?;
    let payload = bytes::Bytes::from(vec![b'x'; 1024]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.request("bench.echo", payload.clone()).await.is_err() {
        if Instant::now() > deadline {
            return Err("the responder did not answer".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        client.request("bench.echo", payload.clone()).await?;
        taken.push(started.elapsed());
    }
    latencies(report, "floor: core NATS request-reply", taken);
    let started = Instant::now();
    let done = futures::stream::iter(0..calls)
        .map(|_| {
            let client = client.clone();
            let payload = payload.clone();
            async move { client.request("bench.echo", payload).await.is_ok() }
        })
        .buffer_unordered(256)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    report.add(
        "floor: pipelined core NATS request-reply",
        done as f64 / started.elapsed().as_secs_f64(),
        "req/s",
    );
    Ok(())
}

async fn floor_jetstream(
    url: &str,
    samples: usize,
    calls: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    use async_nats::jetstream::{self, consumer, stream};
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client);
    let bench = js
        .get_or_create_stream(stream::Config {
            name: "BENCH".into(),
            subjects: vec!["bench.js".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    let consumer: consumer::PullConsumer = bench
        .get_or_create_consumer(
            "bench",
            consumer::pull::Config {
                durable_name: Some("bench".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await?;
    let payload = bytes::Bytes::from(vec![b'x'; 1024]);
    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        js.publish("bench.js", payload.clone()).await?.await?;
        taken.push(started.elapsed());
    }
    latencies(report, "floor: JetStream publish with ack", taken);
    // Publish in windows: the client bounds acknowledgements in flight, so collect them as we go.
    let mut acks = Vec::with_capacity(1000);
    for _ in 0..calls {
        acks.push(js.publish("bench.js", payload.clone()).await?);
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    let started = Instant::now();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(500)
        .messages()
        .await?;
    let mut consumed = 0;
    let total = samples + calls;
    while consumed < total {
        let Some(message) = messages.next().await else {
            break;
        };
        message?.ack().await?;
        consumed += 1;
    }
    report.add(
        "floor: JetStream consume and ack",
        consumed as f64 / started.elapsed().as_secs_f64(),
        "msg/s",
    );
    Ok(())
}

async fn floor_redis_set(
    url: &str,
    blob: &str,
    samples: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut taken = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        let () = redis::cmd("SET")
            .arg(format!("bench:blob:{i}"))
            .arg(blob)
            .query_async(&mut conn)
            .await?;
        taken.push(started.elapsed());
    }
    latencies(report, "floor: Redis SET of a session", taken);
    Ok(())
}

async fn checkpoint_cost(
    url: &str,
    blob: &str,
    samples: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let store = SessionStore::connect(&RedisConfig::local(url.to_owned())).await?;
    let token = "bench-lead:task";
    store
        .try_lease("bench", "checkpoints", token, Duration::from_secs(600))
        .await?;
    let history: Vec<skein_common::protocol::message::Message> =
        serde_json::from_str::<Value>(blob)?["history"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|m| {
                        skein_common::protocol::message::Message::user(
                            m["content"].as_str().unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
    let checkpoint = TurnCheckpoint {
        new_messages: history,
        iterations: 3,
        usage: Default::default(),
        loaded_skills: Vec::new(),
    };
    let mut taken = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        store
            .save_checkpoint("bench", "checkpoints", &format!("t{i}"), token, &checkpoint)
            .await?;
        taken.push(started.elapsed());
    }
    latencies(report, "skein: checkpoint of a step", taken);
    let bytes = serde_json::to_string(&checkpoint)?;
    floor_redis_set(url, &bytes, samples, &mut Report::default()).await?;
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut taken = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        let () = redis::cmd("SET")
            .arg(format!("bench:same:{i}"))
            .arg(&bytes)
            .query_async(&mut conn)
            .await?;
        taken.push(started.elapsed());
    }
    latencies(report, "floor: Redis SET of the same bytes", taken);
    Ok(())
}

async fn wait_workers(store: &SessionStore, n: usize) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.live_workers().await?.len() < n {
        if Instant::now() > deadline {
            return Err(format!("{n} workers did not come up").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Time from spawning a worker process to its first announcement, median of 5.
async fn start_to_ready(
    nodes: &Nodes,
    store: &SessionStore,
    report: &mut Report,
) -> Result<Duration, Failed> {
    let mut taken = Vec::new();
    for i in 0..5 {
        let id = format!("ready-{i}");
        let started = Instant::now();
        let mut worker = nodes.worker(&id);
        loop {
            if store
                .live_workers()
                .await?
                .iter()
                .any(|w| w.worker_id == id)
            {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err("a worker did not get ready".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        taken.push(started.elapsed());
        worker.sigterm();
        let _ = worker.wait_exit(Duration::from_secs(10)).await;
        store.remove_worker(&id).await?;
    }
    taken.sort();
    report.add(
        "skein: worker start to ready",
        taken[2].as_secs_f64() * 1e3,
        "ms",
    );
    Ok(taken[2])
}

fn origin(i: usize) -> TaskOrigin {
    TaskOrigin {
        task_id: format!("bench-{i}-{}", unique("t")),
        tenant: "bench".into(),
        user: "bench".into(),
        session: format!("s{}", i % 64),
        workspace: format!("s{}", i % 64),
        deadline_ms: None,
    }
}

async fn noop_calls(
    bus: &Bus,
    store: &SessionStore,
    samples: usize,
    calls: usize,
    workers: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    let dispatcher = Arc::new(
        Dispatcher::start(
            bus.clone(),
            store.clone(),
            &unique("bench-lead"),
            &tracker,
            stop.clone(),
        )
        .await?,
    );
    let route = || CallRoute {
        pool: "default",
        timeout: Duration::from_secs(30),
        may_have_run: false,
    };
    let call = |dispatcher: Arc<Dispatcher>, i: usize| async move {
        let result = dispatcher
            .call_tool(&origin(i), 1, "c", "noop", json!({}), route())
            .await;
        matches!(result.outcome, CallOutcome::Ok { .. })
    };
    if samples > 0 {
        let mut taken = Vec::with_capacity(samples);
        for i in 0..samples {
            let started = Instant::now();
            if !call(dispatcher.clone(), i).await {
                return Err("a no-op call failed".into());
            }
            taken.push(started.elapsed());
        }
        latencies(report, "skein: no-op tool call round trip", taken);
    }
    let started = Instant::now();
    let ok = futures::stream::iter(0..calls)
        .map(|i| call(dispatcher.clone(), 1_000_000 + i))
        .buffer_unordered(256)
        .filter(|ok| futures::future::ready(*ok))
        .count()
        .await;
    report.add(
        &format!("skein: no-op tool calls with {workers} worker(s)"),
        ok as f64 / started.elapsed().as_secs_f64(),
        "calls/s",
    );
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

fn task(i: usize) -> TaskSubmission {
    TaskSubmission {
        v: PROTOCOL_VERSION,
        task_id: unique(&format!("turn{i}")),
        tenant: "bench".into(),
        user: "bench".into(),
        session: unique("s"),
        agent: "assistant".into(),
        input: "go".into(),
        overrides: None,
        deadline_ms: None,
    }
}

async fn whole_turns(url: &str, samples: usize, report: &mut Report) -> Result<(), Failed> {
    let client = SkeinClient::connect(&NatsConfig::local(url.to_owned())).await?;
    let warm = client
        .run(&task(0), Duration::from_secs(30), |_| {})
        .await?;
    if warm.answer.as_deref() != Some("done") {
        return Err(format!("the bench turn did not complete: {warm:?}").into());
    }
    let mut taken = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        client
            .run(&task(i), Duration::from_secs(30), |_| {})
            .await?;
        taken.push(started.elapsed());
    }
    latencies(report, "skein: whole turn (two tool calls)", taken);
    Ok(())
}

/// Many sessions at once: every turn submitted, then finals counted from the events.
async fn burst(
    url: &str,
    store: &SessionStore,
    sessions: usize,
    lead_pid: u32,
    lead_admin: &str,
    report: &mut Report,
) -> Result<(), Failed> {
    let client = SkeinClient::connect(&NatsConfig::local(url.to_owned())).await?;
    // The most turns the lead runs at once, sampled from its metrics while the burst runs.
    let sampling = CancellationToken::new();
    let most_in_flight = tokio::spawn({
        let (admin, stop) = (lead_admin.to_owned(), sampling.clone());
        async move {
            let mut most = 0.0_f64;
            while !stop.is_cancelled() {
                if let Some(now) = turns_in_flight(&admin).await {
                    most = most.max(now);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            most
        }
    });
    let nats = async_nats::connect(url).await?;
    let mut finals = nats.subscribe("skein.events.bench.>").await?;
    let idle = rss_kib(lead_pid, "VmRSS")?;
    let tasks: Vec<TaskSubmission> = (0..sessions).map(task).collect();
    let submitted = Instant::now();
    let published = futures::stream::iter(tasks.iter())
        .map(|t| client.submit(t))
        .buffer_unordered(256)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await;
    let mut done = 0;
    let mut finished = std::collections::HashSet::with_capacity(sessions);
    let mut taken = Vec::with_capacity(sessions);
    let deadline = Instant::now() + Duration::from_secs(300);
    while done < published && Instant::now() < deadline {
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(30), finals.next()).await
        else {
            break;
        };
        if let Ok(TurnEvent {
            event: EventKind::Final { .. },
            task_id,
            ..
        }) = serde_json::from_slice::<TurnEvent>(&message.payload)
        {
            if finished.insert(task_id) {
                done += 1;
                taken.push(submitted.elapsed());
            }
        }
    }
    let elapsed = submitted.elapsed();
    let peak = rss_kib(lead_pid, "VmHWM")?;
    // A final event this watcher missed (a slow core subscriber drops messages) is not a lost
    // turn: a turn counts as lost only if its final result is not stored either.
    let mut stored_only = 0;
    for task in tasks.iter().filter(|t| !finished.contains(&t.task_id)) {
        if let Ok(Some(_)) = store
            .final_result(&task.tenant, &task.session, &task.task_id)
            .await
        {
            stored_only += 1;
        }
    }
    sampling.cancel();
    let most_in_flight = most_in_flight.await.unwrap_or(0.0);
    report.add(
        "skein: burst sessions completed",
        (done + stored_only) as f64,
        "turns",
    );
    report.add(
        "skein: burst final events not seen by the watcher (results stored)",
        stored_only as f64,
        "turns",
    );
    report.add(
        "skein: burst sessions lost",
        (sessions - done - stored_only) as f64,
        "turns",
    );
    report.add(
        "skein: burst throughput",
        done as f64 / elapsed.as_secs_f64(),
        "turns/s",
    );
    taken.sort();
    report.add(
        "skein: burst completion p99",
        percentile(&taken, 99) / 1e3,
        "ms",
    );
    report.add("skein: burst peak turns in flight", most_in_flight, "turns");
    report.add(
        "skein: lead peak RSS growth per in-flight turn",
        (peak - idle) / most_in_flight.max(1.0),
        "KiB",
    );
    Ok(())
}

/// The lead's `skein_in_flight{kind="turn"}` gauge, read from its admin server.
async fn turns_in_flight(admin: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: lead\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        body.lines()
            .find(|line| line.starts_with("skein_in_flight{") && line.contains("kind=\"turn\""))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.trim().parse().ok())
    };
    tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .ok()
        .flatten()
}

/// The Celery peer: a worker and a client from `benches/peers/celery_bench.py`, in a cached
/// virtual environment, on the bench's Redis (its own database).
async fn celery_peer(
    redis_url: &str,
    dir: &std::path::Path,
    samples: usize,
    calls: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/peers/celery_bench.py");
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("skein-bench-celery");
    let python = cache.join("bin/python");
    if !python.exists() {
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&cache)
            .status()?;
        let installed = std::process::Command::new(cache.join("bin/pip"))
            .args(["install", "--quiet", "celery[redis]>=5,<6"])
            .status()?;
        if !made.success() || !installed.success() {
            return Err(
                "could not install Celery (python3 -m venv, pip install celery[redis])".into(),
            );
        }
    }
    let url = format!("{}/1", redis_url.trim_end_matches('/'));
    let mut worker = std::process::Command::new(&python);
    worker.arg(&script).args(["worker", &url]);
    let _worker = ChildProcess::spawn(worker, dir.join("celery-worker.log"));
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .args(["client", &url, &samples.to_string(), &calls.to_string()])
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!(
            "the Celery client failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let figures: Value = serde_json::from_slice(&output.stdout)?;
    let figure = |name: &str| figures[name].as_f64().unwrap_or(f64::NAN);
    report.add(
        "peer: Celery task round trip p50",
        figure("round_trip_p50_us"),
        "µs",
    );
    report.add(
        "peer: Celery task round trip p99",
        figure("round_trip_p99_us"),
        "µs",
    );
    report.add(
        "peer: Celery tasks (2 worker processes)",
        figure("throughput_per_s"),
        "tasks/s",
    );
    Ok(())
}

/// A memory figure of a process from /proc (KiB).
fn rss_kib(pid: u32, field: &str) -> Result<f64, Failed> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {field} for process {pid}").into())
}

fn ratios(report: &Report) -> Vec<Value> {
    let rr = report.get("floor: core NATS request-reply p50");
    let pipelined = report.get("floor: pipelined core NATS request-reply");
    let set = report.get("floor: Redis SET of the same bytes p50");
    let round_trip = report.get("skein: no-op tool call round trip p50");
    let two_workers = report.get("skein: no-op tool calls with 2 worker(s)");
    let ratio = |name: &str, value: f64, target: &str| json!({ "name": name, "value": value, "target": target });
    vec![
        ratio(
            "no-op round trip p50 / request-reply p50",
            round_trip / rr,
            "<= 3",
        ),
        ratio(
            "no-op calls with 2 workers / pipelined core NATS",
            two_workers / pipelined,
            ">= 0.15",
        ),
        ratio(
            "whole turn p50 / request-reply p50",
            report.get("skein: whole turn (two tool calls) p50") / rr,
            "<= 12",
        ),
        ratio(
            "checkpoint p50 / Redis SET p50",
            report.get("skein: checkpoint of a step p50") / set,
            "<= 1.5",
        ),
        ratio(
            "Celery round trip p50 / no-op round trip p50",
            report.get("peer: Celery task round trip p50") / round_trip,
            ">= 4",
        ),
        ratio(
            "no-op calls with 2 workers / Celery tasks",
            two_workers / report.get("peer: Celery tasks (2 worker processes)"),
            ">= 20",
        ),
    ]
}

fn print_table(report: &Report) {
    println!("| figure | value | unit |");
    println!("| --- | ---: | --- |");
    for (name, value, unit) in &report.rows {
        println!("| {name} | {value:.1} | {unit} |");
    }
    println!();
    println!("| ratio | value | target |");
    println!("| --- | ---: | --- |");
    for ratio in ratios(report) {
        println!(
            "| {} | {:.2} | {} |",
            ratio["name"].as_str().unwrap_or_default(),
            ratio["value"].as_f64().unwrap_or(f64::NAN),
            ratio["target"].as_str().unwrap_or_default()
        );
    }
}
