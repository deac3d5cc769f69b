//! The floor: what NATS and Redis cost on their own, with nothing of Skein in the path. Core
//! request-reply against a responder process (`skein-bench responder <nats url>`), JetStream
//! publish and consume, a durable call's floor (a stored message pulled by a worker process,
//! `skein-bench work-responder <nats url>`, that replies and acks), and a Redis `SET` of a
//! session-sized blob.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use skein_tests::support::{unique, ChildProcess};

use crate::report::{latencies, Report};
use crate::Failed;

/// A session-sized blob: the JSON of a history of 40 messages.
pub(crate) fn session_blob() -> String {
    let history: Vec<Value> = (0..40)
        .map(|i| json!({ "role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "x".repeat(180) }))
        .collect();
    json!({ "history": history, "turns": 20 }).to_string()
}

/// Runs a floor process's `work` on a single-threaded runtime, as a lean responder would be.
fn on_one_thread(work: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(work),
        Err(_) => ExitCode::FAILURE,
    }
}

/// The process that answers core requests for the floor.
pub(crate) fn responder(url: String) -> ExitCode {
    on_one_thread(async move {
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

/// The stream, subject and consumer of the durable-call floor.
const WORK_STREAM: &str = "BENCH_WORK";
const WORK_SUBJECT: &str = "bench.work";
const WORK_CONSUMER: &str = "bench-work";
/// The header naming where the durable-call floor's worker replies.
const WORK_REPLY: &str = "Bench-Reply";

/// The process that runs the durable-call floor's work: pulls each message from the work stream,
/// replies with its payload where its header says, then acks it.
pub(crate) fn work_responder(url: String) -> ExitCode {
    use async_nats::jetstream::{self, consumer};
    on_one_thread(async move {
        let Ok(client) = async_nats::connect(url.as_str()).await else {
            return ExitCode::FAILURE;
        };
        let js = jetstream::new(client.clone());
        let Ok(stream) = js.get_stream(WORK_STREAM).await else {
            return ExitCode::FAILURE;
        };
        let Ok(consumer) = stream
            .get_consumer::<consumer::pull::Config>(WORK_CONSUMER)
            .await
        else {
            return ExitCode::FAILURE;
        };
        let Ok(mut messages) = consumer.messages().await else {
            return ExitCode::FAILURE;
        };
        while let Some(next) = messages.next().await {
            // A missed heartbeat or a pull that failed is reported in the stream, which goes on.
            let Ok(message) = next else { continue };
            let reply = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(WORK_REPLY))
                .map(|reply| reply.as_str().to_owned());
            if let Some(reply) = reply {
                let _ = client.publish(reply, message.payload.clone()).await;
            }
            let _ = message.ack().await;
        }
        ExitCode::SUCCESS
    })
}

/// A durable call on NATS alone: a task published to a work stream (its ack awaited), pulled by
/// a worker process that replies and acks; timed from the publish to the reply.
pub(crate) async fn floor_durable_call(
    url: &str,
    samples: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    use async_nats::jetstream::{self, consumer, stream};
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client.clone());
    let work = js
        .get_or_create_stream(stream::Config {
            name: WORK_STREAM.into(),
            subjects: vec![WORK_SUBJECT.into()],
            retention: stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await?;
    work.get_or_create_consumer(
        WORK_CONSUMER,
        consumer::pull::Config {
            durable_name: Some(WORK_CONSUMER.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        },
    )
    .await?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["work-responder", url]);
    let _worker = ChildProcess::spawn(cmd, std::env::temp_dir().join(unique("work-responder")));
    let inbox = unique("bench.work-reply");
    let mut replies = client.subscribe(inbox.clone()).await?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(WORK_REPLY, inbox.as_str());
    let payload = bytes::Bytes::from(vec![b'x'; 1024]);
    // The first call also waits for the worker to start.
    durable_call(&js, &headers, &payload, &mut replies).await?;
    let mut taken = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        durable_call(&js, &headers, &payload, &mut replies).await?;
        taken.push(started.elapsed());
    }
    latencies(
        report,
        "floor: durable call (JetStream work, pull, reply, ack)",
        taken,
    );
    Ok(())
}

/// One call of the durable-call floor: the task published, its ack awaited, then its reply;
/// an error if no reply comes within 10 s (the worker is gone).
async fn durable_call(
    js: &async_nats::jetstream::Context,
    headers: &async_nats::HeaderMap,
    payload: &bytes::Bytes,
    replies: &mut async_nats::Subscriber,
) -> Result<(), Failed> {
    let call = async {
        js.publish_with_headers(WORK_SUBJECT, headers.clone(), payload.clone())
            .await?
            .await?;
        replies
            .next()
            .await
            .map(drop)
            .ok_or_else(|| Failed::from("the reply subscription ended"))
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .map_err(|_| "the durable-call floor's worker did not answer within 10 s")?
}

pub(crate) async fn floor_request_reply(
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

pub(crate) async fn floor_jetstream(
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

pub(crate) async fn floor_redis_set(
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
