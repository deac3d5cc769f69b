//! Skein's turn path, through the lead: whole turns one at a time (submit to final result), then a
//! burst of many sessions at once, counting finals from the events (and from the stored results
//! for finals the watcher missed), the lead's peak turns in flight and its memory per turn.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::protocol::{EventKind, TaskSubmission, TurnEvent, PROTOCOL_VERSION};
use skein_common::store::SessionStore;
use skein_tests::support::unique;
use tokio_util::sync::CancellationToken;

use crate::nodes::{rss_kib, turns_in_flight};
use crate::report::{latencies, percentile, Report};
use crate::Failed;

/// Writes, under `dir` as `name`, the scripted model of the burst: each turn makes two no-op
/// calls at once, then answers.
pub(crate) fn two_call_scenario(
    dir: &std::path::Path,
    name: &str,
) -> Result<std::path::PathBuf, Failed> {
    let scenario = dir.join(name);
    std::fs::write(
        &scenario,
        serde_json::json!({ "agents": { "assistant": { "turns": [ { "steps": [
            { "tool_calls": [ { "name": "noop", "arguments": {} }, { "name": "noop", "arguments": {} } ] },
            { "answer": "done" }
        ] } ] } } })
        .to_string(),
    )?;
    Ok(scenario)
}

pub(crate) fn task(i: usize) -> TaskSubmission {
    TaskSubmission {
        replay_of: None,
        v: PROTOCOL_VERSION,
        task_id: unique(&format!("turn{i}")),
        tenant: "bench".into(),
        user: "bench".into(),
        session: unique("s"),
        agent: "assistant".into(),
        input: "go".into(),
        overrides: None,
        deadline_ms: None,
        budget: None,
        multitask: Default::default(),
        output_schema: None,
    }
}

pub(crate) async fn whole_turns(
    url: &str,
    samples: usize,
    report: &mut Report,
) -> Result<(), Failed> {
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

/// Bytes Redis has received so far.
async fn redis_bytes_received(redis: &redis::Client) -> Result<u64, Failed> {
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_input_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO stats has no total_net_input_bytes".into())
}

/// One session of `turns` turns, one after another: the time of a turn and the bytes Redis
/// received during it (the session's writes, plus the cluster's background traffic), at the first
/// turn and at the last.
/// Turns at each end of the long session whose median is reported.
const LONG_SESSION_WINDOW: usize = 20;

pub(crate) async fn long_session(
    url: &str,
    redis_url: &str,
    turns: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    let client = SkeinClient::connect(&NatsConfig::local(url.to_owned())).await?;
    let redis = redis::Client::open(redis_url)?;
    let session = unique("long");
    // Turn time and bytes of every turn; the first and last few are reported as medians.
    let mut turn_times = Vec::with_capacity(turns);
    let mut turn_bytes = Vec::with_capacity(turns);
    let mut compactions = 0usize;
    for i in 1..=turns {
        let mut submission = task(i);
        submission.session = session.clone();
        let bytes = redis_bytes_received(&redis).await?;
        let started = Instant::now();
        let result = client
            .run(&submission, Duration::from_secs(60), |event| {
                if matches!(event.event, EventKind::Compacted { .. }) {
                    compactions += 1;
                }
            })
            .await?;
        turn_times.push(started.elapsed().as_secs_f64() * 1e3);
        turn_bytes.push((redis_bytes_received(&redis).await? - bytes) as f64);
        if result.answer.as_deref() != Some("done") {
            return Err(
                format!("turn {i} of the long session did not complete: {result:?}").into(),
            );
        }
    }
    let window = LONG_SESSION_WINDOW.min(turns);
    let median = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let (first, last) = (..window, turns - window..);
    report.add(
        &format!("skein: long session, turns 1-{window} median time"),
        median(&turn_times[first]),
        "ms",
    );
    report.add(
        &format!(
            "skein: long session, turns {}-{turns} median time",
            turns - window + 1
        ),
        median(&turn_times[last.clone()]),
        "ms",
    );
    report.add(
        &format!("skein: long session, turns 1-{window} median bytes to Redis"),
        median(&turn_bytes[first]),
        "B",
    );
    report.add(
        &format!(
            "skein: long session, turns {}-{turns} median bytes to Redis",
            turns - window + 1
        ),
        median(&turn_bytes[last]),
        "B",
    );
    report.add("skein: long session, compactions", compactions as f64, "");
    Ok(())
}

/// Many sessions at once: every turn submitted, then finals counted from the events.
pub(crate) async fn burst(
    url: &str,
    store: &SessionStore,
    sessions: usize,
    lead_pid: u32,
    lead_admin: &str,
    report: &mut Report,
) -> Result<usize, Failed> {
    let client = SkeinClient::connect(&NatsConfig::local(url.to_owned())).await?;
    // The most turns the lead runs at once, sampled from its metrics while the burst runs, and
    // the most anonymous memory it held (the kernel keeps a peak only of the whole RSS).
    let sampling = CancellationToken::new();
    let idle_anonymous = rss_kib(lead_pid, "RssAnon")?;
    let most_in_flight = tokio::spawn({
        let (admin, stop) = (lead_admin.to_owned(), sampling.clone());
        async move {
            let (mut most, mut most_anonymous) = (0.0_f64, idle_anonymous);
            while !stop.is_cancelled() {
                if let Some(now) = turns_in_flight(&admin).await {
                    most = most.max(now);
                }
                if let Ok(anonymous) = rss_kib(lead_pid, "RssAnon") {
                    most_anonymous = most_anonymous.max(anonymous);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (most, most_anonymous)
        }
    });
    // The watcher counts what its connection dropped: a core subscriber that falls behind loses
    // messages, and a final event it lost is not a lost turn (see below).
    let dropped = Arc::new(AtomicU64::new(0));
    let nats = async_nats::ConnectOptions::new()
        .event_callback({
            let dropped = dropped.clone();
            move |event| {
                if let async_nats::Event::SlowConsumer(_) = event {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                std::future::ready(())
            }
        })
        .connect(url)
        .await?;
    let mut finals = nats.subscribe("skein.events.bench.>").await?;
    let idle = rss_kib(lead_pid, "VmRSS")?;
    let tasks: Vec<TaskSubmission> = (0..sessions).map(task).collect();
    let submitted = Instant::now();
    // Finals are read while the tasks are submitted, so the watcher does not fall behind.
    let watching = tokio::spawn(async move {
        let mut finished = std::collections::HashSet::with_capacity(sessions);
        let mut taken = Vec::with_capacity(sessions);
        let deadline = Instant::now() + Duration::from_secs(300);
        while finished.len() < sessions && Instant::now() < deadline {
            let Ok(Some(message)) =
                tokio::time::timeout(Duration::from_secs(30), finals.next()).await
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
                    taken.push(submitted.elapsed());
                }
            }
        }
        (finished, taken, submitted.elapsed())
    });
    let published = futures::stream::iter(tasks.iter())
        .map(|t| client.submit(t))
        .buffer_unordered(256)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await;
    let (finished, mut taken, elapsed) = watching.await?;
    let done = finished.len();
    if published < sessions {
        eprintln!("{} of {sessions} submissions failed", sessions - published);
    }
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
    let (most_in_flight, peak_anonymous) = most_in_flight.await.unwrap_or((0.0, idle_anonymous));
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
        "skein: burst events the watcher's connection dropped (slow consumer, at least)",
        dropped.load(Ordering::Relaxed) as f64,
        "messages",
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
    report.add("skein: burst lead peak RSS", peak / 1024.0, "MiB");
    // The same without the binary's pages, whose count depends on the page cache, not the turns.
    report.add(
        "skein: lead peak anonymous memory growth per in-flight turn",
        (peak_anonymous - idle_anonymous) / most_in_flight.max(1.0),
        "KiB",
    );
    Ok(done + stored_only)
}
