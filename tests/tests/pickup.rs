//! A task nobody picks up is not a silent wait: `skein submit` says on stderr why its task has
//! not started (no live lead, the earlier tasks of its session, the leads' backlog), and keeps
//! waiting.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::json;
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{eventually, unique, FakeOpenAi, FakeReply};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr};

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

/// Bound on every wait of these tests.
const WAIT: Duration = Duration::from_secs(60);

/// `skein submit` of `input` on `session`, saying why it waits after one second.
fn submit(cluster: &TestCluster, session: &str, input: &str) -> Child {
    tokio::process::Command::new(SKEIN)
        .args([
            "submit",
            "--nats-url",
            &cluster.nats.url,
            "--tenant",
            "acme",
            "--session",
            session,
            "--notice-after",
            "1s",
            "--timeout",
            "60s",
            input,
        ])
        .env("SKEIN_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("skein runs")
}

/// Reads stderr lines until one contains `wanted`; returns it.
async fn line_with(stderr: &mut tokio::io::Lines<BufReader<ChildStderr>>, wanted: &str) -> String {
    let read = async {
        while let Some(line) = stderr.next_line().await.expect("stderr reads") {
            if line.contains(wanted) {
                return line;
            }
        }
        panic!("stderr ended without a line containing {wanted:?}")
    };
    tokio::time::timeout(WAIT, read)
        .await
        .unwrap_or_else(|_| panic!("no line containing {wanted:?} within {WAIT:?}"))
}

/// Waits for `child` to exit; returns its status and stdout.
async fn finished(mut child: Child) -> (ExitStatus, String) {
    let mut stdout = child.stdout.take().expect("stdout piped");
    let run = async {
        let mut out = String::new();
        stdout.read_to_string(&mut out).await.expect("stdout reads");
        (child.wait().await.expect("skein exits"), out)
    };
    tokio::time::timeout(WAIT, run)
        .await
        .expect("skein exits within the wait")
}

/// Waits until the lead runs the first task: its model call is held at `model`.
async fn started(model: &FakeOpenAi) {
    eventually("the first task's model call", WAIT, || {
        let arrived = model.arrived();
        async move { (arrived >= 1).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lead_submit_says_so_and_the_task_runs_once_one_starts() {
    let cluster = TestCluster::start();
    let session = unique("s");
    let mut child = submit(&cluster, &session, "anyone there?");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr piped")).lines();

    let notice = line_with(&mut stderr, "has not started").await;
    println!("{notice}");
    assert!(notice.contains("no live lead"), "{notice}");
    assert!(notice.contains("still waiting"), "{notice}");
    // Drain the rest of stderr, so the command never blocks on a full pipe.
    let rest = tokio::spawn(async move {
        let mut lines = Vec::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            lines.push(line);
        }
        lines
    });

    let script = cluster.scenario(json!([{ "steps": [ { "answer": "picked up: {{input}}" } ] }]));
    cluster.start_nodes(0, &["--scenario", &script]).await;
    let (status, stdout) = finished(child).await;
    let rest = rest.await.expect("stderr drained").join("\n");
    assert!(status.success(), "{stdout}\n{rest}");
    assert!(stdout.contains("picked up: anyone there?"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_an_unfinished_task_of_its_session_submit_names_it() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer("first done"),
        FakeReply::answer("second done"),
    ])
    .await;
    let gate = model.hold();
    cluster.start_nodes(0, &model_flags(&model.base_url)).await;
    let session = unique("s");
    let first = submission("acme", &session, "first question");
    let client = cluster.client().await;
    client.submit(&first).await.expect("first submitted");
    started(&model).await;

    let mut child = submit(&cluster, &session, "second question");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let notice = line_with(&mut stderr, "has not started").await;
    println!("{notice}");
    assert!(
        notice.contains(&format!("the oldest, {}", first.task_id)),
        "{notice}"
    );
    assert!(!notice.contains("no live lead"), "{notice}");
    let rest = tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });

    gate.add_permits(2);
    let (status, stdout) = finished(child).await;
    rest.await.expect("stderr drained");
    assert!(status.success(), "{stdout}");
    assert!(stdout.contains("second done"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_busy_lead_submit_shows_the_leads_backlog() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::answer("first done"),
        FakeReply::answer("second done"),
    ])
    .await;
    let gate = model.hold();
    let mut flags = model_flags(&model.base_url).to_vec();
    flags.extend(["--concurrency", "1"]);
    cluster.start_nodes(0, &flags).await;
    // Another session's task fills the lead's only slot.
    let client = cluster.client().await;
    client
        .submit(&submission("acme", &unique("s"), "first question"))
        .await
        .expect("first submitted");
    started(&model).await;

    let mut child = submit(&cluster, &unique("s"), "second question");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let notice = line_with(&mut stderr, "has not started").await;
    println!("{notice}");
    assert!(
        notice.contains("a lead is running but has not taken it yet"),
        "{notice}"
    );
    assert!(
        notice.contains("1 task(s) not yet delivered, 1 delivered and unfinished"),
        "{notice}"
    );
    let rest = tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });

    gate.add_permits(2);
    let (status, stdout) = finished(child).await;
    rest.await.expect("stderr drained");
    assert!(status.success(), "{stdout}");
    assert!(stdout.contains("second done"), "{stdout}");
}
