//! Proven principals, with real NATS, Redis, a lead and a worker, on a cluster that requires
//! signed operations (`--require-signed`): an approval that is unsigned, forged, expired,
//! replayed, by a principal without the role, of another tenant, by the task's own submitter
//! (`self_approval = false`) or by someone the approver rules leave out is refused, set aside
//! and audited, and the call does not run; the approval of the principal the rules name runs it
//! once, and the audit stream names that principal. Submissions, pauses and cancels are checked
//! the same way.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::HeaderMap;
use serde_json::json;
use skein_common::audit::Verdict;
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::principals::Signer;
use skein_common::protocol::{
    now_ms, ApprovalDecision, ControlAction, FailureKind, RunControl, TaskSubmission, TurnStatus,
    PROTOCOL_VERSION,
};
use skein_common::subjects;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::principals::{
    audited, client_of, hand_signed, people, publish_raw, refused_because, People,
};
use skein_tests::support::{eventually, unique};

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

/// An agents folder whose `assistant` asks before `slow_effect`, and whose approver rules let
/// only olga answer it, never the task's own submitter.
fn guarded_agents(cluster: &TestCluster) -> PathBuf {
    let dir = cluster.dir.join(unique("agents"));
    std::fs::create_dir_all(&dir).expect("agents dir");
    std::fs::write(
        dir.join("AGENTS.md"),
        "+++\n[permissions]\nask = [\"slow_effect\"]\n+++\nYou are careful.\n",
    )
    .expect("AGENTS.md written");
    std::fs::write(
        dir.join("permissions.toml"),
        "self_approval = false\n\n[[approvers]]\ncalls = \"slow_effect\"\nby = [\"olga\", \"alice\"]\n",
    )
    .expect("permissions.toml written");
    dir
}

/// A signing cluster: a test worker and a lead that requires signatures, whose `assistant`
/// calls `slow_effect` (effect `key`) once and then answers.
async fn signing_cluster(cluster: &TestCluster, people: &People, key: &str) {
    let script = cluster.scenario(json!([{ "steps": [
        { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": key, "ms": 10 } } ] },
        { "answer": "done after approval" }
    ] }]));
    let agents = guarded_agents(cluster);
    cluster.spawn_test_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&[
        "--scenario",
        &script,
        "--agents-dir",
        agents.to_str().expect("utf-8 path"),
        "--principals",
        people.file.to_str().expect("utf-8 path"),
        "--require-signed",
        "true",
    ]));
}

fn decision(task: &TaskSubmission, claimed_by: &str) -> ApprovalDecision {
    ApprovalDecision {
        v: PROTOCOL_VERSION,
        tenant: task.tenant.clone(),
        task_id: task.task_id.clone(),
        call_id: None,
        run: None,
        approve: true,
        always: false,
        always_rule: None,
        reason: String::new(),
        by: claimed_by.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_allowed_principal_s_signed_approval_runs_the_call_and_it_is_audited() {
    let cluster = TestCluster::start();
    let people = people(&cluster);
    signing_cluster(&cluster, &people, "deploy").await;
    let alice = client_of(&cluster, Some(&people.alice)).await;
    let mut task = submission("acme", &unique("s"), "deploy it");
    task.user = "someone-else".into();
    let running = async {
        let mut events = Vec::new();
        let result = alice
            .run(&task, Duration::from_secs(90), |e| events.push(e.clone()))
            .await
            .expect("a final result");
        (result, events)
    };
    let answering = async {
        let store = cluster.store().await;
        let request = eventually("the approval request", Duration::from_secs(30), || {
            let store = store.clone();
            let (tenant, task_id) = (task.tenant.clone(), task.task_id.clone());
            async move {
                store
                    .approval_request(&tenant, &task_id)
                    .await
                    .ok()
                    .flatten()
            }
        })
        .await;
        assert_eq!(
            request.user, "alice",
            "the submission's user is its verified principal, not its claim"
        );
        let subject = subjects::approval(&task.tenant, &task.task_id);
        let payload = serde_json::to_vec(&decision(&task, "olga")).expect("json");
        let unsigned = client_of(&cluster, None).await;

        // Unsigned, claiming to be olga.
        unsigned
            .bus()
            .publish_decision(&decision(&task, "olga"))
            .await
            .expect("published");
        audited(
            &unsigned,
            &task,
            "the unsigned answer refused",
            refused_because("unsigned approve"),
        )
        .await;

        // Forged: a stranger's signature under olga's key.
        let forged = hand_signed(
            &Signer::generate(),
            &people.olga,
            &subject,
            &payload,
            now_ms(),
        );
        publish_raw(&unsigned, subject.clone(), forged, payload.clone()).await;
        audited(
            &unsigned,
            &task,
            "the forged answer refused",
            refused_because("does not verify"),
        )
        .await;

        // Expired: olga's own signature, ten minutes old.
        let old = hand_signed(
            &people.olga,
            &people.olga,
            &subject,
            &payload,
            now_ms() - 600_000,
        );
        publish_raw(&unsigned, subject.clone(), old, payload.clone()).await;
        audited(
            &unsigned,
            &task,
            "the expired answer refused",
            refused_because("expired"),
        )
        .await;

        // A principal without the approve role, one of another tenant, and the submitter herself.
        for (who, needle) in [
            (&people.bob, "bob may not approve"),
            (&people.gina, "may not act on tenant acme"),
            (&people.alice, "they submitted"),
        ] {
            let client = client_of(&cluster, Some(who)).await;
            client
                .bus()
                .publish_decision(&decision(&task, "olga"))
                .await
                .expect("published");
            let record = audited(&client, &task, needle, refused_because(needle)).await;
            assert_eq!(record.action, "approve", "{record:?}");
        }
        // `skein approve` as paul, an approver the rules do not name: it fails, saying why.
        let paul_seed = people.paul.seed();
        let out = tokio::process::Command::new(SKEIN)
            .args(["approve", &task.task_id, "--tenant", "acme"])
            .args([
                "--nats-url",
                &cluster.nats.url,
                "--redis-url",
                &cluster.redis.url,
            ])
            .args(["--principals", people.file.to_str().expect("utf-8 path")])
            .args(["--principal-key", &paul_seed])
            .output()
            .await
            .expect("skein runs");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("a lead refused the answer") && said.contains("paul may not answer"),
            "{said}"
        );
        assert_eq!(
            cluster.effect_starts("deploy"),
            0,
            "no refused answer ran the call"
        );
        let still = store
            .approval_request(&task.tenant, &task.task_id)
            .await
            .expect("store")
            .expect("the request still waits");
        assert_eq!(still.unanswered().count(), 1, "{still:?}");

        // Olga's signed answer, claiming to be someone else: recorded as olga.
        let olga_signed = {
            let mut headers = HeaderMap::new();
            people.olga.sign(&mut headers, &subject, &payload, None);
            headers
        };
        publish_raw(
            &unsigned,
            subject.clone(),
            olga_signed.clone(),
            payload.clone(),
        )
        .await;
        let record = audited(&unsigned, &task, "olga's answer recorded", |r| {
            r.verdict == Verdict::Done && r.action == "approve"
        })
        .await;
        assert_eq!(
            (record.principal.as_str(), record.proof.as_str()),
            ("olga", "signed")
        );

        // The very same signed message, published again: a replay.
        publish_raw(&unsigned, subject.clone(), olga_signed, payload.clone()).await;
        audited(
            &unsigned,
            &task,
            "the replay refused",
            refused_because("replayed"),
        )
        .await;
    };
    let ((result, events), ()) = tokio::join!(running, answering);
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(result.answer.as_deref(), Some("done after approval"));
    assert_eq!(
        cluster.effect_starts("deploy"),
        1,
        "the approved call ran exactly once"
    );
    let resolved_by: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            skein_common::protocol::EventKind::ApprovalResolved { by, .. } => Some(by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        resolved_by,
        vec!["olga".to_owned()],
        "answered by the verified principal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_foreign_and_unprivileged_operations_are_refused_with_their_reason() {
    let cluster = TestCluster::start();
    let people = people(&cluster);
    signing_cluster(&cluster, &people, "nothing").await;

    // An unsigned submission ends denied, saying why.
    let unsigned = client_of(&cluster, None).await;
    let task = submission("acme", &unique("s"), "hello");
    let result = unsigned
        .run(&task, Duration::from_secs(60), |_| {})
        .await
        .expect("a final result");
    assert_eq!(result.status, TurnStatus::Failed, "{result:?}");
    let failure = result.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::Denied);
    assert!(
        failure.message.contains("unsigned submit"),
        "{}",
        failure.message
    );

    // A globex principal submitting into acme.
    let gina = client_of(&cluster, Some(&people.gina)).await;
    let task = submission("acme", &unique("s"), "hello");
    let result = gina
        .run(&task, Duration::from_secs(60), |_| {})
        .await
        .expect("a final result");
    let failure = result.failure.expect("a failure");
    assert!(
        failure.message.contains("may not act on tenant acme"),
        "{}",
        failure.message
    );
    let record = audited(&gina, &task, "the foreign submission audited", |r| {
        r.action == "submit" && r.verdict == Verdict::Refused
    })
    .await;
    assert_eq!(record.principal, "gina");

    // bob (submit only) may not pause; olga (operate) may.
    let target = submission("acme", &unique("s"), "later");
    let control = |action| RunControl {
        v: PROTOCOL_VERSION,
        tenant: target.tenant.clone(),
        session: target.session.clone(),
        task_id: target.task_id.clone(),
        action,
        text: String::new(),
        by: "claimed".into(),
    };
    let bob = client_of(&cluster, Some(&people.bob)).await;
    bob.bus()
        .publish_control(&control(ControlAction::Pause))
        .await
        .expect("published");
    audited(
        &bob,
        &target,
        "bob's pause refused",
        refused_because("bob may not pause"),
    )
    .await;
    let olga = client_of(&cluster, Some(&people.olga)).await;
    olga.bus()
        .publish_control(&control(ControlAction::Pause))
        .await
        .expect("published");
    let record = audited(&olga, &target, "olga's pause recorded", |r| {
        r.action == "pause" && r.verdict == Verdict::Done
    })
    .await;
    assert_eq!(record.principal, "olga");
    let store = cluster.store().await;
    let (controls, _) = store
        .controls(&target.tenant, &target.session, &target.task_id, 0)
        .await
        .expect("controls");
    assert!(
        controls.paused,
        "olga's pause was recorded, bob's alone would not have been"
    );

    // An unsigned cancel is heard and refused (audited by the lead), and a process that requires
    // signatures does not count it as asked for when it looks; olga's signed one counts.
    unsigned
        .cancel(&target.tenant, &target.task_id, "no")
        .await
        .expect("published");
    audited(&unsigned, &target, "the unsigned cancel refused", |r| {
        r.action == "cancel" && r.verdict == Verdict::Refused
    })
    .await;
    let mut checking = NatsConfig::local(cluster.nats.url.clone());
    checking.principals = Some(people.file.clone());
    checking.require_signed = true;
    let checking = SkeinClient::connect(&checking).await.expect("connects");
    let asked = |client: SkeinClient| {
        let (tenant, task_id) = (target.tenant.clone(), target.task_id.clone());
        async move {
            client
                .bus()
                .cancel_requested(&tenant, &task_id)
                .await
                .expect("looked up")
        }
    };
    assert!(
        !asked(checking.clone()).await,
        "an unsigned cancel is not honoured"
    );
    olga.cancel(&target.tenant, &target.task_id, "stop")
        .await
        .expect("published");
    assert!(asked(checking).await, "olga's signed cancel is");
    let record = audited(&olga, &target, "olga's cancel audited", |r| {
        r.action == "cancel" && r.verdict == Verdict::Done
    })
    .await;
    assert_eq!(record.principal, "olga");
}

/// Through the gateway on a cluster that requires signatures: the gateway signs with its own
/// key (a `delegate`) as acting for the caller its API key proved. A run started by alice's key
/// runs as alice; carol's answer (her key may approve, the approver rules do not name her) is
/// refused and the call waits; olga's runs it once, recorded as olga, proven by the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_acts_for_the_callers_its_keys_prove() {
    use skein_tests::support::gateway::{start_gateway, KEY, OPERATOR_KEY, READ_ONLY_KEY};
    let cluster = TestCluster::start();
    let people = people(&cluster);
    signing_cluster(&cluster, &people, "ship").await;
    let seed = people.gateway.seed();
    let addr = start_gateway(
        &cluster,
        &[
            "--principals",
            people.file.to_str().expect("utf-8 path"),
            "--principal-key",
            &seed,
        ],
    )
    .await;
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let post = |path: String, key: &'static str, body: serde_json::Value| {
        let request = http
            .post(format!("{base}{path}"))
            .bearer_auth(key)
            .json(&body);
        async move {
            let response = request.send().await.expect("sent");
            let status = response.status();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            assert!(status.is_success(), "{path}: {status} {body}");
            body
        }
    };
    let started = post(
        "/console/api/runs".into(),
        KEY,
        json!({ "agent": "assistant", "input": "ship it" }),
    )
    .await;
    let task_id = started["task_id"].as_str().expect("a task id").to_owned();
    let session = started["session"].as_str().expect("a session").to_owned();
    let mut task = submission("acme", &session, "ship it");
    task.task_id = task_id.clone();
    let store = cluster.store().await;
    let request = eventually("the approval request", Duration::from_secs(30), || {
        let store = store.clone();
        let task_id = task_id.clone();
        async move {
            store
                .approval_request("acme", &task_id)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(request.user, "alice", "the run is alice's");

    let answer = format!("/console/api/approvals/{task_id}/answer");
    post(answer.clone(), READ_ONLY_KEY, json!({ "approve": true })).await;
    let observer = client_of(&cluster, None).await;
    let refused = audited(
        &observer,
        &task,
        "carol's answer refused",
        refused_because("carol may not answer"),
    )
    .await;
    assert_eq!(refused.principal, "carol");
    assert_eq!(
        cluster.effect_starts("ship"),
        0,
        "carol's answer ran nothing"
    );

    post(answer, OPERATOR_KEY, json!({ "approve": true })).await;
    let recorded = audited(&observer, &task, "olga's answer recorded", |r| {
        r.action == "approve" && r.verdict == Verdict::Done
    })
    .await;
    assert_eq!(
        (recorded.principal.as_str(), recorded.proof.as_str()),
        ("olga", "delegated:gateway")
    );
    let result = eventually("the run's end", Duration::from_secs(30), || {
        let (store, session, task_id) = (store.clone(), session.clone(), task_id.clone());
        async move {
            store
                .final_result("acme", &session, &task_id)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(
        cluster.effect_starts("ship"),
        1,
        "the approved call ran once"
    );
}
