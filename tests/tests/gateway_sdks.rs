//! The gateway checked with the official client libraries, pinned and installed by the harness
//! into a cached virtual environment (`support::python_sdk`), against a real cluster: OpenAI's
//! `openai` (Responses and Chat Completions) and A2A's `a2a-sdk` (the agent card, messages,
//! streams and tasks, in A2A 1.0 and 0.3; a task waiting for approval, answered). Each runs a
//! script of `tests/sdk/` that prints what it saw.

use std::net::SocketAddr;

use serde_json::{json, Value};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{
    cluster_with_gateway, guarded_gateway, KEY, SUBMIT_AND_APPROVE_KEY,
};
use skein_tests::support::python_sdk;
use skein_tests::support::test_tools::read_effects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_library_speaks_responses_and_chat_to_the_gateway() {
    let python = tokio::task::spawn_blocking(|| python_sdk::python_with(&[python_sdk::OPENAI]))
        .await
        .expect("the install ran")
        .unwrap_or_else(|e| panic!("the openai library could not be installed: {e}"));
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &[]).await;
    let base_url = format!("http://{addr}/v1");
    let seen = tokio::task::spawn_blocking(move || {
        python_sdk::run_script(&python, "openai_check.py", &[&base_url, KEY, "assistant"])
    })
    .await
    .expect("the script ran")
    .unwrap_or_else(|e| panic!("{e}"));

    let plain = &seen["plain"];
    assert_eq!(plain["status"], "completed", "{seen}");
    assert!(
        plain["output_text"]
            .as_str()
            .is_some_and(|t| t.starts_with("you said hello")),
        "{seen}"
    );
    assert_eq!(plain["metadata"], json!({ "case": "plain" }));
    assert_eq!(plain["item_types"], json!(["message"]));
    assert!(plain["total_tokens"].is_u64(), "{seen}");
    // previous_response_id continued the first response's session.
    let continued = &seen["continued"];
    assert_eq!(continued["status"], "completed");
    assert_eq!(continued["output_text"], "you said and again after hello");

    let streamed = &seen["streamed"];
    let types: Vec<&str> = streamed["types"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        types.first().zip(types.get(1)),
        Some((&"response.created", &"response.in_progress")),
        "{seen}"
    );
    assert_eq!(types.last(), Some(&"response.completed"), "{seen}");
    for kind in [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert!(types.contains(&kind), "{kind} missing: {seen}");
    }
    let numbers: Vec<u64> = streamed["sequence_numbers"]
        .as_array()
        .expect("numbers")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(numbers, (0..types.len() as u64).collect::<Vec<_>>());
    assert_eq!(streamed["final_status"], "completed");
    assert_eq!(streamed["deltas"], streamed["final_text"], "{seen}");
    assert!(
        streamed["final_text"]
            .as_str()
            .is_some_and(|t| t.contains("streamed")),
        "{seen}"
    );
    // Read again after its third event: the same events from the fourth on.
    assert_eq!(seen["resumed"]["first_sequence_number"], 3, "{seen}");
    assert_eq!(seen["resumed"]["same_as_live"], true, "{seen}");

    let background = &seen["background"];
    let statuses = background["statuses"].as_array().expect("statuses");
    assert_eq!(statuses.first(), Some(&json!("queued")), "{seen}");
    assert_eq!(statuses.last(), Some(&json!("completed")), "{seen}");
    assert_eq!(background["background"], true);
    assert!(
        background["output_text"]
            .as_str()
            .is_some_and(|t| t.starts_with("you said later")),
        "{seen}"
    );

    assert_eq!(seen["missing"], 404, "{seen}");
    assert_eq!(seen["unknown_model"], "model_not_found", "{seen}");
    assert_eq!(seen["wrong_key"], 401, "{seen}");

    let chat = &seen["chat"];
    assert!(
        chat["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("you said chat")),
        "{seen}"
    );
    assert_eq!(chat["finish_reason"], "stop");
    assert!(chat["usage"].is_u64(), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_a2a_library_sends_messages_streams_and_reads_tasks() {
    let python = tokio::task::spawn_blocking(|| python_sdk::python_with(&[python_sdk::A2A]))
        .await
        .expect("the install ran")
        .unwrap_or_else(|e| panic!("the a2a library could not be installed: {e}"));
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &[]).await;
    let base_url = format!("http://{addr}");
    let seen = tokio::task::spawn_blocking(move || {
        python_sdk::run_script(&python, "a2a_check.py", &[&base_url, KEY])
    })
    .await
    .expect("the script ran")
    .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(seen["card"]["name"], "Skein", "{seen}");
    assert!(
        seen["card"]["skills"]
            .as_array()
            .is_some_and(|s| s.contains(&json!("assistant"))),
        "{seen}"
    );
    assert_eq!(seen["card"]["streaming"], true);
    let sent = &seen["sent"];
    assert_eq!(sent["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert!(
        sent["answer"]
            .as_str()
            .is_some_and(|a| a.starts_with("you said hello")),
        "{seen}"
    );
    // The same contextId is the same session: the agent saw the earlier message.
    assert_eq!(seen["same_context"]["context_id"], sent["context_id"]);
    assert_eq!(
        seen["same_context"]["answer"], "you said and again after hello",
        "{seen}"
    );
    assert_eq!(seen["get_task"]["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(seen["get_task"]["answer"], sent["answer"]);
    assert_ne!(seen["missing"], "no error", "{seen}");
    let streamed = &seen["streamed"];
    let kinds: Vec<&str> = streamed["kinds"]
        .as_array()
        .expect("kinds")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(kinds.first(), Some(&"task"), "{seen}");
    assert!(kinds.contains(&"artifact_update"), "{seen}");
    assert_eq!(kinds.last(), Some(&"status_update"), "{seen}");
    assert_eq!(streamed["last_state"], "TASK_STATE_COMPLETED", "{seen}");
    assert!(
        streamed["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("you said streamed")),
        "{seen}"
    );
    assert!(
        seen["wrong_key"]
            .as_str()
            .is_some_and(|e| e.contains("401")),
        "{seen}"
    );

    // A finished task subscribed to again replays to its end: the task, its text, its state.
    let resubscribed = &seen["resubscribed"];
    assert_eq!(resubscribed["kinds"][0], "task", "{seen}");
    assert_eq!(resubscribed["last_state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(resubscribed["text"], sent["answer"], "{seen}");
    assert_eq!(seen["unknown_method"], -32601, "{seen}");

    // A2A 0.3: the card names it too; its methods answer in its shapes.
    assert_eq!(seen["card"]["versions"], json!(["1.0", "0.3"]), "{seen}");
    let v03 = &seen["v03_send"];
    assert_eq!(v03["error"], Value::Null, "{seen}");
    assert_eq!(v03["kind"], "task", "{seen}");
    assert_eq!(v03["wrapped_as_1_0"], false, "{seen}");
    assert_eq!(v03["state"], "completed", "{seen}");
    assert_eq!(v03["message_role"], "agent", "{seen}");
    assert_eq!(v03["message_kind"], "message", "{seen}");
    assert_eq!(v03["part"]["kind"], "text", "{seen}");
    assert!(
        v03["part"]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("you said old style")),
        "{seen}"
    );
    assert_eq!(
        seen["v03_get"],
        json!({ "kind": "task", "state": "completed" }),
        "{seen}"
    );
    let replayed = &seen["v03_resubscribe"];
    assert_eq!(replayed["kinds"][0], "task", "{seen}");
    assert_eq!(
        replayed["kinds"].as_array().and_then(|k| k.last()),
        Some(&json!("status-update")),
        "{seen}"
    );
    assert!(
        replayed["kinds"]
            .as_array()
            .is_some_and(|k| k.contains(&json!("artifact-update"))),
        "{seen}"
    );
    assert_eq!(replayed["finals"], json!([true]), "{seen}");
    assert_eq!(replayed["last_state"], "completed", "{seen}");
    assert_eq!(replayed["text"], v03["part"]["text"], "{seen}");
    assert_eq!(seen["v03_missing"], -32001, "{seen}");
    // The library's own 0.3 transport reads what the gateway says in 0.3.
    let library = &seen["v03_library"];
    assert_eq!(library["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(library["get_state"], "TASK_STATE_COMPLETED", "{seen}");
    assert!(
        library["answer"]
            .as_str()
            .is_some_and(|a| a.starts_with("you said through 0.3")),
        "{seen}"
    );
    for (name, text) in [
        ("streamed", "you said streamed 0.3"),
        ("resubscribed", "you said through 0.3"),
    ] {
        let read = &library[name];
        assert_eq!(read["kinds"][0], "task", "{name}: {seen}");
        assert_eq!(read["last_state"], "TASK_STATE_COMPLETED", "{name}: {seen}");
        assert!(
            read["text"].as_str().is_some_and(|t| t.starts_with(text)),
            "{name}: {seen}"
        );
    }
}

/// The gateway of a cluster whose agent asks before each `slow_effect` (keyed by the message).
async fn guarded(cluster: &TestCluster) -> SocketAddr {
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": 10 } } ] },
        { "answer": "observed: {{observations}}" }
    ] }]));
    guarded_gateway(cluster, &script).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_a2a_library_answers_a_task_that_waits_for_approval() {
    let python = tokio::task::spawn_blocking(|| python_sdk::python_with(&[python_sdk::A2A]))
        .await
        .expect("the install ran")
        .unwrap_or_else(|e| panic!("the a2a library could not be installed: {e}"));
    let cluster = TestCluster::start();
    let addr = guarded(&cluster).await;
    let base_url = format!("http://{addr}");
    let seen = tokio::task::spawn_blocking(move || {
        python_sdk::run_script(
            &python,
            "a2a_approval_check.py",
            &[&base_url, SUBMIT_AND_APPROVE_KEY, KEY],
        )
    })
    .await
    .expect("the script ran")
    .unwrap_or_else(|e| panic!("{e}"));

    // The message's task stops where its call waits, naming the call and how to answer.
    let asked = &seen["asked"];
    assert_eq!(asked["state"], "TASK_STATE_INPUT_REQUIRED", "{seen}");
    assert_eq!(asked["approval_tools"], json!(["slow_effect"]), "{seen}");
    let text = asked["message"].as_str().unwrap_or_default();
    for needle in [
        "slow_effect",
        "\"key\":\"deploy-a\"",
        "ask rule slow_effect",
        "\"approve\" or \"deny\"",
    ] {
        assert!(text.contains(needle), "{needle} missing: {seen}");
    }
    assert_eq!(
        seen["get_waiting"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{seen}"
    );
    assert_eq!(seen["get_waiting"]["message"], asked["message"], "{seen}");
    // A key without the approve role is refused, and the task still waits.
    let not_approver = seen["not_approver"].as_str().unwrap_or_default();
    assert!(
        not_approver.contains("may not answer calls waiting for approval"),
        "{seen}"
    );
    assert_eq!(seen["still_waiting"], "TASK_STATE_INPUT_REQUIRED", "{seen}");
    assert!(
        seen["not_an_answer"].as_str().is_some_and(
            |e| e.starts_with("InvalidParamsError") && e.contains("\"approve\" or \"deny\"")
        ),
        "{seen}"
    );
    // The answer resumed the same task, which ran the call and answered with its observation.
    let approved = &seen["approved"];
    assert_eq!(approved["id"], asked["id"], "{seen}");
    assert_eq!(approved["context_id"], asked["context_id"], "{seen}");
    assert_eq!(approved["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(
        approved["answer"], "observed: effect deploy-a done",
        "{seen}"
    );
    assert!(
        seen["after_end"].as_str().is_some_and(
            |e| e.starts_with("UnsupportedOperationError") && e.contains("waits for no input")
        ),
        "{seen}"
    );
    assert!(
        seen["unknown_task"]
            .as_str()
            .is_some_and(|e| e.starts_with("TaskNotFoundError")),
        "{seen}"
    );
    // Denied with a reason: the model heard who refused and why.
    let denied = &seen["denied"];
    assert_eq!(denied["state"], "TASK_STATE_COMPLETED", "{seen}");
    assert!(
        denied["answer"].as_str().is_some_and(
            |a| a.starts_with("observed: ") && a.contains("denied by dave: not on a Friday")
        ),
        "{seen}"
    );

    // Streamed: the stream ends at the wait; the answer streams the same task to its end.
    let ask = &seen["streamed_ask"];
    assert_eq!(ask["kinds"][0], "task", "{seen}");
    assert_eq!(ask["last_state"], "TASK_STATE_INPUT_REQUIRED", "{seen}");
    assert!(
        ask["last_message"]
            .as_str()
            .is_some_and(|m| m.contains("\"key\":\"deploy-b\"")),
        "{seen}"
    );
    let answered = &seen["streamed_answer"];
    assert_eq!(answered["task_ids"], ask["task_ids"], "{seen}");
    assert_eq!(answered["kinds"][0], "task", "{seen}");
    assert!(
        answered["kinds"]
            .as_array()
            .is_some_and(|k| k.contains(&json!("artifact_update"))),
        "{seen}"
    );
    assert_eq!(answered["last_state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(answered["text"], "observed: effect deploy-b done", "{seen}");

    // A2A 0.3: the same, in its words.
    let v03 = &seen["v03_asked"];
    assert_eq!(v03["kind"], "task", "{seen}");
    assert_eq!(v03["state"], "input-required", "{seen}");
    assert_eq!(v03["message_part"]["kind"], "text", "{seen}");
    assert!(
        v03["message_part"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("\"key\":\"deploy-d\"")),
        "{seen}"
    );
    assert_eq!(seen["v03_get"]["state"], "input-required", "{seen}");
    let v03_approved = &seen["v03_approved"];
    assert_eq!(v03_approved["kind"], "task", "{seen}");
    assert_eq!(v03_approved["state"], "completed", "{seen}");
    assert_eq!(
        v03_approved["answer"], "observed: effect deploy-d done",
        "{seen}"
    );

    // The approved task read again: its events to its end.
    let resubscribed = &seen["resubscribed"];
    assert_eq!(resubscribed["kinds"][0], "task", "{seen}");
    assert_eq!(resubscribed["last_state"], "TASK_STATE_COMPLETED", "{seen}");
    assert_eq!(
        resubscribed["text"], "observed: effect deploy-a done",
        "{seen}"
    );

    // Each approved call ran once; the denied one never.
    let effects = read_effects(&cluster.effects_file());
    let started = |key: &str| effects.get(key).map_or(0, |c| c.started);
    assert_eq!(
        (
            started("deploy-a"),
            started("deploy-b"),
            started("deploy-c"),
            started("deploy-d")
        ),
        (1, 1, 0, 1),
        "{effects:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_library_answers_a_response_that_waits_for_approval() {
    let python = tokio::task::spawn_blocking(|| python_sdk::python_with(&[python_sdk::OPENAI]))
        .await
        .expect("the install ran")
        .unwrap_or_else(|e| panic!("the openai library could not be installed: {e}"));
    let cluster = TestCluster::start();
    let addr = guarded(&cluster).await;
    let base_url = format!("http://{addr}/v1");
    let seen = tokio::task::spawn_blocking(move || {
        python_sdk::run_script(
            &python,
            "openai_approval_check.py",
            &[&base_url, KEY, SUBMIT_AND_APPROVE_KEY],
        )
    })
    .await
    .expect("the script ran")
    .unwrap_or_else(|e| panic!("{e}"));

    assert_eq!(
        seen["asked"],
        json!({
            "status": "completed",
            "types": ["mcp_approval_request"],
            "name": "slow_effect",
            "arguments": { "key": "deploy-x", "ms": 10 },
            "server_label": "skein",
        }),
        "{seen}"
    );
    assert_eq!(
        seen["retrieved"],
        json!({ "status": "completed", "types": ["mcp_approval_request"] })
    );
    assert_eq!(seen["without_approve_role"], "PermissionDeniedError 403");
    assert_eq!(
        seen["approved"],
        json!({ "status": "completed", "text": "observed: effect deploy-x done", "previous": true })
    );
    let refused = &seen["refused"];
    assert_eq!(refused["first"], "response.created");
    assert_eq!(refused["last"], "response.completed");
    assert!(
        refused["text"]
            .as_str()
            .is_some_and(|t| t.contains("not today")),
        "the model saw the reason: {seen}"
    );
    let effects = read_effects(&cluster.effects_file());
    assert_eq!(
        effects.get("deploy-x").map(|c| c.started),
        Some(1),
        "approved, run once"
    );
    assert!(!effects.contains_key("deploy-y"), "refused, never run");
}
