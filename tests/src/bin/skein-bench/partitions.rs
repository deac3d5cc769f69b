//! The partition bench: durable no-op calls per second on a local three-node NATS cluster with
//! one work partition (every call through one stream leader) and with three, and what each
//! node's `nats-server` spends per call. Each run has a fresh cluster, Redis and two workers;
//! streams have one replica, and the node that leads each work stream is reported.

use std::path::Path;

use skein_common::bus::{Bus, DEFAULT_MAX_PAYLOAD};
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::store::SessionStore;
use skein_common::subjects;
use skein_tests::support::nats_cluster::NatsCluster;
use skein_tests::support::servers::RedisServer;

use crate::calls::noop_calls;
use crate::costs::cpu_seconds;
use crate::nodes::{wait_workers, Nodes};
use crate::report::Report;
use crate::Failed;

/// Nodes of the NATS cluster.
const NODES: usize = 3;

/// Partition counts measured, the first being the baseline.
const MEASURED: [u32; 2] = [1, 3];

/// Runs the measurement for every count of [`MEASURED`] and adds the figures and their ratios.
pub(crate) async fn partitioned_calls(
    dir: &Path,
    calls: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    for partitions in MEASURED {
        eprintln!("cluster of {NODES}, {partitions} partition(s)");
        one_count(dir, calls, partitions, report).await?;
    }
    let (base, spread) = (MEASURED[0], MEASURED[1]);
    let figure = |what: &str, partitions: u32| report.get(&label(what, partitions));
    let calls_ratio = figure("no-op calls", spread) / figure("no-op calls", base);
    let busiest_ratio =
        figure("busiest node's CPU per call", spread) / figure("busiest node's CPU per call", base);
    report.add(
        &format!("cluster: calls/s with {spread} partitions / with {base}"),
        calls_ratio,
        "",
    );
    report.add(
        &format!("cluster: busiest node's CPU per call with {spread} partitions / with {base}"),
        busiest_ratio,
        "",
    );
    Ok(())
}

fn label(what: &str, partitions: u32) -> String {
    format!("cluster of {NODES}, {partitions} partition(s): {what}")
}

async fn one_count(
    dir: &Path,
    calls: usize,
    partitions: u32,
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
        partitions,
    };
    let cfg = NatsConfig {
        partitions,
        ..NatsConfig::local(nats.url())
    };
    let bus = Bus::connect(&cfg, "bench", DEFAULT_MAX_PAYLOAD).await?;
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
        &label("no-op calls", partitions),
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
        &label("busiest node's CPU per call", partitions),
        busiest,
        "µs",
    );
    report.add(
        &label("all nodes' CPU per call", partitions),
        per_call.iter().sum(),
        "µs",
    );
    for worker in &mut workers {
        worker.kill();
    }
    Ok(())
}
