//! The `skein` command as a user runs it: submit (human and JSON), workers, bad flags.

use std::process::Output;

use skein_common::protocol::{EventKind, TurnEvent, TurnStatus};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::unique;

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

async fn skein(args: &[&str]) -> Output {
    let run = tokio::process::Command::new(SKEIN)
        .args(args)
        .env("SKEIN_LOG_FORMAT", "json")
        .output();
    tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("skein finishes within 60s")
        .expect("skein runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_streams_events_and_prints_the_answer() {
    let cluster = TestCluster::start();
    let worker = cluster.worker_config(&[]);
    let worker_id = worker
        .process
        .instance_id
        .clone()
        .expect("test workers have ids");
    cluster.spawn_worker(worker);
    cluster.spawn_lead(cluster.lead_config(&[]));
    cluster.wait_for_workers(1).await;
    let session = unique("s");

    let human = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--tenant",
        "acme",
        "--session",
        &session,
        "take a note",
    ])
    .await;
    let (stdout, stderr) = (text(&human.stdout), text(&human.stderr));
    assert!(human.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("I saved a note"),
        "the answer goes to stdout: {stdout}"
    );
    assert!(
        stderr.contains("→ write_file") && stderr.contains("✓ write_file"),
        "progress goes to stderr: {stderr}"
    );

    let json = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--tenant",
        "acme",
        "--session",
        &session,
        "--json",
        "again",
    ])
    .await;
    assert!(json.status.success(), "{}", text(&json.stderr));
    let events: Vec<TurnEvent> = text(&json.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not an event ({e}): {line}"))
        })
        .collect();
    match &events.last().expect("some events").event {
        EventKind::Final { result } => {
            assert_eq!(result.status, TurnStatus::Completed);
            assert!(
                result
                    .answer
                    .as_deref()
                    .is_some_and(|a| a.contains("turn 2")),
                "{result:?}"
            );
        }
        other => panic!("the last line is the final result, not {other:?}"),
    }
    assert!(matches!(events[0].event, EventKind::TurnStarted { .. }));

    let workers = skein(&["workers", "--redis-url", &cluster.redis.url]).await;
    let listing = text(&workers.stdout);
    assert!(workers.status.success());
    assert!(
        listing.contains(&worker_id)
            && listing.contains("read_file")
            && listing.contains("+subagents"),
        "{listing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_the_command_line_is_a_clear_error() {
    let cluster = TestCluster::start();
    let rejected = skein(&[
        "submit",
        "--nats-url",
        &cluster.nats.url,
        "--tenant",
        "a.b",
        "hi",
    ])
    .await;
    assert!(!rejected.status.success());
    assert!(
        text(&rejected.stderr).contains("tenant must be"),
        "{}",
        text(&rejected.stderr)
    );

    let bad_config = skein(&[
        "lead",
        "--nats-url",
        &cluster.nats.url,
        "--concurrency",
        "0",
    ])
    .await;
    assert_eq!(
        bad_config.status.code(),
        Some(64),
        "{}",
        text(&bad_config.stderr)
    );
    assert!(text(&bad_config.stderr).contains("concurrency"));

    let unknown_tool = skein(&[
        "worker",
        "--nats-url",
        &cluster.nats.url,
        "--redis-url",
        &cluster.redis.url,
        "--tools",
        "read_file,teleport",
    ])
    .await;
    assert_eq!(
        unknown_tool.status.code(),
        Some(64),
        "bad configuration exits 64"
    );
    assert!(
        text(&unknown_tool.stderr).contains("teleport"),
        "{}",
        text(&unknown_tool.stderr)
    );

    // A token with a space is named with its rule before anything connects (no server here).
    let spaced = skein(&[
        "submit",
        "--nats-url",
        "nats://127.0.0.1:1",
        "--tenant",
        "bad tenant",
        "hi",
    ])
    .await;
    assert!(!spaced.status.success());
    let stderr = text(&spaced.stderr);
    assert!(
        stderr.contains("tenant must be 1-128 characters of A-Z a-z 0-9 _ -"),
        "{stderr}"
    );
    assert!(!stderr.contains("subject"), "{stderr}");

    // `-` reads the input from standard input; one over the payload cap is refused, naming it.
    let big = "x".repeat(2 * 1024 * 1024);
    let mut piped = tokio::process::Command::new(SKEIN)
        .args(["submit", "--nats-url", &cluster.nats.url, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("skein runs");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = piped.stdin.take().expect("stdin");
        stdin
            .write_all(big.as_bytes())
            .await
            .expect("input written");
    }
    let piped = tokio::time::timeout(std::time::Duration::from_secs(60), piped.wait_with_output())
        .await
        .expect("skein finishes")
        .expect("skein runs");
    assert!(!piped.status.success());
    let stderr = text(&piped.stderr);
    assert!(
        stderr.contains(&format!("input is {} bytes; the limit is", big.len())),
        "{stderr}"
    );

    let no_nats = skein(&["submit", "--nats-url", "nats://127.0.0.1:1", "hi"]).await;
    assert!(!no_nats.status.success());
    assert!(
        text(&no_nats.stderr).contains("cannot connect to NATS"),
        "{}",
        text(&no_nats.stderr)
    );
}
