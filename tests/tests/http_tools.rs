//! The HTTP tools on a real worker, driven by a scripted model: `http_request` POSTs a JSON body
//! with the call's `Idempotency-Key` (the same on the retry after a dropped connection), and
//! `http_fetch` aimed at the cloud metadata address or at a name of the loopback interface is
//! denied as an observation, with nothing sent.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::json;
use skein_common::protocol::TurnStatus;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::unique;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One request the recording server read.
#[derive(Debug, Clone)]
struct Seen {
    request_line: String,
    /// Header lines, names lower-cased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 server on 127.0.0.1 that records every request; it drops the connection of the
/// first one without answering (a transient failure) and answers the others `201 Created`.
struct FlakyServer {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FlakyServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("bound address").port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let Some(request) = read_request(socket).await else {
                    continue;
                };
                let (request, mut socket) = request;
                let first = {
                    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                    log.push(request);
                    log.len() == 1
                };
                if first {
                    drop(socket);
                    continue;
                }
                let body = r#"{"id":1}"#;
                let response = format!(
                    "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            }
        });
        Self { port, seen, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FlakyServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads a request head and its `content-length` body.
async fn read_request(socket: tokio::net::TcpStream) -> Option<(Seen, tokio::net::TcpStream)> {
    let mut reader = BufReader::new(socket);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await.ok()?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.ok()?;
    let seen = Seen {
        request_line: request_line.trim_end().to_owned(),
        headers,
        body,
    };
    Some((seen, reader.into_inner()))
}

/// An agents directory whose `assistant` may use `http_request` without asking.
fn agents_allowing_http_request(cluster: &TestCluster) -> String {
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nallow = [\"http_request\"]\n+++\nYou call APIs.\n",
    )
    .expect("AGENTS.md written");
    agents.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_posts_json_with_one_idempotency_key_across_a_retry() {
    let cluster = TestCluster::start();
    let server = FlakyServer::start().await;
    // The server is reached by name: `localhost` resolves to loopback, which the worker refuses
    // unless private addresses are allowed.
    let url = format!("http://localhost:{}/orders", server.port);
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "http_request", "arguments": {
            "method": "POST", "url": url, "json": { "item": "tea", "quantity": 2 }
        } } ] },
        { "answer": "{{observations}}" }
    ] }]));
    cluster.spawn_worker(cluster.worker_config(&[
        "--tools",
        "http_request",
        "--http-allow",
        "localhost",
        "--http-allow-private",
        "true",
    ]));
    cluster.wait_for_workers(1).await;
    let agents = agents_allowing_http_request(&cluster);
    cluster.spawn_lead(cluster.lead_config(&["--scenario", &script, "--agents-dir", &agents]));

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "order tea"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    assert!(
        answer.starts_with("HTTP 201 Created\ncontent-type: application/json")
            && answer.ends_with("\n\n{\"id\":1}"),
        "{answer}"
    );

    let seen = server.seen();
    assert_eq!(
        seen.len(),
        2,
        "the dropped request was sent again: {seen:?}"
    );
    let key = seen[0].header("idempotency-key").expect("a key").to_owned();
    assert!(uuid::Uuid::parse_str(&key).is_ok(), "{key}");
    for request in &seen {
        assert_eq!(request.request_line, "POST /orders HTTP/1.1");
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.header("idempotency-key"), Some(key.as_str()));
        let body: serde_json::Value = serde_json::from_slice(&request.body).expect("a JSON body");
        assert_eq!(body, json!({ "item": "tea", "quantity": 2 }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_fetch_of_metadata_and_loopback_addresses_is_denied() {
    let cluster = TestCluster::start();
    let server = FlakyServer::start().await;
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [
            { "name": "http_fetch", "arguments": { "url": "http://169.254.169.254/latest/meta-data/" } },
            { "name": "http_fetch", "arguments": { "url": format!("http://localhost:{}/", server.port) } },
            { "name": "http_fetch", "arguments": { "url": format!("http://[::ffff:127.0.0.1]:{}/", server.port) } }
        ] },
        { "answer": "{{observations}}" }
    ] }]));
    // Default tools, every host allowed, private addresses not.
    cluster.spawn_worker(cluster.worker_config(&["--http-allow", "*"]));
    cluster.wait_for_workers(1).await;
    cluster.start_nodes(0, &["--scenario", &script]).await;

    let (result, _) = cluster
        .run(&submission("acme", &unique("s"), "look around"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let answer = result.answer.unwrap_or_default();
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 3, "{answer}");
    assert!(
        lines[0].starts_with("error (denied): refused: 169.254.169.254 is a link-local address"),
        "{answer}"
    );
    assert!(
        lines[1].starts_with("error (denied): refused: localhost resolves to")
            && lines[1].contains("loopback"),
        "{answer}"
    );
    assert!(
        lines[2].starts_with("error (denied): refused: ::ffff:127.0.0.1 is a loopback address"),
        "{answer}"
    );
    assert!(
        lines.iter().all(|l| l.contains("SKEIN_HTTP_ALLOW_PRIVATE")),
        "{answer}"
    );
    assert!(server.seen().is_empty(), "nothing was sent");

    // `http_request` is not among the default tools.
    let workers = cluster
        .store()
        .await
        .live_workers()
        .await
        .expect("registry");
    let tools: Vec<&str> = workers[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        tools.contains(&"http_fetch") && !tools.contains(&"http_request"),
        "{tools:?}"
    );
}
