//! Session workspaces in the NATS object store, continued: commands check the session's files
//! out and their changes back in (caps, links, concurrent changes), `skein workspace` seeds,
//! lists and fetches files, and a file whose chunks are lost is reported, not waited for.

use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use skein_common::protocol::{TaskOrigin, TurnStatus};
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{WorkspaceError, WorkspaceStoreConfig};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::fake_openai::tool_messages;
use skein_tests::support::workspaces::{object_store, path, session, store};
use skein_tests::support::{unique, FakeOpenAi, FakeReply, NatsServer};
use skein_worker::scope::{ScopeStats, TaskScope};
use skein_worker::workspace::{CommandWorkspace, ObjectCheckout};

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

fn origin(tenant: &str, session: &str) -> TaskOrigin {
    TaskOrigin {
        task_id: unique("task"),
        tenant: tenant.into(),
        user: "tester".into(),
        session: session.into(),
        workspace: session.into(),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_check_files_out_and_their_changes_back_in() {
    let nats = NatsServer::start();
    let objects = Arc::new(store(&nats).await);
    let session_id = unique("s");
    let s = session("acme", &session_id);
    for (p, content) in [
        ("keep.txt", "same"),
        ("change.txt", "before"),
        ("remove.txt", "bye"),
        ("dir/race.txt", "v1"),
    ] {
        objects
            .write(&s, &path(p), Bytes::from(content), Expect::Any)
            .await
            .expect("seeded");
    }
    let checkout = ObjectCheckout::new(objects.clone());
    let origin = origin("acme", &session_id);
    let scratch_root = std::env::temp_dir().join(unique("skein-scratch"));
    let mut scope = TaskScope::new(Arc::new(ScopeStats::new()), scratch_root.clone(), "shell");

    let checked_out = checkout
        .check_out(&origin, &mut scope)
        .await
        .expect("checks out");
    let dir = checked_out.dir.clone();
    assert!(
        dir.starts_with(&scratch_root),
        "{dir:?} is in the scratch space"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("dir/race.txt")).expect("copied"),
        "v1"
    );
    // What a command does: change, add, remove, link out and in.
    std::fs::write(dir.join("change.txt"), "after").expect("changed");
    std::fs::write(dir.join("new.txt"), "new").expect("added");
    std::fs::remove_file(dir.join("remove.txt")).expect("removed");
    std::fs::write(dir.join("dir/race.txt"), "v2 from the command").expect("changed");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("/etc/hostname", dir.join("escape")).expect("link out");
        std::os::unix::fs::symlink(dir.join("new.txt"), dir.join("alias")).expect("link in");
    }
    // Meanwhile another call changes one of the files in the store.
    objects
        .write(
            &s,
            &path("dir/race.txt"),
            Bytes::from_static(b"v2 from elsewhere"),
            Expect::Any,
        )
        .await
        .expect("changed elsewhere");

    let summary = checkout
        .check_in(&origin, checked_out)
        .await
        .expect("checks in");
    #[cfg(unix)]
    assert_eq!(
        summary,
        "workspace: 3 written, 1 removed; kept the newer version of dir/race.txt (changed in the \
         workspace during the command); not stored: escape (a link leading outside the workspace)"
    );
    let read = |p: &'static str| {
        let (objects, s) = (objects.clone(), s.clone());
        async move {
            objects
                .read(&s, &path(p))
                .await
                .map(|(content, _)| String::from_utf8_lossy(&content).into_owned())
        }
    };
    assert_eq!(read("change.txt").await.expect("written"), "after");
    assert_eq!(read("new.txt").await.expect("written"), "new");
    assert_eq!(read("keep.txt").await.expect("kept"), "same");
    assert_eq!(
        read("dir/race.txt").await.expect("kept"),
        "v2 from elsewhere"
    );
    assert!(matches!(
        read("remove.txt").await,
        Err(WorkspaceError::NotFound(_))
    ));
    #[cfg(unix)]
    {
        assert_eq!(read("alias").await.expect("a copy"), "new");
        assert!(matches!(
            read("escape").await,
            Err(WorkspaceError::NotFound(_))
        ));
    }

    // A second check-out with nothing changed writes nothing back.
    let again = checkout
        .check_out(&origin, &mut scope)
        .await
        .expect("checks out");
    assert_ne!(again.dir, dir, "a fresh directory");
    assert_eq!(checkout.check_in(&origin, again).await, Ok(String::new()));

    scope.close().await.expect("the scope closes");
    assert!(!dir.exists(), "the checked-out files go with the scope");
    let _ = std::fs::remove_dir_all(&scratch_root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_outgrows_the_caps_writes_nothing_back() {
    let nats = NatsServer::start();
    let cfg = WorkspaceStoreConfig {
        max_file_bytes: 10,
        max_session_bytes: 20,
        ..WorkspaceStoreConfig::default()
    };
    let objects = Arc::new(object_store(&nats.url, &cfg, 0).await);
    let session_id = unique("s");
    let s = session("acme", &session_id);
    objects
        .write(
            &s,
            &path("a"),
            Bytes::from_static(b"0123456789"),
            Expect::Any,
        )
        .await
        .expect("seeded");
    let checkout = ObjectCheckout::new(objects.clone());
    let origin = origin("acme", &session_id);
    let scratch_root = std::env::temp_dir().join(unique("skein-scratch"));
    let mut scope = TaskScope::new(Arc::new(ScopeStats::new()), scratch_root.clone(), "shell");

    let out = checkout
        .check_out(&origin, &mut scope)
        .await
        .expect("checks out");
    std::fs::write(out.dir.join("big"), "x".repeat(11)).expect("written");
    std::fs::write(out.dir.join("a"), "changed").expect("written");
    let refused = checkout
        .check_in(&origin, out)
        .await
        .expect_err("over the file cap");
    assert!(
        refused
            .to_string()
            .contains("workspace not updated: big (11 B) over the 10 B per-file cap"),
        "{refused}"
    );

    let out = checkout
        .check_out(&origin, &mut scope)
        .await
        .expect("checks out");
    for name in ["b", "c"] {
        std::fs::write(out.dir.join(name), "x".repeat(6)).expect("written");
    }
    let refused = checkout
        .check_in(&origin, out)
        .await
        .expect_err("over the session cap");
    assert!(
        refused.to_string().contains("workspace not updated")
            && refused.to_string().contains("at most 20 B"),
        "{refused}"
    );
    let files: Vec<String> = objects
        .list(&s)
        .await
        .expect("lists")
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert_eq!(files, ["a"], "nothing was written back");
    let (a, _) = objects.read(&s, &path("a")).await.expect("reads");
    assert_eq!(a, Bytes::from_static(b"0123456789"));
    scope.close().await.expect("the scope closes");
    let _ = std::fs::remove_dir_all(&scratch_root);
}

async fn skein(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut command = tokio::process::Command::new(SKEIN);
    command
        .args(args)
        .env("SKEIN_LOG_FORMAT", "json")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("skein runs");
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().expect("a stdin pipe");
        // A command that refuses early may close its input first.
        let _ = pipe.write_all(input).await;
        drop(pipe);
    }
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("skein finishes within 60s")
        .expect("skein runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skein_workspace_seeds_lists_and_fetches_files() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::tool("read_file", json!({"path": "brief.md"})),
        FakeReply::tool(
            "write_file",
            json!({"path": "out/answer.md", "content": "answered"}),
        ),
        FakeReply::answer("done"),
    ])
    .await;
    cluster.spawn_worker(cluster.worker_config(&[]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));
    let session_id = unique("s");
    let url = cluster.nats.url.clone();
    let common = ["--nats-url", url.as_str(), "--tenant", "acme"];
    let run = |action: &'static str, rest: Vec<String>, stdin: Option<&'static [u8]>| {
        let mut args: Vec<String> = vec!["workspace".into(), action.into()];
        args.extend(common.iter().map(|s| s.to_string()));
        args.extend(rest);
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            skein(&args, stdin).await
        }
    };

    // Seed from a file and from standard input.
    let local = cluster.dir.join("brief.md");
    std::fs::write(&local, "the brief").expect("local file");
    let put = run(
        "put",
        vec![
            session_id.clone(),
            "brief.md".into(),
            local.display().to_string(),
        ],
        None,
    )
    .await;
    assert!(put.status.success(), "{}", text(&put.stderr));
    assert!(
        text(&put.stderr).contains("stored brief.md"),
        "{}",
        text(&put.stderr)
    );
    let piped = run(
        "put",
        vec![session_id.clone(), "data/raw.bin".into(), "-".into()],
        Some(b"\x00\x01binary"),
    )
    .await;
    assert!(piped.status.success(), "{}", text(&piped.stderr));

    // A turn reads the seeded file and writes one of its own.
    let (result, _) = cluster
        .run(&submission("acme", &session_id, "answer the brief"))
        .await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    assert_eq!(tool_messages(&model.requests()[1]), ["the brief"]);

    let ls = run("ls", vec![session_id.clone()], None).await;
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    let lines: Vec<String> = text(&ls.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(lines, ["9 brief.md", "8 data/raw.bin", "8 out/answer.md"]);

    let get = run(
        "get",
        vec![session_id.clone(), "out/answer.md".into()],
        None,
    )
    .await;
    assert!(get.status.success(), "{}", text(&get.stderr));
    assert_eq!(get.stdout, b"answered");
    let saved = cluster.dir.join("raw.bin");
    let to_file = run(
        "get",
        vec![
            session_id.clone(),
            "data/raw.bin".into(),
            "--out".into(),
            saved.display().to_string(),
        ],
        None,
    )
    .await;
    assert!(to_file.status.success(), "{}", text(&to_file.stderr));
    assert_eq!(std::fs::read(&saved).expect("saved"), b"\x00\x01binary");

    // Clear errors: a missing file, a path that escapes, a file over the cap, another tenant.
    let missing = run("get", vec![session_id.clone(), "nope.md".into()], None).await;
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("nope.md: no such file"),
        "{}",
        text(&missing.stderr)
    );
    let escape = run(
        "put",
        vec![session_id.clone(), "../x".into(), "-".into()],
        Some(b"x"),
    )
    .await;
    assert!(!escape.status.success());
    assert!(
        text(&escape.stderr).contains("path escapes the workspace"),
        "{}",
        text(&escape.stderr)
    );
    let big = run(
        "put",
        vec![
            session_id.clone(),
            "big".into(),
            "-".into(),
            "--workspace-max-file".into(),
            "4".into(),
        ],
        Some(b"12345"),
    )
    .await;
    assert!(!big.status.success());
    assert!(
        text(&big.stderr).contains("larger than 4 B"),
        "{}",
        text(&big.stderr)
    );
    let other = skein(
        &[
            "workspace",
            "ls",
            "--nats-url",
            &url,
            "--tenant",
            "globex",
            &session_id,
        ],
        None,
    )
    .await;
    assert!(other.status.success(), "{}", text(&other.stderr));
    assert!(text(&other.stdout).is_empty(), "{}", text(&other.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_whose_chunks_are_lost_is_reported_not_waited_for() {
    let nats = NatsServer::start();
    let objects = object_store(&nats.url, &WorkspaceStoreConfig::default(), 0).await;
    let s = session("acme", &unique("s"));
    let version = objects
        .write(
            &s,
            &path("a.bin"),
            Bytes::from(vec![7u8; 300_000]),
            Expect::Any,
        )
        .await
        .expect("writes");
    // Someone purges the chunks behind the store's back.
    let client = async_nats::connect(&nats.url).await.expect("connects");
    let stream = async_nats::jetstream::new(client)
        .get_stream("OBJ_skein-ws-acme")
        .await
        .expect("the bucket's stream");
    stream
        .purge()
        .filter(format!("$O.skein-ws-acme.C.{}", version.nuid))
        .await
        .expect("purged");
    let read = tokio::time::timeout(Duration::from_secs(30), objects.read(&s, &path("a.bin")))
        .await
        .expect("the read ends");
    assert!(
        matches!(&read, Err(WorkspaceError::Unavailable { message, .. }) if message.contains("a.bin is damaged")),
        "{read:?}"
    );
    // Writing it again repairs it.
    objects
        .write(
            &s,
            &path("a.bin"),
            Bytes::from_static(b"fresh"),
            Expect::Any,
        )
        .await
        .expect("writes again");
    let (content, _) = objects.read(&s, &path("a.bin")).await.expect("reads");
    assert_eq!(content, Bytes::from_static(b"fresh"));
}
