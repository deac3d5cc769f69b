//! Messages as LangGraph's clients read and write them: a session's messages shown as LangChain
//! message dicts (`human`, `ai` with `tool_calls`, `tool`, `system`), and a run's `input` read
//! back into the user's text and images and the conversation before it (whose messages may show
//! no images: they are history).

use serde_json::{json, Value};
use skein_common::protocol::message::{Message, Role};
use skein_common::protocol::InputPart;

use super::super::approvals::CallRef;
use super::super::request::Content;

/// `message` as a LangChain message dict with id `id`.
pub(super) fn shown(message: &Message, id: String) -> Value {
    match message.role {
        Role::User => json!({ "type": "human", "content": message.content, "id": id }),
        Role::System => json!({ "type": "system", "content": message.content, "id": id }),
        Role::Tool => json!({
            "type": "tool",
            "content": message.content,
            "tool_call_id": message.tool_call_id,
            "id": id,
        }),
        Role::Assistant => ai(&message.content, id, &tool_calls(message)),
    }
}

/// An `ai` message with its text and calls.
pub(super) fn ai(text: &str, id: String, calls: &[Value]) -> Value {
    json!({ "type": "ai", "content": text, "id": id, "tool_calls": calls })
}

/// A call waiting for a person as a LangGraph interrupt: its id names the call (`CallRef::id`),
/// its value says what waits and how to answer.
pub(super) fn interrupt(
    call: &CallRef,
    tool: &str,
    arguments: &Value,
    rule: &str,
    expires_at_ms: Option<u64>,
) -> Value {
    json!({
        "value": {
            "call_id": call.call_id, "source": call.source, "tool": tool,
            "arguments": arguments, "rule": rule, "expires_at_ms": expires_at_ms,
            "answer": "resume with {\"approve\": true}, {\"approve\": false, \"reason\": \"…\"}, or one of those by interrupt id",
        },
        "id": call.id(),
    })
}

/// A call as LangChain writes it in an `ai` message.
pub(super) fn tool_call(id: &str, name: &str, arguments: &Value) -> Value {
    json!({ "name": name, "args": arguments, "id": id, "type": "tool_call" })
}

fn tool_calls(message: &Message) -> Vec<Value> {
    message
        .tool_calls
        .iter()
        .map(|call| tool_call(&call.id, &call.name, &call.arguments))
        .collect()
}

/// A session's messages as a thread's `messages`, numbered in the thread.
pub(super) fn thread_messages(thread_id: &str, history: &[Message]) -> Vec<Value> {
    history
        .iter()
        .enumerate()
        .map(|(n, message)| shown(message, format!("{thread_id}-{n}")))
        .collect()
}

/// A run's input: the user's text (its last message) and the messages before it, from
/// `{"messages": [...]}` whose messages are dicts with `role` (`user`, `assistant`, `system`) or
/// `type` (`human`, `ai`, `system`) and `content` (text or parts), or plain strings (the user's).
pub(super) fn read_input(input: &Value) -> Result<RunInput, String> {
    let messages = match input {
        Value::Object(fields) => fields
            .get("messages")
            .ok_or("input needs `messages` (the agent's state is its conversation)")?,
        Value::String(text) => return Ok((text.clone(), Vec::new(), Vec::new())),
        _ => return Err("input must be an object with `messages`".into()),
    };
    let messages = match messages {
        Value::Array(messages) => messages.clone(),
        single @ (Value::Object(_) | Value::String(_)) => vec![single.clone()],
        _ => return Err("input.messages must be a list of messages".into()),
    };
    let mut read = Vec::with_capacity(messages.len());
    for message in &messages {
        read.push(read_message(message)?);
    }
    let last = read.pop();
    if read.iter().any(|(_, images)| !images.is_empty()) {
        return Err(
            "images are taken in the last user message only (the earlier ones are history)".into(),
        );
    }
    let earlier = read.into_iter().map(|(message, _)| message).collect();
    match last {
        Some((last, images)) if last.role == Role::User => Ok((last.content, images, earlier)),
        Some(_) => Err("the last input message must be the user's (role user, type human)".into()),
        None => Err("input.messages is empty".into()),
    }
}

/// A run's input: the user's text, its images, and the messages before it.
pub(super) type RunInput = (String, Vec<InputPart>, Vec<Message>);

fn read_message(message: &Value) -> Result<(Message, Vec<InputPart>), String> {
    if let Value::String(text) = message {
        return Ok((Message::user(text.clone()), Vec::new()));
    }
    let kind = message
        .get("role")
        .or_else(|| message.get("type"))
        .and_then(Value::as_str)
        .ok_or("every input message needs a role (or type)")?;
    let content: Content =
        serde_json::from_value(message.get("content").cloned().unwrap_or(Value::Null))
            .map_err(|_| "a message's content must be text or a list of parts".to_owned())?;
    let text = content.text()?;
    let images = content.images()?;
    let message = match kind {
        "user" | "human" => Message::user(text),
        "assistant" | "ai" => Message::assistant(text),
        "system" | "developer" => Message::system(text),
        other => {
            return Err(format!(
                "input messages of role {other:?} are not accepted: send user, assistant or \
                 system messages (the agent runs its own tools)"
            ))
        }
    };
    Ok((message, images))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_in_each_shape_give_the_users_text_and_what_came_before() {
        let (text, images, before) = read_input(&json!({ "messages": [
            { "role": "system", "content": "be brief" },
            { "type": "ai", "content": [ { "type": "text", "text": "hi" } ] },
            { "role": "user", "content": [
                { "type": "text", "text": "hello" },
                { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }
            ] }
        ] }))
        .expect("read");
        assert_eq!(text, "hello");
        assert_eq!(images.len(), 1);
        assert_eq!(
            before,
            vec![Message::system("be brief"), Message::assistant("hi")]
        );
        assert_eq!(
            read_input(&json!({ "messages": "just this" }))
                .expect("read")
                .0,
            "just this"
        );
        for (bad, says) in [
            (json!({ "messages": [] }), "empty"),
            (
                json!({ "messages": [ { "role": "assistant", "content": "x" } ] }),
                "last",
            ),
            (
                json!({ "messages": [ { "role": "tool", "content": "x" } ] }),
                "tool",
            ),
            (json!({ "other": 1 }), "messages"),
            (
                json!({ "messages": [
                    { "role": "user", "content": [
                        { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }
                    ] },
                    { "role": "assistant", "content": "x" },
                    { "role": "user", "content": "and?" }
                ] }),
                "last user message only",
            ),
            (
                json!({ "messages": [ { "role": "user", "content": [ { "type": "audio" } ] } ] }),
                "not accepted",
            ),
            (json!(3), "object"),
        ] {
            let error = read_input(&bad).expect_err("refused");
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn a_sessions_messages_show_as_langchain_dicts() {
        let mut asked = Message::assistant("");
        asked
            .tool_calls
            .push(skein_common::protocol::message::ToolCall {
                id: "c1".into(),
                name: "echo".into(),
                arguments: json!({ "text": "x" }),
            });
        let shown = thread_messages(
            "t",
            &[
                Message::user("hi"),
                asked,
                Message::tool_result("c1", "x"),
                Message::assistant("done"),
            ],
        );
        let kinds: Vec<&str> = shown
            .iter()
            .map(|m| m["type"].as_str().expect("present"))
            .collect();
        assert_eq!(kinds, ["human", "ai", "tool", "ai"]);
        assert_eq!(shown[1]["tool_calls"][0]["name"], "echo");
        assert_eq!(shown[1]["tool_calls"][0]["args"]["text"], "x");
        assert_eq!(shown[2]["tool_call_id"], "c1");
        assert_eq!(shown[3]["id"], "t-3");
    }
}
