//! Session workspaces go with their sessions, against real NATS and Redis: `skein sessions rm`
//! removes the session's files (and the versions kept for forks) with its keys, and removes
//! nothing while a turn holds the session; `skein workspace rm` removes files one by one or the
//! whole workspace; the leads' sweep removes the workspaces of expired sessions, and only theirs.
//!
//! The sweep acts on every tenant of a NATS server, so its tests start servers of their own, never
//! the shared ones `SKEIN_TEST_NATS_URL` / `SKEIN_TEST_REDIS_URL` name.

use std::process::Output;
use std::time::Duration;

use bytes::Bytes;
use skein_common::config::RedisConfig;
use skein_common::protocol::message::Message;
use skein_common::store::SessionStore;
use skein_common::workspace::objects::Expect;
use skein_common::workspace::{ObjectWorkspaces, SessionRef, WorkspaceStoreConfig};
use skein_lead::expiry::{self, Swept};
use skein_tests::support::cluster::TestCluster;
use skein_tests::support::workspaces::{object_store, path, session};
use skein_tests::support::{eventually, free_port, unique, NatsServer, RedisServer};

const NODE: &str = env!("CARGO_BIN_EXE_skein-node");

/// Runs `skein` with `args`; bounded by the commands' own timeouts.
fn skein(args: &[&str]) -> Output {
    std::process::Command::new(NODE)
        .args(args)
        .env("SKEIN_LOG_FORMAT", "json")
        .output()
        .expect("skein runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes `files` (path, content) into `s`.
async fn seed(objects: &ObjectWorkspaces, s: &SessionRef, files: &[(&str, &str)]) {
    for (p, content) in files {
        objects
            .write(s, &path(p), Bytes::from(content.to_string()), Expect::Any)
            .await
            .expect("seeded");
    }
}

/// Saves a session with one message, so that Redis holds its state.
async fn save_session(store: &SessionStore, tenant: &str, session: &str) {
    let loaded = store.load(tenant, session).await.expect("load");
    let mut state = loaded.state;
    state.history.push(Message::user("hello"));
    state.turns = 1;
    store
        .save(tenant, session, loaded.version, &state)
        .await
        .expect("saved");
}

/// The paths of `s`'s files.
async fn paths(objects: &ObjectWorkspaces, s: &SessionRef) -> Vec<String> {
    let files = objects.list(s).await.expect("lists");
    files.into_iter().map(|f| f.path).collect()
}

/// Whether the bucket holds any object of `s` at all: a file, a removal's mark or a version kept
/// for forks.
async fn holds_objects_of(objects: &ObjectWorkspaces, s: &SessionRef) -> bool {
    let stored = objects
        .stored_sessions(s.tenant())
        .await
        .expect("lists the bucket");
    stored.iter().any(|stored| stored.session == s.session())
}

/// Messages the tenant's bucket holds: metadata and chunks.
async fn bucket_messages(nats_url: &str, tenant: &str) -> u64 {
    let client = async_nats::connect(nats_url).await.expect("connects");
    let mut stream = async_nats::jetstream::new(client)
        .get_stream(format!("OBJ_skein-ws-{tenant}"))
        .await
        .expect("the bucket's stream");
    stream.info().await.expect("stream info").state.messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skein_sessions_rm_removes_the_sessions_files_but_not_while_a_turn_runs() {
    // Private servers: the test counts every message of the tenant's bucket.
    let cluster = TestCluster::with_servers(
        NatsServer::start_on_port(free_port()),
        RedisServer::start_on_port(free_port()),
    );
    let store = cluster.store().await;
    let objects = object_store(&cluster.nats.url, &WorkspaceStoreConfig::default(), 0).await;
    let (gone_id, kept_id) = (unique("gone"), unique("kept"));
    let (gone, kept) = (session("acme", &gone_id), session("acme", &kept_id));
    save_session(&store, "acme", &gone_id).await;
    save_session(&store, "acme", &kept_id).await;
    // The other session: one file, one chunk, one metadata message.
    seed(&objects, &kept, &[("notes.md", "kept")]).await;
    let kept_messages = bucket_messages(&cluster.nats.url, "acme").await;
    // Files, a rewritten one (its first version kept for forks) and a removed one (its mark).
    seed(
        &objects,
        &gone,
        &[("a.txt", "v1"), ("dir/b.txt", "b"), ("c.txt", "c")],
    )
    .await;
    seed(&objects, &gone, &[("a.txt", "v2")]).await;
    assert!(objects
        .remove(&gone, &path("c.txt"), Expect::Any)
        .await
        .expect("removes"));
    assert_eq!(paths(&objects, &gone).await, ["a.txt", "dir/b.txt"]);
    assert!(bucket_messages(&cluster.nats.url, "acme").await > kept_messages);

    let rm = |session: &str| {
        skein(&[
            "sessions",
            "--redis-url",
            &cluster.redis.url,
            "--tenant",
            "acme",
            "rm",
            "--nats-url",
            &cluster.nats.url,
            session,
        ])
    };

    // A turn holds the lease: refused, and nothing removed, files included.
    assert!(store
        .try_lease("acme", &gone_id, "lead-a", Duration::from_secs(60))
        .await
        .expect("lease"));
    let refused = rm(&gone_id);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        text(&refused.stderr).contains("a turn is running"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(paths(&objects, &gone).await, ["a.txt", "dir/b.txt"]);
    assert!(store.load("acme", &gone_id).await.expect("load").version > 0);
    store
        .release_lease("acme", &gone_id, "lead-a")
        .await
        .expect("released");

    let removed = rm(&gone_id);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    assert!(
        text(&removed.stdout).contains("2 files"),
        "{}",
        text(&removed.stdout)
    );
    assert!(paths(&objects, &gone).await.is_empty());
    assert!(
        !holds_objects_of(&objects, &gone).await,
        "no mark and no kept version is left"
    );
    assert_eq!(
        bucket_messages(&cluster.nats.url, "acme").await,
        kept_messages,
        "every chunk of the session is purged"
    );
    assert_eq!(store.load("acme", &gone_id).await.expect("load").version, 0);
    // The other session is untouched.
    assert_eq!(paths(&objects, &kept).await, ["notes.md"]);
    assert!(store.load("acme", &kept_id).await.expect("load").version > 0);

    let again = rm(&gone_id);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("no session"),
        "{}",
        text(&again.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skein_workspace_rm_removes_files_or_the_whole_workspace() {
    let cluster = TestCluster::start();
    let objects = object_store(&cluster.nats.url, &WorkspaceStoreConfig::default(), 0).await;
    let (id, other_id) = (unique("s"), unique("other"));
    let (s, other) = (session("acme", &id), session("acme", &other_id));
    seed(
        &objects,
        &s,
        &[("a.txt", "a"), ("b.txt", "b"), ("dir/c.txt", "c")],
    )
    .await;
    seed(&objects, &s, &[("a.txt", "a again")]).await;
    seed(&objects, &other, &[("a.txt", "theirs")]).await;
    let rm = |rest: &[&str]| {
        let mut args = vec![
            "workspace",
            "rm",
            "--nats-url",
            &cluster.nats.url,
            "--tenant",
            "acme",
        ];
        args.extend(rest);
        skein(&args)
    };

    let one = rm(&[&id, "b.txt"]);
    assert!(one.status.success(), "{}", text(&one.stderr));
    assert_eq!(paths(&objects, &s).await, ["a.txt", "dir/c.txt"]);

    let missing = rm(&[&id, "nope.txt"]);
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("nope.txt: no such file"),
        "{}",
        text(&missing.stderr)
    );
    let escape = rm(&[&id, "../x"]);
    assert!(!escape.status.success());
    assert_eq!(paths(&objects, &s).await, ["a.txt", "dir/c.txt"]);

    let whole = rm(&[&id]);
    assert!(whole.status.success(), "{}", text(&whole.stderr));
    assert!(
        text(&whole.stderr).contains("(2 files)"),
        "{}",
        text(&whole.stderr)
    );
    assert!(paths(&objects, &s).await.is_empty());
    assert!(
        !holds_objects_of(&objects, &s).await,
        "the marks and kept versions go too"
    );
    assert_eq!(paths(&objects, &other).await, ["a.txt"]);

    let empty = rm(&[&id]);
    assert!(empty.status.success(), "{}", text(&empty.stderr));
    assert!(
        text(&empty.stderr).contains("no files"),
        "{}",
        text(&empty.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_removes_the_workspaces_of_expired_sessions_and_no_other() {
    let nats = NatsServer::start_on_port(free_port());
    let redis = RedisServer::start_on_port(free_port());
    let ttl = Duration::from_secs(3600);
    let store = SessionStore::connect(&RedisConfig {
        session_ttl: Some(ttl),
        ..RedisConfig::local(redis.url.clone())
    })
    .await
    .expect("redis reachable");
    let objects = object_store(&nats.url, &WorkspaceStoreConfig::default(), 0).await;
    let sessions = ["expired", "live", "busy", "other-tenant"].map(unique);
    let [expired, live, busy, elsewhere] = [
        session("acme", &sessions[0]),
        session("acme", &sessions[1]),
        session("acme", &sessions[2]),
        session("globex", &sessions[3]),
    ];
    for s in [&expired, &live, &busy, &elsewhere] {
        seed(&objects, s, &[("a.txt", "a"), ("dir/b.txt", "b")]).await;
        save_session(&store, s.tenant(), s.session()).await;
    }
    // Three sessions expire; `live` keeps its state.
    let mut conn = redis::Client::open(redis.url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable");
    for s in [&expired, &busy, &elsewhere] {
        for key in [
            skein_common::store::keys::session(s.tenant(), s.session()),
            skein_common::store::keys::history(s.tenant(), s.session()),
        ] {
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(&key)
                .arg(1)
                .query_async(&mut conn)
                .await
                .expect("PEXPIRE");
        }
    }
    eventually("the sessions expire", Duration::from_secs(10), || {
        let (store, expired) = (store.clone(), expired.session().to_owned());
        async move {
            let loaded = store.load("acme", &expired).await.ok()?;
            (loaded.version == 0).then_some(())
        }
    })
    .await;
    // A turn holds `busy`.
    assert!(store
        .try_lease("acme", busy.session(), "lead-a", Duration::from_secs(60))
        .await
        .expect("lease"));
    let sweeper = object_store(&nats.url, &WorkspaceStoreConfig::default(), 0).await;
    let now_ms = skein_common::protocol::now_ms();

    // Written within the TTL: kept, expired or not (a session seeded before its first turn).
    let early = expiry::sweep(&store, &sweeper, ttl, now_ms).await;
    assert_eq!(early, Swept::default());
    assert_eq!(paths(&objects, &expired).await, ["a.txt", "dir/b.txt"]);

    // A TTL later, the expired sessions' workspaces go, in every tenant; the busy one waits.
    let later = now_ms + ttl.as_millis() as u64 + 1_000;
    let swept = expiry::sweep(&store, &sweeper, ttl, later).await;
    assert_eq!(
        swept,
        Swept {
            sessions: 2,
            files: 4,
            failed: 0
        }
    );
    for gone in [&expired, &elsewhere] {
        assert!(paths(&objects, gone).await.is_empty(), "{gone:?}");
        assert!(!holds_objects_of(&objects, gone).await, "{gone:?}");
    }
    assert_eq!(paths(&objects, &live).await, ["a.txt", "dir/b.txt"]);
    assert_eq!(paths(&objects, &busy).await, ["a.txt", "dir/b.txt"]);
    assert!(
        store
            .load("acme", live.session())
            .await
            .expect("load")
            .version
            > 0,
        "a live session keeps its state"
    );

    // Once the turn is over, the next sweep takes the busy one too.
    store
        .release_lease("acme", busy.session(), "lead-a")
        .await
        .expect("released");
    let swept = expiry::sweep(&store, &sweeper, ttl, later).await;
    assert_eq!(swept.sessions, 1);
    assert!(paths(&objects, &busy).await.is_empty());
    assert_eq!(paths(&objects, &live).await, ["a.txt", "dir/b.txt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_sweeps_the_workspace_of_a_session_once_it_expires() {
    let cluster = TestCluster::with_servers(
        NatsServer::start_on_port(free_port()),
        RedisServer::start_on_port(free_port()),
    );
    let expiring = SessionStore::connect(&RedisConfig {
        session_ttl: Some(Duration::from_secs(1)),
        ..RedisConfig::local(cluster.redis.url.clone())
    })
    .await
    .expect("redis reachable");
    let kept_forever = cluster.store().await;
    let objects = object_store(&cluster.nats.url, &WorkspaceStoreConfig::default(), 0).await;
    // `kept` is written first and sorts first: a sweep that finds `gone` idle long enough has
    // found `kept` so too, and has looked at it already.
    let (kept, gone) = (
        session("acme", &unique("alive")),
        session("acme", &unique("expired")),
    );
    seed(&objects, &kept, &[("a.txt", "a")]).await;
    seed(&objects, &gone, &[("a.txt", "a")]).await;
    save_session(&expiring, "acme", gone.session()).await;
    save_session(&kept_forever, "acme", kept.session()).await;

    cluster.spawn_lead(cluster.lead_config(&["--session-ttl", "1s"]));
    eventually(
        "the expired session's workspace is removed",
        Duration::from_secs(30),
        || {
            let (objects, gone) = (&objects, &gone);
            async move { paths(objects, gone).await.is_empty().then_some(()) }
        },
    )
    .await;
    assert_eq!(
        expiring
            .load("acme", gone.session())
            .await
            .expect("load")
            .version,
        0,
        "the session expired first"
    );
    assert_eq!(paths(&objects, &kept).await, ["a.txt"]);
}
