//! Secrets never leak. A cluster runs with three planted secrets — the NATS password, the Redis
//! password (both read from `*_FILE` files) and the model API key — through a run with failures
//! in it: a tool call, a model that refuses the key and echoes it back, an undecodable submission
//! that is dead-lettered, and connections refused for a wrong password. Every output is searched:
//! the processes' logs, the spans they export (content recording on), every event and final
//! result, the dead letters, and the errors the client and store return. A model API key too
//! short to mask safely stops a lead or a worker at start, naming the setting, not the value.

use std::time::Duration;

use serde_json::json;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::protocol::TurnStatus;
use skein_common::store::SessionStore;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::otlp::OtlpReceiver;
use skein_tests::support::servers::{NatsServer, RedisServer};
use skein_tests::support::{
    eventually, stopped_at_start, unique, ChildProcess, FakeOpenAi, FakeReply,
};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");
const NATS_PASSWORD: &str = "planted-nats-password-7f3a";
const REDIS_PASSWORD: &str = "planted-redis-password-91c2";
const MODEL_KEY: &str = "sk-planted-model-key-5d8e";

fn leaks(text: &str) -> Vec<&'static str> {
    [NATS_PASSWORD, REDIS_PASSWORD, MODEL_KEY]
        .into_iter()
        .filter(|secret| text.contains(secret))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_secrets_appear_in_no_output_of_a_run_with_failures() {
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{ users = [ {{ user: skein, password: {NATS_PASSWORD:?} }} ] }}"
    ));
    let redis = RedisServer::start_with_args(&["--requirepass".into(), REDIS_PASSWORD.into()]);
    let cluster = TestCluster::with_servers(nats, redis);
    let secrets = cluster.dir.join("secrets");
    std::fs::create_dir_all(&secrets).expect("secrets dir");
    for (name, value) in [
        ("nats", NATS_PASSWORD),
        ("redis", REDIS_PASSWORD),
        ("model", MODEL_KEY),
    ] {
        std::fs::write(secrets.join(name), format!("{value}\n")).expect("secret file");
    }
    let receiver = OtlpReceiver::start().await;
    let model = FakeOpenAi::start(vec![
        FakeReply::tool(
            "write_file",
            json!({ "path": "notes.txt", "content": "nothing secret" }),
        ),
        FakeReply::answer("noted"),
        FakeReply::Status(401, format!("invalid api key {MODEL_KEY}")),
    ])
    .await;
    let node = |role: &str, log: &str| {
        let mut cmd = std::process::Command::new(NODE);
        cmd.args(cluster.process_args(role))
            .args(["--nats-user", "skein"])
            .args([
                "--model-provider",
                "openai",
                "--model-base-url",
                &model.base_url,
            ])
            .env("SKEIN_NATS_PASSWORD_FILE", secrets.join("nats"))
            .env("SKEIN_REDIS_PASSWORD_FILE", secrets.join("redis"))
            .env("SKEIN_MODEL_API_KEY_FILE", secrets.join("model"))
            .env("SKEIN_LOG", "debug")
            .env("SKEIN_TRACE_CONTENT", "true")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100");
        ChildProcess::spawn(cmd, cluster.dir.join(log))
    };
    let worker = node("worker", "worker.log");
    let store = SessionStore::connect(&RedisConfig {
        password: Some(REDIS_PASSWORD.into()),
        ..RedisConfig::local(cluster.redis.url.clone())
    })
    .await
    .expect("redis with its password");
    eventually("a live worker", Duration::from_secs(30), || {
        let store = store.clone();
        async move { (!store.live_workers().await.ok()?.is_empty()).then_some(()) }
    })
    .await;
    let lead = node("lead", "lead.log");
    let client = SkeinClient::connect(&NatsConfig {
        user: Some("skein".into()),
        password: Some(NATS_PASSWORD.into()),
        ..NatsConfig::local(cluster.nats.url.clone())
    })
    .await
    .expect("client connects");

    let mut outputs = Vec::new();
    for (input, completes) in [("take a note", true), ("now fail", false)] {
        let mut events = Vec::new();
        let result = client
            .run(
                &submission("acme", &unique("s"), input),
                Duration::from_secs(60),
                |e| events.push(serde_json::to_string(e).unwrap_or_default()),
            )
            .await
            .expect("a final result");
        assert_eq!(
            result.status == TurnStatus::Completed,
            completes,
            "{result:?}"
        );
        outputs.extend(events);
        outputs.push(format!("{result:?}"));
    }
    // The model's refusal, which echoed the key, reached the client as a failure, masked.
    assert!(
        outputs
            .iter()
            .any(|o| o.contains("answered 401") && o.contains("[redacted]")),
        "the model's refusal is reported with the key masked"
    );

    // An undecodable submission is dead-lettered.
    client
        .bus()
        .client()
        .publish("skein.submit.acme.raw", "not json".into())
        .await
        .expect("published");
    let letters = eventually("the dead letter", Duration::from_secs(20), || {
        let bus = client.bus().clone();
        async move {
            let letters = bus.dead_letters().await.ok()?;
            (!letters.is_empty()).then_some(letters)
        }
    })
    .await;
    for letter in &letters {
        outputs.push(format!(
            "{letter:?} {}",
            String::from_utf8_lossy(&letter.payload)
        ));
    }

    // Connections refused for a wrong password say so without echoing any password.
    let wrong_nats = SkeinClient::connect(&NatsConfig {
        user: Some("skein".into()),
        password: Some(format!("{NATS_PASSWORD}-wrong")),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::local(cluster.nats.url.clone())
    })
    .await
    .err()
    .map(|e| e.to_string())
    .expect("a wrong NATS password is refused");
    outputs.push(wrong_nats);
    let wrong_redis = SessionStore::connect(&RedisConfig::local(format!(
        "redis://:{REDIS_PASSWORD}-wrong@{}",
        cluster.redis.url.trim_start_matches("redis://")
    )))
    .await
    .err()
    .map(|e| e.to_string())
    .expect("a wrong Redis password is refused");
    outputs.push(wrong_redis);

    // Spans, once exported.
    let spans = eventually("spans of both runs", Duration::from_secs(30), || {
        let spans = receiver.spans();
        async move {
            let chats = spans.iter().filter(|s| s.name.starts_with("chat")).count();
            (chats >= 3).then_some(spans)
        }
    })
    .await;
    for span in &spans {
        outputs.push(format!("{} {:?}", span.name, span.attributes));
    }
    drop(lead);
    drop(worker);
    for log in ["lead.log", "worker.log"] {
        let text = std::fs::read_to_string(cluster.dir.join(log)).unwrap_or_default();
        assert!(text.len() > 100, "{log} holds the run's log lines");
        outputs.push(text);
    }

    let leaked: Vec<_> = outputs
        .iter()
        .flat_map(|o| {
            leaks(o)
                .into_iter()
                .map(move |s| (s, o.chars().take(300).collect::<String>()))
        })
        .collect();
    assert!(leaked.is_empty(), "secrets leaked: {leaked:#?}");
}

/// A model API key too short to mask (every occurrence of a one-letter key in answers and tool
/// output would be masked) stops a lead or a worker at start as bad configuration, with a
/// message that names the setting and never shows the value, given inline or in its file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_key_too_short_to_mask_stops_the_process_at_start() {
    let cluster = TestCluster::start();
    let key_file = cluster.dir.join("short-key");
    let short = "Zq7-x9w";
    std::fs::write(&key_file, format!("{short}\n")).expect("key file");
    for (role, inline) in [("lead", Some("k")), ("worker", None)] {
        let mut cmd = tokio::process::Command::new(NODE);
        cmd.args(cluster.process_args(role));
        match inline {
            Some(key) => cmd.args(["--model-api-key", key]),
            None => cmd.env("SKEIN_MODEL_API_KEY_FILE", &key_file),
        };
        let stderr = stopped_at_start(cmd, role).await;
        assert!(
            stderr.contains("SKEIN_MODEL_API_KEY") && stderr.contains("at least 8 bytes"),
            "{role}: {stderr}"
        );
        assert!(!stderr.contains(short), "{role}: the value is not shown");
    }
}
