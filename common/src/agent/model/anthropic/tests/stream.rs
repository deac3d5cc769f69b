//! The streamed events read into deltas and the assembled answer, written from the documented
//! format (`fixtures/anthropic_*.sse`).

use super::*;

#[tokio::test]
async fn a_text_answer_streams_its_deltas_and_counts_cached_prompt_tokens() {
    let items = read_all(by_event(TEXT_ANSWER)).await;
    assert_eq!(
        pieces_of(&items),
        vec![("text", "Hello"), ("text", ", world!")]
    );
    let response = done_of(&items);
    assert_eq!(response.message.role, Role::Assistant);
    assert_eq!(response.message.content, "Hello, world!");
    assert!(response.message.tool_calls.is_empty());
    assert_eq!(response.message.reasoning, None);
    assert_eq!(response.finish_reason.as_deref(), Some("end_turn"));
    // `input_tokens` leaves the cached tokens out; the prompt is all of them. The output count
    // is message_delta's (cumulative), not message_start's.
    assert_eq!(
        response.usage,
        Usage {
            prompt_tokens: 25 + 1200 + 3400,
            completion_tokens: 15,
            cache_read_tokens: 3400,
            cache_write_tokens: 1200,
        }
    );
}

#[tokio::test]
async fn parallel_tool_uses_are_assembled_from_input_json_split_over_deltas_and_reads() {
    for (how, body) in [
        ("by event", by_event(PARALLEL_TOOL_USE)),
        ("by 7 bytes", by_bytes(PARALLEL_TOOL_USE, 7)),
        ("by 1 byte", by_bytes(PARALLEL_TOOL_USE, 1)),
    ] {
        let items = read_all(body).await;
        assert_eq!(
            pieces_of(&items),
            vec![("text", "I'll look up both.")],
            "{how}"
        );
        let response = done_of(&items);
        assert_eq!(response.finish_reason.as_deref(), Some("tool_use"), "{how}");
        assert_eq!(
            response.message.tool_calls,
            vec![
                ToolCall {
                    id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".to_owned(),
                    name: "get_weather".to_owned(),
                    arguments: json!({"location": "San Francisco, CA", "unit": "celsius"}),
                },
                ToolCall {
                    id: "toolu_01VfZq8VhUqQX2bJzLw7pJ2R".to_owned(),
                    name: "get_time".to_owned(),
                    arguments: json!({"timezone": "America/Los_Angeles"}),
                },
            ],
            "{how}"
        );
        assert_eq!(response.usage.prompt_tokens, 472, "{how}");
        assert_eq!(response.usage.completion_tokens, 89, "{how}");
        assert_eq!(response.usage.cache_read_tokens, 0, "{how}");
    }
}

#[tokio::test]
async fn thinking_is_streamed_kept_with_its_signature_and_sent_back_first() {
    let items = read_all(by_event(THINKING_TOOL_USE)).await;
    assert_eq!(
        pieces_of(&items),
        vec![
            ("reasoning", "The user wants the weather. "),
            ("reasoning", "I should call get_weather."),
        ]
    );
    let response = done_of(&items);
    let thinking = "The user wants the weather. I should call get_weather.";
    let signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds";
    assert_eq!(response.message.reasoning.as_deref(), Some(thinking));
    assert_eq!(
        response.message.reasoning_signature.as_deref(),
        Some(signature)
    );
    assert_eq!(response.message.content, "");
    let call_id = response.message.tool_calls[0].id.clone();

    // The next step of the turn sends the thinking back, signed, before the call.
    let next = request(
        vec![
            Message::system("be brief"),
            Message::user("weather in Paris?"),
            response.message.clone(),
            Message::tool_result(&call_id, "sunny"),
        ],
        vec![tool("get_weather")],
    );
    let body = conversation(client("http://localhost").request_body(&next));
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": thinking, "signature": signature},
                {"type": "tool_use", "id": call_id, "name": "get_weather",
                 "input": {"location": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": "sunny"},
            ]},
        ])
    );
}

#[test]
fn thinking_without_a_signature_or_from_several_blocks_is_not_sent_back() {
    // Reasoning of another provider (no signature) cannot be a thinking block.
    let mut unsigned = Message::assistant("hi");
    unsigned.reasoning = Some("hmm".to_owned());
    let body = conversation(
        client("http://localhost")
            .request_body(&request(vec![Message::user("hi"), unsigned], Vec::new())),
    );
    assert_eq!(
        body["messages"][1]["content"],
        json!([{"type": "text", "text": "hi"}])
    );

    // Two thinking blocks: their joined text is kept, no signature fits it.
    let mut accumulator = MessageAccumulator::default();
    for event in [
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "a", "signature": "s1"}}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "redacted_thinking", "data": "EncryptedBytes"}}),
        json!({"type": "content_block_start", "index": 2,
               "content_block": {"type": "thinking", "thinking": "b", "signature": "s2"}}),
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "signature_delta", "signature": "ignored"}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
    ] {
        let event = serde_json::from_value(event).expect("an event");
        accumulator.absorb(event).expect("absorbed");
    }
    let message = accumulator.finish().message;
    assert_eq!(message.reasoning.as_deref(), Some("ab"));
    assert_eq!(message.reasoning_signature, None);
}

#[tokio::test]
async fn a_mid_stream_error_event_is_a_retryable_server_error_not_an_answer() {
    let items = read_all(by_event(MIDSTREAM_ERROR)).await;
    assert!(
        matches!(items.first(), Some(Ok(ModelChunk::Delta(text))) if text == "Partial"),
        "{items:?}"
    );
    let Some(Err(error)) = items.last() else {
        panic!("expected an error, got {items:?}");
    };
    assert!(
        matches!(error, ModelError::ServerError { message, retryable: true }
            if message.contains("Overloaded") && message.contains("overloaded_error")),
        "{error:?}"
    );
    assert!(error.to_failure().retryable);
    assert_eq!(items.iter().filter(|item| item.is_err()).count(), 1);

    // The client's own mistakes are not worth trying again.
    let invalid = MIDSTREAM_ERROR.replace("overloaded_error", "invalid_request_error");
    let items = read_all(by_event(&invalid)).await;
    assert!(
        matches!(
            items.last(),
            Some(Err(ModelError::ServerError {
                retryable: false,
                ..
            }))
        ),
        "{items:?}"
    );
}

#[tokio::test]
async fn a_stream_cut_before_its_stop_is_interrupted_and_unknown_events_are_ignored() {
    let cut = TEXT_ANSWER
        .split("event: message_delta")
        .next()
        .expect("a head")
        .to_owned();
    let items = read_all(by_event(&cut)).await;
    assert!(
        matches!(items.last(), Some(Err(ModelError::Interrupted(_)))),
        "{items:?}"
    );
    assert!(items
        .last()
        .is_some_and(|item| item.as_ref().is_err_and(|e| e.to_failure().retryable)));

    // A body that ends after its stop reason, without message_stop, is whole; an event type
    // this client does not know (the API may add some) changes nothing.
    let unknown = "event: brand_new\ndata: {\"type\": \"brand_new\", \"x\": 1}\n\n";
    let without_stop = TEXT_ANSWER
        .replace("event: ping", &format!("{unknown}event: ping"))
        .split("event: message_stop")
        .next()
        .expect("a head")
        .to_owned();
    let items = read_all(by_event(&without_stop)).await;
    assert_eq!(done_of(&items).message.content, "Hello, world!");
}

#[test]
fn deltas_that_do_not_fit_their_block_are_bad_responses() {
    let mut accumulator = MessageAccumulator::default();
    let orphan = serde_json::from_value(json!({"type": "content_block_delta", "index": 3,
        "delta": {"type": "text_delta", "text": "x"}}))
    .expect("an event");
    assert!(matches!(
        accumulator.absorb(orphan),
        Err(ModelError::BadResponse(_))
    ));
    let start = serde_json::from_value(json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}}}))
    .expect("an event");
    assert_eq!(
        accumulator.absorb(start).expect("starts"),
        Progress::Nothing
    );
    let wrong = serde_json::from_value(json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "x"}}))
    .expect("an event");
    let error = accumulator
        .absorb(wrong)
        .expect_err("a text delta for a tool_use block");
    assert!(error.to_string().contains("text_delta"), "{error}");
}

#[test]
fn text_a_block_starts_with_is_streamed_like_a_delta() {
    let mut accumulator = MessageAccumulator::default();
    let start = serde_json::from_value(json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": "Hi"}}))
    .expect("an event");
    assert_eq!(
        accumulator.absorb(start).expect("starts"),
        Progress::Text("Hi".to_owned())
    );
    let delta = serde_json::from_value(json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": " there"}}))
    .expect("an event");
    assert_eq!(
        accumulator.absorb(delta).expect("a delta"),
        Progress::Text(" there".to_owned())
    );
    assert_eq!(accumulator.finish().message.content, "Hi there");
}

#[test]
fn tool_input_cut_short_is_kept_as_text_for_the_call_to_be_refused() {
    let mut accumulator = MessageAccumulator::default();
    for event in [
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "t1", "name": "write", "input": {}}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"a"}}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "tool_use", "id": "t2", "name": "list", "input": {}}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}),
    ] {
        accumulator
            .absorb(serde_json::from_value(event).expect("an event"))
            .expect("absorbed");
    }
    let calls = accumulator.finish().message.tool_calls;
    assert_eq!(calls[0].arguments, json!("{\"path\": \"a"));
    // No input at all is an empty object.
    assert_eq!(calls[1].arguments, json!({}));
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_times_out_between_events() {
    let head = TEXT_ANSWER.split("event: ping").next().expect("a head");
    let body: SseBody = futures::stream::iter(vec![Ok(head.as_bytes().to_vec())])
        .chain(futures::stream::pending())
        .boxed();
    let items: Vec<_> = sse_answer(body, Duration::from_secs(2), far(), false)
        .collect()
        .await;
    assert!(
        matches!(items.last(), Some(Err(ModelError::TimedOut(_)))),
        "{items:?}"
    );
}

#[test]
fn a_whole_json_answer_is_read_as_one_and_an_error_body_as_the_servers_error() {
    let whole = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "Think.", "signature": "sig"},
            {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"location": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 6},
    });
    let response = parse_whole(whole.to_string().as_bytes(), false).expect("parses");
    assert_eq!(response.message.content, "Calling.");
    assert_eq!(response.message.reasoning.as_deref(), Some("Think."));
    assert_eq!(response.message.reasoning_signature.as_deref(), Some("sig"));
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!({"location": "Oslo"})
    );
    assert_eq!(response.usage.prompt_tokens, 16);
    assert_eq!(response.usage.cache_read_tokens, 6);
    assert_eq!(response.usage.cache_write_tokens, 0);

    let error =
        br#"{"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}"#;
    assert!(matches!(
        parse_whole(error, false),
        Err(ModelError::ServerError {
            retryable: true,
            ..
        })
    ));
}
