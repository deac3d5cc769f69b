//! The gateway's Agent Protocol runs that meet other runs and other tenants: a busy thread
//! refuses a second run (and a retry with the same `Idempotency-Key` is the same run), a running
//! run cancelled, a streamed or waited-for run cancelled when its client leaves
//! (`on_disconnect=cancel`), and another tenant's key refused every read and action on a thread's
//! runs, leaving its interrupt intact.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_tests::support::agent_protocol::{contents, run_of, said, started, Api};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::eventually;
use skein_tests::support::gateway::{
    gateway_before, guarded_gateway, KEY, OTHER_TENANT_KEY, SUBMIT_AND_APPROVE_KEY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_thread_refuses_a_second_run_and_a_stream_whose_client_leaves_cancels_on_request() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "slow-{{input}}", "ms": 30000 } } ] },
        { "answer": "finished" }
    ] }]));
    let addr = gateway_before(&cluster, &script, &[]).await;
    let api = Api::new(addr);
    let thread = api.thread(KEY).await;
    let runs = format!("/threads/{thread}/runs");
    let first = json!({ "assistant_id": "assistant", "input": said("one") });
    let keyed = [("Idempotency-Key", "run-one")];
    let run: Value = api
        .send("POST", &runs, KEY, Some(first.clone()), &keyed)
        .await
        .json()
        .await
        .expect("a run");
    let run_id = run["run_id"].as_str().expect("a run").to_owned();
    eventually("the slow call runs", Duration::from_secs(30), || async {
        (started(&cluster, "slow-one") > 0).then_some(())
    })
    .await;
    assert_eq!(
        api.ok("GET", &format!("/threads/{thread}"), KEY, None)
            .await["status"],
        "busy"
    );
    assert_eq!(
        api.ok(
            "GET",
            &format!("/threads/{thread}/runs/{run_id}"),
            KEY,
            None
        )
        .await["status"],
        "running"
    );
    let (busy, error) = api
        .call(
            "POST",
            &format!("/threads/{thread}/runs"),
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("two") })),
        )
        .await;
    assert_eq!(busy, StatusCode::CONFLICT, "{error}");
    assert!(
        error["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("busy"),
        "{error}"
    );
    // A retry of the running run with its Idempotency-Key is that run, not a second one.
    let retried = api.send("POST", &runs, KEY, Some(first), &keyed).await;
    assert_eq!(retried.status(), StatusCode::OK);
    let retried: Value = retried.json().await.expect("a run");
    assert_eq!(retried["run_id"], run_id.as_str());
    let other = json!({ "assistant_id": "assistant", "input": said("other") });
    let reused = api.send("POST", &runs, KEY, Some(other), &keyed).await;
    assert_eq!(
        reused.status(),
        StatusCode::CONFLICT,
        "the key named another run"
    );
    let listed = api.ok("GET", &runs, KEY, None).await;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let cancelled = api
        .send(
            "POST",
            &format!("/threads/{thread}/runs/{run_id}/cancel?wait=true&action=rollback"),
            KEY,
            None,
            &[],
        )
        .await;
    assert_eq!(cancelled.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        api.ok(
            "GET",
            &format!("/threads/{thread}/runs/{run_id}"),
            KEY,
            None
        )
        .await["status"],
        "interrupted"
    );

    // A client that leaves its stream with on_disconnect=cancel cancels its run.
    let response = api.send("POST", &format!("/threads/{thread}/runs/stream"), KEY, Some(json!({ "assistant_id": "assistant", "input": said("three"), "on_disconnect": "cancel" })), &[]).await;
    let left = run_of(response.headers());
    let mut body = response.bytes_stream();
    use futures::StreamExt;
    let first = body.next().await.expect("a first part").expect("read");
    assert!(String::from_utf8_lossy(&first).contains("metadata"));
    eventually("the slow call runs", Duration::from_secs(30), || async {
        (started(&cluster, "slow-three") > 0).then_some(())
    })
    .await;
    drop(body);
    let store = cluster.store().await;
    let ended = eventually("the left run ends", Duration::from_secs(30), || {
        let (store, thread, left) = (store.clone(), thread.clone(), left.clone());
        async move {
            store
                .final_result("acme", &thread, &left)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(ended.status, skein_common::protocol::TurnStatus::Cancelled);

    // The same for a client that leaves a run it waits for.
    let waiting = {
        let (http, url) = (
            api.http.clone(),
            format!("{}/threads/{thread}/runs/wait", api.base),
        );
        tokio::spawn(async move {
            http.post(url)
                .header("x-api-key", KEY)
                .header("Idempotency-Key", "run-four")
                .json(&json!({ "assistant_id": "assistant", "input": said("four"), "on_disconnect": "cancel" }))
                .send()
                .await
        })
    };
    eventually("the slow call runs", Duration::from_secs(30), || async {
        (started(&cluster, "slow-four") > 0).then_some(())
    })
    .await;
    waiting.abort();
    let runs = api
        .ok("GET", &format!("/threads/{thread}/runs"), KEY, None)
        .await;
    let four = runs
        .as_array()
        .and_then(|runs| {
            runs.iter()
                .find(|r| r["kwargs"]["input"]["messages"][0]["content"] == "four")
        })
        .and_then(|r| r["run_id"].as_str())
        .expect("the waited-for run")
        .to_owned();
    let ended = eventually("the left run ends", Duration::from_secs(30), || {
        let (store, thread, four) = (store.clone(), thread.clone(), four.clone());
        async move {
            store
                .final_result("acme", &thread, &four)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(ended.status, skein_common::protocol::TurnStatus::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_key_cannot_read_cancel_or_resume_a_threads_runs() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "deploy-{{input}}", "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let addr = guarded_gateway(&cluster, &script).await;
    let api = Api::new(addr);
    let thread = api.thread(SUBMIT_AND_APPROVE_KEY).await;

    // A run of acme's that stops at an interrupt.
    let waited = api
        .send(
            "POST",
            &format!("/threads/{thread}/runs/wait"),
            SUBMIT_AND_APPROVE_KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("deploy") })),
            &[],
        )
        .await;
    assert_eq!(waited.status(), StatusCode::OK);
    let run = run_of(waited.headers());
    let values: Value = waited.json().await.expect("values");
    assert_eq!(
        values["__interrupt__"][0]["value"]["arguments"]["key"], "deploy-deploy",
        "{values}"
    );

    // Globex's key finds neither the thread nor its runs: it cannot read, list, cancel or resume
    // them, nor read the thread's state.
    let resume =
        json!({ "assistant_id": "assistant", "command": { "resume": { "approve": true } } });
    for (method, path, body) in [
        ("GET", format!("/threads/{thread}/runs/{run}"), None),
        ("GET", format!("/threads/{thread}/runs"), None),
        ("POST", format!("/threads/{thread}/runs/{run}/cancel"), None),
        (
            "POST",
            format!("/threads/{thread}/runs/wait"),
            Some(resume.clone()),
        ),
        ("GET", format!("/threads/{thread}/state"), None),
    ] {
        let (status, body) = api.call(method, &path, OTHER_TENANT_KEY, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {body}");
    }
    assert_eq!(
        started(&cluster, "deploy-deploy"),
        0,
        "another tenant's resume did not run the call"
    );
    assert_eq!(
        api.ok(
            "GET",
            &format!("/threads/{thread}/runs/{run}"),
            SUBMIT_AND_APPROVE_KEY,
            None
        )
        .await["status"],
        "interrupted",
        "another tenant's cancel left the run as it was"
    );

    // The interrupt is intact: acme's approver resumes it and the call runs once.
    let done = api
        .ok(
            "POST",
            &format!("/threads/{thread}/runs/wait"),
            SUBMIT_AND_APPROVE_KEY,
            Some(resume),
        )
        .await;
    let answer = contents(&done).last().cloned().unwrap_or_default();
    assert!(answer.starts_with("ai:observed:"), "{answer}");
    assert_eq!(
        started(&cluster, "deploy-deploy"),
        1,
        "the approved call ran once"
    );
}
