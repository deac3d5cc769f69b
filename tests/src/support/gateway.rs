//! The HTTP gateway in tests: a cluster (one worker, a lead on a scripted model, or one whose agent
//! asks a person before `slow_effect`) with a gateway in front of it on a free port, keys for two
//! tenants, a key without the `submit` role and one with `submit` and `approve`, and reading an
//! error in OpenAI's shape.

use std::net::SocketAddr;

use reqwest::StatusCode;
use serde_json::{json, Value};
use skein_lead::gateway::keys::key_hash;

use super::cluster::TestCluster;
use super::unique;

pub const KEY: &str = "sk-test-alice";
pub const READ_ONLY_KEY: &str = "sk-test-approver";
pub const OTHER_TENANT_KEY: &str = "sk-test-globex";
/// A second key of the same tenant as [`KEY`].
pub const SECOND_KEY: &str = "sk-test-bob";
/// A key of [`KEY`]'s tenant that may start runs and answer calls waiting for a person.
pub const SUBMIT_AND_APPROVE_KEY: &str = "sk-test-dave";
/// A key of [`KEY`]'s tenant with every role: start runs, answer calls, operate (cancel, pause,
/// dead letters).
pub const OPERATOR_KEY: &str = "sk-test-olga";
/// A key of [`OTHER_TENANT_KEY`]'s tenant that may start runs and operate.
pub const OTHER_TENANT_OPERATOR_KEY: &str = "sk-test-gina";

/// A cluster with one worker and a lead, and a gateway in front of it; returns its address.
pub async fn cluster_with_gateway(cluster: &TestCluster, extra: &[&str]) -> SocketAddr {
    let script = cluster.scenario(json!([{ "steps": [
        { "answer": "you said {{input}} after {{previous_input}}" }
    ] }]));
    gateway_before(cluster, &script, extra).await
}

/// [`cluster_with_gateway`] whose lead runs the scenario `script`.
pub async fn gateway_before(cluster: &TestCluster, script: &str, extra: &[&str]) -> SocketAddr {
    gateway_with_lead(cluster, &["--scenario", script], extra).await
}

/// A worker with the test tools, a lead started with `lead_flags`, and a gateway (with `extra`
/// flags) in front of them; returns its address.
pub async fn gateway_with_lead(
    cluster: &TestCluster,
    lead_flags: &[&str],
    extra: &[&str],
) -> SocketAddr {
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(lead_flags));
    start_gateway(cluster, extra).await
}

/// A gateway (with `extra` flags) in front of `cluster`, knowing the keys of this module;
/// returns its address.
pub async fn start_gateway(cluster: &TestCluster, extra: &[&str]) -> SocketAddr {
    let keys = cluster.dir.join(unique("keys")).with_extension("toml");
    std::fs::write(
        &keys,
        format!(
            "[[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"alice\"\nroles = [\"submit\"]\n\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"carol\"\nroles = [\"approve\"]\n\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"globex\"\nprincipal = \"gus\"\nroles = [\"submit\"]\n\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"bob\"\nroles = [\"submit\"]\n\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"dave\"\nroles = [\"submit\", \"approve\"]\n\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"olga\"\nroles = [\"submit\", \"approve\", \"operate\"]\n\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"globex\"\nprincipal = \"gina\"\nroles = [\"submit\", \"operate\"]\n",
            key_hash(KEY),
            key_hash(READ_ONLY_KEY),
            key_hash(OTHER_TENANT_KEY),
            key_hash(SECOND_KEY),
            key_hash(SUBMIT_AND_APPROVE_KEY),
            key_hash(OPERATOR_KEY),
            key_hash(OTHER_TENANT_OPERATOR_KEY)
        ),
    )
    .expect("keys written");
    let mut args = vec![
        "gateway".to_owned(),
        "--nats-url".into(),
        cluster.nats.url.clone(),
        "--redis-url".into(),
        cluster.redis.url.clone(),
        "--gateway-addr".into(),
        "127.0.0.1:0".into(),
        "--gateway-keys".into(),
        keys.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    #[derive(clap::Parser)]
    struct Args {
        #[command(flatten)]
        gateway: skein_lead::gateway::GatewayConfig,
    }
    let cfg = <Args as clap::Parser>::try_parse_from(args)
        .expect("valid gateway flags")
        .gateway;
    let (bound, listening) = tokio::sync::oneshot::channel();
    let shutdown = cluster.shutdown_token();
    tokio::spawn(async move {
        if let Err(e) = skein_lead::gateway::run(cfg, shutdown, Some(bound)).await {
            panic!("gateway failed: {e}");
        }
    });
    listening.await.expect("the gateway listens")
}

/// A worker with the test tools, a lead whose `assistant` runs the scenario `script` and asks a
/// person before every `slow_effect` call, and a gateway in front of them that knows the agent;
/// returns its address.
pub async fn guarded_gateway(cluster: &TestCluster, script: &str) -> SocketAddr {
    let agents = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&agents).expect("agents dir");
    std::fs::write(
        agents.join("AGENTS.md"),
        "+++\n[permissions]\nask = [\"slow_effect\"]\n+++\nYou are careful.\n",
    )
    .expect("AGENTS.md written");
    let agents = agents.to_str().expect("utf-8 path");
    gateway_with_lead(
        cluster,
        &["--scenario", script, "--agents-dir", agents],
        &["--agents-dir", agents],
    )
    .await
}

pub fn chat(addr: SocketAddr) -> String {
    format!("http://{addr}/v1/chat/completions")
}

pub async fn error_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body: Value = response.json().await.expect("a JSON error");
    (status, body["error"].clone())
}
