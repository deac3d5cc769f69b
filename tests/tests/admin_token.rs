//! The admin server's token, through real lead and worker processes: with the token in a file
//! named by `SKEIN_ADMIN_TOKEN_FILE`, `/metrics` answers 401 without it or with another one and
//! 200 with it, while `/healthz` and `/readyz` stay open for the probes.

use std::time::Duration;

use skein_tests::support::cluster::TestCluster;
use skein_tests::support::{eventually, free_port, ChildProcess};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");
const TOKEN: &str = "metrics-token-for-the-test";

/// The status of `GET path` on 127.0.0.1:`port` with `authorization`, if the server answers.
async fn status(port: u16, path: &str, authorization: Option<&str>) -> Option<u16> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("build client");
    let mut request = client.get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(value) = authorization {
        request = request.header(reqwest::header::AUTHORIZATION, value);
    }
    request.send().await.ok().map(|r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_its_file_guards_the_metrics_of_leads_and_workers() {
    let cluster = TestCluster::start();
    let token_file = cluster.dir.join("admin-token");
    // As a mounted secret often is: with a trailing newline, which is not part of the token.
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file written");
    let mut processes = Vec::new();
    for role in ["lead", "worker"] {
        let port = free_port();
        let mut args = cluster.process_args(role);
        let at = args
            .iter()
            .position(|a| a == "--admin-addr")
            .expect("process args name an admin address");
        args[at + 1] = format!("127.0.0.1:{port}");
        let mut cmd = std::process::Command::new(NODE);
        cmd.args(args).env("SKEIN_ADMIN_TOKEN_FILE", &token_file);
        let process = ChildProcess::spawn(cmd, cluster.dir.join(format!("{role}.log")));
        processes.push((role, port, process));
    }
    for (role, port, process) in &processes {
        let port = *port;
        eventually(
            &format!("the {role} is ready"),
            Duration::from_secs(60),
            || async move { (status(port, "/readyz", None).await == Some(200)).then_some(()) },
        )
        .await;
        assert_eq!(status(port, "/healthz", None).await, Some(200), "{role}");
        assert_eq!(status(port, "/metrics", None).await, Some(401), "{role}");
        assert_eq!(
            status(port, "/metrics", Some("Bearer not-the-token")).await,
            Some(401),
            "{role}"
        );
        assert_eq!(
            status(port, "/metrics", Some(&format!("Bearer {TOKEN}"))).await,
            Some(200),
            "{role}: {}",
            process.log()
        );
    }
}
