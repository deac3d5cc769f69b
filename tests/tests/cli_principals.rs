//! The `skein` command run by a principal, as a user runs it (the `skein-node` binary, with the
//! principals file and key given as flags), against real nats-server and redis-server:
//! - `skein dlq`: a tenant principal lists, shows, replays and removes only its tenant's letters
//!   (another tenant's, or one of no tenant, is "no dead letter"), needs `operate` to replay, and
//!   purges only its own; an operator of every tenant sees them all. A replay is signed by whoever
//!   replays it, so a lead that requires signed operations runs the replayed task, and each
//!   replay, removal and purge is in the audit trail naming the principal;
//! - `skein audit`: a tenant principal reads only its tenant's records;
//! - `skein sessions rm` and `skein workspace rm`: only in the principal's tenant, with `operate`,
//!   audited; a key the principals file does not list, or none where signatures are required,
//!   is refused before anything is done;
//! - `skein keys new`: the seed printed is the key of the entry printed, and the entry loads.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use skein_common::audit::{AuditFilter, AuditRecord, Verdict};
use skein_common::bus::Bus;
use skein_common::principals::{Principal, PrincipalBook, Role, Signer};
use skein_common::protocol::TurnStatus;
use skein_tests::support::cluster::{submission, TestCluster};
use skein_tests::support::{eventually, unique};

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

/// Environment the command would otherwise read its principal from.
const PRINCIPAL_ENV: [&str; 4] = [
    "SKEIN_PRINCIPALS",
    "SKEIN_PRINCIPAL_KEY",
    "SKEIN_REQUIRE_SIGNED",
    "SKEIN_TENANT",
];

/// The principals of these tests, and the file that lists them.
struct People {
    /// acme: submit and operate.
    acme_ops: Signer,
    /// acme: submit only.
    acme_viewer: Signer,
    /// every tenant: operate.
    root: Signer,
    file: PathBuf,
}

fn people(cluster: &TestCluster) -> People {
    let (acme_ops, acme_viewer, root) =
        (Signer::generate(), Signer::generate(), Signer::generate());
    let entry = |name: &str, tenant: &str, roles: &str, key: &Signer| {
        format!(
            "[[principals]]\nname = \"{name}\"\ntenant = \"{tenant}\"\nroles = [{roles}]\nkey = \"{}\"\n\n",
            key.public_key()
        )
    };
    let text = [
        entry("acme-ops", "acme", "\"submit\", \"operate\"", &acme_ops),
        entry("acme-viewer", "acme", "\"submit\"", &acme_viewer),
        entry("root", "*", "\"operate\"", &root),
    ]
    .concat();
    let file = cluster.dir.join(format!("{}.toml", unique("principals")));
    std::fs::write(&file, text).expect("principals file written");
    People {
        acme_ops,
        acme_viewer,
        root,
        file,
    }
}

/// Runs `skein` with `args`, none of its principal settings taken from the environment.
async fn skein(args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(SKEIN);
    command.args(args).env("SKEIN_LOG_FORMAT", "json");
    for name in PRINCIPAL_ENV {
        command.env_remove(name);
    }
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("skein finishes within 60s")
        .expect("skein runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The output of a command that succeeded.
fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The error of a command that failed.
fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure; stdout: {}",
        text(&out.stdout)
    );
    text(&out.stderr)
}

/// The flags that connect to the cluster as the principal of `key`.
fn as_principal(cluster: &TestCluster, file: &Path, key: &Signer) -> Vec<String> {
    vec![
        "--nats-url".into(),
        cluster.nats.url.clone(),
        "--principals".into(),
        file.display().to_string(),
        "--principal-key".into(),
        key.seed(),
    ]
}

/// `skein dlq <action>` as the principal of `key`.
async fn dlq(cluster: &TestCluster, people: &People, key: &Signer, action: &[&str]) -> Output {
    let mut args = vec![
        "dlq".to_owned(),
        "--redis-url".into(),
        cluster.redis.url.clone(),
    ];
    args.extend(as_principal(cluster, &people.file, key));
    args.extend(action.iter().map(|a| a.to_string()));
    skein(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
}

/// The numbers of the letters `skein dlq list --json` shows the principal of `key`.
async fn listed(cluster: &TestCluster, people: &People, key: &Signer) -> Vec<u64> {
    let out = dlq(cluster, people, key, &["list", "--json"]).await;
    succeeded(&out)
        .lines()
        .map(|line| {
            let letter: Value = serde_json::from_str(line).expect("a JSON letter per line");
            letter["seq"].as_u64().expect("a number")
        })
        .collect()
}

/// A submission of `tenant` set aside as a dead letter (as a lead does with one it refuses): its
/// task, session and letter number.
async fn set_aside(bus: &Bus, tenant: &str) -> (String, String, u64) {
    let session = unique("s");
    let task = submission(tenant, &session, &format!("work of {tenant}"));
    let subject = format!("skein.submit.{tenant}.{session}");
    let payload = serde_json::to_vec(&task).expect("encodes");
    bus.dead_letter(
        &subject,
        Some(&task.task_id),
        None,
        payload.into(),
        "set aside by the test",
        1,
    )
    .await
    .expect("letter stored");
    let seq = letter_of(bus, &subject).await;
    (task.task_id, session, seq)
}

/// The number of the letter of `subject`.
async fn letter_of(bus: &Bus, subject: &str) -> u64 {
    bus.dead_letters()
        .await
        .expect("dead letters readable")
        .into_iter()
        .find(|l| l.original_subject == subject)
        .expect("the letter is stored")
        .seq
}

/// Waits for the record of `action` in `tenant`'s audit trail that `matches`.
async fn audited(
    bus: &Bus,
    tenant: &str,
    action: &str,
    matches: impl Fn(&AuditRecord) -> bool,
) -> AuditRecord {
    let filter = AuditFilter {
        tenant: Some(tenant.to_owned()),
        ..Default::default()
    };
    eventually(
        &format!("the {action} record of tenant {tenant}"),
        Duration::from_secs(20),
        || {
            let (bus, filter) = (bus.clone(), filter.clone());
            let matches = &matches;
            async move {
                let records = bus.audit_records(&filter, 1000).await.ok()?;
                records
                    .into_iter()
                    .find(|r| r.action == action && matches(r))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_principal_sees_and_replays_only_its_tenant_s_dead_letters() {
    let cluster = TestCluster::start();
    let people = people(&cluster);
    let principals = people.file.display().to_string();
    // A lead that requires signed operations: a replay runs only if whoever replays signs it.
    let script = cluster.scenario(json!([{ "steps": [ { "answer": "replayed: {{input}}" } ] }]));
    cluster
        .start_nodes(
            1,
            &[
                "--scenario",
                &script,
                "--principals",
                &principals,
                "--require-signed",
                "true",
            ],
        )
        .await;
    let client = cluster.client().await;
    let bus = client.bus();
    let (acme_task, acme_session, acme) = set_aside(bus, "acme").await;
    let (_, _, globex) = set_aside(bus, "globex").await;
    bus.dead_letter(
        "skein.tool.default.read_file",
        None,
        None,
        "garbage".into(),
        "undecodable",
        1,
    )
    .await
    .expect("letter stored");
    let tenantless = letter_of(bus, "skein.tool.default.read_file").await;

    // Each sees its own: the tenant principal its tenant's, the operator every letter.
    assert_eq!(
        listed(&cluster, &people, &people.acme_ops).await,
        vec![acme]
    );
    assert_eq!(
        listed(&cluster, &people, &people.root).await,
        vec![acme, globex, tenantless]
    );
    let shown = dlq(
        &cluster,
        &people,
        &people.acme_ops,
        &["show", &acme.to_string()],
    )
    .await;
    let shown: Value = serde_json::from_str(&succeeded(&shown)).expect("show prints JSON");
    assert_eq!(shown["tenant"], "acme");
    assert_eq!(shown["task_id"], acme_task.as_str());

    // Another tenant's letter, and one of no tenant, are not there for acme.
    for seq in [globex, tenantless] {
        let seq = seq.to_string();
        for action in ["show", "replay", "remove"] {
            let out = dlq(&cluster, &people, &people.acme_ops, &[action, &seq]).await;
            let error = failed(&out);
            assert!(
                error.contains(&format!("no dead letter {seq}")),
                "{action} {seq}: {error}"
            );
        }
    }
    assert_eq!(
        listed(&cluster, &people, &people.root).await,
        vec![acme, globex, tenantless],
        "nothing was replayed or removed"
    );

    // Without the operate role, no replay.
    let out = dlq(
        &cluster,
        &people,
        &people.acme_viewer,
        &["replay", &acme.to_string()],
    )
    .await;
    let error = failed(&out);
    assert!(
        error.contains("acme-viewer") && error.contains("role operate"),
        "{error}"
    );

    // acme's operator replays its letter: signed, so the lead runs the task to its end.
    let out = dlq(
        &cluster,
        &people,
        &people.acme_ops,
        &["replay", &acme.to_string()],
    )
    .await;
    succeeded(&out);
    let store = cluster.store().await;
    let answer = eventually("the replayed task's end", Duration::from_secs(30), || {
        let store = store.clone();
        let (session, task) = (acme_session.clone(), acme_task.clone());
        async move {
            let ended = store.final_result("acme", &session, &task).await.ok()??;
            (ended.status == TurnStatus::Completed).then_some(ended.answer.unwrap_or_default())
        }
    })
    .await;
    assert!(answer.contains("replayed: work of acme"), "{answer}");
    assert!(bus.dead_letter_at(acme).await.expect("readable").is_none());

    // The replay is in acme's audit trail, naming who replayed it.
    let record = audited(bus, "acme", "dlq_replay", |r| r.target == acme.to_string()).await;
    assert_eq!(record.principal, "acme-ops");
    assert_eq!(record.proof, "signed");
    assert_eq!(record.task_id, acme_task);
    assert_eq!(record.verdict, Verdict::Done);

    // acme reads its own records, and only those.
    let mut audit = vec!["audit".to_owned()];
    audit.extend(as_principal(&cluster, &people.file, &people.acme_ops));
    let args: Vec<&str> = audit.iter().map(String::as_str).collect();
    let own = skein(&[args.as_slice(), &["--json"]].concat()).await;
    let records: Vec<AuditRecord> = succeeded(&own)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON record per line"))
        .collect();
    assert!(records.iter().all(|r| r.tenant == "acme"), "{records:?}");
    assert!(
        records.iter().any(|r| r.action == "dlq_replay"),
        "{records:?}"
    );
    let plain = skein(&[args.as_slice(), &["--task", &acme_task]].concat()).await;
    let plain = succeeded(&plain);
    assert!(
        plain.contains("\tacme\tacme-ops (signed)\tdlq_replay\t") && plain.contains("\tdone"),
        "{plain}"
    );
    let foreign = skein(&[args.as_slice(), &["--tenant", "globex"]].concat()).await;
    let error = failed(&foreign);
    assert!(
        error.contains("acme-ops") && error.contains("globex"),
        "{error}"
    );

    // A tenant's purge removes its letters only, one by one, each recorded.
    let (_, _, second) = set_aside(bus, "acme").await;
    let out = dlq(&cluster, &people, &people.acme_ops, &["purge"]).await;
    succeeded(&out);
    assert!(
        text(&out.stderr).contains("purged 1 dead letters of tenant acme"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        listed(&cluster, &people, &people.root).await,
        vec![globex, tenantless]
    );
    let record = audited(bus, "acme", "dlq_purge", |r| r.target == second.to_string()).await;
    assert_eq!(record.principal, "acme-ops");

    // The operator removes a letter of no tenant, then purges the rest.
    let out = dlq(
        &cluster,
        &people,
        &people.root,
        &["remove", &tenantless.to_string()],
    )
    .await;
    succeeded(&out);
    let out = dlq(&cluster, &people, &people.root, &["purge"]).await;
    succeeded(&out);
    assert!(
        text(&out.stderr).contains("purged 1 dead letters"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        listed(&cluster, &people, &people.root).await,
        Vec::<u64>::new()
    );
    let removed = audited(bus, "*", "dlq_remove", |r| {
        r.target == tenantless.to_string()
    })
    .await;
    assert_eq!(removed.principal, "root");
    let purged = audited(bus, "*", "dlq_purge", |_| true).await;
    assert_eq!(
        (purged.principal.as_str(), purged.target.as_str()),
        ("root", "1 letters")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_workspaces_are_removed_only_by_an_operator_of_their_tenant() {
    let cluster = TestCluster::start();
    let people = people(&cluster);
    let bus = cluster.client().await.bus().clone();
    let file = cluster.dir.join("notes.txt");
    std::fs::write(&file, "a note").expect("file written");
    let file = file.display().to_string();
    let (first, second) = (unique("s"), unique("s"));

    let workspace = |key: &Signer, tenant: &str, action: &[&str]| {
        let mut args = vec!["workspace".to_owned(), action[0].to_owned()];
        args.extend(as_principal(&cluster, &people.file, key));
        args.extend(["--tenant".to_owned(), tenant.to_owned()]);
        args.extend(action[1..].iter().map(|a| a.to_string()));
        args
    };
    let run = |args: Vec<String>| async move {
        skein(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
    };
    for session in [&first, &second] {
        let put = workspace(
            &people.acme_ops,
            "acme",
            &["put", session, "notes.txt", &file],
        );
        succeeded(&run(put).await);
    }

    // Another tenant's approvals are out of sight; its own are listed (none wait).
    let approvals = |tenant: &str| {
        let mut args = vec![
            "approvals".to_owned(),
            "--redis-url".into(),
            cluster.redis.url.clone(),
        ];
        args.extend(as_principal(&cluster, &people.file, &people.acme_viewer));
        args.extend(["--tenant".to_owned(), tenant.to_owned(), "--json".into()]);
        args
    };
    let error = failed(&run(approvals("globex")).await);
    assert!(
        error.contains("may not list the approvals of tenant globex"),
        "{error}"
    );
    assert_eq!(succeeded(&run(approvals("acme")).await).trim(), "[]");

    // Another tenant's workspace is out of reach; removing takes the operate role.
    let foreign = run(workspace(&people.acme_ops, "globex", &["ls", &first])).await;
    let error = failed(&foreign);
    assert!(
        error.contains("acme-ops belongs to tenant acme") && error.contains("globex"),
        "{error}"
    );
    let viewer = run(workspace(
        &people.acme_viewer,
        "acme",
        &["rm", &first, "notes.txt"],
    ))
    .await;
    let error = failed(&viewer);
    assert!(
        error.contains("acme-viewer") && error.contains("role operate"),
        "{error}"
    );
    let removed = run(workspace(
        &people.acme_ops,
        "acme",
        &["rm", &first, "notes.txt"],
    ))
    .await;
    succeeded(&removed);
    let record = audited(&bus, "acme", "workspace_remove", |r| {
        r.target == format!("{first}: notes.txt")
    })
    .await;
    assert_eq!(
        (record.principal.as_str(), record.proof.as_str()),
        ("acme-ops", "signed")
    );

    let sessions = |key: &Signer, tenant: &str, session: &str| {
        let mut args = vec![
            "sessions".to_owned(),
            "--redis-url".into(),
            cluster.redis.url.clone(),
            "--tenant".into(),
            tenant.into(),
            "rm".into(),
            session.into(),
        ];
        args.extend(as_principal(&cluster, &people.file, key));
        args
    };
    let foreign = run(sessions(&people.acme_ops, "globex", &second)).await;
    let error = failed(&foreign);
    assert!(
        error.contains("may not remove the sessions of tenant globex"),
        "{error}"
    );
    let viewer = run(sessions(&people.acme_viewer, "acme", &second)).await;
    let error = failed(&viewer);
    assert!(
        error.contains("acme-viewer") && error.contains("role operate"),
        "{error}"
    );
    let removed = run(sessions(&people.acme_ops, "acme", &second)).await;
    let out = succeeded(&removed);
    assert!(
        out.contains(&format!("removed session {second} (0 keys, 1 files)")),
        "{out}"
    );
    let record = audited(&bus, "acme", "session_remove", |r| r.target == second).await;
    assert_eq!(record.principal, "acme-ops");

    // No key where signatures are required, or a key the file does not list: refused.
    let principals = people.file.display().to_string();
    let base = [
        "dlq",
        "--nats-url",
        cluster.nats.url.as_str(),
        "--principals",
        principals.as_str(),
    ];
    let unsigned = skein(&[&base[..], &["--require-signed", "true", "list"]].concat()).await;
    let error = failed(&unsigned);
    assert!(
        error.contains("this cluster requires signed operations: set SKEIN_PRINCIPAL_KEY"),
        "{error}"
    );
    let stranger = Signer::generate().seed();
    let unlisted = skein(&[&base[..], &["--principal-key", &stranger, "list"]].concat()).await;
    let error = failed(&unlisted);
    assert!(
        error.contains("not listed in the principals file"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_new_prints_a_seed_and_the_principals_entry_of_its_key() {
    let out = skein(&[
        "keys", "new", "--name", "alice", "--tenant", "acme", "--role", "submit", "--role",
        "operate",
    ])
    .await;
    let seed = succeeded(&out).trim().to_owned();
    let stderr = text(&out.stderr);
    let entry = &stderr[stderr.find("[[principals]]").expect("an entry")..];
    let book = PrincipalBook::parse(entry).expect("the entry loads");
    let key = Signer::from_seed(&seed).expect("a user seed").public_key();
    assert!(stderr.contains(&format!("public key: {key}")), "{stderr}");
    assert!(!stderr.contains(&seed), "the seed goes to stdout only");
    assert_eq!(
        book.get(&key),
        Some(&Principal {
            name: "alice".into(),
            tenant: "acme".into(),
            roles: vec![Role::Submit, Role::Operate],
        })
    );

    let out = skein(&["keys", "new", "--json"]).await;
    let pair: Value = serde_json::from_str(succeeded(&out).trim()).expect("JSON");
    let seed = pair["seed"].as_str().expect("a seed");
    assert_eq!(
        Signer::from_seed(seed).expect("a user seed").public_key(),
        pair["public_key"].as_str().expect("a public key")
    );

    let bad = skein(&["keys", "new", "--role", "admin"]).await;
    assert!(failed(&bad).contains("unknown role"));
}
