//! Chat messages, tool calls and token usage: the conversation model stored in sessions, carried in
//! checkpoints and spoken by every model provider.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::content::ImagePart;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: String,
    /// Calls the assistant asked for (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The model's visible reasoning before this answer (assistant messages of thinking models,
    /// e.g. DeepSeek's `reasoning_content`); sent back with the message, since some servers
    /// refuse a follow-up without it. Absent in sessions written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The provider's signature over `reasoning` (Anthropic's signed `thinking` block), sent back
    /// with it so the provider can check the reasoning is its own and unchanged. Absent when the
    /// provider signs nothing, and in sessions written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_signature: Option<String>,
    /// Images the message shows the model after its text: a user's (from a submission's content
    /// parts) or a tool call's (from its result). Large ones are kept by payload reference and
    /// read only when a request is built. Absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImagePart>,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self::text(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::text(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::text(Role::Assistant, content)
    }

    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            reasoning: None,
            reasoning_signature: None,
            images: Vec::new(),
        }
    }

    /// The same message showing `images` after its text.
    pub fn with_images(mut self, images: Vec<ImagePart>) -> Self {
        self.images = images;
        self
    }

    /// Appends the message's JSON to `out`: byte for byte its `Serialize` output, with its texts
    /// written a word at a time ([`crate::json_out::push_str`]); for long conversations written
    /// often (a turn's checkpoints).
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        use crate::json_out::{push_member, push_str};
        // Every field named: a new one does not compile until it is written here.
        let Message {
            role,
            content,
            tool_calls,
            tool_call_id,
            reasoning,
            reasoning_signature,
            images,
        } = self;
        out.extend_from_slice(match role {
            Role::System => b"{\"role\":\"system\",\"content\":",
            Role::User => b"{\"role\":\"user\",\"content\":",
            Role::Assistant => b"{\"role\":\"assistant\",\"content\":",
            Role::Tool => b"{\"role\":\"tool\",\"content\":",
        });
        push_str(out, content);
        if !tool_calls.is_empty() {
            push_member(out, "tool_calls", tool_calls)?;
        }
        for (name, text) in [
            (&b",\"tool_call_id\":"[..], tool_call_id),
            (b",\"reasoning\":", reasoning),
            (b",\"reasoning_signature\":", reasoning_signature),
        ] {
            if let Some(text) = text {
                out.extend_from_slice(name);
                push_str(out, text);
            }
        }
        if !images.is_empty() {
            push_member(out, "images", images)?;
        }
        out.push(b'}');
        Ok(())
    }

    fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
            reasoning_signature: None,
            images: Vec::new(),
        }
    }
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCall {
    /// Call id; unique within the turn.
    pub id: String,
    pub name: String,
    /// Arguments as JSON (an object for well-behaved models).
    pub arguments: Value,
}

/// Tokens used by model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// Every token of the prompt, those read from or written to a prompt cache included.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    // The cache counts are plain numbers, not options, which would take twice the room: `Usage`
    // travels inline in `FinalResult` and turn checkpoints, which enums hold by value, and those
    // are at clippy's `large_enum_variant` bound. "None" and "not said" both count as 0.
    /// Of `prompt_tokens`, those read from the provider's prompt cache (Anthropic's
    /// `cache_read_input_tokens`); 0, and left out, when none were or the provider does not say.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of `prompt_tokens`, those written to the provider's prompt cache (Anthropic's
    /// `cache_creation_input_tokens`); 0, and left out, when none were or the provider does not
    /// say.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Adds `other`, saturating: the counts come from model servers, which may report anything.
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::{Message, Role, Usage};

    #[test]
    fn messages_stored_before_reasoning_existed_still_decode() {
        let old = r#"{"role": "assistant", "content": "hi"}"#;
        let message: Message = serde_json::from_str(old).expect("an old message decodes");
        assert_eq!(message.role, Role::Assistant);
        assert_eq!(message.reasoning, None);
        assert_eq!(message.reasoning_signature, None);
        let written = serde_json::to_value(&message).expect("encodes");
        assert!(written.get("reasoning").is_none(), "{written}");
        assert!(written.get("reasoning_signature").is_none(), "{written}");
    }

    #[test]
    fn usage_stored_before_cache_counts_existed_still_decodes_and_is_written_alike() {
        let old = r#"{"prompt_tokens": 3, "completion_tokens": 4}"#;
        let usage: Usage = serde_json::from_str(old).expect("an old usage decodes");
        assert_eq!((usage.cache_read_tokens, usage.cache_write_tokens), (0, 0));
        let written = serde_json::to_string(&usage).expect("encodes");
        assert_eq!(written, r#"{"prompt_tokens":3,"completion_tokens":4}"#);
    }

    #[test]
    fn usage_reported_by_a_server_saturates_instead_of_overflowing() {
        let mut total = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: 1,
            cache_read_tokens: u64::MAX,
            cache_write_tokens: 2,
        };
        total.add(Usage {
            prompt_tokens: 5,
            completion_tokens: u64::MAX,
            cache_read_tokens: 5,
            cache_write_tokens: 3,
        });
        assert_eq!(total.prompt_tokens, u64::MAX);
        assert_eq!(total.completion_tokens, u64::MAX);
        assert_eq!(total.cache_read_tokens, u64::MAX);
        assert_eq!(total.cache_write_tokens, 5);
    }
}
