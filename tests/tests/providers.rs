//! Several providers in one lead (`SKEIN_PROVIDERS`): an agent whose model is
//! `claude:claude-sonnet-4-5` is served by the named Anthropic provider, with that provider's own
//! key (from its file) and extra header; when it refuses, the agent's fallback `backup:gpt-4o`
//! is served by the named OpenAI-compatible provider with its own key. Each server is asked for
//! the model by the name it knows, without the provider's prefix.

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::fake_anthropic::{AnthropicReply, FakeAnthropic};
use skein_tests::support::fake_openai::{FakeOpenAi, FakeReply};
use skein_tests::support::unique;

const ANTHROPIC_KEY: &str = "sk-ant-provider-file-key";
const OPENAI_KEY: &str = "sk-openai-provider-file-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_s_model_and_its_fallback_are_served_by_two_named_providers() {
    let cluster = TestCluster::start();
    let anthropic =
        FakeAnthropic::start(vec![AnthropicReply::refusal(404, "not_found_error", None)]).await;
    let openai =
        FakeOpenAi::start(vec![FakeReply::answer("answered by the backup provider")]).await;

    let dir = cluster.dir.join(unique("providers"));
    std::fs::create_dir_all(dir.join("agents")).expect("dirs");
    std::fs::write(dir.join("anthropic.key"), format!("{ANTHROPIC_KEY}\n")).expect("key file");
    std::fs::write(dir.join("openai.key"), OPENAI_KEY).expect("key file");
    let providers = dir.join("providers.toml");
    std::fs::write(
        &providers,
        format!(
            r#"
[providers.claude]
kind = "anthropic"
base_url = "{anthropic_url}"
api_key_file = "{anthropic_key}"
headers = {{ "anthropic-beta" = "fine-grained-tool-streaming-2025-05-14" }}
max_output_tokens = 1500

[providers.backup]
kind = "openai"
base_url = "{openai_url}"
api_key_file = "{openai_key}"
"#,
            anthropic_url = anthropic.base_url,
            anthropic_key = dir.join("anthropic.key").display(),
            openai_url = openai.base_url,
            openai_key = dir.join("openai.key").display(),
        ),
    )
    .expect("providers file");
    std::fs::write(
        dir.join("agents").join("AGENTS.md"),
        "+++\nfallback_models = [\"backup:gpt-4o\"]\n\
         [model]\nprovider = \"claude\"\nname = \"claude-sonnet-4-5\"\n+++\nYou help.\n",
    )
    .expect("AGENTS.md");
    // The default provider stays the scripted one: neither server is it.
    cluster.spawn_lead(cluster.lead_config(&[
        "--providers",
        providers.to_str().expect("utf-8 path"),
        "--agents-dir",
        dir.join("agents").to_str().expect("utf-8 path"),
    ]));

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "hello"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(
        result.answer.as_deref(),
        Some("answered by the backup provider")
    );

    let asked = anthropic.requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let first = &asked[0];
    assert_eq!(first.body["model"], json!("claude-sonnet-4-5"));
    assert_eq!(first.body["max_tokens"], json!(1500));
    assert_eq!(first.header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(
        first.header("anthropic-beta"),
        Some("fine-grained-tool-streaming-2025-05-14")
    );

    let fallen_back = openai.received();
    assert_eq!(fallen_back.len(), 1, "{fallen_back:?}");
    assert_eq!(fallen_back[0].body["model"], json!("gpt-4o"));
    assert_eq!(
        fallen_back[0].header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    assert!(fallen_back[0].header("anthropic-beta").is_none());
}
