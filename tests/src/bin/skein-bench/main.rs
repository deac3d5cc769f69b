//! `skein-bench`: measures Skein against the floor of its own infrastructure, in one run on one
//! machine. It starts its own `nats-server` and `redis-server` on free ports and real lead and
//! worker processes (this binary re-run as `skein-bench node ...`), then prints a table of
//! figures and Skein/floor ratios (and writes them as JSON with `--json FILE`).
//!
//! Run on demand (it is not a test): `cargo run --release -p skein-tests --bin skein-bench`.
//!
//! # Layout
//! - `floor`: NATS and Redis on their own (and its processes: the request-reply floor's
//!   `responder`, the durable-call floor's `work-responder`).
//! - `nodes`: the lead and worker processes, and what is read from them while they run.
//! - `calls`: a step's checkpoint and no-op tool calls through the dispatcher.
//! - `turns`: whole turns, then a burst of sessions.
//! - `costs`: what a call and a turn cost each process (CPU) and Redis (commands, bytes).
//! - `gateway`: the same turn streamed over HTTP through the gateway, many at once, its memory.
//! - `plans`: a plan's steps across two workers (speed-up), and its overhead against plain
//!   subagent calls.
//! - `celery`: the Celery peer.
//! - `soak`: `--soak`, tool tasks of every outcome and what the workers hold before and after.
//! - `partitions`: `--partitions`, no-op calls and a burst of turns on a three-node NATS cluster
//!   with one partition and with three.
//! - `report`: the figures, the ratios and the printed tables.

mod calls;
mod celery;
mod costs;
mod floor;
mod gateway;
mod nodes;
mod partitions;
mod plans;
mod report;
mod soak;
mod turns;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use skein_common::bus::Bus;
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::store::SessionStore;
use skein_tests::support::servers::{NatsServer, RedisServer};
use skein_tests::support::unique;

use calls::{checkpoint_cost, noop_calls};
use celery::celery_peer;
use costs::{report_costs, Parts};
use floor::{
    floor_durable_call, floor_jetstream, floor_redis_set, floor_request_reply, responder,
    session_blob, work_responder,
};
use nodes::{rss_kib, start_to_ready, wait_workers, Nodes};
use report::{print_table, ratios, Report};
use turns::{burst, long_session, two_call_scenario, whole_turns};

// The shipped binaries' allocator, so the lead and workers this binary runs as `node` measure
// what ships.
skein_common::global_allocator!();

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
    /// Concurrent sessions of the burst (0 skips it).
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
    /// The log filter (`SKEIN_LOG`) of the lead, workers and gateway the bench starts: by default
    /// the processes' own default, `info`, so that the figures are what ships.
    #[arg(long, default_value = "info")]
    node_log: String,
    /// Turns of the long session (time and Redis bytes at its first and last turn); 0 skips it.
    #[arg(long, default_value_t = 1000)]
    long_session: usize,
    /// Steps of the plan bench (a plan of independent steps on two workers); 0 skips it.
    #[arg(long, default_value_t = 20)]
    plan_steps: usize,
    /// Turns streamed through the HTTP gateway with 256 open at once (0 skips the gateway).
    #[arg(long, default_value_t = 2000)]
    gateway_runs: usize,
    /// Run only the soak: tool tasks of every outcome against two workers, and what the
    /// workers hold before and after.
    #[arg(long)]
    soak: bool,
    /// Run only the partition bench: no-op calls and turns per second on a local three-node NATS
    /// cluster with one partition and with three, and what each node spends per call.
    #[arg(long)]
    partitions: bool,
    /// Tasks of the soak.
    #[arg(long, default_value_t = 20_000)]
    soak_tasks: usize,
    /// Soak tasks in flight at once.
    #[arg(long, default_value_t = 64)]
    soak_in_flight: usize,
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
        Some("work-responder") => return work_responder(args.get(2).cloned().unwrap_or_default()),
        Some("mcp-fixture") => {
            return skein_tests::support::mcp_fixture::main_from(args[2..].to_vec())
        }
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

pub(crate) type Failed = Box<dyn std::error::Error + Send + Sync>;

/// The figure of no-op calls per second with `workers` workers.
fn calls_with(workers: usize) -> String {
    format!("skein: no-op tool calls with {workers} worker(s)")
}

async fn run(args: Args) -> Result<(), Failed> {
    let nats = NatsServer::start();
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(unique("skein-bench"));
    std::fs::create_dir_all(&dir)?;
    if args.soak {
        let nodes = Nodes {
            nats: nats.url.clone(),
            redis: redis.url.clone(),
            dir: dir.clone(),
            wrap_lead: None,
            log: args.node_log.clone(),
            partitions: 1,
        };
        let bus = Bus::connect(
            &NatsConfig::local(nats.url.clone()),
            "bench",
            skein_common::bus::DEFAULT_MAX_PAYLOAD,
        )
        .await?;
        bus.ensure_streams().await?;
        let store = SessionStore::connect(&RedisConfig::local(redis.url.clone())).await?;
        soak::soak_run(&nodes, &bus, &store, args.soak_tasks, args.soak_in_flight).await?;
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if args.partitions {
        let mut report = Report::default();
        partitions::partitioned_calls(&dir, args.calls, &mut report).await?;
        print_table(&report);
        write_json(&report, args.json.as_deref())?;
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    let mut report = Report::default();
    eprintln!("floor");
    floor_request_reply(&nats.url, args.samples, args.calls, &mut report).await?;
    floor_jetstream(&nats.url, args.samples, args.calls, &mut report).await?;
    floor_durable_call(&nats.url, args.samples, &mut report).await?;
    let blob = session_blob();
    floor_redis_set(&redis.url, &blob, args.samples, &mut report).await?;

    eprintln!("skein");
    let cluster = Nodes {
        nats: nats.url.clone(),
        redis: redis.url.clone(),
        dir: dir.clone(),
        wrap_lead: args.wrap_lead.clone(),
        log: args.node_log.clone(),
        partitions: 1,
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
    noop_calls(
        &bus,
        &store,
        args.samples,
        args.calls,
        &calls_with(1),
        &mut report,
    )
    .await?;
    let mut second = cluster.worker("worker-2");
    wait_workers(&store, 2).await?;
    let mut redis_counters = redis::Client::open(redis.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut parts = Parts {
        lead: std::process::id(),
        workers: vec![first.id(), second.id()],
        nats: nats.pid(),
        redis: redis.pid(),
    };
    let before = parts.snapshot(&mut redis_counters).await?;
    let calls = noop_calls(&bus, &store, 0, args.calls, &calls_with(2), &mut report).await?;
    let after = parts.snapshot(&mut redis_counters).await?;
    report_costs(&mut report, "call", calls, &before, &after);
    let scenario = two_call_scenario(&dir, "scenario.json")?;
    let lead_admin = format!("127.0.0.1:{}", skein_tests::support::free_port());
    let mut lead = cluster.lead(&scenario, &lead_admin);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // VmRSS counts the pages of the binary mapped in, which depend on what of the file the page
    // cache holds: the same bytes measured 22 MiB, and 27 MiB as a fresh copy. The anonymous
    // part is the process's own memory.
    for (name, pid, field) in [
        ("lead idle RSS", lead.id(), "VmRSS"),
        ("worker idle RSS", first.id(), "VmRSS"),
        ("lead idle anonymous RSS", lead.id(), "RssAnon"),
        ("worker idle anonymous RSS", first.id(), "RssAnon"),
    ] {
        report.add(name, rss_kib(pid, field)? / 1024.0, "MiB");
    }
    whole_turns(&nats.url, args.samples.min(500), &mut report).await?;
    if args.long_session > 0 {
        long_session(&nats.url, &redis.url, args.long_session, &mut report).await?;
    }
    // `--burst 0` skips it: its figures (and the memory per turn in flight) would read zero,
    // as if measured.
    if args.burst > 0 {
        parts.lead = lead.id();
        let before = parts.snapshot(&mut redis_counters).await?;
        let turns = burst(
            &nats.url,
            &store,
            args.burst,
            lead.id(),
            &lead_admin,
            &mut report,
        )
        .await?;
        let after = parts.snapshot(&mut redis_counters).await?;
        report_costs(&mut report, "turn", turns, &before, &after);
    }
    // After the burst, whose memory figures it would otherwise move.
    if args.gateway_runs > 0 {
        eprintln!("gateway");
        gateway::gateway(
            &cluster,
            args.samples.min(500),
            args.gateway_runs,
            &mut report,
        )
        .await?;
    }
    let _ = ready;
    cluster.stop_lead(&mut lead).await;
    first.kill();
    second.kill();
    if args.plan_steps > 0 {
        eprintln!("plans");
        // The burst's workers are gone from the registry once their heartbeats lapse; the plan's
        // own two run subagents.
        for worker in store.live_workers().await? {
            store.remove_worker(&worker.worker_id).await?;
        }
        plans::plans(&cluster, &store, args.plan_steps, &mut report).await?;
    }
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
    write_json(&report, args.json.as_deref())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Writes the figures and ratios as JSON to `path`, when there is one.
fn write_json(report: &Report, path: Option<&std::path::Path>) -> Result<(), Failed> {
    let Some(path) = path else { return Ok(()) };
    let rows: Vec<Value> = report
        .rows
        .iter()
        .map(|(name, value, unit)| json!({ "name": name, "value": value, "unit": unit }))
        .collect();
    std::fs::write(
        path,
        serde_json::to_string_pretty(&json!({ "figures": rows, "ratios": ratios(report) }))?,
    )?;
    Ok(())
}
