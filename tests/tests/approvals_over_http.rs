//! Calls waiting for a person over the gateway's protocols when a step asks about more than one:
//! every waiting call is shown, an answer must settle each of them (one left out is refused,
//! naming it), and once all are answered each runs once; a stateless run stopped at an interrupt
//! keeps its thread, and its retry with the same `Idempotency-Key` is the same run.

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{guarded_gateway, SUBMIT_AND_APPROVE_KEY};
use skein_tests::support::test_tools::read_effects;

/// A scenario whose one step asks about two `slow_effect` calls, then answers.
fn two_calls(cluster: &TestCluster) -> String {
    cluster.scenario(json!([{ "steps": [
        { "tool_calls": [
            { "name": "slow_effect", "arguments": { "key": "a-{{input}}", "ms": 10 } },
            { "name": "slow_effect", "arguments": { "key": "b-{{input}}", "ms": 10 } }
        ] },
        { "answer": "observed: {{observations}}" }
    ] }]))
}

async fn post(http: &reqwest::Client, url: &str, body: Value) -> (StatusCode, Value) {
    post_keyed(http, url, body, None).await
}

async fn post_keyed(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    idempotency_key: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = http
        .post(url)
        .header("x-api-key", SUBMIT_AND_APPROVE_KEY)
        .json(&body);
    if let Some(key) = idempotency_key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("sent");
    let status = response.status();
    let text = response.text().await.expect("a body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn started(cluster: &TestCluster, key: &str) -> Option<usize> {
    read_effects(&cluster.effects_file())
        .get(key)
        .map(|c| c.started)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_shows_every_waiting_call_and_goes_on_only_when_each_is_answered() {
    let cluster = TestCluster::start();
    let script = two_calls(&cluster);
    let addr = guarded_gateway(&cluster, &script).await;
    let http = reqwest::Client::new();
    let responses = format!("http://{addr}/v1/responses");

    let (status, asked) = post(
        &http,
        &responses,
        json!({ "model": "assistant", "input": "r" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{asked}");
    let requests: Vec<&Value> = asked["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|item| item["type"] == "mcp_approval_request")
        .collect();
    assert_eq!(requests.len(), 2, "both calls are shown: {asked}");
    let ids: Vec<&str> = requests.iter().filter_map(|r| r["id"].as_str()).collect();
    let previous = asked["id"].as_str().expect("an id");

    let one = json!({ "model": "assistant", "previous_response_id": previous, "input": [
        { "type": "mcp_approval_response", "approval_request_id": ids[0], "approve": true }
    ] });
    let (status, refused) = post(&http, &responses, one).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(ids[1])),
        "names the call left out: {refused}"
    );
    assert_eq!(
        started(&cluster, "a-r"),
        None,
        "nothing runs on a refused answer"
    );

    let both = json!({ "model": "assistant", "previous_response_id": previous, "input": [
        { "type": "mcp_approval_response", "approval_request_id": ids[0], "approve": true },
        { "type": "mcp_approval_response", "approval_request_id": ids[1], "approve": true }
    ] });
    let (status, done) = post(&http, &responses, both).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["output"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["type"] == "message"))
        .map(|m| {
            m["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default();
    assert!(
        text.contains("effect a-r done") && text.contains("effect b-r done"),
        "{done}"
    );
    assert_eq!(
        (started(&cluster, "a-r"), started(&cluster, "b-r")),
        (Some(1), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_interrupts_are_each_answered_and_a_stateless_run_keeps_its_waiting_thread() {
    let cluster = TestCluster::start();
    let script = two_calls(&cluster);
    let addr = guarded_gateway(&cluster, &script).await;
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let said = |text: &str| json!({ "messages": [ { "role": "user", "content": text } ] });

    // A stateless run that stops at its interrupts keeps its thread; its retry is the same run.
    let request = json!({ "assistant_id": "assistant", "input": said("s") });
    let (status, values) = post_keyed(
        &http,
        &format!("{base}/runs/wait"),
        request.clone(),
        Some("once"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{values}");
    let interrupts = values["__interrupt__"]
        .as_array()
        .expect("interrupts")
        .clone();
    assert_eq!(interrupts.len(), 2, "both calls wait: {values}");
    let (status, again) =
        post_keyed(&http, &format!("{base}/runs/wait"), request, Some("once")).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again["__interrupt__"], values["__interrupt__"],
        "the same run, not a second"
    );
    let threads: Value = http
        .post(format!("{base}/threads/search"))
        .header("x-api-key", SUBMIT_AND_APPROVE_KEY)
        .json(&json!({ "status": "interrupted" }))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("threads");
    let waiting = threads.as_array().expect("threads");
    assert_eq!(
        waiting.len(),
        1,
        "one stateless thread, kept while it waits: {threads}"
    );
    let thread = waiting[0]["thread_id"].as_str().expect("an id").to_owned();

    // One decision for two waiting calls is refused; each answered by its interrupt id runs.
    let wait = format!("{base}/threads/{thread}/runs/wait");
    let (status, refused) = post(
        &http,
        &wait,
        json!({ "assistant_id": "assistant", "command": { "resume": { "decisions": [ { "type": "approve" } ] } } }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let first = interrupts[0]["id"].as_str().expect("an id");
    let (status, refused) = post(
        &http,
        &wait,
        json!({ "assistant_id": "assistant", "command": { "resume": { first: { "approve": true } } } }),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "one of two answered: {refused}"
    );
    assert_eq!(started(&cluster, "a-s"), None);
    let second = interrupts[1]["id"].as_str().expect("an id");
    let (status, done) = post(
        &http,
        &wait,
        json!({ "assistant_id": "assistant", "command": { "resume": {
            first: { "approve": true }, second: { "approve": false, "reason": "not b" }
        } } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let last = done["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        last.contains("effect a-s done") && last.contains("not b"),
        "{done}"
    );
    assert_eq!(
        (started(&cluster, "a-s"), started(&cluster, "b-s")),
        (Some(1), None)
    );
}
