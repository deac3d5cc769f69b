//! The request body: system blocks, tools, alternating turns, cache breakpoints, the answer
//! bound and thinking, images.

use super::*;

#[test]
fn the_request_maps_system_tools_and_alternating_turns_with_cache_breakpoints() {
    let steer = Message::user("also check b.txt");
    let req = request(
        vec![
            Message::system("You are terse."),
            Message::system("Workspace: /w"),
            Message::user("read a.txt"),
            Message::user(""),
            assistant_calling(&[
                ("toolu_a", "read_file", json!({"path": "a.txt"})),
                ("toolu_b", "read_file", json!("{broken")),
            ]),
            Message::tool_result("toolu_a", "alpha"),
            Message::tool_result("toolu_b", ""),
            steer,
            Message::assistant("a.txt says alpha"),
            Message::system("Answer now."),
        ],
        vec![tool("read_file"), tool("list_dir")],
    );
    let body = client("http://localhost").request_body(&req);
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 4096,
            "stream": true,
            "system": [
                {"type": "text", "text": "You are terse."},
                {"type": "text", "text": "Workspace: /w"},
                {"type": "text", "text": "Answer now.", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [
                {"name": "read_file", "description": "The read_file tool.",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
                {"name": "list_dir", "description": "The list_dir tool.",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                 "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "read a.txt"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_a", "name": "read_file",
                     "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {}},
                ]},
                // Both results, then the steering text, in one user message.
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "alpha"},
                    {"type": "tool_result", "tool_use_id": "toolu_b"},
                    {"type": "text", "text": "also check b.txt"},
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "a.txt says alpha",
                    "cache_control": {"type": "ephemeral"}}]},
            ],
        })
    );
}

#[test]
fn results_come_before_text_in_a_merged_user_message_and_max_tokens_follows_the_request() {
    let mut req = request(
        vec![
            Message::user("first"),
            assistant_calling(&[("toolu_x", "list_dir", json!({}))]),
            Message::user("typed while the call ran"),
            Message::tool_result("toolu_x", "[]"),
        ],
        Vec::new(),
    );
    req.max_output_tokens = Some(256);
    let body = conversation(client("http://localhost").request_body(&req));
    assert_eq!(body["max_tokens"], json!(256));
    assert!(body.get("tools").is_none());
    assert!(body.get("system").is_none());
    assert!(body.get("thinking").is_none());
    assert_eq!(
        body["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "[]"},
            {"type": "text", "text": "typed while the call ran"},
        ])
    );
    let roles: Vec<_> = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(roles, vec!["user", "assistant", "user"]);
}

#[test]
fn a_thinking_budget_is_asked_for_within_the_calls_output_tokens() {
    let thinking = client("http://localhost")
        .with_thinking_budget(2048)
        .expect("a budget under 4096");
    let mut req = request(vec![Message::user("hi")], Vec::new());
    assert_eq!(
        thinking.request_body(&req)["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    req.max_output_tokens = Some(1500);
    assert_eq!(
        thinking.request_body(&req)["thinking"],
        json!({"type": "enabled", "budget_tokens": 1499})
    );
    req.max_output_tokens = Some(1000);
    assert!(thinking.request_body(&req).get("thinking").is_none());

    for refused in [512, 4096, 10_000] {
        assert!(matches!(
            client("http://localhost").with_thinking_budget(refused),
            Err(ModelError::Misconfigured(_))
        ));
    }
}

#[test]
fn a_users_images_become_image_blocks_after_its_text() {
    use crate::protocol::ImagePart;
    let images = vec![
        ImagePart::Base64 {
            media_type: "image/png".to_owned(),
            data: "aGVsbG8=".to_owned(),
        },
        ImagePart::Url {
            url: "https://example.com/cat.jpg".to_owned(),
        },
    ];
    let body = conversation(client("http://127.0.0.1:9").request_body(&request(
        vec![Message::user("what is this?").with_images(images)],
        Vec::new(),
    )));
    assert_eq!(
        body["messages"],
        json!([{ "role": "user", "content": [
            { "type": "text", "text": "what is this?" },
            { "type": "image", "source":
                { "type": "base64", "media_type": "image/png", "data": "aGVsbG8=" } },
            { "type": "image", "source": { "type": "url", "url": "https://example.com/cat.jpg" } }
        ] }])
    );
}

#[test]
fn a_tool_results_images_go_inside_its_tool_result_block() {
    use crate::protocol::ImagePart;
    let shot = ImagePart::Base64 {
        media_type: "image/jpeg".to_owned(),
        data: "/9j/".to_owned(),
    };
    let body = conversation(client("http://127.0.0.1:9").request_body(&request(
        vec![
            Message::user("screenshot both"),
            assistant_calling(&[("c1", "shot", json!({})), ("c2", "shot", json!({}))]),
            Message::tool_result("c1", "[image 1: image/jpeg, 3 bytes]").with_images(vec![shot]),
            Message::tool_result("c2", "no screen"),
        ],
        vec![tool("shot")],
    )));
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(
        messages[2]["content"],
        json!([
            { "type": "tool_result", "tool_use_id": "c1", "content": [
                { "type": "text", "text": "[image 1: image/jpeg, 3 bytes]" },
                { "type": "image", "source":
                    { "type": "base64", "media_type": "image/jpeg", "data": "/9j/" } }
            ] },
            { "type": "tool_result", "tool_use_id": "c2", "content": "no screen" }
        ])
    );
}

#[tokio::test]
async fn a_client_configured_without_images_fails_a_request_with_images_before_sending() {
    use crate::protocol::ImagePart;
    // No server listens: a request that went out would fail as unreachable instead.
    let client = client("http://127.0.0.1:9").with_images(false);
    let shown = request(
        vec![Message::user("look").with_images(vec![ImagePart::Url {
            url: "https://example.com/a.png".to_owned(),
        }])],
        Vec::new(),
    );
    let error = client.complete(shown).await.expect_err("refused");
    assert!(matches!(error, ModelError::ImagesRefused(_)), "{error:?}");
    let failure = error.to_failure();
    assert_eq!(failure.kind, FailureKind::InvalidInput);
    assert!(
        failure
            .message
            .contains("model claude-test of provider anthropic"),
        "{}",
        failure.message
    );
}
