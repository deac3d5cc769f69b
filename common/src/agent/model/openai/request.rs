//! The `/chat/completions` request body of a [`ModelRequest`]: messages (with their images, see
//! `images`), tool specs and calls, the answer's bound in the field the server reads, and a
//! structured answer's `response_format`.

use serde_json::{json, Value};

use super::*;

/// The `/chat/completions` body for `request`, its answer's bound (if it has one) in `field`.
pub(super) fn request_body(request: &ModelRequest, stream: bool, field: MaxTokensField) -> Value {
    let messages = images::wire_messages(&request.messages, wire_message);
    let mut body = json!({ "model": request.model, "messages": messages, "stream": stream });
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(wire_tool).collect();
    }
    if let Some(bound) = request.max_output_tokens {
        body[field.as_str()] = json!(bound);
    }
    if let Some(schema) = &request.output_schema {
        body["response_format"] = response_format(schema);
    }
    if stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    body
}

/// `response_format` asking for an answer that matches `schema`: strict when the schema says so,
/// or (unset) when it keeps to what strict mode accepts ([`strict_compatible`]).
pub(super) fn response_format(schema: &OutputSchema) -> Value {
    let strict = schema
        .strict
        .unwrap_or_else(|| strict_compatible(&schema.schema));
    let mut format = json!({ "name": schema.name, "schema": schema.schema, "strict": strict });
    if !schema.description.is_empty() {
        format["description"] = Value::String(schema.description.clone());
    }
    json!({ "type": "json_schema", "json_schema": format })
}

/// Whether OpenAI's strict mode takes `schema` as it is: only the keywords strict mode reads,
/// every object closed (`additionalProperties: false`) with all its properties required. A
/// schema that is not is sent with `strict: false` (the server follows it as best it can; the
/// runtime checks the answer either way), rather than refused by the server.
pub fn strict_compatible(schema: &Value) -> bool {
    const STRICT_KEYWORDS: [&str; 22] = [
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "definitions",
        "description",
        "title",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    ];
    let Value::Object(map) = schema else {
        return false;
    };
    if map
        .keys()
        .any(|key| !STRICT_KEYWORDS.contains(&key.as_str()))
    {
        return false;
    }
    let is_object = match map.get("type") {
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
        _ => map.contains_key("properties"),
    };
    if is_object {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return false;
        }
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let properties = map.get("properties").and_then(Value::as_object);
        if properties.is_some_and(|p| p.keys().any(|name| !required.contains(&name.as_str()))) {
            return false;
        }
        if !properties
            .into_iter()
            .flatten()
            .all(|(_, s)| strict_compatible(s))
        {
            return false;
        }
    }
    let nested_ok = |keyword: &str| match map.get(keyword) {
        None => true,
        Some(Value::Object(entries)) if keyword.ends_with("efs") || keyword == "definitions" => {
            entries.values().all(strict_compatible)
        }
        Some(Value::Array(list)) => list.iter().all(strict_compatible),
        Some(single) => strict_compatible(single),
    };
    nested_ok("items") && nested_ok("anyOf") && nested_ok("$defs") && nested_ok("definitions")
}

pub(super) fn wire_message(message: &Message) -> Value {
    let role = match message.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    // An assistant message that only calls tools carries `null` content.
    let content = if message.content.is_empty() && !message.tool_calls.is_empty() {
        Value::Null
    } else if message.role != Role::Tool && !message.images.is_empty() {
        images::content_parts(message)
    } else {
        Value::String(message.content.clone())
    };
    let mut wire = json!({ "role": role, "content": content });
    if !message.tool_calls.is_empty() {
        wire["tool_calls"] = message.tool_calls.iter().map(wire_tool_call).collect();
    }
    if let Some(call_id) = &message.tool_call_id {
        wire["tool_call_id"] = Value::String(call_id.clone());
    }
    if let Some(reasoning) = message.reasoning.as_ref().filter(|r| !r.is_empty()) {
        if message.role == Role::Assistant {
            wire["reasoning_content"] = Value::String(reasoning.clone());
        }
    }
    wire
}

pub(super) fn wire_tool_call(call: &ToolCall) -> Value {
    let arguments = match &call.arguments {
        object @ Value::Object(_) => object.to_string(),
        // Text that is not JSON, or JSON that is not an object: strict servers (Ollama) refuse
        // the whole conversation over it, so the history carries an empty object instead.
        _ => "{}".to_owned(),
    };
    json!({
        "id": call.id,
        "type": "function",
        "function": { "name": call.name, "arguments": arguments },
    })
}

pub(super) fn wire_tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    })
}
