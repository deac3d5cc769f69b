//! Tenants fenced off by the broker: a real nats-server runs `deploy/nats/tenants.conf` (a service
//! user, tenants `acme` and `globex`). A lead and a worker run as the service user; `acme`'s
//! client runs a task and watches it end to end, and reads its own values stored by reference; a
//! plain NATS client logged in as `acme` cannot submit as, cancel, watch or read the events or
//! stored values of `globex`, reach a workspace through a forged tool task, forge a result, or
//! read another tenant's inbox — each refused by the server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::protocol::TurnStatus;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::servers::{NatsServer, RedisServer};
use skein_tests::support::{eventually, unique};

const SERVICE_PASSWORD: &str = "service-secret";

/// The deploy configuration with its variables filled in and a second tenant, `globex`, made
/// from `acme`'s entry as its comment says.
fn tenants_config() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/nats/tenants.conf");
    let text = std::fs::read_to_string(path).expect("deploy/nats/tenants.conf");
    let start = text.find("    # One tenant.").expect("the tenant entry");
    let end = text[start..].find("\n  ]").expect("the end of the users") + start;
    let acme = &text[start..end];
    let globex = acme.replace("acme", "globex").replace("ACME", "GLOBEX");
    let text = format!("{}{acme}\n{globex}{}", &text[..start], &text[end..]);
    text.replace("$SKEIN_NATS_USER", "skein")
        .replace("$SKEIN_NATS_PASSWORD", SERVICE_PASSWORD)
        .replace("$TENANT_ACME_PASSWORD", "acme-secret")
        .replace("$TENANT_GLOBEX_PASSWORD", "globex-secret")
}

fn tenant_nats(url: &str, tenant: &str) -> NatsConfig {
    NatsConfig {
        user: Some(tenant.into()),
        password: Some(format!("{tenant}-secret")),
        inbox_prefix: Some(format!("_INBOX_{tenant}")),
        ..NatsConfig::local(url)
    }
}

/// A plain client logged in as `tenant`, with every error the server sends it.
async fn plain_client(url: &str, tenant: &str) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let client = async_nats::ConnectOptions::new()
        .user_and_password(tenant.into(), format!("{tenant}-secret"))
        .custom_inbox_prefix(format!("_INBOX_{tenant}"))
        .event_callback(move |event| {
            if let async_nats::Event::ServerError(error) = event {
                seen.lock().expect("not poisoned").push(error.to_string());
            }
            futures::future::ready(())
        })
        .connect(url)
        .await
        .expect("the tenant connects");
    (client, errors)
}

/// Waits until the server has refused `what` (its permissions violation names the subject).
async fn refused(errors: &Arc<Mutex<Vec<String>>>, what: &str, subject: &str) {
    eventually(
        &format!("the server to refuse {what}"),
        Duration::from_secs(10),
        || async {
            let errors = errors.lock().expect("not poisoned");
            errors
                .iter()
                .any(|e| e.to_lowercase().contains("permissions violation") && e.contains(subject))
                .then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reaches_only_its_own_tasks() {
    let nats = NatsServer::start_with_config(&tenants_config());
    let cluster = TestCluster::with_servers(nats, RedisServer::start());
    let url = cluster.nats.url.clone();
    let service = ["--nats-user", "skein", "--nats-password", SERVICE_PASSWORD];
    cluster.spawn_worker(cluster.worker_config(&service));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&service));

    // Its own task runs end to end with only the tenant's permissions.
    let acme = SkeinClient::connect(&tenant_nats(&url, "acme"))
        .await
        .expect("acme connects");
    let task = submission("acme", &unique("s"), "hello");
    let result = acme
        .run(&task, Duration::from_secs(30), |_| {})
        .await
        .expect("acme's task answered");
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");

    let (intruder, errors) = plain_client(&url, "acme").await;
    let attempts = [
        ("a submission as globex", "skein.submit.globex.s1"),
        ("a cancel of globex's task", "skein.cancel.globex.t1"),
        ("an approval for globex", "skein.approval.globex.t1"),
        ("a result lookup of globex", "skein.result.globex.s1.t1"),
        ("a forged tool task", "skein.tool.default.read_file"),
        ("a forged subagent task", "skein.agent.default.helper"),
        ("a forged result", "skein.reply.worker-1.1"),
        (
            "a watch of globex's events",
            "$JS.API.CONSUMER.CREATE.SKEIN_EVENTS.w.skein.events.globex.t1",
        ),
        (
            "a read of globex's last event",
            "$JS.API.DIRECT.GET.SKEIN_EVENTS.skein.events.globex.t1",
        ),
        ("a stream change", "$JS.API.STREAM.DELETE.SKEIN_SUBMIT"),
        (
            "a read of globex's stored values",
            "$JS.API.STREAM.MSG.GET.OBJ_skein-payloads-globex",
        ),
    ];
    for (what, subject) in attempts {
        intruder
            .publish(subject.to_owned(), "{}".into())
            .await
            .expect("sent");
        intruder.flush().await.expect("flushed");
        refused(&errors, what, subject).await;
    }
    for (what, subject) in [
        ("globex's live events", "skein.events.globex.>"),
        ("globex's inbox", "_INBOX_globex.>"),
        ("the work queue's messages", "skein.tool.>"),
    ] {
        let _subscription = intruder.subscribe(subject.to_owned()).await.expect("sent");
        intruder.flush().await.expect("flushed");
        refused(&errors, what, subject).await;
    }
    // Nothing the intruder sent reached the cluster: globex has no submission, acme's own
    // submissions went through.
    let service_client = SkeinClient::connect(&NatsConfig {
        user: Some("skein".into()),
        password: Some(SERVICE_PASSWORD.into()),
        ..NatsConfig::local(&url)
    })
    .await
    .expect("service connects");
    let waiting = service_client
        .bus()
        .oldest_submission("globex", "s1")
        .await
        .expect("looked");
    assert_eq!(waiting, None, "no submission of globex was stored");

    // A value of acme's stored by reference (a large answer, say) is readable by acme.
    let payloads = skein_common::payloads::PayloadStore::new(service_client.bus());
    let reference = payloads
        .store(
            "acme",
            &task.session,
            &task.task_id,
            "a large answer".into(),
        )
        .await
        .expect("stored");
    let read = acme
        .fetch_payload("acme", &reference)
        .await
        .expect("acme reads its own stored value");
    assert_eq!(&read[..], b"a large answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reads_its_own_workspace_files_and_nobody_elses() {
    use skein_common::workspace::objects::Expect;
    use skein_common::workspace::{
        ObjectWorkspaces, SessionRef, WorkspacePath, WorkspaceStoreConfig,
    };
    let nats = NatsServer::start_with_config(&tenants_config());
    let url = nats.url.clone();
    let service = SkeinClient::connect(&NatsConfig {
        user: Some("skein".into()),
        password: Some(SERVICE_PASSWORD.into()),
        ..NatsConfig::local(&url)
    })
    .await
    .expect("service connects");
    let settings = WorkspaceStoreConfig::default();
    let written = ObjectWorkspaces::new(service.bus(), &settings, 0);
    let path = WorkspacePath::parse("notes/plan.txt").expect("a path");
    for tenant in ["acme", "globex"] {
        let session = SessionRef::new(tenant, "s1").expect("a session");
        written
            .write(
                &session,
                &path,
                format!("{tenant}'s plan").into(),
                Expect::Any,
            )
            .await
            .expect("the service writes");
    }

    // acme reads its own file through the workspace code, with only its own permissions.
    let acme = SkeinClient::connect(&tenant_nats(&url, "acme"))
        .await
        .expect("acme connects");
    let read = ObjectWorkspaces::new(acme.bus(), &settings, 0);
    let own = SessionRef::new("acme", "s1").expect("a session");
    let (content, _) = read
        .read(&own, &path)
        .await
        .expect("acme reads its own file");
    assert_eq!(&content[..], b"acme's plan");

    // Not globex's bucket, and no write to its own.
    let (intruder, errors) = plain_client(&url, "acme").await;
    let jetstream = async_nats::jetstream::new(intruder.clone());
    let _ = jetstream
        .get_object_store("skein-ws-globex")
        .await
        .map(|_| ());
    let _ = intruder
        .request("$JS.API.STREAM.MSG.GET.OBJ_skein-ws-globex", "{}".into())
        .await;
    refused(&errors, "reading globex's workspace", "OBJ_skein-ws-globex").await;
    intruder
        .publish("$O.skein-ws-acme.C.forged", "forged".into())
        .await
        .expect("sent");
    refused(
        &errors,
        "writing its own workspace",
        "$O.skein-ws-acme.C.forged",
    )
    .await;
}
