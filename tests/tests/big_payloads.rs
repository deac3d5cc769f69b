//! Payloads by reference, on a real nats-server with its default 1 MiB `max_payload`: a tool
//! call whose arguments are 3 MB runs whole on a worker; a 3 MB final answer reaches the client
//! whole; a subagent's 2 MB task reaches the child whole and its 2 MB answer comes back as a
//! preview with the whole in the workspace; events carrying such values (the call's arguments,
//! the streamed answer) never break the event stream.

use serde_json::{json, Value};
use skein_common::payloads::INLINE_MAX;
use skein_common::protocol::{EventKind, FinalResult, TurnEvent, TurnStatus};
use skein_tests::support::chaos::scenario;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::unique;

const MB: usize = 1024 * 1024;

/// `HEAD`, `bytes` of `fill` without whitespace (the scripted model streams an answer word by
/// word: this one is a single delta), and `TAIL`.
fn big_text(bytes: usize, fill: &str) -> String {
    format!("HEAD{}TAIL", fill.repeat(bytes / fill.len()))
}

/// The events of `task_id` as the stream holds them, up to the final one.
async fn stream_events(cluster: &TestCluster, task: &str) -> Vec<TurnEvent> {
    use futures::StreamExt;
    let client = cluster.client().await;
    let events = client.watch("acme", task).await.expect("the stream opens");
    let collect = async {
        futures::pin_mut!(events);
        let mut seen = Vec::new();
        while let Some(event) = events.next().await {
            let event = event.expect("every event decodes");
            let last = matches!(event.event, EventKind::Final { .. });
            seen.push(event);
            if last {
                break;
            }
        }
        seen
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), collect)
        .await
        .expect("the stream reaches the final event")
}

fn final_of(events: &[TurnEvent]) -> &FinalResult {
    match events.last().map(|e| &e.event) {
        Some(EventKind::Final { result }) => result,
        other => panic!("the last event is the final one, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_file_call_with_three_megabytes_of_content_runs_whole() {
    let cluster = TestCluster::start();
    let content = big_text(3 * MB, "0123456789abcdef");
    let arguments = json!({ "path": "big.txt", "content": content });
    let script = scenario(
        &cluster,
        json!([{ "steps": [
            { "tool_calls": [ { "name": "write_file", "arguments": arguments } ] },
            { "answer": "saved: {{observations}}" }
        ] }]),
    );
    cluster
        .start_nodes(1, &["--scenario", script.to_str().expect("utf-8 path")])
        .await;

    let task = submission("acme", &unique("s"), "save it");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let finished = events.iter().find_map(|e| match &e.event {
        EventKind::ToolFinished { ok, preview, .. } => Some((*ok, preview.clone())),
        _ => None,
    });
    assert!(
        matches!(&finished, Some((true, _))),
        "the call ran: {finished:?}"
    );
    let written = cluster
        .workspace_file("acme", &task.session, "big.txt")
        .await
        .expect("the file exists");
    assert_eq!(written.len(), content.len());
    assert!(written == content, "the file holds the whole content");

    // The event announcing the call shows a preview and where the whole arguments are; the
    // stream goes on to its final event.
    let streamed = stream_events(&cluster, &task.task_id).await;
    let (shown, reference) = streamed
        .iter()
        .find_map(|e| match &e.event {
            EventKind::ToolStarted {
                arguments,
                arguments_ref,
                ..
            } => Some((arguments.clone(), arguments_ref.clone())),
            _ => None,
        })
        .expect("a tool_started event");
    let shown = shown.as_str().expect("a preview of the arguments");
    assert!(shown.len() <= INLINE_MAX, "{}", shown.len());
    assert!(shown.starts_with(r#"{"content":"HEAD"#), "{:.100}", shown);
    let reference = reference.expect("a reference to the whole arguments");
    assert_eq!(reference.bucket, "skein-payloads-acme");
    let whole = cluster
        .client()
        .await
        .fetch_payload("acme", &reference)
        .await
        .expect("the whole arguments are readable");
    let whole: Value = serde_json::from_slice(&whole).expect("JSON");
    assert_eq!(whole, arguments);
    assert_eq!(final_of(&streamed).status, TurnStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_megabyte_answer_reaches_the_client_whole() {
    let cluster = TestCluster::start();
    let answer = big_text(3 * MB, "x");
    let script = scenario(&cluster, json!([{ "steps": [ { "answer": answer } ] }]));
    cluster
        .start_nodes(0, &["--scenario", script.to_str().expect("utf-8 path")])
        .await;

    let task = submission("acme", &unique("s"), "say a lot");
    let (result, events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert!(
        result.answer.as_deref() == Some(answer.as_str()),
        "the whole answer: {} bytes",
        result.answer.as_ref().map_or(0, String::len)
    );
    assert_eq!(result.answer_ref, None);
    // The one 3 MB delta streamed as several events, in order, each within the inline limit.
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ModelDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(deltas.len() > 1, "{} deltas", deltas.len());
    assert!(deltas.iter().all(|d| d.len() <= INLINE_MAX));
    assert!(deltas.concat() == answer, "the deltas make the answer");
    // What `run` passed on as the final event has the whole answer too, and came from the
    // stream (a stored result passed on in its place has seq 0).
    let last = events.last().expect("events");
    assert!(last.seq > 0);
    assert!(
        matches!(&last.event, EventKind::Final { result } if result.answer.as_deref() == Some(answer.as_str()))
    );

    // As the stream holds it: a preview and a reference, which the client resolves.
    let streamed = stream_events(&cluster, &task.task_id).await;
    let raw = final_of(&streamed).clone();
    let preview = raw.answer.clone().expect("a preview");
    assert!(preview.len() <= INLINE_MAX, "{}", preview.len());
    assert!(preview.starts_with("HEAD") && preview.ends_with("TAIL"));
    assert!(raw.answer_ref.is_some());
    let client = cluster.client().await;
    let whole = client.whole_answer(raw).await.expect("the answer is read");
    assert!(whole.answer.as_deref() == Some(answer.as_str()));
    // A late client asking any lead gets it whole as well.
    let looked_up = client
        .stored_final("acme", &task.session, &task.task_id)
        .await
        .expect("the lookup works")
        .expect("the task has ended");
    assert!(looked_up.answer.as_deref() == Some(answer.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_gets_a_two_megabyte_task_whole_and_its_answer_comes_back_by_reference() {
    let cluster = TestCluster::start();
    let agents = cluster.dir.join("agents");
    std::fs::create_dir_all(agents.join("subagents")).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\nname = \"assistant\"\nsubagents = [\"echo\"]\nmax_iterations = 3\n+++\nDelegate.\n",
    )
    .expect("lead agent written");
    std::fs::write(
        agents.join("subagents/echo.md"),
        "+++\nname = \"echo\"\ndescription = \"repeats its task\"\nmax_iterations = 2\n+++\nRepeat.\n",
    )
    .expect("subagent written");
    let input = big_text(2 * MB, "y");
    let scenario_path = cluster.dir.join("subagent-scenario.json");
    std::fs::write(
        &scenario_path,
        json!({ "agents": {
            "assistant": { "turns": [ { "steps": [
                { "tool_calls": [ { "name": "spawn_agent", "arguments": { "agent": "echo", "task": input } } ] },
                { "answer": "child said: {{observations}}" }
            ] } ] },
            "echo": { "turns": [ { "steps": [ { "answer": "{{input}}" } ] } ] }
        } })
        .to_string(),
    )
    .expect("scenario written");
    let script = scenario_path.to_str().expect("utf-8 path");
    let agents = agents.to_str().expect("utf-8 path");
    cluster.spawn_worker(cluster.worker_config(&["--scenario", script]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&["--scenario", script, "--agents-dir", agents]));

    let task = submission("acme", &unique("s"), "delegate");
    let (result, _events) = cluster.run(&task).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.expect("an answer");
    assert!(
        answer.len() < 300 * 1024,
        "a preview: {} bytes",
        answer.len()
    );
    assert!(
        answer.contains(&format!("the whole output ({} bytes)", input.len())),
        "{answer:.300}"
    );
    let path = answer
        .split_whitespace()
        .find(|word| word.starts_with(".skein/results/"))
        .expect("the preview names the file")
        .trim_end_matches(':');
    let whole = cluster
        .workspace_file("acme", &task.session, path)
        .await
        .expect("the child's whole answer is in the workspace");
    assert!(
        whole == input,
        "the child got its whole task and answered it whole"
    );
}
