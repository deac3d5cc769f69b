//! The HTTP tools against in-process HTTP servers on loopback addresses: the recording server and
//! the helpers, the allowlist, the address guard (literal hosts, names, redirects) and the
//! idempotency key; `request` covers methods, bodies, caps and header refusals.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode as AxumStatus};
use axum::response::{IntoResponse, Response};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::{json, Value};

use super::*;
use crate::tools::test_support::{origin, scope, TestDir};
use crate::tools::{idempotency_key, ToolContext, ToolRegistry};

fn patterns(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

// ---- a recording server ----

/// One request a test server received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// An HTTP server on a loopback address that records every request. `/redirect/<code>?<target>`
/// redirects, `/status/<code>` answers that status, `/binary` a PNG-ish body, `/big` 4 KiB of
/// text, `/loop` redirects to itself; anything else answers `seen <METHOD> <path>`.
struct Server {
    addr: SocketAddr,
    log: Log,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(ip: &str) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let log = Log::default();
        let app = axum::Router::new().fallback(answer).with_state(log.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, log, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn seen(&self) -> Vec<Seen> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(log): State<Log>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 4 << 20)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Seen {
            method: parts.method.to_string(),
            path: path.clone(),
            headers: parts.headers.clone(),
            body,
        });
    let status = |code: &str| {
        AxumStatus::from_u16(code.parse().unwrap_or(500)).unwrap_or(AxumStatus::IM_A_TEAPOT)
    };
    if let Some(code) = path.strip_prefix("/redirect/") {
        let target = parts.uri.query().unwrap_or("/").to_owned();
        return (status(code), [(header::LOCATION, target)]).into_response();
    }
    if let Some(code) = path.strip_prefix("/status/") {
        return (status(code), "status body").into_response();
    }
    match path.as_str() {
        "/binary" => (
            [(header::CONTENT_TYPE, "image/png")],
            vec![0x89, b'P', b'N', b'G', 0, 1, 2, 3],
        )
            .into_response(),
        "/big" => "x".repeat(4096).into_response(),
        "/loop" => (AxumStatus::FOUND, [(header::LOCATION, "/loop")]).into_response(),
        _ => format!("seen {} {path}", parts.method).into_response(),
    }
}

// ---- tools under test ----

/// Resolves the names a test maps; any other name is an error.
struct Names(Vec<(String, IpAddr)>);

impl Resolve for Names {
    fn resolve(&self, name: Name) -> Resolving {
        let found: Vec<SocketAddr> = self
            .0
            .iter()
            .filter(|(n, _)| n == name.as_str())
            .map(|(_, ip)| SocketAddr::new(*ip, 0))
            .collect();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            if found.is_empty() {
                Err(format!("no test address for {name}").into())
            } else {
                Ok(Box::new(found.into_iter()) as Addrs)
            }
        })
    }
}

/// A registry with both HTTP tools. With `names`, names resolve through that map (behind the
/// guard); without, through the system resolver.
fn tools(allow: &[&str], allow_private: bool, names: &[(&str, &str)]) -> ToolRegistry {
    let policy = AddressPolicy::new(&patterns(allow), allow_private);
    let connect = Duration::from_secs(2);
    let client = if names.is_empty() {
        client(connect, policy)
    } else {
        let map = names
            .iter()
            .map(|(n, ip)| (n.to_string(), ip.parse().expect("test address")))
            .collect();
        client_with_resolver(
            connect,
            GuardedResolver::wrapping(policy, Arc::new(Names(map))),
        )
    }
    .expect("client");
    let settings = HttpSettings {
        allow: patterns(allow),
        allow_private,
        max_bytes: 1024,
        timeout: Duration::from_secs(10),
    };
    let mut registry = ToolRegistry::new();
    registry.register(HttpFetch::new(client.clone(), &settings));
    registry.register(HttpRequest::new(client, &settings));
    registry
}

async fn call_with_key(
    registry: &ToolRegistry,
    tool: &str,
    arguments: Value,
    key: &str,
) -> Result<String, ToolError> {
    let dir = TestDir::new();
    let mut scope = scope(&dir);
    let origin = origin("acme", "s1");
    let ctx = ToolContext {
        origin: &origin,
        call_id: "c1",
        idempotency_key: key,
        time_limit: std::time::Duration::from_secs(60),
        scope: &mut scope,
    };
    let result = registry.call(tool, arguments, ctx).await;
    scope.close().await.expect("scope closes");
    result
}

async fn call(registry: &ToolRegistry, tool: &str, arguments: Value) -> Result<String, ToolError> {
    call_with_key(registry, tool, arguments, "key-1").await
}

async fn fetch(registry: &ToolRegistry, url: &str) -> Result<String, ToolError> {
    call(registry, "http_fetch", json!({ "url": url })).await
}

fn denied(result: Result<String, ToolError>) -> String {
    match result {
        Err(ToolError::Denied(message)) => message,
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn invalid(result: Result<String, ToolError>) -> String {
    match result {
        Err(ToolError::InvalidArguments(message)) => message,
        other => panic!("expected invalid arguments, got {other:?}"),
    }
}

// ---- the allowlist ----

#[test]
fn exact_hosts_match_ignoring_case_and_trailing_dot() {
    let allow = patterns(&["api.example.com", "[::1]", "10.0.0.1"]);
    assert!(host_allowed("api.example.com", &allow));
    assert!(host_allowed("API.Example.com.", &allow));
    assert!(host_allowed("[::1]", &allow));
    assert!(host_allowed("10.0.0.1", &allow));
    assert!(!host_allowed("example.com", &allow));
    assert!(!host_allowed("evil.api.example.com", &allow));
    assert!(!host_allowed("api.example.com.evil.net", &allow));
}

#[test]
fn suffix_patterns_match_subdomains_only() {
    let allow = patterns(&["*.example.com"]);
    assert!(host_allowed("a.example.com", &allow));
    assert!(host_allowed("a.b.example.com", &allow));
    assert!(!host_allowed("example.com", &allow));
    assert!(!host_allowed("badexample.com", &allow));
    assert!(!host_allowed(".example.com", &allow));
    assert!(!host_allowed("example.com.evil.net", &allow));
}

#[test]
fn star_allows_all_and_empty_allows_none() {
    assert!(host_allowed("anything.test", &patterns(&["*"])));
    assert!(!host_allowed("anything.test", &[]));
    assert!(!host_allowed(
        "anything.test",
        &patterns(&["", "*.", "*x.test"])
    ));
    assert!(!host_allowed("", &patterns(&["*"])));
}

#[tokio::test]
async fn refusals_happen_before_any_request() {
    let message = denied(fetch(&tools(&[], false, &[]), "https://example.com/").await);
    assert!(
        message.contains("example.com") && message.contains(ENV_HTTP_ALLOW),
        "{message}"
    );
    let message = denied(
        fetch(
            &tools(&["*.example.com"], false, &[]),
            "https://example.org/",
        )
        .await,
    );
    assert!(message.contains("example.org"), "{message}");
    let any = tools(&["*"], false, &[]);
    denied(fetch(&any, "file:///etc/passwd").await);
    invalid(fetch(&any, "not a url").await);
}

// ---- the address guard ----

#[tokio::test]
async fn literal_hosts_of_refused_classes_are_denied_by_both_tools() {
    let any = tools(&["*"], false, &[]);
    let cases = [
        ("http://10.0.0.5/", "10.0.0.5 is a private address"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 is a link-local address",
        ),
        ("http://127.0.0.1:1/", "127.0.0.1 is a loopback address"),
        ("http://0x7f.1:1/", "127.0.0.1 is a loopback address"),
        ("http://[::1]:1/", "::1 is a loopback address"),
        (
            "http://[::ffff:127.0.0.1]:1/",
            "::ffff:127.0.0.1 is a loopback address (it carries 127.0.0.1)",
        ),
        ("http://[fd00::1]/", "fd00::1 is a unique-local address"),
        (
            "http://100.64.0.1/",
            "100.64.0.1 is a shared (carrier-grade NAT) address",
        ),
        ("http://0.0.0.0:1/", "0.0.0.0 is an unspecified address"),
    ];
    for (url, expected) in cases {
        let message = denied(fetch(&any, url).await);
        assert!(
            message.starts_with(&format!("refused: {expected}"))
                && message.contains(ENV_HTTP_ALLOW_PRIVATE),
            "{url}: {message}"
        );
        let message = denied(
            call(
                &any,
                "http_request",
                json!({ "method": "POST", "url": url, "json": {} }),
            )
            .await,
        );
        assert!(message.contains(expected), "{url}: {message}");
    }
}

#[tokio::test]
async fn an_allowlisted_address_is_reached() {
    let server = Server::start("127.0.0.1").await;
    let named = tools(&["127.0.0.1"], false, &[]);
    assert_eq!(
        fetch(&named, &server.url("/page")).await,
        Ok("seen GET /page".to_owned())
    );
    let output = call(
        &named,
        "http_request",
        json!({ "method": "DELETE", "url": server.url("/item/7") }),
    )
    .await
    .expect("deleted");
    assert!(output.starts_with("HTTP 200 OK\n"), "{output}");
    assert!(output.ends_with("\n\nseen DELETE /item/7"), "{output}");
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn names_resolving_to_private_addresses_need_the_setting() {
    let server = Server::start("127.0.0.1").await;
    let names = [("service.test", "127.0.0.1")];
    let url = format!("http://service.test:{}/page", server.port());

    let strict = tools(&["service.test"], false, &names);
    let message = denied(fetch(&strict, &url).await);
    assert!(
        message.starts_with(
            "refused: service.test resolves to 127.0.0.1, which is a loopback address"
        ),
        "{message}"
    );
    assert!(server.seen().is_empty(), "nothing was sent");

    let open = tools(&["service.test"], true, &names);
    assert_eq!(fetch(&open, &url).await, Ok("seen GET /page".to_owned()));

    let named = tools(&["service.test", "127.0.0.1"], false, &names);
    assert_eq!(fetch(&named, &url).await, Ok("seen GET /page".to_owned()));
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn localhost_is_refused_through_the_system_resolver() {
    let server = Server::start("127.0.0.1").await;
    let strict = tools(&["localhost"], false, &[]);
    let message = denied(fetch(&strict, &format!("http://localhost:{}/", server.port())).await);
    assert!(
        message.starts_with("refused: localhost resolves to") && message.contains("loopback"),
        "{message}"
    );
    assert!(server.seen().is_empty());
}

#[tokio::test]
async fn redirects_to_refused_addresses_are_denied_before_they_are_followed() {
    // `inside` stands for a service on the worker's own network: it must never be reached.
    let front = Server::start("127.0.0.1").await;
    let inside = Server::start("127.0.0.2").await;
    let names = [("front.test", "127.0.0.1"), ("internal.test", "127.0.0.2")];
    let registry = tools(
        &["127.0.0.1", "front.test", "internal.test", "*"],
        false,
        &names,
    );
    let front_url = |path: &str| format!("http://front.test:{}{path}", front.port());
    let cases = [
        (
            format!("http://internal.test:{}/secret", inside.port()),
            "internal.test resolves to 127.0.0.2, which is a loopback address".to_owned(),
        ),
        (
            format!("http://127.0.0.2:{}/secret", inside.port()),
            "127.0.0.2 is a loopback address".to_owned(),
        ),
        (
            format!("http://[::ffff:127.0.0.2]:{}/secret", inside.port()),
            "::ffff:127.0.0.2 is a loopback address".to_owned(),
        ),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "169.254.169.254 is a link-local address".to_owned(),
        ),
    ];
    for (target, expected) in &cases {
        for code in ["302", "307"] {
            let url = front_url(&format!("/redirect/{code}?{target}"));
            let message = denied(fetch(&registry, &url).await);
            assert!(message.contains(expected.as_str()), "{url}: {message}");
        }
    }
    assert_eq!(front.seen().len(), 2 * cases.len());
    assert!(inside.seen().is_empty(), "{:?}", inside.seen());

    // An allowed target is followed.
    let url = front_url(&format!("/redirect/302?{}", front.url("/landing")));
    assert_eq!(
        fetch(&registry, &url).await,
        Ok("seen GET /landing".to_owned())
    );
}

// ---- idempotency key ----

#[tokio::test]
async fn every_request_and_hop_carries_the_calls_idempotency_key() {
    let server = Server::start("127.0.0.1").await;
    let registry = tools(&["127.0.0.1"], false, &[]);
    let origin = origin("acme", "s1");
    let key = idempotency_key(&origin, "task-1/0/c1");
    assert_eq!(key, idempotency_key(&origin, "task-1/0/c1"), "stable");
    let other = idempotency_key(&origin, "task-1/0/c2");
    assert_ne!(key, other);

    // The same call run twice (a redelivery), then another call.
    let post = json!({
        "method": "POST",
        "url": server.url(&format!("/redirect/307?{}", server.url("/orders"))),
        "json": { "item": 7 },
    });
    for run_key in [&key, &key, &other] {
        call_with_key(&registry, "http_request", post.clone(), run_key)
            .await
            .expect("posted");
    }
    call_with_key(
        &registry,
        "http_fetch",
        json!({ "url": server.url("/page") }),
        &key,
    )
    .await
    .expect("fetched");

    let seen = server.seen();
    let keys: Vec<(&str, &str, Option<&str>)> = seen
        .iter()
        .map(|s| {
            (
                s.method.as_str(),
                s.path.as_str(),
                s.header(IDEMPOTENCY_KEY),
            )
        })
        .collect();
    let (k, o) = (Some(key.as_str()), Some(other.as_str()));
    assert_eq!(
        keys,
        [
            ("POST", "/redirect/307", k),
            ("POST", "/orders", k),
            ("POST", "/redirect/307", k),
            ("POST", "/orders", k),
            ("POST", "/redirect/307", o),
            ("POST", "/orders", o),
            ("GET", "/page", k),
        ]
    );
    assert_eq!(seen[1].body, br#"{"item":7}"#, "a 307 re-sends the body");
}

mod request;
