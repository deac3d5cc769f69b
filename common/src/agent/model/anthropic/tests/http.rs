//! HTTP against a one-shot local server: the path, key and version sent, refusals read.

use super::*;

/// Serves one connection: reads its request (head and `content-length` body), answers with
/// `response` as is, and gives back the request's text.
async fn serve_once(response: String) -> (String, tokio::task::JoinHandle<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port on 127.0.0.1");
    let base_url = format!("http://{}", listener.local_addr().expect("a bound address"));
    let served = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("a connection");
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let read = stream.read(&mut buffer).await.expect("the request reads");
            seen.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&seen);
            if let Some(head_end) = text.find("\r\n\r\n") {
                let length = text[..head_end]
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if seen.len() >= head_end + 4 + length || read == 0 {
                    break;
                }
            } else if read == 0 {
                break;
            }
        }
        stream
            .write_all(response.as_bytes())
            .await
            .expect("the answer writes");
        let _ = stream.shutdown().await;
        String::from_utf8_lossy(&seen).into_owned()
    });
    (base_url, served)
}

fn refusal(status: u16, reason: &str, retry_after: u64, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nretry-after: {retry_after}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn rate_limits_and_overloads_are_retryable_and_carry_retry_after() {
    for (status, reason, kind) in [
        (429, "Too Many Requests", "rate_limit_error"),
        (529, "Overloaded", "overloaded_error"),
    ] {
        let body = format!(
            r#"{{"type": "error", "error": {{"type": "{kind}", "message": "slow down"}}}}"#
        );
        let (base_url, served) = serve_once(refusal(status, reason, 7, &body)).await;
        let error = client(&base_url)
            .complete(request(vec![Message::user("hi")], Vec::new()))
            .await
            .expect_err("refused");
        served.await.expect("served");
        assert!(
            matches!(&error, ModelError::Status { status: s, retry_after: Some(wait), body: b }
                if *s == status && *wait == Duration::from_secs(7) && b.contains(kind)),
            "{error:?}"
        );
        let failure = error.to_failure();
        assert_eq!(failure.kind, FailureKind::ModelFailed);
        assert!(failure.retryable, "{status}");
        assert_eq!(
            crate::agent::model::retry_after(&failure),
            Some(Duration::from_secs(7))
        );
    }
}

#[tokio::test]
async fn a_prompt_too_long_refusal_is_a_context_overflow() {
    let body = r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 214513 tokens > 200000 maximum"}}"#;
    let (base_url, served) = serve_once(refusal(400, "Bad Request", 0, body)).await;
    let error = client(&base_url)
        .complete(request(vec![Message::user("hi")], Vec::new()))
        .await
        .expect_err("refused");
    served.await.expect("served");
    assert!(
        matches!(
            error,
            ModelError::Status {
                status: 400,
                retry_after: None,
                ..
            }
        ),
        "{error:?}"
    );
    let failure = error.to_failure();
    assert_eq!(failure.kind, FailureKind::ContextOverflow);
    assert!(!failure.retryable);
}

#[tokio::test]
async fn a_call_posts_to_v1_messages_with_the_key_and_version_and_reads_the_stream() {
    let events = TEXT_ANSWER;
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{events}",
        events.len()
    );
    let (base_url, served) = serve_once(response).await;
    let answer = client(&base_url)
        .complete(request(vec![Message::user("hi")], vec![tool("read_file")]))
        .await
        .expect("an answer");
    assert_eq!(answer.message.content, "Hello, world!");
    let seen = served.await.expect("served");
    let (head, body) = seen.split_once("\r\n\r\n").expect("a head and a body");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("post /v1/messages http/1.1"), "{head}");
    assert!(
        head.contains("\r\nx-api-key: sk-ant-unit-test-key"),
        "{head}"
    );
    assert!(head.contains("\r\nanthropic-version: 2023-06-01"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: application/json"),
        "{head}"
    );
    assert!(!head.contains("authorization"), "{head}");
    let body: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["max_tokens"], json!(4096));
    assert_eq!(body["model"], json!("claude-test"));
}
