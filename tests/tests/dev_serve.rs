//! `skein dev --serve`: the local cluster stays up with an HTTP gateway in front of it, whose URL
//! and key it prints; a client that uses them gets an answer from the cluster; Ctrl-C stops
//! everything, the gateway included.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dev_cluster_serves_http_with_the_key_it_prints_until_ctrl_c() {
    let mut dev = Command::new(NODE)
        .args(["dev", "--serve", "--fresh"])
        .env_remove("SKEIN_MODEL_PROVIDER")
        .env_remove("SKEIN_GATEWAY_ADDR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("skein dev starts");
    let stderr = dev.stderr.take().expect("stderr");
    let (lines, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut said = Vec::new();
    let gateway = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = heard.recv().await {
            said.push(line.clone());
            if let Some(rest) = line.strip_prefix("gateway at ") {
                return Some(rest.to_owned());
            }
        }
        None
    })
    .await;
    let Ok(Some(gateway)) = gateway else {
        let _ = dev.kill();
        panic!("no gateway line; skein dev said:\n{}", said.join("\n"));
    };
    // "http://127.0.0.1:PORT/v1 · key sk-dev-... (tenant dev)"
    let mut words = gateway.split_whitespace();
    let base = words.next().expect("a URL").to_owned();
    let key = words.nth(2).expect("a key").to_owned();
    assert!(
        base.starts_with("http://127.0.0.1:") && base.ends_with("/v1"),
        "{gateway}"
    );
    assert!(key.starts_with("sk-dev-"), "{gateway}");

    let http = reqwest::Client::new();
    let response: Value = http
        .post(format!("{base}/responses"))
        .bearer_auth(&key)
        .json(&json!({ "model": "assistant", "input": "hello from HTTP" }))
        .send()
        .await
        .expect("the gateway answers")
        .json()
        .await
        .expect("json");
    assert_eq!(response["status"], "completed", "{response}");
    let text = response["output"]
        .as_array()
        .and_then(|items| items.iter().rev().find(|i| i["type"] == "message"))
        .and_then(|m| m["content"][0]["text"].as_str())
        .unwrap_or_default();
    assert!(!text.is_empty(), "{response}");
    let refused = http
        .get(format!("{base}/models"))
        .bearer_auth("sk-dev-not-this-one")
        .send()
        .await
        .expect("sent");
    assert_eq!(refused.status(), reqwest::StatusCode::UNAUTHORIZED);

    // Ctrl-C stops everything, the gateway first.
    let pid = dev.id().to_string();
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let stopped = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = heard.recv().await {
            said.push(line);
        }
    })
    .await;
    assert!(
        stopped.is_ok(),
        "skein dev did not stop:\n{}",
        said.join("\n")
    );
    let status = dev.wait().expect("exits");
    assert!(status.success(), "{status}: {}", said.join("\n"));
    let stops: Vec<&String> = said.iter().filter(|l| l.contains("stopped ")).collect();
    assert!(
        stops.first().is_some_and(|l| l.contains("gateway")),
        "{}",
        said.join("\n")
    );
    assert!(
        tokio::net::TcpStream::connect(base.trim_start_matches("http://").trim_end_matches("/v1"))
            .await
            .is_err(),
        "the gateway still listens"
    );
}
