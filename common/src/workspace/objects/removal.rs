//! Removing a session's whole workspace, and finding the sessions a tenant's bucket holds objects
//! of, with when each was last written (what the sweep of expired sessions reads).
//!
//! A session's objects are its files (`<session>/<path>`), the marks of the files it removed, and
//! the versions kept apart for forks (`~history/<session>/<path>`, see `history`), each version
//! with its chunks. Removing the workspace purges all of them from the tenant's bucket: nothing of
//! it is kept, so no fork can copy its files afterwards.
//!
//! Invariants:
//! - a removal acts on what one listing of the bucket saw ([`StoredSession`]): the chunks of every
//!   version it saw, then the metadata of every name up to the last message it saw of that name
//!   (`Bucket::purge_meta_through`). A write that lands after the listing keeps its metadata and
//!   its chunks; only a version the listing saw can be purged under it;
//! - chunks go before metadata: a removal that fails half-way leaves names that the next removal
//!   finds again (a reader meanwhile gets the "damaged" error, never a hang), and no chunks that
//!   no name reaches;
//! - a session's last write is the latest `modified` among its messages (a write, or a removal's
//!   mark): the writer's clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;

use super::bucket::{Buckets, Meta, FIND_ONLY, WORKSPACE_BUCKETS};
use super::history::HISTORY_PREFIX;
use super::{ObjectWorkspaces, LIST_TIMEOUT};
use crate::bus::Bus;
use crate::protocol::validate_token;
use crate::workspace::{ContentCache, Limits, SessionRef, WorkspaceError};

/// Purge requests of one removal in flight at once.
const PURGES_IN_FLIGHT: usize = 16;

/// The objects of one session in its tenant's bucket, as one listing saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSession {
    pub tenant: String,
    pub session: String,
    /// Files it holds now (names of its own, not removed).
    pub files: usize,
    /// When it was last written (Unix milliseconds; 0 when no message says).
    pub last_written_ms: u64,
    /// Every name of the session (files, removed files, kept versions) and the stream sequence
    /// of the last message the listing saw of it.
    names: BTreeMap<String, u64>,
    /// Every version the listing saw, by the id its chunks are published under.
    nuids: BTreeSet<String>,
}

impl StoredSession {
    /// How long before `now_ms` it was last written; zero for a write stamped later.
    pub fn idle_at(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.last_written_ms))
    }

    fn new(tenant: &str, session: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            session: session.to_owned(),
            files: 0,
            last_written_ms: 0,
            names: BTreeMap::new(),
            nuids: BTreeSet::new(),
        }
    }
}

/// The session an object name belongs to: the part before its first `/`, once a kept version's
/// prefix is taken off; `None` for a name that belongs to no session (not a token).
fn session_of(name: &str) -> Option<&str> {
    let name = name.strip_prefix(HISTORY_PREFIX).unwrap_or(name);
    let (session, _) = name.split_once('/')?;
    validate_token("workspace", session).ok().map(|()| session)
}

/// Groups every metadata message of `tenant`'s bucket (`metas`, oldest first) by session.
fn group(tenant: &str, metas: Vec<Meta>) -> BTreeMap<String, StoredSession> {
    let mut sessions: BTreeMap<String, StoredSession> = BTreeMap::new();
    // The last message of each current name (not a kept version): a file, or a removal's mark.
    let mut current: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    for Meta { info, seq } in metas {
        let Some(session) = session_of(&info.name) else {
            continue;
        };
        let stored = sessions
            .entry(session.to_owned())
            .or_insert_with(|| StoredSession::new(tenant, session));
        let last = stored.names.entry(info.name.clone()).or_insert(seq);
        *last = (*last).max(seq);
        if !info.deleted && !info.nuid.is_empty() {
            stored.nuids.insert(info.nuid.clone());
        }
        let written_ms = info.modified.map_or(0, |at| {
            u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
        });
        stored.last_written_ms = stored.last_written_ms.max(written_ms);
        if !info.name.starts_with(HISTORY_PREFIX) {
            let entry = current.entry(info.name).or_insert((seq, info.deleted));
            if seq >= entry.0 {
                *entry = (seq, info.deleted);
            }
        }
    }
    for (name, (_, deleted)) in current {
        if let Some(stored) = session_of(&name).and_then(|s| sessions.get_mut(s)) {
            stored.files += usize::from(!deleted);
        }
    }
    sessions
}

impl ObjectWorkspaces {
    /// Workspaces reached through `bus` to find and remove sessions' objects: it creates no
    /// bucket and leaves every bucket's replicas as the workers set them.
    pub fn finder(bus: &Bus) -> Self {
        Self {
            limits: Limits::default(),
            buckets: Buckets::of_kind(bus.jetstream().clone(), FIND_ONLY, WORKSPACE_BUCKETS),
            cache: ContentCache::new(0),
            versions: 0,
        }
    }

    /// The tenants that have a workspace bucket.
    pub async fn tenants(&self) -> Result<Vec<String>, WorkspaceError> {
        self.buckets.tenants().await
    }

    /// The sessions `tenant`'s bucket holds objects of, sorted by name (its every metadata
    /// message is read: the cost grows with the bucket's objects and kept versions).
    pub async fn stored_sessions(
        &self,
        tenant: &str,
    ) -> Result<Vec<StoredSession>, WorkspaceError> {
        let Some(bucket) = self.buckets.get(tenant, false).await? else {
            return Ok(Vec::new());
        };
        let listed = match tokio::time::timeout(LIST_TIMEOUT, bucket.all_meta()).await {
            Ok(listed) => listed,
            Err(_) => Err(WorkspaceError::Unavailable {
                message: format!("listing {} took longer than {LIST_TIMEOUT:?}", bucket.name),
                source: None,
            }),
        };
        let metas = self.forget_bucket_on_failure(tenant, listed)?;
        Ok(group(tenant, metas).into_values().collect())
    }

    /// Removes the objects of `stored` (see the module documentation); returns how many files
    /// it held.
    pub async fn remove_stored(&self, stored: &StoredSession) -> Result<usize, WorkspaceError> {
        let Some(bucket) = self.buckets.get(&stored.tenant, false).await? else {
            return Ok(0);
        };
        // The requests are made before they are streamed: a closure that makes them inside the
        // stream would keep the future from being `Send` for every lifetime a spawner asks.
        let purges: Vec<_> = stored
            .nuids
            .iter()
            .map(|nuid| bucket.purge_version(nuid))
            .collect();
        let chunks = futures::stream::iter(purges)
            .buffer_unordered(PURGES_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        if let Some(failed) = chunks.into_iter().find_map(Result::err) {
            return self.forget_bucket_on_failure(&stored.tenant, Err(failed));
        }
        let purges: Vec<_> = stored
            .names
            .iter()
            .map(|(name, through)| bucket.purge_meta_through(name, *through))
            .collect();
        let names = futures::stream::iter(purges)
            .buffer_unordered(PURGES_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        for name in stored.names.keys() {
            self.cache.forget(&bucket.cache_key(name));
        }
        match names.into_iter().find_map(Result::err) {
            Some(failed) => self.forget_bucket_on_failure(&stored.tenant, Err(failed)),
            None => Ok(stored.files),
        }
    }

    /// Removes every object of `session`: its files, the marks of removed ones and the versions
    /// kept for forks; returns how many files it held (0 when it had none).
    pub async fn remove_session(&self, session: &SessionRef) -> Result<usize, WorkspaceError> {
        let stored = self.stored_sessions(session.tenant()).await?;
        match stored.iter().find(|s| s.session == session.session()) {
            Some(stored) => self.remove_stored(stored).await,
            None => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::object_store::ObjectInfo;

    use super::*;

    fn meta(name: &str, nuid: &str, seq: u64, at_ms: i128, deleted: bool) -> Meta {
        let mut info: ObjectInfo = serde_json::from_value(serde_json::json!({
            "name": name, "bucket": "b", "nuid": nuid, "size": 1, "chunks": 1,
            "deleted": deleted,
        }))
        .expect("object info");
        info.modified = Some(async_nats::datetime::from_nanos(at_ms * 1_000_000).expect("a time"));
        Meta { info, seq }
    }

    #[test]
    fn a_sessions_objects_are_its_files_its_marks_and_its_kept_versions() {
        let grouped = group(
            "acme",
            vec![
                meta("s1/a.txt", "a1", 1, 1_000, false),
                meta("s1/b.txt", "b1", 2, 2_000, false),
                meta("~history/s1/a.txt", "a1", 3, 1_000, false),
                meta("s1/a.txt", "a2", 4, 3_000, false),
                meta("s1/b.txt", "gone", 5, 4_000, true),
                meta("s2/c.txt", "c1", 6, 500, false),
                meta("not a session/x", "x", 7, 9_000, false),
                meta("loose", "y", 8, 9_000, false),
            ],
        );
        assert_eq!(grouped.keys().collect::<Vec<_>>(), ["s1", "s2"]);
        let s1 = &grouped["s1"];
        assert_eq!(s1.files, 1, "a.txt is there, b.txt was removed");
        assert_eq!(s1.last_written_ms, 4_000, "the removal is its last write");
        assert_eq!(
            s1.names
                .iter()
                .map(|(n, s)| (n.as_str(), *s))
                .collect::<Vec<_>>(),
            [("s1/a.txt", 4), ("s1/b.txt", 5), ("~history/s1/a.txt", 3)]
        );
        assert_eq!(
            s1.nuids.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a1", "a2", "b1"],
            "a removal's mark has no chunks"
        );
        let s2 = &grouped["s2"];
        assert_eq!((s2.files, s2.last_written_ms), (1, 500));
        assert_eq!(s2.idle_at(1_500), Duration::from_secs(1));
        assert_eq!(s2.idle_at(100), Duration::ZERO);
    }
}
