//! The HTTP gateway in front of the bench's cluster (`--gateway`, on by default): the same no-op
//! turn as `turns` streamed over HTTP (the Responses API, SSE, read to `response.completed`)
//! one at a time, runs per second with 256 streams open at once, and the gateway's peak memory
//! growth per open stream.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use skein_tests::support::free_port;

use crate::nodes::{rss_kib, Nodes};
use crate::report::{latencies, Report};
use crate::Failed;

const KEY: &str = "sk-bench";
/// Streams open at once in the concurrent run.
const OPEN_STREAMS: usize = 256;

pub(crate) async fn gateway(
    nodes: &Nodes,
    samples: usize,
    runs: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let keys = nodes.dir.join("gateway-keys.toml");
    std::fs::write(
        &keys,
        format!(
            "[[keys]]\nsha256 = \"{}\"\ntenant = \"bench\"\nprincipal = \"bench\"\nroles = [\"submit\"]\n",
            skein_lead::gateway::keys::key_hash(KEY)
        ),
    )?;
    let port = free_port();
    let mut process = nodes.gateway(&keys, port);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(OPEN_STREAMS)
        .build()?;
    let started = Instant::now();
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        if started.elapsed() > Duration::from_secs(15) {
            return Err("the gateway did not answer within 15 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    streamed_turn(&http, &base).await?;
    let idle = rss_kib(process.id(), "VmRSS")?;
    report.add("gateway idle RSS", idle / 1024.0, "MiB");

    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        streamed_turn(&http, &base).await?;
        taken.push(started.elapsed());
    }
    latencies(report, "gateway: whole turn streamed over HTTP", taken);

    let started = Instant::now();
    futures::stream::iter(0..runs)
        .map(|_| streamed_turn(&http, &base))
        .buffer_unordered(OPEN_STREAMS)
        .try_collect::<Vec<()>>()
        .await?;
    report.add(
        "gateway: streamed runs, 256 open at once",
        runs as f64 / started.elapsed().as_secs_f64(),
        "runs/s",
    );
    let peak = rss_kib(process.id(), "VmHWM")?;
    report.add(
        "gateway: peak RSS growth per open stream",
        (peak - idle) / OPEN_STREAMS as f64,
        "KiB",
    );
    process.kill();
    Ok(())
}

/// One no-op turn through `POST /v1/responses` with `stream`, read until it completes.
async fn streamed_turn(http: &reqwest::Client, base: &str) -> Result<(), Failed> {
    let mut response = http
        .post(format!("{base}/v1/responses"))
        .bearer_auth(KEY)
        .json(&json!({ "model": "assistant", "input": "go", "stream": true }))
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(format!("the gateway answered {}", response.status()).into());
    }
    // Only the tail is kept: an event name split across chunks is still found.
    let mut tail = String::new();
    while let Some(chunk) = response.chunk().await? {
        tail.push_str(&String::from_utf8_lossy(&chunk));
        if tail.contains("event: response.completed") {
            return Ok(());
        }
        if tail.contains("event: response.failed") || tail.contains("event: error") {
            return Err(format!("a streamed turn did not complete: {tail}").into());
        }
        if tail.len() > 4096 {
            tail = tail.split_off(tail.len() - 64);
        }
    }
    Err("a stream ended before its response completed".into())
}
