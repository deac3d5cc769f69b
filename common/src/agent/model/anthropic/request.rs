//! The `/v1/messages` request body for a [`ModelRequest`]: Skein's conversation mapped onto
//! Anthropic's content blocks.
//!
//! - System messages, wherever they stand, become the top-level `system` text blocks, in order;
//!   the last carries `cache_control: {"type": "ephemeral"}`, and so does the last tool, so the
//!   tools and the system prompt, the prefix every step of a turn repeats, are cached; so does
//!   the conversation's last block, so each step reads the steps before it from the cache (three
//!   of the API's four breakpoints).
//! - User text is a `text` block, followed by the message's images as `image` blocks (a `base64`
//!   source for inline bytes, a `url` source for an image by URL). An assistant message is its `thinking` block (only when it
//!   kept both the thinking and its signature: the API refuses unsigned thinking), its `text`,
//!   then one `tool_use` block per call (`input` must be an object: anything else goes as `{}`,
//!   as the OpenAI client does). A tool message is a `tool_result` block in a user message; when
//!   the call returned images, its `content` is a list: the text block, then the image blocks.
//! - The API wants user and assistant turns to alternate, so consecutive messages of one role
//!   are merged into one message (the results of parallel calls become one user message), and in
//!   a user message the `tool_result` blocks come before any text (the API requires it; a
//!   steering message sent after tool results joins their message after them).
//! - Empty text is left out (the API refuses empty text blocks); a message left with no block is
//!   dropped.
//! - A structured answer (`ModelRequest::output_schema`) is a tool, [`ANSWER_TOOL`], whose
//!   `input_schema` is the schema, offered last (an agent's own tool of that name is left out),
//!   and the model must call a tool: `tool_choice` is `{"type": "tool", "name": "final_answer"}`
//!   when it is the only tool, `{"type": "any"}` beside the agent's tools. The API refuses a
//!   forced tool while the model thinks: with thinking on, `tool_choice` is `auto` and the system
//!   prompt ends with [`ANSWER_TOOL_INSTRUCTION`] (an answer written as text is still checked as
//!   JSON). The stream decoder turns the tool's call into the answer's text.

use serde_json::{json, Value};

use super::super::ModelRequest;
use crate::protocol::message::{Message, Role};
use crate::protocol::{ImagePart, OutputSchema, ToolSpec};

/// The smallest thinking budget the API accepts.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// The tool through which the model gives a structured answer: its `input_schema` is the output
/// schema, and its input is the answer.
pub const ANSWER_TOOL: &str = "final_answer";

/// What the model is told when it may not be forced to call [`ANSWER_TOOL`] (while thinking).
pub const ANSWER_TOOL_INSTRUCTION: &str = "When you have the final answer, give it by calling the \
     final_answer tool, whose input is the answer; do not write the answer as text.";

/// The body asking for `request`, streamed, in at most `max_tokens` output tokens, thinking
/// within `thinking_budget` tokens when one is set and fits under `max_tokens`.
pub(super) fn request_body(
    request: &ModelRequest,
    max_tokens: u64,
    thinking_budget: Option<u64>,
) -> Value {
    let mut messages = wire_messages(&request.messages);
    mark_conversation_cached(&mut messages);
    let mut body = json!({
        "model": request.model,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream": true,
    });
    // The API wants `budget_tokens < max_tokens`: a call allowed fewer output tokens than the
    // budget thinks within what it may spend, or not at all below the API's minimum.
    let thinking = thinking_budget
        .map(|budget| budget.min(max_tokens.saturating_sub(1)))
        .filter(|&budget| budget >= MIN_THINKING_BUDGET);
    if let Some(budget) = thinking {
        body["thinking"] = json!({ "type": "enabled", "budget_tokens": budget });
    }
    let answer = request.output_schema.as_deref();
    let mut system = system_blocks(&request.messages);
    // Forcing a tool is refused while the model thinks: it is then asked to use it.
    if answer.is_some() && thinking.is_some() {
        system.push(json!({ "type": "text", "text": ANSWER_TOOL_INSTRUCTION }));
    }
    if let Some(last) = system.last_mut() {
        last["cache_control"] = ephemeral();
    }
    if !system.is_empty() {
        body["system"] = Value::Array(system);
    }
    // A tool of the agent's that shares the answer tool's name could not be told apart from it.
    let mut tools: Vec<Value> = request
        .tools
        .iter()
        .filter(|tool| answer.is_none() || tool.name != ANSWER_TOOL)
        .map(wire_tool)
        .collect();
    let other_tools = !tools.is_empty();
    if let Some(schema) = answer {
        tools.push(answer_tool(schema));
        body["tool_choice"] = match (thinking, other_tools) {
            (Some(_), _) => json!({ "type": "auto" }),
            (None, true) => json!({ "type": "any" }),
            (None, false) => json!({ "type": "tool", "name": ANSWER_TOOL }),
        };
    }
    if let Some(last) = tools.last_mut() {
        last["cache_control"] = ephemeral();
    }
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    body
}

/// The tool a structured answer is given through.
fn answer_tool(schema: &OutputSchema) -> Value {
    let description = if schema.description.is_empty() {
        format!(
            "Gives your final answer ({}): its input is the answer. Call it once you are done.",
            schema.name
        )
    } else {
        format!(
            "Gives your final answer ({}): its input is the answer. Call it once you are done. \
             The answer: {}",
            schema.name, schema.description
        )
    };
    json!({ "name": ANSWER_TOOL, "description": description, "input_schema": schema.schema })
}

fn ephemeral() -> Value {
    json!({ "type": "ephemeral" })
}

fn system_blocks(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| m.role == Role::System && !m.content.is_empty())
        .map(|m| json!({ "type": "text", "text": m.content }))
        .collect()
}

/// The `messages` array: user and assistant turns, alternating.
fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role {
            Role::System => continue,
            Role::User => ("user", user_blocks(message)),
            Role::Tool => ("user", vec![tool_result_block(message)]),
            Role::Assistant => ("assistant", assistant_blocks(message)),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // Stable: results keep their order, and so does the text after them.
                blocks.sort_by_key(|block| block["type"] != "tool_result");
            }
            json!({ "role": role, "content": blocks })
        })
        .collect()
}

/// Puts a cache breakpoint on the last block of the conversation, so the next step of the turn
/// (which repeats all of it) reads it from the cache and pays for its new blocks only. Thinking
/// blocks cannot carry one; a conversation ending in one is left unmarked.
fn mark_conversation_cached(messages: &mut [Value]) {
    let last_block = messages
        .last_mut()
        .and_then(|message| message["content"].as_array_mut())
        .and_then(|blocks| blocks.last_mut());
    if let Some(block) = last_block {
        if !matches!(
            block["type"].as_str(),
            Some("thinking" | "redacted_thinking")
        ) {
            block["cache_control"] = ephemeral();
        }
    }
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({ "type": "text", "text": text }))
}

fn user_blocks(message: &Message) -> Vec<Value> {
    text_block(&message.content)
        .into_iter()
        .chain(message.images.iter().map(image_block))
        .collect()
}

/// One image as an `image` block: its bytes inline, or its URL.
fn image_block(image: &ImagePart) -> Value {
    let source = match image {
        ImagePart::Url { url } => json!({ "type": "url", "url": url }),
        ImagePart::Base64 { media_type, data } => {
            json!({ "type": "base64", "media_type": media_type, "data": data })
        }
        // Refused before a request is built (`check_images`).
        ImagePart::Payload { media_type, .. } => {
            json!({ "type": "base64", "media_type": media_type, "data": "" })
        }
    };
    json!({ "type": "image", "source": source })
}

fn tool_result_block(message: &Message) -> Value {
    let Some(call_id) = &message.tool_call_id else {
        // A result that answers no call cannot be a `tool_result`; its text still counts.
        return json!({ "type": "text", "text": message.content });
    };
    let mut block = json!({ "type": "tool_result", "tool_use_id": call_id });
    if !message.images.is_empty() {
        block["content"] = Value::Array(user_blocks(message));
    } else if !message.content.is_empty() {
        block["content"] = Value::String(message.content.clone());
    }
    block
}

fn assistant_blocks(message: &Message) -> Vec<Value> {
    let mut blocks = Vec::with_capacity(2 + message.tool_calls.len());
    if let (Some(thinking), Some(signature)) = (&message.reasoning, &message.reasoning_signature) {
        if !signature.is_empty() {
            blocks
                .push(json!({ "type": "thinking", "thinking": thinking, "signature": signature }));
        }
    }
    blocks.extend(text_block(&message.content));
    for call in &message.tool_calls {
        let input = match &call.arguments {
            object @ Value::Object(_) => object.clone(),
            _ => Value::Object(Default::default()),
        };
        blocks
            .push(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": input }));
    }
    blocks
}

fn wire_tool(spec: &ToolSpec) -> Value {
    let input_schema = match &spec.parameters {
        schema @ Value::Object(_) => schema.clone(),
        _ => json!({ "type": "object" }),
    };
    json!({ "name": spec.name, "description": spec.description, "input_schema": input_schema })
}
