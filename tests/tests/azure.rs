//! Azure OpenAI through the whole cluster, with the fake server in Azure's place: a turn's model
//! calls go to the deployment named by the model, with the configured `api-version`, the key in
//! an `api-key` header and no `Authorization` header; under a budget the answer's bound travels
//! as `max_completion_tokens` (Azure deprecates `max_tokens`). An Azure provider left pointing
//! at OpenAI's API stops a process at start.

use serde_json::json;
use skein_common::protocol::{Budget, TurnStatus};
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::fake_openai::ReceivedRequest;
use skein_tests::support::{stopped_at_start, unique, FakeOpenAi, FakeReply};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// The key the tests give the Azure provider (long enough to be masked).
const AZURE_KEY: &str = "azure-test-key-0123456789";
/// The deployment the agent's model names.
const DEPLOYMENT: &str = "gpt-4o-prod";

/// Lead flags for the fake server as an Azure OpenAI resource, with `extra` flags.
fn azure_flags(model: &FakeOpenAi, extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--model-provider",
        "azure",
        "--model-base-url",
        &model.root_url,
        "--model-api-key",
        AZURE_KEY,
        "--model",
        DEPLOYMENT,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.extend(extra.iter().map(|s| s.to_string()));
    flags
}

fn refs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// Asserts `request` is an Azure call of the deployment with `api_version`, keyed by `api-key`.
fn assert_azure_call(request: &ReceivedRequest, api_version: &str) {
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.path,
        format!("/openai/deployments/{DEPLOYMENT}/chat/completions")
    );
    assert_eq!(request.query_param("api-version"), Some(api_version));
    assert_eq!(request.header("api-key"), Some(AZURE_KEY));
    assert_eq!(
        request.header("authorization"),
        None,
        "the key goes in api-key, not as a bearer token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_calls_the_azure_deployment_with_its_api_version_and_key_header() {
    let cluster = TestCluster::start();
    // A tool call run by the worker, then the answer: two model calls of one turn.
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("list_files", json!({ "path": "." })),
        FakeReply::answer("answered through Azure"),
    ])
    .await;
    let flags = azure_flags(&model, &[]);
    cluster.start_nodes(1, &refs(&flags)).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "what is here?"))
        .await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("answered through Azure"));
    let received = model.received();
    assert_eq!(received.len(), 2, "{received:?}");
    for request in &received {
        // The default api-version: the current generally available one.
        assert_azure_call(request, "2024-10-21");
        // No budget: no bound is sent, the deployment's own default applies.
        assert!(request.body.get("max_completion_tokens").is_none());
        assert!(request.body.get("max_tokens").is_none());
    }
    // The second call carries the tool's result: the turn went through the worker.
    let messages = received[1].body["messages"]
        .as_array()
        .expect("messages")
        .clone();
    assert!(messages.iter().any(|m| m["role"] == "tool"), "{messages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_budget_azure_is_sent_max_completion_tokens_and_the_configured_version() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![FakeReply::answer("bounded")]).await;
    let flags = azure_flags(
        &model,
        &[
            "--model-api-version",
            "2025-04-01-preview",
            "--model-max-output-tokens",
            "300",
        ],
    );
    cluster.start_nodes(0, &refs(&flags)).await;

    let mut task = submission("acme", &unique("s"), "hello");
    task.budget = Some(Budget {
        max_total_tokens: Some(1_000_000),
        max_cost_usd: None,
    });
    let (result, _) = cluster.run(&task).await;

    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let received = model.received();
    assert_eq!(received.len(), 1);
    assert_azure_call(&received[0], "2025-04-01-preview");
    assert_eq!(received[0].body["max_completion_tokens"], json!(300));
    assert!(
        received[0].body.get("max_tokens").is_none(),
        "never both fields: {}",
        received[0].body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_provider_left_on_openais_url_stops_the_process_at_start() {
    let cluster = TestCluster::start();
    for role in ["lead", "worker"] {
        let mut cmd = tokio::process::Command::new(NODE);
        cmd.args(cluster.process_args(role))
            .args(["--model-provider", "azure"])
            .env_remove("SKEIN_MODEL_BASE_URL");
        let stderr = stopped_at_start(cmd, role).await;
        assert!(
            stderr.contains("SKEIN_MODEL_BASE_URL must name the Azure OpenAI resource"),
            "{role}: {stderr}"
        );
    }
}
