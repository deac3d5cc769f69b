//! The partition bench: durable no-op calls per second on a local three-node NATS cluster with
//! one partition (every call through one stream leader) and with three, and what each node's
//! `nats-server` spends per call; then a burst of two-tool turns of as many sessions as calls /
//! 10, submitted by a client of the same partition count, and the turns per second of one lead.
//! Three partitions are measured twice: placed by NATS as the processes create them, and placed
//! one per node (each partition's submit, work and events streams made first with a placement
//! tag, as an operator can). Each run has a fresh cluster, Redis and two workers; streams have one replica,
//! and the node that leads each work stream is reported.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use skein_common::client::SkeinClient;
use skein_common::protocol::{EventKind, TurnEvent};

use skein_common::bus::{Bus, DEFAULT_MAX_PAYLOAD};
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::store::SessionStore;
use skein_common::subjects;
use skein_tests::support::nats_cluster::NatsCluster;
use skein_tests::support::servers::RedisServer;

use crate::calls::noop_calls;
use crate::costs::cpu_seconds;
use crate::nodes::{wait_ready, wait_workers, Nodes};
use crate::report::Report;
use crate::turns::{task, two_call_scenario};
use crate::Failed;

/// Nodes of the NATS cluster.
const NODES: usize = 3;

/// The layouts measured, the first being the baseline: (partitions, placed one per node).
const MEASURED: [(u32, bool); 3] = [(1, false), (3, false), (3, true)];

/// Runs the measurement for every layout of [`MEASURED`] and adds the figures and their ratios
/// to the first.
pub(crate) async fn partitioned_calls(
    dir: &Path,
    calls: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    for (partitions, one_per_node) in MEASURED {
        eprintln!("{}", layout(partitions, one_per_node));
        one_layout(dir, calls, partitions, one_per_node, report).await?;
    }
    let (base, base_placed) = MEASURED[0];
    let mut ratios = Vec::new();
    for &(partitions, one_per_node) in &MEASURED[1..] {
        let ratio = |what: &str| {
            report.get(&label(what, partitions, one_per_node))
                / report.get(&label(what, base, base_placed))
        };
        let named = layout(partitions, one_per_node);
        ratios.push((
            format!("{named}: calls/s / with {base}"),
            ratio("no-op calls"),
        ));
        ratios.push((
            format!("{named}: busiest node's CPU per call / with {base}"),
            ratio("busiest node's CPU per call"),
        ));
        ratios.push((
            format!("{named}: turns/s / with {base}"),
            ratio("burst throughput"),
        ));
    }
    for (name, value) in ratios {
        report.add(&name, value, "");
    }
    Ok(())
}

fn layout(partitions: u32, one_per_node: bool) -> String {
    let placed = if one_per_node { ", one per node" } else { "" };
    format!("cluster of {NODES}, {partitions} partition(s){placed}")
}

fn label(what: &str, partitions: u32, one_per_node: bool) -> String {
    format!("{}: {what}", layout(partitions, one_per_node))
}

async fn one_layout(
    dir: &Path,
    calls: usize,
    partitions: u32,
    one_per_node: bool,
    report: &mut Report,
) -> Result<(), Failed> {
    let nats = NatsCluster::start(NODES);
    nats.wait_ready().await;
    let redis = RedisServer::start();
    let nodes = Nodes {
        nats: nats.url(),
        redis: redis.url.clone(),
        dir: dir.to_path_buf(),
        wrap_lead: None,
        log: "info".into(),
        partitions,
    };
    let cfg = NatsConfig {
        partitions,
        ..NatsConfig::local(nats.url())
    };
    let bus = Bus::connect(&cfg, "bench", DEFAULT_MAX_PAYLOAD).await?;
    if one_per_node {
        place_one_per_node(&bus, &nats).await?;
    }
    bus.ensure_streams().await?;
    let store = SessionStore::connect(&RedisConfig::local(redis.url.clone())).await?;
    let mut workers = [nodes.worker("part-1"), nodes.worker("part-2")];
    wait_workers(&store, workers.len()).await?;
    let mut leaders = Vec::new();
    for k in 0..partitions {
        leaders.push(nats.stream_leader(&subjects::work_stream(k)).await);
    }
    eprintln!("  work stream leaders (node index by partition): {leaders:?}");
    // Warm-up: connections, consumers and the leaders' first pulls.
    noop_calls(
        &bus,
        &store,
        0,
        calls / 10,
        "warm-up",
        &mut Report::default(),
    )
    .await?;

    let pids: Vec<u32> = (0..NODES)
        .map(|i| nats.node(i).pid().ok_or("a NATS node without a process"))
        .collect::<Result<_, _>>()?;
    let before: Vec<f64> = pids
        .iter()
        .map(|&pid| cpu_seconds(pid))
        .collect::<Result<_, _>>()?;
    let done = noop_calls(
        &bus,
        &store,
        0,
        calls,
        &label("no-op calls", partitions, one_per_node),
        report,
    )
    .await?;
    let after: Vec<f64> = pids
        .iter()
        .map(|&pid| cpu_seconds(pid))
        .collect::<Result<_, _>>()?;
    let per_call: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(a, b)| (b - a) / done.max(1) as f64 * 1e6)
        .collect();
    eprintln!("  NATS CPU per call by node (µs): {per_call:?}");
    let busiest = per_call.iter().cloned().fold(0.0, f64::max);
    report.add(
        &label("busiest node's CPU per call", partitions, one_per_node),
        busiest,
        "µs",
    );
    report.add(
        &label("all nodes' CPU per call", partitions, one_per_node),
        per_call.iter().sum(),
        "µs",
    );
    let turns = (calls / 10).max(100);
    let per_second = turn_burst(&nodes, dir, &nats.url(), partitions, turns).await?;
    report.add(
        &label("burst throughput", partitions, one_per_node),
        per_second,
        "turns/s",
    );
    for worker in &mut workers {
        worker.kill();
    }
    Ok(())
}

/// Turns per second of one lead through a burst of `turns` sessions' two-tool turns, submitted
/// by a client of `partitions` partitions; an error if a turn does not end.
async fn turn_burst(
    nodes: &Nodes,
    dir: &Path,
    url: &str,
    partitions: u32,
    turns: usize,
) -> Result<f64, Failed> {
    let scenario = two_call_scenario(dir, "partitions-scenario.json")?;
    let admin = format!("127.0.0.1:{}", skein_tests::support::free_port());
    let mut lead = nodes.lead(&scenario, &admin);
    wait_ready(&admin).await?;
    let client = SkeinClient::connect(&NatsConfig {
        partitions,
        ..NatsConfig::local(url.to_owned())
    })
    .await?;
    let mut finals = client
        .bus()
        .client()
        .subscribe("skein.events.bench.>")
        .await?;
    let tasks: Vec<_> = (0..turns).map(task).collect();
    let started = Instant::now();
    let submitted = futures::stream::iter(&tasks)
        .map(|t| client.submit(t))
        .buffer_unordered(256)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await;
    let mut ended = std::collections::HashSet::with_capacity(turns);
    while ended.len() < submitted {
        let next = tokio::time::timeout(Duration::from_secs(60), finals.next()).await;
        let Ok(Some(message)) = next else {
            break;
        };
        if let Ok(TurnEvent {
            event: EventKind::Final { .. },
            task_id,
            ..
        }) = serde_json::from_slice::<TurnEvent>(&message.payload)
        {
            ended.insert(task_id);
        }
    }
    let elapsed = started.elapsed();
    lead.kill();
    if ended.len() < turns {
        return Err(format!("{} of {turns} turns ended", ended.len()).into());
    }
    Ok(turns as f64 / elapsed.as_secs_f64())
}

/// Makes each partition's work, submit and events streams first, on node `k % NODES` (its placement
/// tag), so that the processes find them made.
async fn place_one_per_node(bus: &Bus, nats: &NatsCluster) -> Result<(), Failed> {
    let jetstream = async_nats::jetstream::new(bus.client().clone());
    for mut config in bus.stream_configs() {
        let partition = subjects::parse_work_stream(&config.name)
            .or_else(|| subjects::parse_partition_stream(subjects::SUBMIT_STREAM, &config.name))
            .or_else(|| subjects::parse_partition_stream(subjects::EVENTS_STREAM, &config.name));
        let Some(k) = partition else {
            continue;
        };
        config.placement = Some(async_nats::jetstream::stream::Placement {
            cluster: None,
            tags: vec![nats.name(k as usize % NODES).to_owned()],
        });
        jetstream.create_stream(config).await?;
    }
    Ok(())
}
