//! The HTTP gateway against a real cluster (NATS, Redis, a lead and a worker; the model
//! scripted): OpenAI-compatible chat completions, streamed and not, with the conversation before
//! the last message seeded into the run's session; the agents as models; keys that prove a
//! tenant and its roles; `Idempotency-Key`; and a clear error in OpenAI's shape for every bad
//! request; a background response cancelled; rate limits, CORS, the OpenAPI document and the
//! header timeout that closes slow and idle connections.
//! `gateway_sdks.rs` drives it with the official client libraries.

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::gateway::{
    chat, cluster_with_gateway, error_of, gateway_before, KEY, OTHER_TENANT_KEY, READ_ONLY_KEY,
    SECOND_KEY,
};
use skein_tests::support::test_tools::read_effects;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_runs_the_agents_turn_on_the_conversation_it_was_given() {
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &[]).await;
    let http = reqwest::Client::new();

    let models: Value = http
        .get(format!("http://{addr}/v1/models"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["object"], "list");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&"assistant"), "{models}");

    let request = json!({ "model": "assistant", "messages": [
        { "role": "system", "content": "be brief" },
        { "role": "user", "content": "hello" },
        { "role": "assistant", "content": "hi" },
        { "role": "user", "content": [ { "type": "text", "text": "what now" } ] }
    ] });
    let response = http
        .post(chat(addr))
        .bearer_auth(KEY)
        .json(&request)
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "assistant");
    let answer = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("an answer");
    // The last user message is the input (the caller's instructions at its head), the earlier
    // conversation is the session's history.
    assert!(answer.contains("what now"), "{answer}");
    assert!(answer.contains("be brief"), "{answer}");
    assert!(answer.ends_with("after hello"), "{answer}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(
        body["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0,
        "{body}"
    );
    let id = body["id"].as_str().expect("an id");
    let session = id.replacen("chatcmpl-", "chat-", 1);
    let store = cluster.store().await;
    let loaded = store.load("acme", &session).await.expect("the session");
    assert_eq!(loaded.state.history.len(), 4, "two seeded, the turn's two");
    assert_eq!(loaded.state.turns, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_completion_sends_chunks_then_its_usage_and_done() {
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &[]).await;
    let response = reqwest::Client::new()
        .post(chat(addr))
        .bearer_auth(KEY)
        .json(&json!({ "model": "assistant", "stream": true,
            "stream_options": { "include_usage": true },
            "messages": [ { "role": "user", "content": "stream it" } ] }))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream")));
    let text = response.text().await.expect("the stream");
    let data: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("a JSON chunk"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "you said stream it after ");
    let finish = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect::<Vec<_>>();
    assert_eq!(finish, ["stop"]);
    let usage = chunks.last().expect("a usage chunk");
    assert!(
        usage["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0,
        "{usage}"
    );
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_with_the_same_idempotency_key_is_the_same_run() {
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &[]).await;
    let http = reqwest::Client::new();
    let request = json!({ "model": "assistant", "messages": [
        { "role": "user", "content": "first" },
        { "role": "assistant", "content": "ok" },
        { "role": "user", "content": "once" } ] });
    let mut answers = Vec::new();
    for _ in 0..2 {
        let body: Value = http
            .post(chat(addr))
            .bearer_auth(KEY)
            .header("Idempotency-Key", "order-42")
            .json(&request)
            .send()
            .await
            .expect("answered")
            .json()
            .await
            .expect("json");
        answers.push(body);
    }
    assert_eq!(answers[0]["id"], answers[1]["id"]);
    assert_eq!(
        answers[0]["choices"][0]["message"]["content"],
        answers[1]["choices"][0]["message"]["content"]
    );
    let session = answers[0]["id"]
        .as_str()
        .expect("an id")
        .replacen("chatcmpl-", "chat-", 1);
    let loaded = cluster
        .store()
        .await
        .load("acme", &session)
        .await
        .expect("the session");
    assert_eq!(loaded.state.turns, 1, "the run was not started twice");
    assert_eq!(loaded.state.history.len(), 4);

    // A stream retried with its Idempotency-Key and the Last-Event-ID it saw resumes after it.
    let streamed = json!({ "model": "assistant", "stream": true, "messages": [
        { "role": "user", "content": "stream me" } ] });
    let chunks = |text: String| -> Vec<(u64, Value)> {
        let mut chunks = Vec::new();
        for block in text.split("\n\n") {
            let id = block
                .lines()
                .find_map(|l| l.strip_prefix("id: ")?.parse().ok());
            let data = block.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(id), Some(data)) = (id, data) {
                let mut chunk: Value = serde_json::from_str(data).unwrap_or(json!(data));
                // When each chunk was made is not part of what is compared.
                chunk.as_object_mut().map(|c| c.remove("created"));
                chunks.push((id, chunk));
            }
        }
        chunks
    };
    let mut seen = Vec::new();
    for last_event_id in [None, Some("2")] {
        let mut post = http
            .post(chat(addr))
            .bearer_auth(KEY)
            .header("Idempotency-Key", "stream-7")
            .json(&streamed);
        if let Some(last) = last_event_id {
            post = post.header("Last-Event-ID", last);
        }
        let text = post.send().await.expect("sent").text().await.expect("text");
        seen.push(chunks(text));
    }
    let ids: Vec<u64> = seen[0].iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        (1..=seen[0].len() as u64).collect::<Vec<_>>(),
        "numbered chunks"
    );
    assert!(seen[0].len() > 3, "{:?}", seen[0]);
    assert_eq!(
        seen[1],
        seen[0][2..],
        "the retry resumes after the second chunk"
    );
    let (status, e) = error_of(
        http.post(chat(addr))
            .bearer_auth(KEY)
            .header("Last-Event-ID", "2")
            .json(&streamed)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("Idempotency-Key")),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_clear_error_in_openais_shape() {
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &["--gateway-max-body", "4096"]).await;
    let http = reqwest::Client::new();
    let hello =
        json!({ "model": "assistant", "messages": [ { "role": "user", "content": "hi" } ] });

    let (status, e) = error_of(
        http.post(chat(addr))
            .json(&hello)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("missing_api_key"))
    );
    let (status, e) = error_of(
        http.post(chat(addr))
            .bearer_auth("sk-wrong")
            .json(&hello)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_api_key"))
    );
    let (status, e) = error_of(
        http.post(chat(addr))
            .bearer_auth(READ_ONLY_KEY)
            .json(&hello)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{e}");
    assert!(e["message"].as_str().unwrap_or("").contains("carol"), "{e}");

    let cases = [
        (
            json!({ "model": "nobody", "messages": [ { "role": "user", "content": "hi" } ] }),
            StatusCode::NOT_FOUND,
            "model_not_found",
        ),
        (
            json!({ "model": "assistant", "messages": [] }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({ "model": "assistant", "messages": [ { "role": "assistant", "content": "hi" } ] }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({ "model": "assistant", "messages": [ { "role": "tool", "content": "x" }, { "role": "user", "content": "hi" } ] }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({ "model": "assistant", "messages": [ { "role": "user", "content": [ { "type": "image_url", "image_url": { "url": "x" } } ] } ] }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({ "messages": "no model" }),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            json!({ "model": "assistant", "messages": [ { "role": "user", "content": "x".repeat(5000) } ] }),
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
    ];
    for (body, expected, code) in cases {
        let (status, e) = error_of(
            http.post(chat(addr))
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(
            (status, e["code"].as_str()),
            (expected, Some(code)),
            "{body}: {e}"
        );
        assert!(!e["message"].as_str().unwrap_or("").is_empty(), "{e}");
        assert!(e["type"].as_str().is_some());
    }
    let (status, e) = error_of(
        http.post(chat(addr))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    let (status, e) = error_of(
        http.get(format!("http://{addr}/v1/nothing"))
            .bearer_auth(KEY)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    // Nothing was lost or left half-done: the gateway still answers.
    let ok = http
        .post(chat(addr))
        .bearer_auth(KEY)
        .json(&hello)
        .send()
        .await
        .expect("sent");
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_is_cancelled_and_bad_response_requests_get_clear_errors() {
    let cluster = TestCluster::start();
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "slow-{{turn}}", "ms": 20000 } } ] },
        { "answer": "finished" }
    ] }]));
    let addr = gateway_before(&cluster, &script, &[]).await;
    let http = reqwest::Client::new();
    let responses = format!("http://{addr}/v1/responses");

    let created: Value = http
        .post(&responses)
        .bearer_auth(KEY)
        .json(&json!({ "model": "assistant", "input": "slowly", "background": true }))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(created["status"], "queued", "{created}");
    let id = created["id"].as_str().expect("an id").to_owned();
    // Cancelled once its call runs.
    let started = tokio::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(30)
        && read_effects(&cluster.effects_file()).is_empty()
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let cancelled: Value = http
        .post(format!("{responses}/{id}/cancel"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(
        cancelled["output"][0]["type"], "skein_tool_call",
        "{cancelled}"
    );
    assert_eq!(cancelled["output"][0]["name"], "slow_effect", "{cancelled}");
    let read: Value = http
        .get(format!("{responses}/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(read["status"], "cancelled", "{read}");
    // Another tenant's key does not find it, nor cancel it.
    for request in [
        http.get(format!("{responses}/{id}")),
        http.post(format!("{responses}/{id}/cancel")),
    ] {
        let (status, e) = error_of(
            request
                .bearer_auth(OTHER_TENANT_KEY)
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(
            (status, e["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("response_not_found"))
        );
    }

    let refused = [
        (json!({ "model": "assistant" }), "input"),
        (
            json!({ "model": "assistant", "input": [] }),
            "input is empty",
        ),
        (
            json!({ "model": "assistant", "input": "x", "tools": [ { "type": "function", "name": "f" } ] }),
            "tools are not accepted",
        ),
        (
            json!({ "model": "assistant", "input": [ { "type": "function_call_output", "call_id": "c", "output": "o" } ] }),
            "function_call_output",
        ),
        (
            json!({ "model": "assistant", "input": [ { "role": "assistant", "content": "hi" } ] }),
            "must be the user's",
        ),
        (
            json!({ "model": "assistant", "input": "x", "metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>() }),
            "metadata takes at most 16",
        ),
        (
            json!({ "model": "assistant", "input": [ { "role": "user", "content": "earlier" }, { "role": "user", "content": "x" } ], "previous_response_id": id }),
            "only the new user message",
        ),
    ];
    for (body, says) in refused {
        let (status, e) = error_of(
            http.post(&responses)
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {e}");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(says)),
            "{body}: {e}"
        );
    }
    let (status, e) = error_of(
        http.post(&responses)
            .bearer_auth(KEY)
            .json(
                &json!({ "model": "assistant", "input": "x", "previous_response_id": "resp_none" }),
            )
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("response_not_found"))
    );
    let (status, e) = error_of(
        http.get(format!("{responses}/{id}?stream=true&starting_after=soon"))
            .bearer_auth(KEY)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    let (status, _) = error_of(
        http.get(format!("{responses}/{id}"))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_rate_limited_browsers_of_listed_origins_are_served_and_every_route_is_documented()
{
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(
        &cluster,
        &[
            "--gateway-requests-per-minute",
            "3",
            "--gateway-cors-origins",
            "https://console.example.com",
        ],
    )
    .await;
    let http = reqwest::Client::new();

    // Every documented route exists: asked without a key, a keyed one says 401, never 404.
    let document: Value = http
        .get(format!("http://{addr}/openapi.json"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().expect("paths");
    assert!(paths.contains_key("/v1/responses/{id}"), "{document}");
    for (path, operations) in paths {
        for (method, operation) in operations.as_object().expect("operations") {
            // Every `{name}` segment (`{id}`, `{run_id}`, `{task_id}`, ...) gets a made-up value.
            let concrete = path
                .split('/')
                .map(|segment| {
                    if segment.starts_with('{') && segment.ends_with('}') {
                        "resp_x"
                    } else {
                        segment
                    }
                })
                .collect::<Vec<_>>()
                .join("/");
            let url = format!("http://{addr}{concrete}");
            let request = match method.as_str() {
                "get" => http.get(&url),
                "post" => http.post(&url),
                "patch" => http.patch(&url),
                "delete" => http.delete(&url),
                other => panic!("undocumented method {other}"),
            };
            let status = request.send().await.expect("sent").status();
            let keyed = operation["security"]
                .as_array()
                .is_some_and(|s| !s.is_empty());
            let expected = if keyed {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::OK
            };
            assert_eq!(status, expected, "{method} {path}");
        }
    }

    // Three requests a minute per key, counted across gateways in Redis. A minute about to
    // turn would restart the count: start in a fresh one.
    let second = skein_common::protocol::now_ms() / 1000 % 60;
    if second > 50 {
        tokio::time::sleep(std::time::Duration::from_secs(61 - second)).await;
    }
    let models = format!("http://{addr}/v1/models");
    for _ in 0..3 {
        let status = http
            .get(&models)
            .bearer_auth(KEY)
            .send()
            .await
            .expect("sent")
            .status();
        assert_eq!(status, StatusCode::OK);
    }
    let refused = http
        .get(&models)
        .bearer_auth(KEY)
        .send()
        .await
        .expect("sent");
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let (status, e) = error_of(refused).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limit_exceeded"))
    );
    // Another key of the same tenant has its own count.
    let status = http
        .get(&models)
        .bearer_auth(SECOND_KEY)
        .send()
        .await
        .expect("sent")
        .status();
    assert_eq!(status, StatusCode::OK);

    // A listed origin's preflight is answered; another origin's is refused.
    let preflight = |origin: &str| {
        http.request(
            reqwest::Method::OPTIONS,
            format!("http://{addr}/v1/responses"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type, idempotency-key",
        )
        .send()
    };
    let allowed = preflight("https://console.example.com")
        .await
        .expect("sent");
    assert_eq!(allowed.status(), StatusCode::NO_CONTENT);
    let header = |response: &reqwest::Response, name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        header(&allowed, "access-control-allow-origin").as_deref(),
        Some("https://console.example.com")
    );
    assert!(header(&allowed, "access-control-allow-headers")
        .is_some_and(|h| h.contains("idempotency-key")));
    let other = preflight("https://elsewhere.example.com")
        .await
        .expect("sent");
    assert_eq!(other.status(), StatusCode::FORBIDDEN);
    // A simple answer carries the header only for a listed origin.
    for (origin, expected) in [
        (
            "https://console.example.com",
            Some("https://console.example.com"),
        ),
        ("https://elsewhere.example.com", None),
    ] {
        let response = http
            .get(format!("http://{addr}/healthz"))
            .header("origin", origin)
            .send()
            .await
            .expect("sent");
        assert_eq!(
            header(&response, "access-control-allow-origin").as_deref(),
            expected
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_does_not_send_its_headers_in_time_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = TestCluster::start();
    let addr = cluster_with_gateway(&cluster, &["--gateway-header-timeout", "1s"]).await;
    // Half a request, then nothing: the gateway closes the connection. The bound on each wait
    // below is 10 s: well past the configured 1 s, yet well short of the 30 s hyper would use by
    // default, so a gateway that ignored the flag would fail here rather than pass late.
    let bound = std::time::Duration::from_secs(10);
    let mut slow = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connected");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("written");
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(bound, slow.read_to_end(&mut answer))
        .await
        .expect("the gateway closes a connection whose headers do not come");
    assert!(
        closed.is_err() || !String::from_utf8_lossy(&answer).contains("200 OK"),
        "no answer to half a request: {}",
        String::from_utf8_lossy(&answer)
    );
    // An idle keep-alive connection is closed the same way after its response.
    let mut idle = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connected");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("written");
    let mut answer = Vec::new();
    tokio::time::timeout(bound, idle.read_to_end(&mut answer))
        .await
        .expect("the idle connection is closed")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with("ok"),
        "one answer, then the connection closed: {answer}"
    );
}
