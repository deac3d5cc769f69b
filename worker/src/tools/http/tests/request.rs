//! `http_request`: methods, bodies, caller headers, response rendering, redirects of other
//! methods, unreachable servers and redirect loops; the tools' declared effects.

use super::*;

// ---- methods, bodies, headers ----

#[tokio::test]
async fn methods_and_bodies_reach_the_server() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let requests = [
        json!({ "method": "POST", "url": server.url("/a"), "json": { "name": "x", "n": [1, 2] } }),
        json!({ "method": "PUT", "url": server.url("/b"), "body": "a,b\n1,2", "content_type": "text/csv" }),
        json!({ "method": "patch", "url": server.url("/c"), "json": { "n": 3 }, "content_type": "application/merge-patch+json" }),
        json!({ "method": "DELETE", "url": server.url("/d"), "body": "why" }),
        json!({ "method": "GET", "url": server.url("/e") }),
    ];
    for request in &requests {
        let output = call(&registry, "http_request", request.clone())
            .await
            .expect("answered");
        assert!(
            output.starts_with("HTTP 200 OK\ncontent-type: text/plain"),
            "{output}"
        );
    }
    let head = call(
        &registry,
        "http_request",
        json!({ "method": "HEAD", "url": server.url("/f") }),
    )
    .await
    .expect("answered");
    assert!(head.ends_with("\n\n(no body: HEAD request)"), "{head}");

    let seen: Vec<(String, String, Option<String>, String)> = server
        .seen()
        .iter()
        .map(|s| {
            (
                s.method.clone(),
                s.path.clone(),
                s.header("content-type").map(str::to_owned),
                String::from_utf8_lossy(&s.body).into_owned(),
            )
        })
        .collect();
    let row = |m: &str, p: &str, t: Option<&str>, b: &str| {
        (
            m.to_owned(),
            p.to_owned(),
            t.map(str::to_owned),
            b.to_owned(),
        )
    };
    assert_eq!(
        seen,
        [
            row(
                "POST",
                "/a",
                Some("application/json"),
                r#"{"n":[1,2],"name":"x"}"#
            ),
            row("PUT", "/b", Some("text/csv"), "a,b\n1,2"),
            row(
                "PATCH",
                "/c",
                Some("application/merge-patch+json"),
                r#"{"n":3}"#
            ),
            row("DELETE", "/d", Some("text/plain; charset=utf-8"), "why"),
            row("GET", "/e", None, ""),
            row("HEAD", "/f", None, ""),
        ]
    );
}

#[tokio::test]
async fn request_bodies_over_the_cap_are_too_large_and_not_sent() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let url = server.url("/upload");
    let over = "x".repeat(MAX_REQUEST_BODY_BYTES + 1);
    for request in [
        json!({ "method": "POST", "url": url, "body": over }),
        json!({ "method": "PUT", "url": url, "json": { "data": over } }),
    ] {
        match call(&registry, "http_request", request).await {
            Err(ToolError::TooLarge(message)) => {
                assert!(
                    message.contains(&MAX_REQUEST_BODY_BYTES.to_string()),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(server.seen().is_empty());
    let at_cap = "x".repeat(MAX_REQUEST_BODY_BYTES);
    call(
        &registry,
        "http_request",
        json!({ "method": "POST", "url": url, "body": at_cap }),
    )
    .await
    .expect("a body at the cap is sent");
    assert_eq!(server.seen()[0].body.len(), MAX_REQUEST_BODY_BYTES);
}

#[tokio::test]
async fn caller_headers_are_checked_and_sent() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let url = server.url("/h");
    let refused = [
        ("Host", "evil.test"),
        ("Content-Length", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close"),
        ("Cookie", "a=b"),
        ("Idempotency-Key", "mine"),
        ("Content-Type", "text/plain"),
        ("Proxy-Authorization", "Basic x"),
        ("Sec-Fetch-Site", "none"),
        ("bad name", "x"),
        ("X-Split", "a\r\nInjected: yes"),
    ];
    for (name, value) in refused {
        let request =
            json!({ "method": "POST", "url": url, "body": "b", "headers": { name: value } });
        let message = invalid(call(&registry, "http_request", request).await);
        assert!(message.contains(name), "{name}: {message}");
    }
    let many: serde_json::Map<String, Value> = (0..=MAX_HEADERS)
        .map(|i| (format!("x-h{i}"), json!("v")))
        .collect();
    invalid(
        call(
            &registry,
            "http_request",
            json!({ "method": "GET", "url": url, "headers": many }),
        )
        .await,
    );
    assert!(server.seen().is_empty(), "nothing was sent");

    let request = json!({
        "method": "GET",
        "url": url,
        "headers": { "Authorization": "Bearer t0k", "X-Custom": "yes", "Accept": "text/plain" },
    });
    call(&registry, "http_request", request)
        .await
        .expect("sent");
    let seen = &server.seen()[0];
    assert_eq!(seen.header("authorization"), Some("Bearer t0k"));
    assert_eq!(seen.header("x-custom"), Some("yes"));
    assert_eq!(seen.header("accept"), Some("text/plain"));
    assert_eq!(seen.header(IDEMPOTENCY_KEY), Some("key-1"));
}

#[tokio::test]
async fn bad_arguments_are_refused_before_sending() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let url = server.url("/x");
    let cases = [
        (
            json!({ "method": "POST", "url": url, "json": {}, "body": "b" }),
            "not both",
        ),
        (
            json!({ "method": "GET", "url": url, "body": "b" }),
            "takes no body",
        ),
        (
            json!({ "method": "HEAD", "url": url, "json": [] }),
            "takes no body",
        ),
        (
            json!({ "method": "POST", "url": url, "content_type": "text/csv" }),
            "content_type",
        ),
        (json!({ "method": "TRACE", "url": url }), "unknown variant"),
        (json!({ "method": "POST", "url": "nowhere" }), "url"),
    ];
    for (request, expected) in cases {
        let message = invalid(call(&registry, "http_request", request.clone()).await);
        assert!(message.contains(expected), "{request}: {message}");
    }
    assert!(server.seen().is_empty());
}

// ---- responses ----

#[tokio::test]
async fn responses_render_status_headers_and_text_or_a_description() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let request = |path: &str| json!({ "method": "GET", "url": server.url(path) });

    let not_found = call(&registry, "http_request", request("/status/404"))
        .await
        .expect("a 404 is output");
    assert!(
        not_found.starts_with("HTTP 404 Not Found\ncontent-type: text/plain")
            && not_found.ends_with("\n\nstatus body"),
        "{not_found}"
    );
    assert_eq!(
        fetch(&registry, &server.url("/status/500")).await,
        Ok("HTTP 500 Internal Server Error\n\nstatus body".to_owned())
    );

    let binary = call(&registry, "http_request", request("/binary"))
        .await
        .expect("answered");
    assert!(
        binary.ends_with("\n\n[binary body: 8 bytes of image/png, not shown]"),
        "{binary}"
    );

    let big = call(&registry, "http_request", request("/big"))
        .await
        .expect("answered");
    assert!(
        big.contains("content-length: 4096")
            && big.ends_with(&format!(
                "{}\n[response truncated at 1024 of 4096 bytes]",
                "x".repeat(1024)
            )),
        "{big}"
    );
    let small = call(
        &registry,
        "http_request",
        json!({ "method": "GET", "url": server.url("/big"), "max_bytes": 10 }),
    )
    .await
    .expect("answered");
    assert!(
        small.ends_with("\n\nxxxxxxxxxx\n[response truncated at 10 of 4096 bytes]"),
        "{small}"
    );
}

#[tokio::test]
async fn other_methods_follow_only_307_and_308_and_keep_credentials_in_their_origin() {
    let front = Server::start("127.0.0.1").await;
    let other = Server::start("127.0.0.2").await;
    let registry = tools(&["127.0.0.1", "127.0.0.2"], false, &[]);
    let post = |path: String| {
        json!({
            "method": "POST",
            "url": front.url(&path),
            "json": { "a": 1 },
            "headers": { "Authorization": "Bearer t0k" },
        })
    };

    let see_other = call(
        &registry,
        "http_request",
        post(format!("/redirect/303?{}", front.url("/done"))),
    )
    .await
    .expect("a 303 is output");
    assert!(
        see_other.starts_with("HTTP 303 See Other\n")
            && see_other.contains(&format!("\nlocation: {}\n", front.url("/done"))),
        "{see_other}"
    );
    assert_eq!(front.seen().len(), 1, "not followed");

    for code in ["307", "308"] {
        let output = call(
            &registry,
            "http_request",
            post(format!("/redirect/{code}?{}", front.url("/same"))),
        )
        .await
        .expect("followed");
        assert!(output.ends_with("seen POST /same"), "{output}");
        call(
            &registry,
            "http_request",
            post(format!("/redirect/{code}?{}", other.url("/away"))),
        )
        .await
        .expect("followed");
    }
    let front_seen = front.seen();
    assert!(
        front_seen
            .iter()
            .all(|s| s.header("authorization") == Some("Bearer t0k") && s.method == "POST"),
        "{front_seen:?}"
    );
    let away = other.seen();
    assert_eq!(away.len(), 2);
    for seen in &away {
        assert_eq!(
            (seen.method.as_str(), seen.body.as_slice()),
            ("POST", &br#"{"a":1}"#[..])
        );
        assert_eq!(
            seen.header("authorization"),
            None,
            "not sent to another origin"
        );
        assert!(seen.header(IDEMPOTENCY_KEY).is_some());
    }
}

#[tokio::test]
async fn unreachable_servers_are_unavailable() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let registry = tools(&["127.0.0.1"], false, &[]);
    let url = format!("http://127.0.0.1:{port}/");
    for result in [
        fetch(&registry, &url).await,
        call(
            &registry,
            "http_request",
            json!({ "method": "POST", "url": url, "body": "b" }),
        )
        .await,
    ] {
        match result {
            Err(ToolError::Unavailable(message)) => {
                assert!(message.contains("127.0.0.1"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn redirect_loops_stop() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let url = server.url("/loop");
    match fetch(&registry, &url).await {
        Err(ToolError::Failed(message)) => assert!(message.contains("redirects"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.seen().len(), MAX_REDIRECTS + 1);
}

#[test]
fn effects_and_descriptions() {
    let registry = tools(&["api.example.com"], false, &[]);
    let fetch = registry.spec("http_fetch").expect("http_fetch");
    assert!(fetch.effects.read_only && !fetch.effects.destructive);
    let request = registry.spec("http_request").expect("http_request");
    assert!(request.effects.destructive && !request.effects.read_only);
    assert!(
        request.description.contains("api.example.com")
            && request.description.contains("Idempotency-Key")
            && request.description.contains("refused"),
        "{}",
        request.description
    );
    let open = tools(&["api.example.com"], true, &[]);
    let description = &open.spec("http_request").expect("http_request").description;
    assert!(!description.contains("refused"), "{description}");
}
