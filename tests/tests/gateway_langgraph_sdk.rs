//! The gateway's Agent Protocol checked with LangGraph's official client, `langgraph-sdk` (pinned,
//! installed by the harness into a cached virtual environment), against a real cluster whose agent
//! asks a person before its tool: threads, a streamed run and its stream rejoined, `runs.wait`
//! stopped at an interrupt and resumed with a `Command`, `runs.join`, `runs.cancel`, a stateless
//! run, history, copy, search and removal (`tests/sdk/langgraph_check.py`).

use serde_json::{json, Value};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{guarded_gateway, KEY, SUBMIT_AND_APPROVE_KEY};
use skein_tests::support::python_sdk;
use skein_tests::support::test_tools::read_effects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_langgraph_client_runs_streams_interrupts_and_resumes_threads() {
    let python = tokio::task::spawn_blocking(|| python_sdk::python_with(&[python_sdk::LANGGRAPH]))
        .await
        .expect("the install ran")
        .unwrap_or_else(|e| panic!("the langgraph client could not be installed: {e}"));
    let cluster = TestCluster::start();
    // A thread's first message is answered; from its second on the agent calls `slow_effect`,
    // which its permission rules ask a person about.
    let script = cluster.scenario(json!([
        { "steps": [ { "answer": "you said {{input}}" } ] },
        { "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "sdk-{{input}}", "ms": 10 } } ] },
            { "answer": "observed: {{observations}}" }
        ] }
    ]));
    let addr = guarded_gateway(&cluster, &script).await;
    let base_url = format!("http://{addr}");
    let seen = tokio::task::spawn_blocking(move || {
        python_sdk::run_script(
            &python,
            "langgraph_check.py",
            &[&base_url, KEY, SUBMIT_AND_APPROVE_KEY],
        )
    })
    .await
    .expect("the script ran")
    .unwrap_or_else(|e| panic!("{e}"));

    assert!(
        seen["assistants"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("assistant"))),
        "{seen}"
    );
    assert_eq!(seen["assistant"], "assistant");
    assert_eq!(
        seen["thread"],
        json!({ "status": "idle", "metadata": { "sdk": "langgraph" } })
    );

    let stream = &seen["stream"];
    let events: Vec<&str> = stream["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(events.first(), Some(&"metadata"), "{seen}");
    assert_eq!(events.last(), Some(&"end"), "{seen}");
    for mode in ["values", "messages", "updates"] {
        assert!(events.contains(&mode), "{mode} in {seen}");
    }
    assert_eq!(stream["text"], "you said hello");
    assert_eq!(stream["last_values"], json!(["hello", "you said hello"]));
    // Rejoined after the second part: the same parts from the third on.
    let ids = stream["ids"].as_array().expect("ids");
    assert_eq!(seen["rejoined"]["ids"].as_array().expect("ids"), &ids[2..]);
    assert_eq!(
        seen["rejoined"]["events"].as_array().expect("events")[..],
        stream["events"].as_array().expect("events")[2..]
    );

    assert_eq!(
        seen["interrupt"],
        json!({ "tool": "slow_effect", "key": "sdk-deploy", "thread_status": "interrupted" })
    );
    assert_eq!(seen["resume_without_approve_role"], "HTTPStatusError 403");
    let resumed = &seen["resumed"];
    assert_eq!(
        resumed["last"], "observed: effect sdk-deploy done",
        "{seen}"
    );
    assert_eq!(resumed["thread_status"], "idle");
    assert_eq!(
        resumed["runs"],
        json!(["success", "interrupted", "success"]),
        "newest first: the resume, the interrupted run, the streamed run"
    );
    let effects = read_effects(&cluster.effects_file());
    assert_eq!(
        effects.get("sdk-deploy").map(|c| c.started),
        Some(1),
        "approved, run once"
    );

    assert_eq!(
        seen["cancelled"],
        json!({ "joined_interrupted": true, "status": "interrupted" })
    );
    assert!(
        !effects.contains_key("sdk-later"),
        "a cancelled waiting call never runs"
    );
    let stateless = &seen["stateless"];
    assert_eq!(stateless["last_values"], json!(["alone", "you said alone"]));
    assert_eq!(
        seen["history"],
        json!([["turn-2", 6], ["turn-1", 2], ["turn-0", 0]]),
        "a state per turn (the second: the call, its result and the answer); the cancelled run left none"
    );
    assert_eq!(seen["copy"], json!({ "new_id": true, "messages": 6 }));
    assert_eq!(
        seen["search"],
        json!([false, true]),
        "newest first: the copy, then the thread"
    );
    assert_eq!(seen["deleted"], "NotFoundError 404");
    assert_eq!(seen["wrong_key"], "AuthenticationError 401");
}
