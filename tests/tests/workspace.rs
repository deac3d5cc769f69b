//! Session workspaces in the NATS object store, on a real nats-server (2.9 in CI): files written on
//! one worker are read on another with no shared directory, the file tools (edit, glob, grep)
//! work on it, caps are refused clearly, writes are all-or-nothing under concurrent reads, and
//! sessions and tenants are isolated. `workspace_commands.rs` covers check-out and check-in,
//! `skein workspace` and damaged files.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use skein_common::protocol::{EventKind, TurnEvent, TurnStatus};
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{SessionRef, WorkspaceError, WorkspacePath, WorkspaceStoreConfig};
use skein_tests::support::cluster::{model_flags, submission, TestCluster};
use skein_tests::support::fake_openai::tool_messages;
use skein_tests::support::workspaces::{object_store, path, session, store};
use skein_tests::support::{unique, FakeOpenAi, FakeReply, NatsServer};

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

/// Two writers of one file, each in its own process (no shared cache), both expecting the same
/// version, write at once: the broker lets exactly one land, and the other is told of the
/// conflict; what is read back is the winner's. Many rounds, so the writes do interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_racing_on_one_version_of_a_file_land_one_and_the_other_conflicts() {
    const ROUNDS: usize = 20;
    let nats = NatsServer::start();
    let (left, right) = (store(&nats).await, store(&nats).await);
    let session = session("acme", &unique("s"));
    let file = path("shared.txt");
    let mut current = left
        .write(&session, &file, Bytes::from_static(b"base"), Expect::Absent)
        .await
        .expect("the first version");
    for round in 0..ROUNDS {
        let (a, b) = (
            Bytes::from(format!("left {round}")),
            Bytes::from(format!("right {round}")),
        );
        let (from_left, from_right) = tokio::join!(
            left.write(&session, &file, a.clone(), Expect::Seq(current.seq)),
            right.write(&session, &file, b.clone(), Expect::Seq(current.seq)),
        );
        let (winner, content) = match (from_left, from_right) {
            (Ok(version), Err(WorkspaceError::Conflict(_))) => (version, a),
            (Err(WorkspaceError::Conflict(_)), Ok(version)) => (version, b),
            other => panic!("round {round}: exactly one write lands, not {other:?}"),
        };
        let (read, version) = store(&nats)
            .await
            .read(&session, &file)
            .await
            .expect("reads");
        assert_eq!((read, &version), (content, &winner), "round {round}");
        current = winner;
    }
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
    // No earlier versions kept: a replaced version's chunks go at once.
    let no_versions = WorkspaceStoreConfig {
        versions: 0,
        ..WorkspaceStoreConfig::default()
    };
    let writer = object_store(&nats.url, &no_versions, 16 << 20).await;
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
        let reader = object_store(&nats.url, &WorkspaceStoreConfig::default(), 0).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_versions_are_kept_up_to_the_limit_and_give_a_sessions_files_at_an_instant() {
    let nats = NatsServer::start();
    let two_versions = WorkspaceStoreConfig {
        versions: 2,
        ..WorkspaceStoreConfig::default()
    };
    let objects = object_store(&nats.url, &two_versions, 0).await;
    let source = session("acme", &unique("s"));
    let file = path("notes.txt");
    let instant = || async {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let at = skein_common::protocol::now_ms();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        at
    };
    let mut instants = vec![instant().await];
    for version in 1..=5 {
        objects
            .write(
                &source,
                &file,
                Bytes::from(format!("v{version}")),
                Expect::Any,
            )
            .await
            .expect("written");
        instants.push(instant().await);
    }
    assert!(objects
        .remove(&source, &file, Expect::Any)
        .await
        .expect("removed"));
    instants.push(instant().await);

    // What a copy of the session at each instant holds: the file's content, none, or an error.
    let copy_at = |at: u64| {
        let objects = &objects;
        let source = source.clone();
        async move {
            let target = session("acme", &unique("f"));
            match objects.copy_session_as_of(&source, &target, at).await {
                Ok(0) => Ok(None),
                Ok(_) => {
                    let (content, _) = objects
                        .read(&target, &path("notes.txt"))
                        .await
                        .expect("read");
                    Ok(Some(String::from_utf8(content.to_vec()).expect("text")))
                }
                Err(e) => Err(e.to_string()),
            }
        }
    };
    assert_eq!(
        copy_at(instants[0]).await,
        Ok(None),
        "before the first write"
    );
    // v1 to v3 were dropped (two versions are kept besides the removal's mark).
    for &dropped in &instants[1..=3] {
        let error = copy_at(dropped).await.expect_err("no longer kept");
        assert!(
            error.contains("no version from then of notes.txt"),
            "{error}"
        );
    }
    assert_eq!(copy_at(instants[4]).await, Ok(Some("v4".into())));
    assert_eq!(copy_at(instants[5]).await, Ok(Some("v5".into())));
    assert_eq!(copy_at(instants[6]).await, Ok(None), "after its removal");

    // What remains of the source's file: the removal's mark, and two kept versions with one
    // chunk each; the dropped versions' chunks are gone. The two copies that held the file
    // added a chunk and a metadata message each.
    let copies_written = 2;
    assert_eq!(
        writer_stream_messages(&nats.url, "acme").await,
        1 + 2 * 2 + 2 * copies_written
    );
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

/// The byte limit of a tenant's bucket (`SKEIN_WORKSPACE_BUCKET_BYTES`) as its stream has it.
async fn bucket_max_bytes(nats_url: &str, tenant: &str) -> i64 {
    let client = async_nats::connect(nats_url).await.expect("connects");
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream
        .get_stream(format!("OBJ_skein-ws-{tenant}"))
        .await
        .expect("the tenant's bucket exists");
    stream.info().await.expect("stream info").config.max_bytes
}

/// One tenant cannot fill the store every tenant shares: its bucket is held to
/// `SKEIN_WORKSPACE_BUCKET_BYTES`, whether a process with the setting creates it or opens one
/// made without it, and a write past the limit is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_bucket_is_held_to_its_byte_limit() {
    let nats = NatsServer::start();
    let limit: u64 = 1 << 20;
    let bounded_cfg = WorkspaceStoreConfig {
        bucket_bytes: Some(limit),
        ..WorkspaceStoreConfig::default()
    };

    // Made without a limit, then opened by a process that has one.
    let older = unique("older");
    let unbounded = store(&nats).await;
    unbounded
        .write(
            &session(&older, "s1"),
            &path("a"),
            Bytes::from_static(b"a"),
            Expect::Any,
        )
        .await
        .expect("written");
    assert!(
        bucket_max_bytes(&nats.url, &older).await <= 0,
        "no limit of its own yet"
    );
    let bounded = object_store(&nats.url, &bounded_cfg, 0).await;
    bounded
        .write(
            &session(&older, "s1"),
            &path("b"),
            Bytes::from_static(b"b"),
            Expect::Any,
        )
        .await
        .expect("written");
    assert_eq!(bucket_max_bytes(&nats.url, &older).await, limit as i64);

    // Made with the limit; a file larger than it is refused, and the bucket keeps its files.
    let newer = unique("newer");
    let s = session(&newer, "s1");
    bounded
        .write(
            &s,
            &path("small"),
            Bytes::from_static(b"small"),
            Expect::Any,
        )
        .await
        .expect("written");
    assert_eq!(bucket_max_bytes(&nats.url, &newer).await, limit as i64);
    let big = Bytes::from(vec![7u8; 2 * limit as usize]);
    assert!(
        bounded
            .write(&s, &path("big"), big, Expect::Any)
            .await
            .is_err(),
        "a write past the bucket's limit is refused"
    );
    let (small, _) = bounded.read(&s, &path("small")).await.expect("read");
    assert_eq!(small.as_ref(), b"small");
}
