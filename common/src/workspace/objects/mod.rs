//! `ObjectWorkspaces`: every session's files in the NATS object store, one bucket per tenant
//! (`skein-ws-<tenant>`, stream `OBJ_skein-ws-<tenant>`), one object per file named
//! `<session>/<path>`. The same code serves another family of per-tenant buckets
//! ([`BucketKind`], [`ObjectWorkspaces::of_kind`]): the values stored by reference
//! (`crate::payloads`).
//!
//! The objects keep the object store's own layout (chunks on `$O.<bucket>.C.<nuid>`, metadata on
//! `$O.<bucket>.M.<base64 of the name>`, rolled up to one message per name), so `nats object`
//! and any client library read them. Reads and writes go through it directly to add what a shared
//! workspace needs:
//!
//! - **all-or-nothing writes.** A write publishes its chunks under a new `nuid`, then the metadata
//!   that names them, then purges the chunks of the version it replaced. A reader takes one
//!   metadata message and reads only that version's chunks; if they are purged under it (a newer
//!   write finished), it reads the newer version instead, and it checks the size and the SHA-256
//!   digest of what it assembled. So a reader gets an old or a new content, never a mix, and never
//!   hangs on missing chunks;
//! - **compare-and-set.** The metadata is published with `Nats-Expected-Last-Subject-Sequence`:
//!   a conditional write (an edit, a check-in) fails with [`WorkspaceError::Conflict`] if the file
//!   changed since it was read, and every replaced version's chunks are purged by the write that
//!   replaced it;
//! - **leader reads.** Metadata and chunks are read with `STREAM.MSG.GET`, answered by the stream's
//!   leader, so a write acknowledged on one worker is seen by a read on any other, whatever the
//!   bucket's replicas;
//! - **caps.** Before a write, the session's files are listed: the new size must keep the session
//!   under its cap, and the path must not clash with a file (`a` a file and `a/b` wanted) or a
//!   directory (`a/b` present and `a` wanted);
//! - **cache.** Contents read or written are kept in a [`ContentCache`] by object name, used only
//!   when the metadata read just before names the same `nuid` and digest;
//! - **earlier versions.** With `SKEIN_WORKSPACE_VERSIONS` above 0, a replaced version (or a
//!   removal's mark) is kept apart with its chunks instead of purged, up to that many per file,
//!   so a fork can copy a session's files as they were at an instant ([`history`],
//!   [`ObjectWorkspaces::copy_session_as_of`]).
//!
//! Works on nats-server 2.9: `create_object_store` creates the stream directly (unlike
//! `create_key_value`, it does not query the account first); buckets are created on the first
//! write of a tenant, never by a read. Listing a session reads the metadata of every object of the
//! tenant's bucket (names are base64 in subjects, so a session cannot be filtered by subject): its
//! cost grows with the tenant's file count.
//!
//! Layout: this module is the files' view (list, read, write, remove, the checks); `bucket` is the
//! tenant's bucket and the stream requests a file is made of; `history` the versions kept apart;
//! `removal` a session's whole workspace removed, and the sessions a bucket holds.

mod bucket;
mod history;
mod removal;

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{object_store::ObjectInfo, object_store::ObjectOptions};
use bytes::Bytes;

use self::bucket::{Bucket, Buckets, Fetch, Meta, MetaPublish, CHUNK_BYTES};
use self::history::SessionVersions;
use super::cache::{ContentCache, ContentId};
use super::path::{clean_relative, WorkspacePath};
use super::{digest, human_size, Limits, SessionRef, WorkspaceError, WorkspaceStoreConfig};
use crate::bus::{Bus, BusError};

pub use self::bucket::{bucket_name, BucketKind, BUCKET_PREFIX, WORKSPACE_BUCKETS};
pub use self::removal::StoredSession;

/// How many versions a read follows when the one it started on is replaced under it (a file
/// rewritten continuously can replace a few in a row while its chunks are being read).
const READ_ATTEMPTS: usize = 16;

/// How many times an unconditional write retries its metadata when another write lands first.
const WRITE_ATTEMPTS: usize = 5;

/// Longest a listing of one session may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

fn object_name(session: &SessionRef, path: &WorkspacePath) -> String {
    format!("{}/{}", session.session(), path.as_str())
}

/// One version of a file, as its metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Stream sequence of the metadata message: what a conditional write compares.
    pub seq: u64,
    /// Names this version's chunks; new for every write.
    pub nuid: String,
    pub digest: Option<String>,
    pub size: u64,
}

/// A file of a session, as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// Normal form of the path (see [`WorkspacePath`]).
    pub path: String,
    pub size: u64,
    pub nuid: String,
    pub digest: Option<String>,
}

/// What a write requires of the file's current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Nothing: the write replaces whatever is there.
    Any,
    /// No file at that path.
    Absent,
    /// Exactly the version whose metadata has this sequence.
    Seq(u64),
}

/// Session workspaces in the object store. See the module documentation.
pub struct ObjectWorkspaces {
    limits: Limits,
    buckets: Buckets,
    cache: ContentCache,
    /// Replaced versions kept per file (0: purged at once).
    versions: usize,
}

impl std::fmt::Debug for ObjectWorkspaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectWorkspaces")
            .field("limits", &self.limits)
            .field("replicas", &self.buckets.replicas())
            .field("cache", &self.cache)
            .field("versions", &self.versions)
            .finish()
    }
}

impl ObjectWorkspaces {
    /// Workspaces reached through `bus`, with `cfg`'s caps and replicas (by default the bus's
    /// stream replicas), caching at most `cache_bytes` of contents.
    pub fn new(bus: &Bus, cfg: &WorkspaceStoreConfig, cache_bytes: usize) -> Self {
        Self {
            limits: cfg.limits(),
            buckets: Buckets::new(
                bus.jetstream().clone(),
                cfg.bucket_replicas(bus.stream_replicas()),
            )
            .with_max_bytes(cfg.bucket_bytes),
            cache: ContentCache::new(cache_bytes),
            versions: cfg.versions,
        }
    }

    /// Objects of another bucket family (`kind`) through `bus`, in the same layout and with the
    /// same guarantees, `limits` as caps, the bus's stream replicas, and no content cache. Only
    /// [`stat`](Self::stat), [`read`](Self::read) and
    /// [`write_prechecked`](Self::write_prechecked) are meant for them: a listing reads every
    /// object of a tenant's bucket.
    pub fn of_kind(bus: &Bus, kind: BucketKind, limits: Limits) -> Self {
        Self {
            limits,
            buckets: Buckets::of_kind(bus.jetstream().clone(), bus.stream_replicas(), kind),
            cache: ContentCache::new(0),
            versions: 0,
        }
    }

    /// Raises every tenant's existing bucket with fewer than `replicas` replicas to them
    /// (refusals are reported at error level); returns how many were raised.
    pub async fn raise_bucket_replicas(bus: &Bus, replicas: usize) -> Result<usize, BusError> {
        let prefix = bucket::stream_name(BUCKET_PREFIX);
        bus.raise_replicas_of(&prefix, replicas).await
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The content cache (for its usage).
    pub fn cache(&self) -> &ContentCache {
        &self.cache
    }

    /// Every file of `session`, sorted by path. Objects whose names are not normal workspace
    /// paths (written by other tools) are left out: no tool could name them.
    pub async fn list(&self, session: &SessionRef) -> Result<Vec<StoredFile>, WorkspaceError> {
        let Some(bucket) = self.buckets.get(session.tenant(), false).await? else {
            return Ok(Vec::new());
        };
        let prefix = format!("{}/", session.session());
        let listing = async {
            let mut files = Vec::new();
            for info in bucket.list_metadata().await? {
                if info.deleted {
                    continue;
                }
                let Some(path) = info.name.strip_prefix(&prefix) else {
                    continue;
                };
                if is_link(&info) || !is_workspace_path(path) {
                    tracing::debug!(object = %info.name, "object not addressable as a workspace file; skipped");
                    continue;
                }
                files.push(StoredFile {
                    path: path.to_owned(),
                    size: info.size as u64,
                    nuid: info.nuid,
                    digest: info.digest,
                });
            }
            files.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(files)
        };
        let listed = match tokio::time::timeout(LIST_TIMEOUT, listing).await {
            Ok(listed) => listed,
            Err(_) => Err(WorkspaceError::Unavailable {
                message: format!("listing {} took longer than {LIST_TIMEOUT:?}", bucket.name),
                source: None,
            }),
        };
        self.forget_bucket_on_failure(session.tenant(), listed)
    }

    /// Copies every file of `from` into `to` (a fork's workspace); returns how many. Files of
    /// `to` with other paths stay.
    pub async fn copy_session(
        &self,
        from: &SessionRef,
        to: &SessionRef,
    ) -> Result<usize, WorkspaceError> {
        let files = self.list(from).await?;
        for file in &files {
            let path = WorkspacePath::parse(&file.path)
                .map_err(|e| WorkspaceError::Invalid(e.to_string()))?;
            let (content, _) = self.read(from, &path).await?;
            self.write(to, &path, content, Expect::Any).await?;
        }
        Ok(files.len())
    }

    /// Copies the files `from` held at `at_ms` (Unix time in milliseconds) into `to`, from the
    /// versions kept apart ([`history`]); returns how many. A file whose version then is not
    /// known (its history does not reach that far, or was not kept) fails the copy before
    /// anything is written, naming every such file.
    pub async fn copy_session_as_of(
        &self,
        from: &SessionRef,
        to: &SessionRef,
        at_ms: u64,
    ) -> Result<usize, WorkspaceError> {
        let Some(bucket) = self.buckets.get(from.tenant(), false).await? else {
            return Ok(0);
        };
        let messages = match tokio::time::timeout(LIST_TIMEOUT, bucket.all_metadata()).await {
            Ok(messages) => self.forget_bucket_on_failure(from.tenant(), messages)?,
            Err(_) => {
                return Err(WorkspaceError::Unavailable {
                    message: format!(
                        "reading the versions in {} took longer than {LIST_TIMEOUT:?}",
                        bucket.name
                    ),
                    source: None,
                })
            }
        };
        let messages = messages.into_iter().filter(|info| !is_link(info)).collect();
        let versions = SessionVersions::collect(from.session(), messages, is_workspace_path);
        // An instant kept in milliseconds stands for the whole of its millisecond: a write that
        // came before it within that millisecond (its time kept in nanoseconds) is before it.
        let (files, unknown) = versions.at(i128::from(at_ms) * 1_000_000 + 999_999);
        if !unknown.is_empty() {
            return Err(WorkspaceError::NotFound(format!(
                "the workspace keeps no version from then of {} (a file keeps its last \
                 SKEIN_WORKSPACE_VERSIONS earlier versions)",
                unknown.join(", ")
            )));
        }
        for (path, info) in &files {
            let content = match bucket.fetch(info).await {
                Ok(content) => content,
                Err(Fetch::Replaced(why)) => {
                    return Err(WorkspaceError::NotFound(format!(
                        "the version of {path} from then is no longer kept ({why})"
                    )))
                }
                Err(Fetch::Failed(error)) => return Err(error),
            };
            let path =
                WorkspacePath::parse(path).map_err(|e| WorkspaceError::Invalid(e.to_string()))?;
            self.write(to, &path, content, Expect::Any).await?;
        }
        Ok(files.len())
    }

    /// The current version of a file, if there is one.
    pub async fn stat(
        &self,
        session: &SessionRef,
        path: &WorkspacePath,
    ) -> Result<Option<Version>, WorkspaceError> {
        let Some(bucket) = self.buckets.get(session.tenant(), false).await? else {
            return Ok(None);
        };
        let meta = bucket.meta(&object_name(session, path)).await;
        let meta = self.forget_bucket_on_failure(session.tenant(), meta)?;
        Ok(meta.filter(|m| !m.info.deleted).map(|m| m.version()))
    }

    /// A file's whole content and its version.
    pub async fn read(
        &self,
        session: &SessionRef,
        path: &WorkspacePath,
    ) -> Result<(Bytes, Version), WorkspaceError> {
        let Some(bucket) = self.buckets.get(session.tenant(), false).await? else {
            return Err(not_found(path));
        };
        let read = self.read_in(&bucket, session, path).await;
        self.forget_bucket_on_failure(session.tenant(), read)
    }

    async fn read_in(
        &self,
        bucket: &Bucket,
        session: &SessionRef,
        path: &WorkspacePath,
    ) -> Result<(Bytes, Version), WorkspaceError> {
        let name = object_name(session, path);
        let mut why_not = String::new();
        let mut failed_seq = None;
        for _ in 0..READ_ATTEMPTS {
            let meta = match bucket.meta(&name).await? {
                Some(meta) if !meta.info.deleted => meta,
                _ => return Err(not_found(path)),
            };
            if failed_seq == Some(meta.seq) {
                // Still the version whose chunks did not add up: nothing replaced it, so its
                // chunks are lost (purged by hand, or a write whose outcome was unknown).
                return Err(WorkspaceError::Unavailable {
                    message: format!(
                        "{path} is damaged in the workspace store ({why_not}); write it again"
                    ),
                    source: None,
                });
            }
            let version = meta.version();
            if version.size > self.limits.max_file_bytes {
                return Err(WorkspaceError::TooLarge(format!(
                    "{path} is {} ({} bytes), over the {} per-file cap: it cannot be read here",
                    human_size(version.size),
                    version.size,
                    human_size(self.limits.max_file_bytes)
                )));
            }
            let id = ContentId {
                nuid: version.nuid.clone(),
                digest: version.digest.clone().unwrap_or_default(),
            };
            if let Some(content) = self.cache.get(&bucket.cache_key(&name), &id) {
                return Ok((content, version));
            }
            match bucket.fetch(&meta.info).await {
                Ok(content) => {
                    self.cache
                        .put(&bucket.cache_key(&name), id, content.clone());
                    return Ok((content, version));
                }
                Err(Fetch::Replaced(why)) => {
                    why_not = why;
                    failed_seq = Some(meta.seq);
                }
                Err(Fetch::Failed(error)) => return Err(error),
            }
        }
        Err(WorkspaceError::Unavailable {
            message: format!(
                "{path} kept changing while it was read ({READ_ATTEMPTS} versions tried; last: \
                 {why_not}); try again"
            ),
            source: None,
        })
    }

    /// Writes a whole file (see the module documentation for the checks and guarantees).
    pub async fn write(
        &self,
        session: &SessionRef,
        path: &WorkspacePath,
        content: Bytes,
        expect: Expect,
    ) -> Result<Version, WorkspaceError> {
        let bucket = self.bucket_to_write(session, path, content.len()).await?;
        let files = self.list(session).await?;
        check_namespace(&files, path)?;
        let others: u64 = files
            .iter()
            .filter(|f| f.path != path.as_str())
            .map(|f| f.size)
            .sum();
        self.limits.check_session(others + content.len() as u64)?;
        let written = self
            .write_in(&bucket, &object_name(session, path), path, content, expect)
            .await;
        self.forget_bucket_on_failure(session.tenant(), written)
    }

    /// [`write`](Self::write) without listing the session first: the caller has checked the
    /// session cap, and that no file clashes with `path`, against its own view of every file (a
    /// check-in does that once for all the files it writes back). The per-file cap still holds.
    pub async fn write_prechecked(
        &self,
        session: &SessionRef,
        path: &WorkspacePath,
        content: Bytes,
        expect: Expect,
    ) -> Result<Version, WorkspaceError> {
        let bucket = self.bucket_to_write(session, path, content.len()).await?;
        let written = self
            .write_in(&bucket, &object_name(session, path), path, content, expect)
            .await;
        self.forget_bucket_on_failure(session.tenant(), written)
    }

    /// The bucket a write of `len` bytes at `path` goes to (created if missing), once the path
    /// names a file and the per-file cap holds.
    async fn bucket_to_write(
        &self,
        session: &SessionRef,
        path: &WorkspacePath,
        len: usize,
    ) -> Result<Bucket, WorkspaceError> {
        if path.is_root() {
            return Err(WorkspaceError::Invalid(
                "the workspace itself is a directory: give a file path".into(),
            ));
        }
        self.limits.check_file(path, len as u64)?;
        self.buckets
            .get(session.tenant(), true)
            .await?
            .ok_or_else(|| WorkspaceError::Unavailable {
                message: "the workspace bucket could not be created".into(),
                source: None,
            })
    }

    async fn write_in(
        &self,
        bucket: &Bucket,
        name: &str,
        path: &WorkspacePath,
        content: Bytes,
        expect: Expect,
    ) -> Result<Version, WorkspaceError> {
        let mut current = bucket.meta(name).await?;
        check_expectation(path, current.as_ref(), expect)?;

        let nuid = uuid::Uuid::new_v4().simple().to_string();
        let chunks = bucket.publish_chunks(&nuid, &content).await;
        let chunks = match chunks {
            Ok(chunks) => chunks,
            Err(error) => {
                bucket.purge_chunks(&nuid).await;
                return Err(error);
            }
        };
        let digest = digest(&content);
        let mut info = ObjectInfo {
            name: name.to_owned(),
            description: None,
            metadata: HashMap::new(),
            headers: None,
            options: Some(ObjectOptions {
                link: None,
                max_chunk_size: Some(CHUNK_BYTES),
            }),
            bucket: bucket.name.clone(),
            nuid: nuid.clone(),
            size: content.len(),
            chunks,
            modified: now(),
            digest: Some(digest.clone()),
            deleted: false,
        };
        for _ in 0..WRITE_ATTEMPTS {
            let expected_seq = current.as_ref().map_or(0, |m| m.seq);
            history::mark_replacing(&mut info, current.as_ref().map(|m| &m.info));
            match bucket.publish_meta(&info, expected_seq).await {
                Ok(seq) => {
                    self.retire(bucket, current).await;
                    let id = ContentId {
                        nuid: nuid.clone(),
                        digest: digest.clone(),
                    };
                    self.cache.put(&bucket.cache_key(name), id, content);
                    return Ok(Version {
                        seq,
                        nuid,
                        digest: Some(digest),
                        size: info.size as u64,
                    });
                }
                Err(MetaPublish::Conflict) if expect == Expect::Any => {
                    // Another write landed first; this one replaces it.
                    current = bucket.meta(name).await?;
                }
                Err(MetaPublish::Conflict) => {
                    bucket.purge_chunks(&nuid).await;
                    return Err(changed(path));
                }
                Err(MetaPublish::Failed(error)) => {
                    // The publish may have landed with only its acknowledgement lost: the chunks
                    // stay if the metadata names them.
                    match bucket.meta(name).await {
                        Ok(Some(now)) if now.info.nuid == nuid => {
                            self.retire(bucket, current).await;
                            return Ok(now.version());
                        }
                        Ok(_) => bucket.purge_chunks(&nuid).await,
                        Err(_) => {}
                    }
                    return Err(error);
                }
            }
        }
        bucket.purge_chunks(&nuid).await;
        Err(WorkspaceError::Unavailable {
            message: format!(
                "{path} was written by others {WRITE_ATTEMPTS} times while this write ran; try again"
            ),
            source: None,
        })
    }

    /// Removes a file; false if there was none. With [`Expect::Seq`], only that version.
    pub async fn remove(
        &self,
        session: &SessionRef,
        path: &WorkspacePath,
        expect: Expect,
    ) -> Result<bool, WorkspaceError> {
        let Some(bucket) = self.buckets.get(session.tenant(), false).await? else {
            return Ok(false);
        };
        let removed = self.remove_in(&bucket, session, path, expect).await;
        self.forget_bucket_on_failure(session.tenant(), removed)
    }

    async fn remove_in(
        &self,
        bucket: &Bucket,
        session: &SessionRef,
        path: &WorkspacePath,
        expect: Expect,
    ) -> Result<bool, WorkspaceError> {
        let name = object_name(session, path);
        let current = match bucket.meta(&name).await? {
            Some(meta) if !meta.info.deleted => meta,
            _ if matches!(expect, Expect::Seq(_)) => return Err(changed(path)),
            _ => return Ok(false),
        };
        check_expectation(path, Some(&current), expect)?;
        let mut info = current.info.clone();
        // A mark of its own, holding no chunks: the next version names it as the one it
        // replaced, so a mark whose keeping failed shows as a gap, never as the removed version.
        info.nuid = uuid::Uuid::new_v4().simple().to_string();
        info.deleted = true;
        info.chunks = 0;
        info.size = 0;
        info.digest = None;
        info.modified = now();
        history::mark_replacing(&mut info, Some(&current.info));
        match bucket.publish_meta(&info, current.seq).await {
            Ok(_) => {}
            Err(MetaPublish::Conflict) => return Err(changed(path)),
            Err(MetaPublish::Failed(error)) => return Err(error),
        }
        self.cache.forget(&bucket.cache_key(&name));
        self.retire(bucket, Some(current)).await;
        Ok(true)
    }

    /// What becomes of the metadata a write or removal replaced: kept apart with its chunks
    /// while versions are kept, otherwise its chunks purged.
    async fn retire(&self, bucket: &Bucket, replaced: Option<Meta>) {
        let Some(replaced) = replaced else {
            return;
        };
        if self.versions > 0 {
            history::keep_replaced(bucket, replaced, self.versions).await;
        } else if !replaced.info.deleted {
            bucket.purge_chunks(&replaced.info.nuid).await;
        }
    }

    /// Drops the handle of `tenant`'s bucket when `result` says the store failed (the bucket
    /// may have been removed or recreated), so the next call looks it up again.
    fn forget_bucket_on_failure<T>(
        &self,
        tenant: &str,
        result: Result<T, WorkspaceError>,
    ) -> Result<T, WorkspaceError> {
        if matches!(result, Err(WorkspaceError::Unavailable { .. })) {
            self.buckets.forget(tenant);
        }
        result
    }
}

fn is_link(info: &ObjectInfo) -> bool {
    info.options.as_ref().is_some_and(|o| o.link.is_some())
}

/// Whether a name below a session is a path a tool could name (objects written by other tools
/// may not be).
fn is_workspace_path(path: &str) -> bool {
    clean_relative(path).ok().as_deref() == Some(path)
}

fn not_found(path: &WorkspacePath) -> WorkspaceError {
    WorkspaceError::NotFound(format!("{path}: no such file or directory"))
}

fn changed(path: &WorkspacePath) -> WorkspaceError {
    WorkspaceError::Conflict(format!(
        "{path} changed while this operation ran; nothing was written: read it again"
    ))
}

fn check_expectation(
    path: &WorkspacePath,
    current: Option<&Meta>,
    expect: Expect,
) -> Result<(), WorkspaceError> {
    let live = current.filter(|m| !m.info.deleted);
    match (expect, live) {
        (Expect::Any, _) | (Expect::Absent, None) => Ok(()),
        (Expect::Seq(seq), Some(meta)) if meta.seq == seq => Ok(()),
        _ => Err(changed(path)),
    }
}

/// Refuses a file at `path` when a file lies on its way (`a` for `a/b`) or below it (`a/b` for
/// `a`): one name cannot be a file and a directory at once.
pub fn check_namespace(files: &[StoredFile], path: &WorkspacePath) -> Result<(), WorkspaceError> {
    for file in files {
        if path.as_str().len() > file.path.len()
            && path.as_str().starts_with(&file.path)
            && path.as_str().as_bytes()[file.path.len()] == b'/'
        {
            return Err(WorkspaceError::Invalid(format!(
                "{} is a file, so {path} cannot be created below it",
                file.path
            )));
        }
        if path.contains(&file.path) {
            return Err(WorkspaceError::Invalid(format!(
                "{path} is a directory (it holds {})",
                file.path
            )));
        }
    }
    Ok(())
}

fn now() -> Option<async_nats::datetime::DateTime> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    async_nats::datetime::from_nanos(i128::try_from(nanos).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> StoredFile {
        StoredFile {
            path: path.into(),
            size: 1,
            nuid: "n".into(),
            digest: None,
        }
    }

    #[test]
    fn a_name_is_a_file_or_a_directory_never_both() {
        let files = [file("a"), file("dir/b.txt")];
        let path = |p: &str| WorkspacePath::parse(p).expect("valid");
        assert!(check_namespace(&files, &path("a")).is_ok());
        assert!(check_namespace(&files, &path("ab")).is_ok());
        assert!(check_namespace(&files, &path("dir/c.txt")).is_ok());
        assert!(check_namespace(&files, &path("dir2")).is_ok());
        let below_file = check_namespace(&files, &path("a/x")).expect_err("clash");
        assert!(
            below_file.to_string().contains("a is a file"),
            "{below_file}"
        );
        let over_dir = check_namespace(&files, &path("dir")).expect_err("clash");
        assert!(
            over_dir.to_string().contains("dir is a directory"),
            "{over_dir}"
        );
    }
}
