//! The gateway's Agent Protocol (LangGraph Platform's API) against a real cluster: threads made,
//! read, searched, changed, copied and removed within their tenant; runs waited for, streamed in
//! every mode and read again after a `Last-Event-ID`, joined and listed; a call waiting for a
//! person as an interrupt resumed (approved or refused) by a caller who may approve, and a waiting
//! run cancelled; bad requests refused with `{"detail"}` and their status. Runs meeting other runs
//! and other tenants are in `agent_protocol_runs.rs`.

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_tests::support::agent_protocol::{contents, run_of, said, started, Api};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{
    cluster_with_gateway, guarded_gateway, KEY, OTHER_TENANT_KEY, SUBMIT_AND_APPROVE_KEY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_and_runs_are_sessions_and_tasks_streamed_read_again_and_fenced_by_tenant() {
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &[]).await;
    let api = Api::new(addr);

    let assistants = api
        .ok("POST", "/assistants/search", KEY, Some(json!({})))
        .await;
    assert!(
        assistants
            .as_array()
            .expect("a list")
            .iter()
            .any(|a| a["assistant_id"] == "assistant"),
        "{assistants}"
    );
    assert_eq!(
        api.ok("GET", "/assistants/assistant", KEY, None).await["graph_id"],
        "assistant"
    );

    let made = api
        .ok(
            "POST",
            "/threads",
            KEY,
            Some(json!({ "metadata": { "team": "red" } })),
        )
        .await;
    let thread = made["thread_id"].as_str().expect("an id").to_owned();
    assert_eq!(made["status"], "idle");
    assert_eq!(made["values"]["messages"], json!([]));
    let (again, _) = api
        .call(
            "POST",
            "/threads",
            KEY,
            Some(json!({ "thread_id": thread })),
        )
        .await;
    assert_eq!(again, StatusCode::CONFLICT, "a thread is made once");
    let kept = api
        .ok(
            "POST",
            "/threads",
            KEY,
            Some(json!({ "thread_id": thread, "if_exists": "do_nothing" })),
        )
        .await;
    assert_eq!(kept["created_at"], made["created_at"]);
    let (other, body) = api
        .call("GET", &format!("/threads/{thread}"), OTHER_TENANT_KEY, None)
        .await;
    assert_eq!(
        other,
        StatusCode::NOT_FOUND,
        "another tenant's thread is not found"
    );
    assert!(
        body["detail"].as_str().is_some_and(|d| d.contains(&thread)),
        "{body}"
    );
    let (no_key, _) = api
        .call("GET", &format!("/threads/{thread}"), "", None)
        .await;
    assert_eq!(no_key, StatusCode::UNAUTHORIZED);

    // Waited for: the thread's values at the run's end.
    let waited = api
        .send(
            "POST",
            &format!("/threads/{thread}/runs/wait"),
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("hello") })),
            &[],
        )
        .await;
    let first_run = run_of(waited.headers());
    let values: Value = waited.json().await.expect("values");
    assert_eq!(
        contents(&values),
        ["human:hello", "ai:you said hello after "]
    );

    // Streamed in every mode: metadata first, end last, numbered parts.
    let path = format!("/threads/{thread}/runs/stream");
    let modes = json!(["values", "updates", "messages-tuple", "custom"]);
    let (headers, parts) = api.stream(&path, KEY, Some(json!({ "assistant_id": "assistant", "input": said("again"), "stream_mode": modes })), &[]).await;
    let run = run_of(&headers);
    assert_eq!(parts[0].event, "metadata");
    assert_eq!(parts[0].data["run_id"], run.as_str());
    assert_eq!(parts.last().map(|p| p.event.as_str()), Some("end"));
    let ids: Vec<u64> = parts.iter().map(|p| p.id.expect("numbered")).collect();
    assert_eq!(ids, (1..=parts.len() as u64).collect::<Vec<_>>());
    let text: String = parts
        .iter()
        .filter(|p| p.event == "messages")
        .map(|p| p.data[0]["content"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(text, "you said again after hello");
    let last_values = parts
        .iter()
        .rev()
        .find(|p| p.event == "values")
        .expect("values");
    assert_eq!(
        contents(&last_values.data),
        [
            "human:hello",
            "ai:you said hello after ",
            "human:again",
            "ai:you said again after hello"
        ]
    );
    assert!(parts.iter().any(|p| p.event == "updates"
        && p.data["agent"]["messages"][0]["content"] == "you said again after hello"));
    assert!(
        parts
            .iter()
            .any(|p| p.event == "custom" && p.data["event"]["type"] == "turn_started"),
        "Skein's own events"
    );

    // Read again after the second part: the same parts from the third on.
    let rejoin = format!("/threads/{thread}/runs/{run}/stream?stream_mode=values&stream_mode=updates&stream_mode=messages-tuple&stream_mode=custom");
    let (_, resumed) = api
        .stream(&rejoin, KEY, None, &[("Last-Event-ID", "2")])
        .await;
    let tail: Vec<(String, Option<u64>)> =
        parts[2..].iter().map(|p| (p.event.clone(), p.id)).collect();
    let read_again: Vec<(String, Option<u64>)> =
        resumed.iter().map(|p| (p.event.clone(), p.id)).collect();
    assert_eq!(read_again, tail);
    // A client reconnecting to the stream's `Location` names no modes: the run's own are used.
    let location = headers
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("Location names the stream")
        .to_owned();
    let (_, reconnected) = api
        .stream(&location, KEY, None, &[("Last-Event-ID", "2")])
        .await;
    let reconnected: Vec<(String, Option<u64>)> = reconnected
        .iter()
        .map(|p| (p.event.clone(), p.id))
        .collect();
    assert_eq!(reconnected, tail);

    let runs = api
        .ok("GET", &format!("/threads/{thread}/runs"), KEY, None)
        .await;
    let listed: Vec<(&str, &str)> = runs
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().expect("present"),
                r["status"].as_str().expect("present"),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [(run.as_str(), "success"), (first_run.as_str(), "success")]
    );
    let joined = api
        .ok(
            "GET",
            &format!("/threads/{thread}/runs/{first_run}/join"),
            KEY,
            None,
        )
        .await;
    assert_eq!(
        contents(&joined),
        ["human:hello", "ai:you said hello after "],
        "a run's own values"
    );
    let (missing, _) = api
        .call("GET", &format!("/threads/{thread}/runs/nothing"), KEY, None)
        .await;
    assert_eq!(missing, StatusCode::NOT_FOUND);

    let state = api
        .ok("GET", &format!("/threads/{thread}/state"), KEY, None)
        .await;
    assert_eq!(contents(&state["values"]).len(), 4);
    assert_eq!(state["checkpoint"]["checkpoint_id"], "turn-2");
    assert_eq!(state["parent_checkpoint"]["checkpoint_id"], "turn-1");
    let history = api
        .ok(
            "POST",
            &format!("/threads/{thread}/history"),
            KEY,
            Some(json!({})),
        )
        .await;
    let sizes: Vec<(String, usize)> = history
        .as_array()
        .expect("states")
        .iter()
        .map(|s| {
            (
                s["checkpoint"]["checkpoint_id"]
                    .as_str()
                    .expect("present")
                    .to_owned(),
                contents(&s["values"]).len(),
            )
        })
        .collect();
    assert_eq!(
        sizes,
        [
            ("turn-2".to_owned(), 4),
            ("turn-1".to_owned(), 2),
            ("turn-0".to_owned(), 0)
        ]
    );

    let patched = api
        .ok(
            "PATCH",
            &format!("/threads/{thread}"),
            KEY,
            Some(json!({ "metadata": { "stage": "b" } })),
        )
        .await;
    assert_eq!(patched["metadata"], json!({ "team": "red", "stage": "b" }));
    let found = api
        .ok(
            "POST",
            "/threads/search",
            KEY,
            Some(json!({ "metadata": { "team": "red" } })),
        )
        .await;
    assert!(found
        .as_array()
        .expect("present")
        .iter()
        .any(|t| t["thread_id"] == thread.as_str()));
    let none = api
        .ok(
            "POST",
            "/threads/search",
            KEY,
            Some(json!({ "metadata": { "team": "blue" } })),
        )
        .await;
    assert!(!none
        .as_array()
        .expect("present")
        .iter()
        .any(|t| t["thread_id"] == thread.as_str()));
    let theirs = api
        .ok("POST", "/threads/search", OTHER_TENANT_KEY, Some(json!({})))
        .await;
    assert!(
        !theirs
            .as_array()
            .expect("present")
            .iter()
            .any(|t| t["thread_id"] == thread.as_str()),
        "fenced by tenant"
    );

    let copy = api
        .ok("POST", &format!("/threads/{thread}/copy"), KEY, None)
        .await;
    assert_ne!(copy["thread_id"], thread.as_str());
    assert_eq!(
        contents(&copy["values"]).len(),
        4,
        "the copy has the thread's messages"
    );
    assert_eq!(copy["metadata"]["team"], "red");

    // A stateless run's thread goes once it ends.
    let solo = api
        .send(
            "POST",
            "/runs/wait",
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("solo") })),
            &[],
        )
        .await;
    let location = solo
        .headers()
        .get("content-location")
        .and_then(|v| v.to_str().ok())
        .expect("located")
        .to_owned();
    let values: Value = solo.json().await.expect("values");
    assert_eq!(contents(&values), ["human:solo", "ai:you said solo after "]);
    let solo_thread = location.split('/').nth(2).expect("a thread").to_owned();
    let (gone, _) = api
        .call("GET", &format!("/threads/{solo_thread}"), KEY, None)
        .await;
    assert_eq!(gone, StatusCode::NOT_FOUND);

    // A removed thread takes its workspace's files with it.
    let files = skein_common::workspace::ObjectWorkspaces::new(
        cluster.client().await.bus(),
        &skein_common::workspace::WorkspaceStoreConfig::default(),
        0,
    );
    let workspace = skein_common::workspace::SessionRef::new("acme", &thread).expect("a session");
    files
        .write(
            &workspace,
            &skein_common::workspace::WorkspacePath::parse("notes.txt").expect("a path"),
            "kept with the thread".into(),
            skein_common::workspace::objects::Expect::Any,
        )
        .await
        .expect("a file of the thread");
    let (removed, _) = api
        .call("DELETE", &format!("/threads/{thread}"), KEY, None)
        .await;
    assert_eq!(removed, StatusCode::NO_CONTENT);
    let (gone, _) = api
        .call("GET", &format!("/threads/{thread}"), KEY, None)
        .await;
    assert_eq!(gone, StatusCode::NOT_FOUND);
    assert_eq!(
        files.list(&workspace).await.expect("listed").len(),
        0,
        "the thread's files went with it"
    );
    let audited = cluster
        .client()
        .await
        .bus()
        .audit_records(&Default::default(), 100)
        .await
        .expect("audit readable");
    assert!(
        audited.iter().any(|r| r.action == "session_remove"
            && r.target == thread
            && r.principal == "alice"
            && r.tenant == "acme"),
        "the removal is in the audit trail: {audited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_run_and_thread_requests_get_clear_errors() {
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &["--gateway-max-body", "4096"]).await;
    let api = Api::new(addr);
    let thread = api.thread(KEY).await;
    let runs = format!("/threads/{thread}/runs");
    for (body, status, says) in [
        (
            json!({ "assistant_id": "nobody", "input": said("x") }),
            StatusCode::NOT_FOUND,
            "nobody",
        ),
        (
            json!({ "assistant_id": "assistant" }),
            StatusCode::BAD_REQUEST,
            "input",
        ),
        (
            json!({ "assistant_id": "assistant", "input": said("x"), "stream_mode": "debug" }),
            StatusCode::BAD_REQUEST,
            "debug",
        ),
        (
            json!({ "assistant_id": "assistant", "input": said("x"), "interrupt_before": ["tools"] }),
            StatusCode::BAD_REQUEST,
            "interrupt_before",
        ),
        (
            json!({ "assistant_id": "assistant", "input": said("x"), "command": { "resume": true } }),
            StatusCode::BAD_REQUEST,
            "not both",
        ),
        (
            json!({ "assistant_id": "assistant", "command": { "resume": true } }),
            StatusCode::CONFLICT,
            "no interrupt",
        ),
        (
            json!({ "assistant_id": "assistant", "input": said("x"), "multitask_strategy": "sometimes" }),
            StatusCode::BAD_REQUEST,
            "sometimes",
        ),
        (
            json!({ "assistant_id": "assistant", "input": { "messages": [ { "role": "tool", "content": "x" } ] } }),
            StatusCode::BAD_REQUEST,
            "tool",
        ),
        (
            json!({ "assistant_id": "assistant", "input": said(&"x".repeat(5000)) }),
            StatusCode::PAYLOAD_TOO_LARGE,
            "larger",
        ),
    ] {
        let (got, error) = api.call("POST", &runs, KEY, Some(body.clone())).await;
        assert_eq!(got, status, "{body}: {error}");
        let detail = error["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(says), "{body}: {detail}");
    }
    let (malformed, error) = {
        let response = api
            .http
            .post(format!("{}{runs}", api.base))
            .header("x-api-key", KEY)
            .header("content-type", "application/json")
            .body("{nope")
            .send()
            .await
            .expect("sent");
        (
            response.status(),
            response.json::<Value>().await.expect("json"),
        )
    };
    assert_eq!(malformed, StatusCode::BAD_REQUEST, "{error}");
    let (unknown, _) = api
        .call(
            "POST",
            "/threads/no-such-thread/runs",
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("x") })),
        )
        .await;
    assert_eq!(unknown, StatusCode::NOT_FOUND);
    let made = api.ok("POST", "/threads/made-on-demand/runs/wait", KEY, Some(json!({ "assistant_id": "assistant", "input": said("x"), "if_not_exists": "create" }))).await;
    assert_eq!(
        contents(&made).len(),
        2,
        "if_not_exists: create makes the thread"
    );
    let (bad_search, _) = api
        .call("POST", "/threads/search", KEY, Some(json!({ "limit": -1 })))
        .await;
    assert_eq!(bad_search, StatusCode::BAD_REQUEST);
    let (bad_id, _) = api
        .call(
            "POST",
            "/threads",
            KEY,
            Some(json!({ "thread_id": "no spaces" })),
        )
        .await;
    assert_eq!(bad_id, StatusCode::BAD_REQUEST);
    // Nothing was lost: the thread's runs that were refused left no trace, the one made ran.
    let listed = api.ok("GET", &runs, KEY, None).await;
    assert_eq!(listed, json!([]), "refused runs are not recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_for_a_person_is_an_interrupt_resumed_by_an_approver() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "deploy-{{input}}", "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    let addr = guarded_gateway(&cluster, &script).await;
    let api = Api::new(addr);
    let thread = api.thread(KEY).await;

    let waited = api
        .send(
            "POST",
            &format!("/threads/{thread}/runs/wait"),
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("deploy") })),
            &[],
        )
        .await;
    let first = run_of(waited.headers());
    let values: Value = waited.json().await.expect("values");
    let interrupt = &values["__interrupt__"][0];
    assert_eq!(interrupt["value"]["tool"], "slow_effect", "{values}");
    assert_eq!(interrupt["value"]["arguments"]["key"], "deploy-deploy");
    assert_eq!(
        started(&cluster, "deploy-deploy"),
        0,
        "not run before it is approved"
    );
    let seen = api
        .ok("GET", &format!("/threads/{thread}"), KEY, None)
        .await;
    assert_eq!(seen["status"], "interrupted");
    let waiting: Vec<&Value> = seen["interrupts"]
        .as_object()
        .expect("interrupts")
        .values()
        .collect();
    assert_eq!(waiting.len(), 1, "{seen}");
    assert_eq!(
        api.ok("GET", &format!("/threads/{thread}/runs/{first}"), KEY, None)
            .await["status"],
        "interrupted"
    );
    let state = api
        .ok("GET", &format!("/threads/{thread}/state"), KEY, None)
        .await;
    assert_eq!(state["next"], json!(["agent"]));
    assert_eq!(state["interrupts"][0]["value"]["tool"], "slow_effect");

    // A new input while it waits is refused (multitask_strategy reject), and a caller who may not
    // approve cannot resume it.
    let (busy, error) = api
        .call(
            "POST",
            &format!("/threads/{thread}/runs"),
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("more") })),
        )
        .await;
    assert_eq!(busy, StatusCode::CONFLICT, "{error}");
    let resume = json!({ "assistant_id": "assistant", "command": { "resume": { "approve": true } }, "stream_mode": ["updates", "values"] });
    let (forbidden, _) = api
        .call(
            "POST",
            &format!("/threads/{thread}/runs/wait"),
            KEY,
            Some(resume.clone()),
        )
        .await;
    assert_eq!(forbidden, StatusCode::FORBIDDEN);
    assert_eq!(
        api.ok("GET", &format!("/threads/{thread}"), KEY, None)
            .await["status"],
        "interrupted"
    );

    let (headers, parts) = api
        .stream(
            &format!("/threads/{thread}/runs/stream"),
            SUBMIT_AND_APPROVE_KEY,
            Some(resume),
            &[],
        )
        .await;
    let second = run_of(&headers);
    assert_ne!(second, first);
    assert_eq!(parts.last().map(|p| p.event.as_str()), Some("end"));
    assert!(
        !parts.iter().any(|p| p.data.get("__interrupt__").is_some()),
        "the resumed run does not show the interrupt again"
    );
    let last = parts
        .iter()
        .rev()
        .find(|p| p.event == "values")
        .expect("values");
    let answer = contents(&last.data).last().cloned().unwrap_or_default();
    assert!(answer.starts_with("ai:observed:"), "{answer}");
    assert_eq!(
        started(&cluster, "deploy-deploy"),
        1,
        "the approved call ran once"
    );
    assert_eq!(
        api.ok("GET", &format!("/threads/{thread}/runs/{first}"), KEY, None)
            .await["status"],
        "interrupted"
    );
    assert_eq!(
        api.ok(
            "GET",
            &format!("/threads/{thread}/runs/{second}"),
            KEY,
            None
        )
        .await["status"],
        "success"
    );
    assert_eq!(
        api.ok("GET", &format!("/threads/{thread}"), KEY, None)
            .await["status"],
        "idle"
    );

    // Refused with a reason, as LangChain's human-in-the-loop decisions say it.
    let run = api
        .ok(
            "POST",
            &format!("/threads/{thread}/runs"),
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("again") })),
        )
        .await;
    let run_id = run["run_id"].as_str().expect("a run").to_owned();
    let joined = api
        .ok(
            "GET",
            &format!("/threads/{thread}/runs/{run_id}/join"),
            KEY,
            None,
        )
        .await;
    assert_eq!(
        joined["__interrupt__"][0]["value"]["arguments"]["key"], "deploy-again",
        "{joined}"
    );
    let refused = api.ok("POST", &format!("/threads/{thread}/runs/wait"), SUBMIT_AND_APPROVE_KEY, Some(json!({ "assistant_id": "assistant", "command": { "resume": { "decisions": [ { "type": "reject", "message": "not today" } ] } } }))).await;
    let answer = contents(&refused).last().cloned().unwrap_or_default();
    assert!(
        answer.contains("not today"),
        "the model saw the reason: {answer}"
    );
    assert_eq!(
        started(&cluster, "deploy-again"),
        0,
        "a refused call never runs"
    );

    // A waiting run cancelled.
    let run = api
        .ok(
            "POST",
            &format!("/threads/{thread}/runs"),
            KEY,
            Some(json!({ "assistant_id": "assistant", "input": said("third") })),
        )
        .await;
    let run_id = run["run_id"].as_str().expect("a run").to_owned();
    api.ok(
        "GET",
        &format!("/threads/{thread}/runs/{run_id}/join"),
        KEY,
        None,
    )
    .await;
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
    let final_result = cluster
        .store()
        .await
        .final_result("acme", &thread, &run_id)
        .await
        .expect("read")
        .expect("ended");
    assert_eq!(
        final_result.status,
        skein_common::protocol::TurnStatus::Cancelled
    );
    assert_eq!(started(&cluster, "deploy-third"), 0);
}
