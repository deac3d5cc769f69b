use std::path::PathBuf;

use clap::Parser;

use super::*;

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    model: ModelConfig,
}

fn config(extra: &[&str]) -> ModelConfig {
    let args = ["test"].iter().chain(extra).copied();
    Flags::try_parse_from(args).expect("valid flags").model
}

fn write_file(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("file written");
    path
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skein-providers-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn a_prefixed_model_goes_to_its_named_provider_and_any_other_to_the_default() {
    let dir = temp_dir();
    let file = write_file(
        &dir,
        "providers.toml",
        r#"
        [providers.claude]
        kind = "anthropic"
        [providers.local]
        kind = "openai"
        base_url = "http://127.0.0.1:9/v1"
        "#,
    );
    let providers = Providers::from_config(&config(&[
        "--providers",
        file.to_str().expect("utf-8 path"),
    ]))
    .expect("valid providers");
    assert_eq!(providers.default_label(), "scripted");
    assert_eq!(
        providers.route("claude:claude-sonnet-4-5").1,
        "claude-sonnet-4-5"
    );
    assert_eq!(providers.label_for("claude:claude-sonnet-4-5"), "anthropic");
    assert_eq!(providers.route("local:llama3:8b").1, "llama3:8b");
    assert_eq!(providers.label_for("local:llama3:8b"), "openai");
    // A name whose prefix is no provider's is the default provider's, colons and all.
    assert_eq!(providers.route("llama3:8b").1, "llama3:8b");
    assert_eq!(providers.label_for("llama3:8b"), "scripted");
    assert_eq!(providers.route("gpt-4o").1, "gpt-4o");
    assert_eq!(providers.route("claude:").1, "claude:");
    let labels = providers.labels();
    assert_eq!(labels.get("claude"), Some(&"anthropic"));
    assert_eq!(labels.get("local"), Some(&"openai"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_file_may_be_json_and_may_name_the_default_provider() {
    let file = ProvidersFile::parse(
        r#"{"default": "azure", "providers": {"azure": {"kind": "azure",
            "base_url": "https://acme.openai.azure.com", "limits": {"max_concurrency": 2}}}}"#,
    )
    .expect("valid JSON");
    assert_eq!(file.default.as_deref(), Some("azure"));
    assert_eq!(
        file.limits().get("azure"),
        Some(&TrafficLimits {
            max_concurrency: 2,
            tokens_per_minute: 0
        })
    );
}

#[test]
fn mistakes_in_the_file_are_refused_with_what_is_wrong() {
    let cases = [
        ("[providers.a]\nkind = \"cohere\"\n", "unknown kind"),
        (
            "[providers.a]\nkind = \"openai\"\nbase_ur = \"x\"\n",
            "base_ur",
        ),
        ("[providers.a]\nkind = \"azure\"\n", "base_url"),
        (
            "default = \"b\"\n[providers.a]\nkind = \"openai\"\n",
            "\"b\"",
        ),
        ("[providers.\"a:b\"]\nkind = \"openai\"\n", "provider name"),
        (
            "[providers.a]\nkind = \"openai\"\napi_key_env = \"X\"\napi_key_file = \"/k\"\n",
            "not both",
        ),
        (
            "[providers.a]\nkind = \"openai\"\ntimeout = \"soon\"\n",
            "timeout",
        ),
        (
            "[providers.a]\nkind = \"openai\"\nheaders = { \"bad header\" = \"v\" }\n",
            "header name",
        ),
        (
            "{\"providers\": {\"a\": {\"kind\": 1}}}",
            "expected a string",
        ),
    ];
    for (text, expected) in cases {
        let error = ProvidersFile::parse(text).expect_err(text);
        assert!(error.contains(expected), "{text}: {error}");
    }
}

#[test]
fn a_provider_never_goes_out_without_the_key_it_was_given() {
    let unset = ProvidersFile::parse(
        "[providers.a]\nkind = \"openai\"\napi_key_env = \"SKEIN_TEST_NO_SUCH_VARIABLE_7F3A\"\n",
    )
    .expect("valid file");
    let error = unset.providers["a"]
        .api_key()
        .expect_err("an unset variable");
    assert!(
        error.contains("SKEIN_TEST_NO_SUCH_VARIABLE_7F3A"),
        "{error}"
    );

    let dir = temp_dir();
    let key = write_file(&dir, "key", "sk-from-a-file-0123\n");
    let from_file = ProvidersFile::parse(&format!(
        "[providers.a]\nkind = \"openai\"\napi_key_file = \"{}\"\n",
        key.display()
    ))
    .expect("valid file");
    assert_eq!(
        from_file.providers["a"].api_key().expect("readable"),
        Some("sk-from-a-file-0123".to_owned())
    );
    let providers = write_file(
        &dir,
        "providers.toml",
        &format!(
            "[providers.a]\nkind = \"openai\"\napi_key_file = \"{}\"\n",
            key.display()
        ),
    );
    let cfg = config(&["--providers", providers.to_str().expect("utf-8 path")]);
    assert_eq!(provider_secrets(&cfg), ["sk-from-a-file-0123"]);
    let missing = write_file(
        &dir,
        "missing.toml",
        "[providers.a]\nkind = \"openai\"\napi_key_file = \"/nonexistent/skein/key\"\n",
    );
    let error = config(&["--providers", missing.to_str().expect("utf-8 path")])
        .validate()
        .expect_err("an unreadable key file");
    assert!(error.contains("api_key_file"), "{error}");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_provider_set_to_take_no_images_refuses_them_before_sending_and_the_others_do_not() {
    use crate::protocol::message::Message;
    use crate::protocol::ImagePart;
    let dir = temp_dir();
    // No server listens on either URL: a request that went out fails as unreachable instead.
    let file = write_file(
        &dir,
        "providers.toml",
        r#"
        [providers.text]
        kind = "openai"
        base_url = "http://127.0.0.1:9/v1"
        images = false
        [providers.vision]
        kind = "openai"
        base_url = "http://127.0.0.1:9/v1"
        "#,
    );
    let providers = Providers::from_config(&config(&[
        "--providers",
        file.to_str().expect("utf-8 path"),
    ]))
    .expect("valid providers");
    let request = |model: &str| ModelRequest {
        model: model.to_owned(),
        agent: "a".to_owned(),
        messages: std::sync::Arc::new(vec![Message::user("look").with_images(vec![
            ImagePart::Url {
                url: "https://example.com/a.png".to_owned(),
            },
        ])]),
        tools: Default::default(),
        max_output_tokens: None,
        output_schema: None,
    };
    let refused = providers
        .complete(request("text:m"))
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, ModelError::ImagesRefused(_)),
        "{refused:?}"
    );
    let sent = providers
        .complete(request("vision:m"))
        .await
        .expect_err("nothing listens");
    assert!(matches!(sent, ModelError::Unreachable(_)), "{sent:?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_limits_of_a_default_named_provider_are_those_of_names_without_a_prefix() {
    use crate::agent::middleware::TrafficPolicy;
    let dir = temp_dir();
    let file = write_file(
        &dir,
        "providers.toml",
        "default = \"local\"\n[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         limits = { max_concurrency = 5 }\n[providers.other]\nkind = \"openai\"\n",
    );
    let cfg = config(&[
        "--providers",
        file.to_str().expect("utf-8 path"),
        "--model-max-concurrency",
        "2",
    ]);
    let policy = TrafficPolicy::from_config(&cfg).expect("a valid policy");
    assert_eq!(
        policy.for_call("llama3:8b", "acme").model.max_concurrency,
        5
    );
    assert_eq!(policy.for_call("local:m", "acme").model.max_concurrency, 5);
    assert_eq!(
        policy.for_call("other:m", "acme").model.max_concurrency,
        2,
        "a named provider without limits of its own has the defaults"
    );
    std::fs::remove_dir_all(dir).ok();
}
