//! Structured answers: the schema offered as a tool the model must call, and its call read
//! back as the answer.

use super::*;

fn answer_schema() -> crate::protocol::OutputSchema {
    crate::protocol::OutputSchema {
        name: "forecast".to_owned(),
        description: "Tomorrow's weather.".to_owned(),
        schema: json!({
            "type": "object",
            "properties": {"sky": {"type": "string"}, "high": {"type": "number"}},
            "required": ["sky", "high"],
        }),
        strict: None,
    }
}

fn structured(mut req: ModelRequest) -> ModelRequest {
    req.output_schema = Some(std::sync::Arc::new(answer_schema()));
    req
}

#[test]
fn an_output_schema_is_a_tool_the_model_must_call() {
    let plain = client("http://localhost");
    // Alone: that very tool is forced.
    let body = plain.request_body(&structured(request(
        vec![Message::system("Be brief."), Message::user("weather?")],
        Vec::new(),
    )));
    assert_eq!(
        body["tools"],
        json!([{
            "name": ANSWER_TOOL,
            "description": "Gives your final answer (forecast): its input is the answer. Call it \
                            once you are done. The answer: Tomorrow's weather.",
            "input_schema": answer_schema().schema,
            "cache_control": {"type": "ephemeral"},
        }])
    );
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": "final_answer"})
    );
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]),
        "no instruction is needed when the tool is forced"
    );

    // Beside the agent's tools: some tool must be called, the answer tool last; an agent's tool
    // of the same name is left out.
    let body = plain.request_body(&structured(request(
        vec![Message::user("weather?")],
        vec![tool("read_file"), tool(ANSWER_TOOL)],
    )));
    let names: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["read_file", ANSWER_TOOL]);
    assert_eq!(body["tools"][1]["input_schema"], answer_schema().schema);
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    // Without a schema, a tool of that name is the agent's own.
    let body = plain.request_body(&request(vec![Message::user("hi")], vec![tool(ANSWER_TOOL)]));
    assert_eq!(
        body["tools"][0]["description"],
        json!("The final_answer tool.")
    );
    assert!(body.get("tool_choice").is_none());

    // Thinking: the API refuses a forced tool, so the model is asked, and told.
    let thinking = client("http://localhost")
        .with_thinking_budget(2048)
        .expect("a budget under 4096");
    let body = thinking.request_body(&structured(request(
        vec![Message::system("Be brief."), Message::user("weather?")],
        Vec::new(),
    )));
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert_eq!(body["thinking"]["type"], json!("enabled"));
    assert_eq!(
        body["system"],
        json!([
            {"type": "text", "text": "Be brief."},
            {"type": "text", "text": ANSWER_TOOL_INSTRUCTION,
             "cache_control": {"type": "ephemeral"}},
        ])
    );
}

/// The events of one message whose blocks are `blocks` (each `(start, deltas)`).
fn message_sse(blocks: &[(Value, Vec<Value>)], stop_reason: &str) -> String {
    let mut events = vec![json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "model": "claude-test", "usage": {"input_tokens": 5, "output_tokens": 1}}})];
    for (index, (start, deltas)) in blocks.iter().enumerate() {
        events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        for delta in deltas {
            events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
    }
    events.push(
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason},
                       "usage": {"output_tokens": 12}}),
    );
    events.push(json!({"type": "message_stop"}));
    events
        .iter()
        .map(|event| {
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn answer_use(id: &str, pieces: &[&str]) -> (Value, Vec<Value>) {
    let mut deltas = vec![json!({"type": "input_json_delta", "partial_json": ""})];
    deltas.extend(
        pieces
            .iter()
            .map(|piece| json!({"type": "input_json_delta", "partial_json": piece})),
    );
    (
        json!({"type": "tool_use", "id": id, "name": ANSWER_TOOL, "input": {}}),
        deltas,
    )
}

#[tokio::test]
async fn the_answer_tools_call_is_the_answers_text_streamed_as_it_comes() {
    let raw = message_sse(
        &[answer_use(
            "toolu_9",
            &["{\"sky\": \"cl", "ear\", \"high\"", ": 21}"],
        )],
        "tool_use",
    );
    let items: Vec<_> = sse_answer(by_bytes(&raw, 7), Duration::from_secs(5), far(), true)
        .collect()
        .await;
    let response = done_of(&items);
    assert_eq!(response.message.content, r#"{"sky": "clear", "high": 21}"#);
    assert!(
        response.message.tool_calls.is_empty(),
        "not a call to dispatch"
    );
    assert_eq!(response.finish_reason.as_deref(), Some("end_turn"));
    let streamed: String = pieces_of(&items)
        .into_iter()
        .map(|(kind, text)| {
            assert_eq!(kind, "text");
            text
        })
        .collect();
    assert_eq!(streamed, response.message.content);

    // Asked without a schema, the same events are an ordinary call.
    let items = read_all(by_event(&raw)).await;
    let response = done_of(&items);
    assert_eq!(response.message.content, "");
    assert_eq!(response.message.tool_calls[0].name, ANSWER_TOOL);
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!({"sky": "clear", "high": 21})
    );
}

#[tokio::test]
async fn an_answer_given_beside_calls_or_after_text_is_the_text_and_the_calls_stand() {
    let read = (
        json!({"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}),
        vec![json!({"type": "input_json_delta", "partial_json": "{\"path\": \"a\"}"})],
    );
    let preamble = (
        json!({"type": "text", "text": ""}),
        vec![json!({"type": "text_delta", "text": "Here it is:"})],
    );
    let raw = message_sse(
        &[
            preamble,
            read,
            answer_use("toolu_2", &["{\"sky\":\"rain\",\"high\":9}"]),
        ],
        "tool_use",
    );
    let items: Vec<_> = sse_answer(by_event(&raw), Duration::from_secs(5), far(), true)
        .collect()
        .await;
    let response = done_of(&items);
    assert_eq!(response.message.content, r#"{"sky":"rain","high":9}"#);
    assert_eq!(response.message.tool_calls.len(), 1);
    assert_eq!(response.message.tool_calls[0].name, "read_file");
    assert_eq!(response.finish_reason.as_deref(), Some("tool_use"));

    // A whole (unstreamed) answer carries the input at the block's start.
    let whole = json!({
        "content": [{"type": "tool_use", "id": "toolu_3", "name": ANSWER_TOOL,
                     "input": {"sky": "fog", "high": 4}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 2},
    });
    let response = parse_whole(whole.to_string().as_bytes(), true).expect("parses");
    assert_eq!(
        serde_json::from_str::<Value>(&response.message.content).expect("JSON"),
        json!({"sky": "fog", "high": 4})
    );
    assert!(response.message.tool_calls.is_empty());
}
