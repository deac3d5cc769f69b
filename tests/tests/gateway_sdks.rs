//! The gateway checked with the official client libraries, pinned and installed by the harness
//! into a cached virtual environment (`support::python_sdk`), against a real cluster: OpenAI's
//! `openai` (Responses and Chat Completions) and A2A's `a2a-sdk` (the agent card, messages,
//! streams and tasks). Each runs a script of `tests/sdk/` that prints what it saw.

use serde_json::{json, Value};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{cluster_with_gateway, KEY};
use skein_tests::support::python_sdk;

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
}
