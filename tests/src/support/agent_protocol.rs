//! The gateway's Agent Protocol in tests: a client for its routes (`x-api-key`, JSON in and out),
//! a run's stream read into its parts, a run's input, the messages of its values, the run a
//! response's `Content-Location` names, and how often an effect of the test tools started.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::cluster::TestCluster;
use super::test_tools::read_effects;

/// One part of a run's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub event: String,
    pub data: Value,
    pub id: Option<u64>,
}

pub fn parts_of(text: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    for block in text.split("\n\n") {
        let (mut event, mut data, mut id) = (None, String::new(), None);
        for line in block.lines() {
            if let Some(name) = line.strip_prefix("event: ") {
                event = Some(name.to_owned());
            } else if let Some(more) = line.strip_prefix("data: ") {
                data.push_str(more);
            } else if let Some(n) = line.strip_prefix("id: ") {
                id = n.parse().ok();
            }
        }
        if let Some(event) = event {
            let data = serde_json::from_str(&data).unwrap_or(Value::Null);
            parts.push(Part { event, data, id });
        }
    }
    parts
}

pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
}

impl Api {
    pub fn new(addr: std::net::SocketAddr) -> Self {
        Api {
            http: reqwest::Client::new(),
            base: format!("http://{addr}"),
        }
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let response = self.send(method, path, key, body, &[]).await;
        let status = response.status();
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("x-api-key", key);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send().await.expect("sent")
    }

    pub async fn ok(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> Value {
        let (status, body) = self.call(method, path, key, body).await;
        assert!(status.is_success(), "{method} {path}: {status} {body}");
        body
    }

    pub async fn stream(
        &self,
        path: &str,
        key: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (reqwest::header::HeaderMap, Vec<Part>) {
        let method = if body.is_some() { "POST" } else { "GET" };
        let response = self.send(method, path, key, body, headers).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers().clone();
        let text = response.text().await.expect("a stream");
        (headers, parts_of(&text))
    }

    pub async fn thread(&self, key: &str) -> String {
        let thread = self.ok("POST", "/threads", key, Some(json!({}))).await;
        thread["thread_id"].as_str().expect("an id").to_owned()
    }
}

pub fn said(text: &str) -> Value {
    json!({ "messages": [ { "role": "user", "content": text } ] })
}

pub fn contents(values: &Value) -> Vec<String> {
    values["messages"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|m| {
            format!(
                "{}:{}",
                m["type"].as_str().unwrap_or("?"),
                m["content"].as_str().unwrap_or("")
            )
        })
        .collect()
}

pub fn run_of(headers: &reqwest::header::HeaderMap) -> String {
    let location = headers
        .get("content-location")
        .and_then(|v| v.to_str().ok())
        .expect("Content-Location names the run");
    location.rsplit('/').next().expect("a run id").to_owned()
}

pub fn started(cluster: &TestCluster, key: &str) -> usize {
    read_effects(&cluster.effects_file())
        .get(key)
        .map_or(0, |c| c.started)
}
