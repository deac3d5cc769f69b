//! Skein's call path: a step's checkpoint in Redis next to a plain `SET` of the same bytes, and
//! no-op tool calls through the dispatcher to the worker processes (round trip latency, then
//! throughput with 256 calls in flight).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use skein_common::bus::Bus;
use skein_common::config::RedisConfig;
use skein_common::dispatch::{CallRoute, Dispatcher};
use skein_common::protocol::{CallOutcome, TaskOrigin};
use skein_common::store::{SessionStore, TurnCheckpoint, TurnClaim, TurnStart};
use skein_tests::support::unique;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::floor::floor_redis_set;
use crate::report::{latencies, Report};
use crate::Failed;

pub(crate) async fn checkpoint_cost(
    url: &str,
    blob: &str,
    samples: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let store = SessionStore::connect(&RedisConfig::local(url.to_owned())).await?;
    let token = "bench-lead:task";
    // A turn's lease, begun as a lead begins a turn: its steps' checkpoints go through it.
    let task_id = unique("checkpoints");
    let lease = store.turn(TurnClaim {
        tenant: "bench",
        session: "checkpoints",
        task_id: &task_id,
        lease_token: token,
        lease_ttl: Duration::from_secs(600),
        max_attempts: 3,
        trace: None,
    });
    if !matches!(lease.begin().await?, TurnStart::Started { .. }) {
        return Err("the checkpoint bench's turn did not start".into());
    }
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
        compaction: None,
        plan: None,
        steered: 0,
        // The steps before the checkpoint's one ended, as a real turn's checkpoint records.
        step_ends: (1..3)
            .map(|step| skein_common::agent::seams::StepEnd {
                step,
                at_ms: skein_common::protocol::now_ms(),
            })
            .collect(),
    };
    // The goal's figure, the dearer path: a checkpoint of a new task that also sets the
    // checkpoints' expiry (`HSET`, `EXPIRE`, `GET` the lease: three commands in one round trip).
    let mut taken = Vec::with_capacity(samples);
    for i in 0..samples {
        let started = Instant::now();
        store
            .save_checkpoint("bench", "checkpoints", &format!("t{i}"), token, &checkpoint)
            .await?;
        taken.push(started.elapsed());
    }
    latencies(report, "skein: checkpoint of a step", taken);
    // What a running turn's step costs: the checkpoint written through its lease, the expiry
    // already set by the turn's start (`HSET`, `GET` the lease).
    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        if !lease.checkpoint(&checkpoint).await? {
            return Err("the checkpoint bench's turn lost its lease".into());
        }
        taken.push(started.elapsed());
    }
    latencies(report, "skein: checkpoint of a running turn's step", taken);
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

pub(crate) fn origin(i: usize) -> TaskOrigin {
    TaskOrigin {
        task_id: format!("bench-{i}-{}", unique("t")),
        tenant: "bench".into(),
        user: "bench".into(),
        session: format!("s{}", i % 64),
        workspace: format!("s{}", i % 64),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

pub(crate) async fn noop_calls(
    bus: &Bus,
    store: &SessionStore,
    samples: usize,
    calls: usize,
    throughput_label: &str,
    report: &mut Report,
) -> Result<usize, Failed> {
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
            .call_tool(&origin(i).into(), 1, "c", "noop", json!({}), route())
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
        throughput_label,
        ok as f64 / started.elapsed().as_secs_f64(),
        "calls/s",
    );
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(ok)
}
