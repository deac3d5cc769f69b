//! Session workspaces in the NATS object store, on a real nats-server (2.9 in CI).

use bytes::Bytes;
use skein_common::bus::{Bus, DEFAULT_MAX_PAYLOAD};
use skein_common::config::NatsConfig;
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{
    ObjectWorkspaces, SessionRef, WorkspaceError, WorkspacePath, WorkspaceStoreConfig,
};
use skein_tests::support::{unique, NatsServer};

async fn store(nats: &NatsServer, cfg: &WorkspaceStoreConfig) -> ObjectWorkspaces {
    let bus = Bus::connect(
        &NatsConfig::local(nats.url.clone()),
        "workspace-test",
        DEFAULT_MAX_PAYLOAD,
    )
    .await
    .expect("connects to the test NATS");
    ObjectWorkspaces::new(bus.jetstream().clone(), cfg, 16 * 1024 * 1024)
}

fn path(p: &str) -> WorkspacePath {
    WorkspacePath::parse(p).expect("a valid path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_round_trips_files_on_this_server() {
    let nats = NatsServer::start();
    let objects = store(&nats, &WorkspaceStoreConfig::default()).await;
    let session = SessionRef::new("acme", &unique("s")).expect("valid");

    assert!(objects.list(&session).await.expect("lists").is_empty());
    let missing = objects.read(&session, &path("a.txt")).await;
    assert!(matches!(missing, Err(WorkspaceError::NotFound(_))), "{missing:?}");

    // Several chunks, and an empty file.
    let big: Bytes = (0..400_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
    let written = objects
        .write(&session, &path("dir/big.bin"), big.clone(), Expect::Any)
        .await
        .expect("writes");
    assert_eq!(written.size, big.len() as u64);
    objects
        .write(&session, &path("empty"), Bytes::new(), Expect::Absent)
        .await
        .expect("writes an empty file");

    let fresh = store(&nats, &WorkspaceStoreConfig::default()).await;
    let (read, version) = fresh.read(&session, &path("dir/big.bin")).await.expect("reads");
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
        .write(&session, &path("empty"), Bytes::from_static(b"x"), Expect::Seq(written.seq))
        .await;
    assert!(matches!(stale, Err(WorkspaceError::Conflict(_))), "{stale:?}");
    let absent = fresh
        .write(&session, &path("empty"), Bytes::from_static(b"x"), Expect::Absent)
        .await;
    assert!(matches!(absent, Err(WorkspaceError::Conflict(_))), "{absent:?}");
    let replaced = fresh
        .write(&session, &path("dir/big.bin"), Bytes::from_static(b"small"), Expect::Seq(written.seq))
        .await
        .expect("the current version may be replaced");
    let (now, _) = objects.read(&session, &path("dir/big.bin")).await.expect("reads");
    assert_eq!(now, Bytes::from_static(b"small"));

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
