//! Images in the chat-completions body: a message's images as `image_url` content parts, and the
//! images of tool results moved where the API takes them.
//!
//! Invariant: a `tool` message carries text only (the API's rule), and no message comes between
//! an assistant's calls and their results; so the images of a run of results follow the run's
//! last result, in one user message whose text names the call each image came from.

use serde_json::{json, Value};

use crate::protocol::message::{Message, Role};
use crate::protocol::ImagePart;

/// The `messages` array, each message mapped by `wire_message`, with the images of tool results
/// in a user message after each run of results.
pub(super) fn wire_messages(
    messages: &[Message],
    wire_message: fn(&Message) -> Value,
) -> Vec<Value> {
    let mut wire = Vec::with_capacity(messages.len());
    let mut tool_images: Vec<Value> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        wire.push(wire_message(message));
        if message.role == Role::Tool && !message.images.is_empty() {
            let call = message.tool_call_id.as_deref().unwrap_or("(unnamed)");
            tool_images.push(json!({
                "type": "text",
                "text": format!(
                    "The result of tool call {call} holds {} image(s):",
                    message.images.len()
                ),
            }));
            tool_images.extend(message.images.iter().map(image_part));
        }
        let run_ends = messages
            .get(i + 1)
            .is_none_or(|next| next.role != Role::Tool);
        if run_ends && !tool_images.is_empty() {
            let content = std::mem::take(&mut tool_images);
            wire.push(json!({ "role": "user", "content": content }));
        }
    }
    wire
}

/// A message's `content` as parts: its text (when it has any), then its images.
pub(super) fn content_parts(message: &Message) -> Value {
    let text =
        (!message.content.is_empty()).then(|| json!({ "type": "text", "text": message.content }));
    text.into_iter()
        .chain(message.images.iter().map(image_part))
        .collect()
}

/// One image as a content part: its URL, or its bytes as a `data:` URL.
fn image_part(image: &ImagePart) -> Value {
    let url = match image {
        ImagePart::Url { url } => url.clone(),
        ImagePart::Base64 { .. } => image.data_url().unwrap_or_default(),
        // Refused before a body is built (`check_images`): a reference is never sent.
        ImagePart::Payload { .. } => String::new(),
    };
    json!({ "type": "image_url", "image_url": { "url": url } })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{request_body, MaxTokensField};
    use crate::agent::model::{check_images, ModelError, ModelRequest};
    use crate::protocol::message::{Message, ToolCall};
    use crate::protocol::{ImagePart, PayloadRef};

    fn url(n: u8) -> ImagePart {
        ImagePart::Url {
            url: format!("https://example.com/{n}.png"),
        }
    }

    fn png() -> ImagePart {
        ImagePart::Base64 {
            media_type: "image/png".into(),
            data: "aGVsbG8=".into(),
        }
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "m1".into(),
            agent: "assistant".into(),
            messages: std::sync::Arc::new(messages),
            tools: Vec::new().into(),
            max_output_tokens: None,
            output_schema: None,
        }
    }

    fn calling(ids: &[&str]) -> Message {
        let mut message = Message::assistant("");
        message.tool_calls = ids
            .iter()
            .map(|id| ToolCall {
                id: (*id).into(),
                name: "screenshot".into(),
                arguments: json!({}),
            })
            .collect();
        message
    }

    #[test]
    fn a_users_images_follow_its_text_as_image_url_parts() {
        let body = request_body(
            &request(vec![
                Message::system("sys"),
                Message::user("what is this?").with_images(vec![url(1), png()]),
                Message::user("").with_images(vec![url(2)]),
            ]),
            false,
            MaxTokensField::MaxTokens,
        );
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/1.png"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}
                ]},
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/2.png"}}
                ]}
            ])
        );
    }

    #[test]
    fn tool_images_follow_the_steps_last_result_in_one_user_message_naming_the_calls() {
        let body = request_body(
            &request(vec![
                Message::user("take two screenshots"),
                calling(&["c1", "c2", "c3"]),
                Message::tool_result("c1", "[image 1: image/png, 5 bytes]")
                    .with_images(vec![png()]),
                Message::tool_result("c2", "no image"),
                Message::tool_result("c3", "two").with_images(vec![url(3), url(4)]),
                Message::assistant("done"),
            ]),
            false,
            MaxTokensField::MaxTokens,
        );
        let messages = body["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            roles,
            [
                "user",
                "assistant",
                "tool",
                "tool",
                "tool",
                "user",
                "assistant"
            ]
        );
        // Tool messages stay text.
        assert_eq!(
            messages[2]["content"],
            json!("[image 1: image/png, 5 bytes]")
        );
        assert_eq!(
            messages[5]["content"],
            json!([
                {"type": "text", "text": "The result of tool call c1 holds 1 image(s):"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
                {"type": "text", "text": "The result of tool call c3 holds 2 image(s):"},
                {"type": "image_url", "image_url": {"url": "https://example.com/3.png"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/4.png"}}
            ])
        );
    }

    #[test]
    fn a_client_without_images_or_a_reference_left_unread_fails_before_sending() {
        let shown = request(vec![Message::user("look").with_images(vec![url(1)])]);
        assert!(check_images(&shown, "openai", true).is_ok());
        let refused = check_images(&shown, "openai", false).expect_err("no images taken");
        assert!(matches!(refused, ModelError::ImagesRefused(_)));
        let failure = refused.to_failure();
        assert_eq!(failure.kind, crate::protocol::FailureKind::InvalidInput);
        assert!(!failure.retryable);
        assert!(
            failure.message.contains("model m1 of provider openai")
                && failure.message.contains("SKEIN_MODEL_IMAGES=false"),
            "{}",
            failure.message
        );
        assert!(check_images(&request(vec![Message::user("text only")]), "openai", false).is_ok());
        let stored = request(vec![Message::user("look").with_images(vec![
            ImagePart::Payload {
                media_type: "image/png".into(),
                payload: PayloadRef {
                    bucket: "skein-payloads-acme".into(),
                    name: "s/t/x".into(),
                    size: 5,
                    digest: "SHA-256=x".into(),
                },
            },
        ])]);
        let unread = check_images(&stored, "openai", true).expect_err("a reference is not sent");
        assert!(unread.to_string().contains("unread"), "{unread}");
    }
}
