//! Session workspaces in the NATS object store, on a real nats-server (2.9 in CI): files written on
//! one worker are read on another with no shared directory, the file tools (edit, glob, grep)
//! work on it, caps are refused clearly, writes are all-or-nothing under concurrent reads,
//! sessions and tenants are isolated, commands check files out and back in, and
//! `skein workspace` seeds and fetches files.

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use skein_common::bus::{Bus, DEFAULT_MAX_PAYLOAD};
use skein_common::config::NatsConfig;
use skein_common::protocol::{EventKind, TaskOrigin, TurnEvent, TurnStatus};
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{
    ObjectWorkspaces, SessionRef, WorkspaceError, WorkspacePath, WorkspaceStoreConfig,
};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::{unique, FakeOpenAi, FakeReply, NatsServer};
use skein_worker::scope::{ScopeStats, TaskScope};
use skein_worker::workspace::{CommandWorkspace, ObjectCheckout};

const SKEIN: &str = env!("CARGO_BIN_EXE_skein-node");

async fn store_with(nats_url: &str, cfg: &WorkspaceStoreConfig, cache: usize) -> ObjectWorkspaces {
    let bus = Bus::connect(
        &NatsConfig::local(nats_url.to_owned()),
        "workspace-test",
        DEFAULT_MAX_PAYLOAD,
    )
    .await
    .expect("connects to the test NATS");
    ObjectWorkspaces::new(bus.jetstream().clone(), cfg, cache)
}

async fn store(nats: &NatsServer) -> ObjectWorkspaces {
    store_with(&nats.url, &WorkspaceStoreConfig::default(), 16 << 20).await
}

fn path(p: &str) -> WorkspacePath {
    WorkspacePath::parse(p).expect("a valid path")
}

fn session(tenant: &str, session: &str) -> SessionRef {
    SessionRef::new(tenant, session).expect("valid tokens")
}

/// `(tool, ok, worker_id)` of every finished call, in order.
fn finished_tools(events: &[TurnEvent]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            EventKind::ToolFinished {
                tool,
                ok,
                worker_id,
                ..
            } => Some((tool.clone(), *ok, worker_id.clone())),
            _ => None,
        })
        .collect()
}

/// The tool results the model saw in `request`, in order.
fn tool_messages(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Files anywhere under `dir` (none if it does not exist).
fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            } else {
                found.push(entry.path().display().to_string());
            }
        }
    }
    found
}

/// A worker of `pool` providing `tools`, with its own workspace root and scratch directory.
fn worker(cluster: &TestCluster, pool: &str, tools: &str, extra: &[&str]) -> skein_worker::Config {
    let mut flags = vec!["--pool", pool, "--tools", tools, "--subagents", "false"];
    flags.extend_from_slice(extra);
    let mut cfg = cluster.worker_config(&flags);
    cfg.workspace_root = Some(cluster.dir.join(pool).join("workspaces"));
    cfg.scratch_dir = Some(cluster.dir.join(pool).join("scratch"));
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_round_trips_files_on_this_server() {
    let nats = NatsServer::start();
    let objects = store(&nats).await;
    let session = session("acme", &unique("s"));

    assert!(objects.list(&session).await.expect("lists").is_empty());
    let missing = objects.read(&session, &path("a.txt")).await;
    assert!(
        matches!(missing, Err(WorkspaceError::NotFound(_))),
        "{missing:?}"
    );

    // Several chunks, and an empty file.
    let big: Bytes = (0..400_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let written = objects
        .write(&session, &path("dir/big.bin"), big.clone(), Expect::Any)
        .await
        .expect("writes");
    assert_eq!(written.size, big.len() as u64);
    objects
        .write(&session, &path("empty"), Bytes::new(), Expect::Absent)
        .await
        .expect("writes an empty file");

    // Another process (no shared cache) reads the same.
    let fresh = store(&nats).await;
    let (read, version) = fresh
        .read(&session, &path("dir/big.bin"))
        .await
        .expect("reads");
    assert_eq!(read, big);
    assert_eq!(version, written);
    let (empty, _) = fresh.read(&session, &path("empty")).await.expect("reads");
    assert!(empty.is_empty());
    let listed: Vec<(String, u64)> = fresh
        .list(&session)
        .await
        .expect("lists")
        .into_iter()
        .map(|f| (f.path, f.size))
        .collect();
    assert_eq!(
        listed,
        [("dir/big.bin".to_owned(), 400_000), ("empty".to_owned(), 0)]
    );

    // Conditional writes: a stale version is refused, the current one accepted.
    let stale = fresh
        .write(
            &session,
            &path("empty"),
            Bytes::from_static(b"x"),
            Expect::Seq(written.seq),
        )
        .await;
    assert!(
        matches!(stale, Err(WorkspaceError::Conflict(_))),
        "{stale:?}"
    );
    let absent = fresh
        .write(
            &session,
            &path("empty"),
            Bytes::from_static(b"x"),
            Expect::Absent,
        )
        .await;
    assert!(
        matches!(absent, Err(WorkspaceError::Conflict(_))),
        "{absent:?}"
    );
    let replaced = fresh
        .write(
            &session,
            &path("dir/big.bin"),
            Bytes::from_static(b"small"),
            Expect::Seq(written.seq),
        )
        .await
        .expect("the current version may be replaced");
    // The first process cached the big content when it wrote it; its cache is checked against
    // the current version, so it reads the new content.
    let (now, _) = objects
        .read(&session, &path("dir/big.bin"))
        .await
        .expect("reads");
    assert_eq!(now, Bytes::from_static(b"small"));

    // A file and a directory cannot share a name.
    let clash = fresh
        .write(
            &session,
            &path("dir"),
            Bytes::from_static(b"x"),
            Expect::Any,
        )
        .await;
    assert!(
        matches!(&clash, Err(WorkspaceError::Invalid(m)) if m.contains("dir is a directory")),
        "{clash:?}"
    );
    let below = fresh
        .write(
            &session,
            &path("empty/x"),
            Bytes::from_static(b"x"),
            Expect::Any,
        )
        .await;
    assert!(
        matches!(&below, Err(WorkspaceError::Invalid(m)) if m.contains("empty is a file")),
        "{below:?}"
    );

    // Removal.
    assert!(objects
        .remove(&session, &path("dir/big.bin"), Expect::Seq(replaced.seq))
        .await
        .expect("removes"));
    assert!(!objects
        .remove(&session, &path("dir/big.bin"), Expect::Any)
        .await
        .expect("nothing left to remove"));
    let gone = fresh.read(&session, &path("dir/big.bin")).await;
    assert!(matches!(gone, Err(WorkspaceError::NotFound(_))), "{gone:?}");
    assert_eq!(fresh.list(&session).await.expect("lists").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_on_one_worker_is_read_on_another_without_a_shared_directory() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::tool(
            "write_file",
            json!({"path": "notes/plan.md", "content": "step one\nstep two\nstep three\n"}),
        ),
        FakeReply::tool(
            "edit_file",
            json!({"path": "notes/plan.md", "old_string": "step two", "new_string": "step 2"}),
        ),
        FakeReply::ToolCalls(vec![
            ("read_file".into(), json!({"path": "notes/plan.md"})),
            ("list_files".into(), json!({})),
            ("glob_files".into(), json!({"pattern": "**/*.md"})),
            (
                "grep_files".into(),
                json!({"pattern": "^step (one|[0-9])$"}),
            ),
            ("read_file".into(), json!({"path": "notes"})),
        ]),
        FakeReply::tool(
            "edit_file",
            json!({"path": "notes/plan.md", "old_string": "step", "new_string": "STEP"}),
        ),
        FakeReply::answer("planned"),
    ])
    .await;
    // Two pools, so the lead sends the writes to one worker and the reads to the other.
    let writer = worker(&cluster, "writers", "write_file,edit_file", &[]);
    let reader = worker(
        &cluster,
        "readers",
        "read_file,list_files,glob_files,grep_files",
        &[],
    );
    let writer_id = writer.process.instance_id.clone().expect("an id");
    let reader_id = reader.process.instance_id.clone().expect("an id");
    cluster.spawn_worker(writer);
    cluster.spawn_worker(reader);
    cluster.wait_for_workers(2).await;
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));

    let session_id = unique("s");
    let (result, events) = cluster.run(&submission("acme", &session_id, "plan")).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");

    let finished = finished_tools(&events);
    let by_tool = |name: &str| -> Vec<&(String, bool, String)> {
        finished.iter().filter(|(tool, ..)| tool == name).collect()
    };
    assert!(by_tool("write_file")
        .iter()
        .all(|(_, ok, id)| *ok && *id == writer_id));
    assert!(by_tool("read_file")
        .iter()
        .all(|(_, _, id)| *id == reader_id));
    assert!(by_tool("grep_files")
        .iter()
        .all(|(_, ok, id)| *ok && *id == reader_id));

    let requests = model.requests();
    assert_eq!(
        tool_messages(&requests[1]),
        ["wrote 29 bytes to notes/plan.md"]
    );
    assert_eq!(
        tool_messages(&requests[2])[1],
        "replaced 1 occurrence in notes/plan.md"
    );
    let reads = tool_messages(&requests[3]);
    assert_eq!(reads.len(), 2 + 5, "{reads:?}");
    assert_eq!(reads[2], "step one\nstep 2\nstep three\n");
    assert_eq!(reads[3], "notes/");
    assert_eq!(reads[4], "notes/plan.md");
    assert_eq!(reads[5], "notes/plan.md:1:step one\nnotes/plan.md:2:step 2");
    assert!(
        reads[6].starts_with("error (invalid_arguments)") && reads[6].contains("is a directory"),
        "{}",
        reads[6]
    );
    let ambiguous = &tool_messages(&requests[4])[7];
    assert!(
        ambiguous.contains("occurs 3 times") && ambiguous.contains("replace_all"),
        "{ambiguous}"
    );

    // The file is in the object store, and on neither worker's disk.
    let (content, _) = store(&cluster.nats)
        .await
        .read(&session("acme", &session_id), &path("notes/plan.md"))
        .await
        .expect("in the object store");
    assert_eq!(
        content,
        Bytes::from_static(b"step one\nstep 2\nstep three\n")
    );
    for pool in ["writers", "readers"] {
        let on_disk = files_under(&cluster.dir.join(pool));
        assert!(on_disk.is_empty(), "{pool}: {on_disk:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_over_the_caps_are_refused_with_clear_errors() {
    let cluster = TestCluster::start();
    let model = FakeOpenAi::start(vec![
        FakeReply::ToolCalls(vec![
            (
                "write_file".into(),
                json!({"path": "big", "content": "x".repeat(1500)}),
            ),
            (
                "write_file".into(),
                json!({"path": "a", "content": "a".repeat(800)}),
            ),
            (
                "write_file".into(),
                json!({"path": "b", "content": "b".repeat(800)}),
            ),
            (
                "write_file".into(),
                json!({"path": "c", "content": "c".repeat(800)}),
            ),
            (
                "write_file".into(),
                json!({"path": "a", "content": "a".repeat(300), "append": true}),
            ),
        ]),
        FakeReply::answer("done"),
    ])
    .await;
    cluster.spawn_worker(cluster.worker_config(&[
        "--workspace-max-file",
        "1KiB",
        "--workspace-max-session",
        "2KiB",
    ]));
    cluster.wait_for_workers(1).await;
    cluster.spawn_lead(cluster.lead_config(&model_flags(&model.base_url)));

    let session_id = unique("s");
    let (result, _) = cluster.run(&submission("acme", &session_id, "fill")).await;
    assert_eq!(result.status, TurnStatus::Completed, "{result:?}");
    let seen = tool_messages(&model.requests()[1]);
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(
        seen[0].starts_with("error (too_large)") && seen[0].contains("at most 1.0 KiB"),
        "{}",
        seen[0]
    );
    assert_eq!(seen[1], "wrote 800 bytes to a");
    assert_eq!(seen[2], "wrote 800 bytes to b");
    assert!(
        seen[3].starts_with("error (too_large)")
            && seen[3].contains("session workspace may hold at most 2.0 KiB"),
        "{}",
        seen[3]
    );
    assert!(
        seen[4].starts_with("error (too_large)") && seen[4].contains("a would be 1.1 KiB"),
        "{}",
        seen[4]
    );
    let files: Vec<(String, u64)> = store(&cluster.nats)
        .await
        .list(&session("acme", &session_id))
        .await
        .expect("lists")
        .into_iter()
        .map(|f| (f.path, f.size))
        .collect();
    assert_eq!(files, [("a".to_owned(), 800), ("b".to_owned(), 800)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_sees_the_old_or_the_new_content_never_a_mix() {
    let nats = NatsServer::start();
    let writer = store(&nats).await;
    let session = session("acme", &unique("s"));
    let file = path("data.bin");
    // Five chunks each; every version is one byte value repeated, so a mix is visible.
    const SIZE: usize = 600_000;
    const VERSIONS: u8 = 24;
    writer
        .write(&session, &file, Bytes::from(vec![0u8; SIZE]), Expect::Any)
        .await
        .expect("the first version");

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..2 {
        // No cache: every read assembles chunks from the stream.
        let reader = store_with(&nats.url, &WorkspaceStoreConfig::default(), 0).await;
        let (session, file, done) = (session.clone(), file.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let (content, version) = reader.read(&session, &file).await.expect("reads");
                assert_eq!(content.len(), SIZE, "a whole version");
                assert_eq!(version.size, SIZE as u64);
                let first = content[0];
                assert!(
                    content.iter().all(|b| *b == first),
                    "read {reads} mixes versions"
                );
                reads += 1;
                if finished {
                    return (reads, first);
                }
            }
        }));
    }
    for value in 1..=VERSIONS {
        writer
            .write(&session, &file, Bytes::from(vec![value; SIZE]), Expect::Any)
            .await
            .expect("a new version");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for reader in readers {
        let (reads, last) = reader.await.expect("the reader ends without panicking");
        assert!(reads > 0);
        assert_eq!(last, VERSIONS, "a read after the last write sees it");
    }
    // Replaced versions leave no chunks behind: one version's worth of messages remains.
    let stream = writer_stream_messages(&nats.url, "acme").await;
    assert_eq!(stream, 5 + 1, "five chunks and one metadata message");
}

/// Messages in the tenant's workspace stream.
async fn writer_stream_messages(nats_url: &str, tenant: &str) -> u64 {
    let client = async_nats::connect(nats_url).await.expect("connects");
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream
        .get_stream(format!("OBJ_skein-ws-{tenant}"))
        .await
        .expect("the bucket's stream exists");
    stream.info().await.expect("stream info").state.messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_tenants_are_isolated() {
    let nats = NatsServer::start();
    let objects = store(&nats).await;
    let s1 = session("acme", "s1");
    objects
        .write(
            &s1,
            &path("secret.txt"),
            Bytes::from_static(b"s1"),
            Expect::Any,
        )
        .await
        .expect("writes");
    // Same tenant, other sessions (one whose name starts like it).
    for other in [session("acme", "s2"), session("acme", "s1-x")] {
        assert!(objects.list(&other).await.expect("lists").is_empty());
        let read = objects.read(&other, &path("secret.txt")).await;
        assert!(matches!(read, Err(WorkspaceError::NotFound(_))), "{read:?}");
    }
    // Another tenant with a session of the same name: another bucket.
    let other_tenant = session("globex", "s1");
    assert!(objects.list(&other_tenant).await.expect("lists").is_empty());
    let read = objects.read(&other_tenant, &path("secret.txt")).await;
    assert!(matches!(read, Err(WorkspaceError::NotFound(_))), "{read:?}");
    objects
        .write(
            &other_tenant,
            &path("secret.txt"),
            Bytes::from_static(b"globex"),
            Expect::Any,
        )
        .await
        .expect("writes its own");
    let (mine, _) = objects.read(&s1, &path("secret.txt")).await.expect("reads");
    assert_eq!(mine, Bytes::from_static(b"s1"));
    // Names that would climb out are refused before any name is built.
    assert!(WorkspacePath::parse("../s2/secret.txt").is_err());
    assert!(SessionRef::new("acme", "s1/../s2").is_err());
    assert!(SessionRef::new("acme.x", "s1").is_err());
}

fn origin(tenant: &str, session: &str) -> TaskOrigin {
    TaskOrigin {
        task_id: unique("task"),
        tenant: tenant.into(),
        user: "tester".into(),
        session: session.into(),
        workspace: session.into(),
        deadline_ms: None,
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
    let objects = Arc::new(store_with(&nats.url, &cfg, 0).await);
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
    let objects = store_with(&nats.url, &WorkspaceStoreConfig::default(), 0).await;
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
