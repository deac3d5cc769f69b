//! Counting a conversation's tokens, and each model's context size.
//!
//! Models the OpenAI tokenizers cover (`gpt-*`, `o1`..`o4`, `chatgpt-*`, fine-tunes of them) are
//! counted exactly with their BPE (loaded once per process, on first use); every other model gets
//! an estimate of one token per four characters, which is what most tokenizers average on English
//! text and code. Either way a message also costs a few tokens of framing.
//!
//! Counting is skipped when it cannot matter: no tokenizer yields more tokens than the text has
//! bytes, so a conversation whose bytes fit under a limit fits in tokens too
//! ([`upper_bound`]).

use tiktoken_rs::tokenizer::Tokenizer;

use crate::protocol::message::Message;
use crate::protocol::ToolSpec;

/// Tokens of framing every message costs (role, separators), as chat formats add them.
const PER_MESSAGE: u64 = 4;

/// Tokens one image is counted as: providers charge by its pixels (OpenAI about 765 for a
/// 1024x1024 image in detail, Anthropic about 1,600 for a megapixel); this estimate sits between,
/// so the context's room for images is neither wasted nor badly overrun.
pub const IMAGE_TOKENS: u64 = 1_200;

/// Context size assumed for a model nobody configured and the tokenizer crate does not know.
pub const DEFAULT_CONTEXT_TOKENS: u64 = 32_768;

/// How a model's text is counted.
#[derive(Debug, Clone, Copy)]
pub enum TokenCounter {
    /// The model's own BPE (loaded on the first text it counts, once per process).
    Exact(Tokenizer),
    /// About four characters a token.
    Estimate,
}

impl TokenCounter {
    /// The counter for `model`: its tokenizer when it is an OpenAI model, an estimate otherwise.
    /// Cheap: nothing is loaded until a text is counted.
    pub fn for_model(model: &str) -> Self {
        match tiktoken_rs::tokenizer::get_tokenizer(model) {
            Some(tokenizer) => TokenCounter::Exact(tokenizer),
            None => TokenCounter::Estimate,
        }
    }

    /// Whether this counts with a real tokenizer.
    pub fn is_exact(&self) -> bool {
        matches!(self, TokenCounter::Exact(_))
    }

    /// Tokens of one piece of text.
    pub fn text(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        let estimate = || (text.chars().count() as u64).div_ceil(4);
        match self {
            TokenCounter::Exact(tokenizer) => match tiktoken_rs::bpe_for_tokenizer(*tokenizer) {
                Ok(bpe) => bpe.encode_ordinary(text).len() as u64,
                Err(_) => estimate(),
            },
            TokenCounter::Estimate => estimate(),
        }
    }

    /// Tokens of one message: its text, reasoning and tool calls, and its framing.
    pub fn message(&self, message: &Message) -> u64 {
        let mut tokens = PER_MESSAGE + self.text(&message.content);
        if let Some(reasoning) = &message.reasoning {
            tokens += self.text(reasoning);
        }
        for call in &message.tool_calls {
            tokens += PER_MESSAGE + self.text(&call.name) + self.text(&call.arguments.to_string());
        }
        if let Some(id) = &message.tool_call_id {
            tokens += self.text(id);
        }
        tokens + IMAGE_TOKENS * message.images.len() as u64
    }

    /// Tokens of a list of messages.
    pub fn messages(&self, messages: &[Message]) -> u64 {
        messages.iter().map(|m| self.message(m)).sum()
    }

    /// Tokens the tool specs add to a request (their names, descriptions and schemas).
    pub fn tools(&self, tools: &[ToolSpec]) -> u64 {
        tools
            .iter()
            .map(|t| {
                PER_MESSAGE
                    + self.text(&t.name)
                    + self.text(&t.description)
                    + self.text(&t.parameters.to_string())
            })
            .sum()
    }
}

/// A bound no count of `messages` can exceed, whatever the tokenizer: their bytes plus framing.
pub fn upper_bound(messages: &[Message]) -> u64 {
    messages.iter().map(message_bytes).sum()
}

/// A bound of the tokens tool specs add to a request: their names', descriptions' and schemas'
/// bytes (the schemas measured as JSON without building it).
pub fn tools_upper_bound(tools: &[ToolSpec]) -> u64 {
    tools
        .iter()
        .map(|t| (t.name.len() + t.description.len() + crate::text::json_len(&t.parameters)) as u64)
        .sum()
}

/// A bound of the tokens an output schema adds to a request (its name, description and schema's
/// bytes; how a provider frames it is within the per-message framing of the request).
pub fn schema_upper_bound(schema: Option<&crate::protocol::OutputSchema>) -> u64 {
    schema.map_or(0, |s| {
        (s.name.len() + s.description.len() + crate::text::json_len(&s.schema)) as u64
    })
}

/// The bytes of one message plus its framing and its images' token estimate (see
/// [`upper_bound`]).
pub fn message_bytes(message: &Message) -> u64 {
    let calls: u64 = message
        .tool_calls
        .iter()
        .map(|c| PER_MESSAGE + (c.name.len() + crate::text::json_len(&c.arguments)) as u64)
        .sum();
    PER_MESSAGE
        + message.content.len() as u64
        + message.reasoning.as_ref().map_or(0, |r| r.len() as u64)
        + message
            .tool_call_id
            .as_ref()
            .map_or(0, |id| id.len() as u64)
        + calls
        + IMAGE_TOKENS * message.images.len() as u64
}

/// The context size of `model` when nobody configured one: what the tokenizer crate knows of
/// OpenAI models, `fallback` for any other.
pub fn default_context_tokens(model: &str, fallback: u64) -> u64 {
    tiktoken_rs::model::get_context_size(model)
        .map(|size| size as u64)
        .unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::message::ToolCall;

    #[test]
    fn openai_models_are_counted_with_their_tokenizer() {
        let counter = TokenCounter::for_model("gpt-4o-mini");
        assert!(counter.is_exact());
        // "hello world" is two tokens in o200k_base.
        assert_eq!(counter.text("hello world"), 2);
        assert!(!TokenCounter::for_model("llama3.2").is_exact());
    }

    #[test]
    fn other_models_are_estimated_at_four_characters_a_token() {
        let counter = TokenCounter::for_model("qwen2.5:7b");
        assert_eq!(counter.text("abcdefgh"), 2);
        assert_eq!(counter.text("abcdefghi"), 3);
        assert_eq!(counter.text("ééééé"), 2, "characters, not bytes");
    }

    #[test]
    fn a_message_counts_its_calls_and_framing() {
        let counter = TokenCounter::Estimate;
        let mut message = Message::assistant("abcd");
        message.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "read".into(),
            arguments: serde_json::json!({"p": 1}),
        });
        // 4 framing + 1 text + (4 framing + 1 name + 2 arguments `{"p":1}`).
        assert_eq!(counter.message(&message), 12);
    }

    #[test]
    fn the_byte_bound_is_never_below_an_exact_count() {
        let counter = TokenCounter::for_model("gpt-4o");
        let messages = vec![
            Message::user("The quick brown fox jumps over the lazy dog. ".repeat(50)),
            Message::assistant("日本語のテキストも数えます。".repeat(20)),
            Message::tool_result("call_1", "{\"rows\": [1, 2, 3]}".repeat(30)),
        ];
        let exact = counter.messages(&messages);
        assert!(exact > 0);
        assert!(upper_bound(&messages) >= exact);
        assert!(upper_bound(&messages) >= TokenCounter::Estimate.messages(&messages));
    }

    #[test]
    fn known_models_have_their_context_size_and_others_the_fallback() {
        assert_eq!(default_context_tokens("gpt-4o-mini", 1000), 128_000);
        assert_eq!(default_context_tokens("my-local-model", 1000), 1000);
    }
}
