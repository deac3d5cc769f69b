//! A secured transport against real servers started with TLS: NATS with mutual TLS (a custom CA
//! and a client certificate), Redis over `rediss://` with a custom CA. A lead and a worker run a
//! turn with a tool call over both; a client without the CA is refused. A client certificate TLS
//! cannot use (X.509 version 1) is refused before any connection, naming the file and the remedy.

use std::time::Duration;

use clap::Parser;
use serde_json::json;
use skein_common::client::SkeinClient;
use skein_common::config::{NatsConfig, RedisConfig};
use skein_common::protocol::TurnStatus;
use skein_common::store::SessionStore;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::servers::{free_port, NatsServer, RedisServer};
use skein_tests::support::tls::TestCertificates;
use skein_tests::support::{eventually, stopped_at_start, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_over_mutual_tls_to_nats_and_tls_to_redis() {
    let dir = std::env::temp_dir().join(unique("skein-tls"));
    let certs = TestCertificates::generate(&dir);
    let path = |p: &std::path::Path| p.display().to_string();
    let nats = NatsServer::start_with_config(&format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true, timeout: 5 }}",
        path(&certs.server_cert),
        path(&certs.server_key),
        path(&certs.ca)
    ));
    let tls_port = free_port();
    let redis = RedisServer::start_with_args(&[
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path(&certs.server_cert),
        "--tls-key-file".into(),
        path(&certs.server_key),
        "--tls-ca-cert-file".into(),
        path(&certs.ca),
        "--tls-auth-clients".into(),
        "no".into(),
    ]);
    let cluster = TestCluster::with_servers(nats, redis);
    let rediss = format!("rediss://127.0.0.1:{tls_port}/");
    let secured = [
        "--nats-tls-ca".to_string(),
        path(&certs.ca),
        "--nats-tls-cert".into(),
        path(&certs.client_cert),
        "--nats-tls-key".into(),
        path(&certs.client_key),
        "--redis-url".into(),
        rediss.clone(),
        "--redis-tls-ca".into(),
        path(&certs.ca),
    ];
    let common = |role: &str| {
        let mut args = vec![
            role.to_string(),
            "--nats-url".into(),
            cluster.nats.url.clone(),
            "--admin-addr".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(secured.iter().cloned());
        args
    };
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "write_file", "arguments": { "path": "tls.txt", "content": "secure" } } ] },
        { "answer": "wrote {{observations}}" }
    ] }]));
    let mut worker = common("skein-worker");
    worker.extend([
        "--workspace-root".into(),
        cluster.dir.join("ws").display().to_string(),
        "--heartbeat".into(),
        "500ms".into(),
    ]);
    cluster.spawn_worker(skein_worker::Config::try_parse_from(worker).expect("worker flags"));
    let mut lead = common("skein-lead");
    lead.extend(["--scenario".into(), script]);
    cluster.spawn_lead(skein_lead::Config::try_parse_from(lead).expect("lead flags"));

    let store = SessionStore::connect(&RedisConfig {
        tls_ca: Some(certs.ca.clone()),
        ..RedisConfig::local(rediss.clone())
    })
    .await
    .expect("redis over TLS");
    eventually("a live worker", Duration::from_secs(20), || {
        let store = store.clone();
        async move { (!store.live_workers().await.ok()?.is_empty()).then_some(()) }
    })
    .await;

    let nats = NatsConfig {
        tls_ca: Some(certs.ca.clone()),
        tls_cert: Some(certs.client_cert.clone()),
        tls_key: Some(certs.client_key.clone()),
        ..NatsConfig::local(cluster.nats.url.clone())
    };
    let client = SkeinClient::connect(&nats)
        .await
        .expect("client over mutual TLS");
    let result = client
        .run(
            &submission("acme", &unique("s"), "write securely"),
            Duration::from_secs(60),
            |_| {},
        )
        .await
        .expect("a final result");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert!(
        result.answer.unwrap_or_default().contains("wrote"),
        "the tool call ran"
    );

    // Without the client certificate the server refuses the connection.
    let refused = SkeinClient::connect(&NatsConfig {
        tls_ca: Some(certs.ca.clone()),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::local(cluster.nats.url.clone())
    })
    .await;
    assert!(refused.is_err(), "no client certificate, no connection");
    // Redis over TLS with a CA that did not sign the server's certificate is refused too.
    let other = TestCertificates::generate(&dir.join("other"));
    let untrusted = SessionStore::connect(&RedisConfig {
        tls_ca: Some(other.ca.clone()),
        ..RedisConfig::local(rediss)
    })
    .await;
    assert!(
        untrusted.is_err(),
        "an untrusted server certificate is refused"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client certificate TLS cannot use (X.509 version 1: what `openssl x509 -req` makes without an
/// extensions file) is refused before any connection is tried, by a client and at the start of a
/// lead or a worker (bad configuration, exit 64), with a message that names the file, says why
/// and how to sign a usable one; the same key signed as version 3 connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_client_certificate_is_refused_with_how_to_make_one() {
    let dir = std::env::temp_dir().join(unique("skein-tls-v1"));
    let certs = TestCertificates::generate(&dir);
    let version_1 = certs.version_1_client();
    let path = |p: &std::path::Path| p.display().to_string();
    let nats = NatsServer::start_with_config(&format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true, timeout: 5 }}",
        path(&certs.server_cert),
        path(&certs.server_key),
        path(&certs.ca)
    ));
    let cluster = TestCluster::with_servers(nats, RedisServer::start());
    let says_why = |message: &str| {
        message.contains(&path(&version_1))
            && message.contains("version 1")
            && message.contains("only version 3")
            && message.contains("extendedKeyUsage=clientAuth")
    };
    let with_certificate = |cert: &std::path::Path| NatsConfig {
        tls_ca: Some(certs.ca.clone()),
        tls_cert: Some(cert.to_path_buf()),
        tls_key: Some(certs.client_key.clone()),
        connect_timeout: Duration::from_secs(5),
        ..NatsConfig::local(cluster.nats.url.clone())
    };

    let refused = SkeinClient::connect(&with_certificate(&version_1))
        .await
        .err()
        .map(|e| e.to_string())
        .expect("a version 1 certificate is refused");
    assert!(says_why(&refused), "{refused}");
    SkeinClient::connect(&with_certificate(&certs.client_cert))
        .await
        .expect("the same key signed as version 3 connects");

    for role in ["lead", "worker"] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_skein-node"));
        cmd.args(cluster.process_args(role))
            .args(["--nats-tls-ca", &path(&certs.ca)])
            .args(["--nats-tls-cert", &path(&version_1)])
            .args(["--nats-tls-key", &path(&certs.client_key)]);
        let stderr = stopped_at_start(cmd, role).await;
        assert!(says_why(&stderr), "{role}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
