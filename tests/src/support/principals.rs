//! What the principals tests share: a principals file of test people with their keys, clients
//! signing as one of them, signatures made by hand (forged, or signed at a chosen time), and
//! waiting for an audit record.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::HeaderMap;
use base64::Engine;
use skein_common::audit::{AuditFilter, AuditRecord, Verdict};
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::principals::{
    signed_bytes, Signer, HEADER_NONCE, HEADER_PRINCIPAL, HEADER_SIGNATURE, HEADER_SIGNED_AT,
};
use skein_common::protocol::TaskSubmission;

use super::cluster::TestCluster;
use super::{eventually, unique};

/// The principals of these tests, each with its key.
pub struct People {
    /// acme: submit and approve (the submitter, who may not approve their own task's calls).
    pub alice: Signer,
    /// acme: approve and operate, the one the approver rules name.
    pub olga: Signer,
    /// acme: submit only.
    pub bob: Signer,
    /// acme: approve, but not named by the approver rules.
    pub paul: Signer,
    /// globex: approve and operate.
    pub gina: Signer,
    /// every tenant: the gateway's own key (delegate, submit, approve, operate).
    pub gateway: Signer,
    pub file: PathBuf,
}

pub fn people(cluster: &TestCluster) -> People {
    let (alice, olga, bob, paul, gina, gateway) = (
        Signer::generate(),
        Signer::generate(),
        Signer::generate(),
        Signer::generate(),
        Signer::generate(),
        Signer::generate(),
    );
    let entry = |name: &str, tenant: &str, roles: &str, key: &Signer| {
        format!(
            "[[principals]]\nname = \"{name}\"\ntenant = \"{tenant}\"\nroles = [{roles}]\nkey = \"{}\"\n\n",
            key.public_key()
        )
    };
    let text = [
        entry("alice", "acme", "\"submit\", \"approve\"", &alice),
        entry("olga", "acme", "\"approve\", \"operate\"", &olga),
        entry("bob", "acme", "\"submit\"", &bob),
        entry("paul", "acme", "\"approve\"", &paul),
        entry("gina", "globex", "\"approve\", \"operate\"", &gina),
        entry(
            "gateway",
            "*",
            "\"delegate\", \"submit\", \"approve\", \"operate\"",
            &gateway,
        ),
    ]
    .concat();
    let file = cluster.dir.join("principals.toml");
    std::fs::write(&file, text).expect("principals file written");
    People {
        alice,
        olga,
        bob,
        paul,
        gina,
        gateway,
        file,
    }
}

/// A client signing with `key` (none: unsigned).
pub async fn client_of(cluster: &TestCluster, key: Option<&Signer>) -> SkeinClient {
    let mut cfg = NatsConfig::local(cluster.nats.url.clone());
    cfg.principal_key = key.map(Signer::seed);
    SkeinClient::connect(&cfg).await.expect("client connects")
}

/// Signature headers made by hand: by `signer`, named as `named` (a forgery when they differ),
/// signed at `signed_at_ms`.
pub fn hand_signed(
    signer: &Signer,
    named: &Signer,
    subject: &str,
    payload: &[u8],
    signed_at_ms: u64,
) -> HeaderMap {
    let nonce = unique("nonce");
    let part = format!("{signed_at_ms}\n{nonce}\n\n\n");
    let pair = nkeys::KeyPair::from_seed(&signer.seed()).expect("seed");
    let signature = pair
        .sign(&signed_bytes(subject, &part, payload))
        .expect("signs");
    let mut headers = HeaderMap::new();
    headers.insert(HEADER_PRINCIPAL, named.public_key().as_str());
    headers.insert(HEADER_SIGNED_AT, signed_at_ms.to_string().as_str());
    headers.insert(HEADER_NONCE, nonce.as_str());
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature);
    headers.insert(HEADER_SIGNATURE, encoded.as_str());
    headers
}

pub async fn publish_raw(
    client: &SkeinClient,
    subject: String,
    headers: HeaderMap,
    payload: Vec<u8>,
) {
    client
        .bus()
        .jetstream()
        .publish_with_headers(subject, headers, payload.into())
        .await
        .expect("published")
        .await
        .expect("stored");
}

/// Waits for the audit record of `task` that `matches`, and returns it.
pub async fn audited(
    client: &SkeinClient,
    task: &TaskSubmission,
    what: &str,
    matches: impl Fn(&AuditRecord) -> bool,
) -> AuditRecord {
    let filter = AuditFilter {
        tenant: Some(task.tenant.clone()),
        task_id: Some(task.task_id.clone()),
        ..Default::default()
    };
    eventually(what, Duration::from_secs(20), || {
        let (bus, filter) = (client.bus().clone(), filter.clone());
        let matches = &matches;
        async move {
            let records = bus.audit_records(&filter, 1000).await.ok()?;
            records.into_iter().find(|r| matches(r))
        }
    })
    .await
}

pub fn refused_because<'a>(needle: &'a str) -> impl Fn(&AuditRecord) -> bool + 'a {
    move |r: &AuditRecord| r.verdict == Verdict::Refused && r.reason.contains(needle)
}
