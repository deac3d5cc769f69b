//! A tenant's workspace bucket: its names in the object store's layout, finding or creating it
//! ([`Buckets`]), and the stream requests a file is made of ([`Bucket`]): a metadata message by
//! object name, chunks by version.
//!
//! Invariants:
//! - every read is a `STREAM.MSG.GET`, answered by the stream's leader (never a possibly lagging
//!   replica), and every request has the JetStream context's timeout;
//! - a metadata publish carries `Nats-Rollup: sub` (one message per object) and
//!   `Nats-Expected-Last-Subject-Sequence` (it lands only on the version it expects);
//! - bucket handles are cached per tenant, bounded, and created only on request (a write), never
//!   by a read;
//! - a bucket is created with the configured replicas, and an existing one with fewer is raised
//!   to them when a process first opens it (never lowered: see `bus::raise_replicas`); handles
//!   that only find buckets ([`FIND_ONLY`]) neither create nor raise.

use std::collections::{HashMap, VecDeque};

use async_nats::header::{
    HeaderMap, HeaderValue, NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, NATS_ROLLUP,
};
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::object_store::{self, ObjectInfo};
use async_nats::jetstream::stream::{RawMessageErrorKind, StorageType};
use async_nats::jetstream::{self, ErrorCode};
use base64::Engine;
use bytes::Bytes;

use super::Version;
use crate::workspace::{digest, WorkspaceError};

/// Bucket names are this and the tenant.
pub const BUCKET_PREFIX: &str = "skein-ws-";

/// Size of the chunks of a new object (the object store's default). A chunk must fit in one
/// message, and in a `STREAM.MSG.GET` answer once base64-encoded.
pub(super) const CHUNK_BYTES: usize = 128 * 1024;

/// Chunks published before the oldest one's acknowledgement is awaited.
const CHUNKS_IN_FLIGHT: usize = 8;

/// Buckets whose handles a process keeps; beyond, the map is emptied and refilled on demand.
const MAX_KNOWN_BUCKETS: usize = 1024;

/// The `Nats-Rollup` value that keeps one metadata message per object.
const ROLLUP_SUBJECT: &str = "sub";

/// The bucket of `tenant`'s workspaces (a valid bucket name for any tenant token).
pub fn bucket_name(tenant: &str) -> String {
    format!("{BUCKET_PREFIX}{tenant}")
}

/// A family of per-tenant buckets: how their names start, what they hold, and how long they keep
/// an object. Workspaces are one family ([`WORKSPACE_BUCKETS`]); values stored by reference
/// (`crate::payloads`) another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketKind {
    /// Bucket names are this and the tenant.
    pub prefix: &'static str,
    /// What the buckets hold, for their description and errors.
    pub holds: &'static str,
    /// How long an object is kept after it was written (the stream's max age); `None` keeps it
    /// until it is removed.
    pub max_age: Option<std::time::Duration>,
}

/// The session workspaces' buckets: `skein-ws-<tenant>`, kept until removed.
pub const WORKSPACE_BUCKETS: BucketKind = BucketKind {
    prefix: BUCKET_PREFIX,
    holds: "session workspaces",
    max_age: None,
};

impl BucketKind {
    /// The bucket of `tenant` (a valid bucket name for any tenant token).
    pub fn bucket_name(&self, tenant: &str) -> String {
        format!("{}{tenant}", self.prefix)
    }
}

pub(super) fn stream_name(bucket: &str) -> String {
    format!("OBJ_{bucket}")
}

fn meta_subject(bucket: &str, object: &str) -> String {
    format!(
        "$O.{bucket}.M.{}",
        base64::engine::general_purpose::URL_SAFE.encode(object)
    )
}

fn chunk_subject(bucket: &str, nuid: &str) -> String {
    format!("$O.{bucket}.C.{nuid}")
}

/// The current metadata of an object, live or deleted, and its stream sequence.
pub(super) struct Meta {
    pub info: ObjectInfo,
    pub seq: u64,
}

impl Meta {
    pub fn version(&self) -> Version {
        Version {
            seq: self.seq,
            nuid: self.info.nuid.clone(),
            digest: self.info.digest.clone(),
            size: self.info.size as u64,
        }
    }
}

/// Why assembling one version failed.
pub(super) enum Fetch {
    /// The version's chunks are gone or do not add up: a newer write replaced it.
    Replaced(String),
    Failed(WorkspaceError),
}

/// Why a metadata publish failed.
pub(super) enum MetaPublish {
    /// The object's last metadata is not the expected one.
    Conflict,
    Failed(WorkspaceError),
}

/// A tenant's bucket: its stream for reads, writes and purges, and the object store for listing.
#[derive(Clone)]
pub(super) struct Bucket {
    pub name: String,
    jetstream: jetstream::Context,
    stream: jetstream::stream::Stream<()>,
}

/// Metadata messages fetched per request of a listing.
const LIST_BATCH: usize = 256;

/// Longest wait for the answer to one fetch of a listing, and how many listings may have one go
/// unanswered before the listing fails.
const LIST_FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
const LIST_FETCH_ATTEMPTS: u32 = 5;

impl Bucket {
    /// Every object's current metadata (deleted objects included), read through an ephemeral
    /// pull consumer that ends when the server has nothing more to deliver. The library's
    /// `list` ends on a delivered message with nothing pending after it, which never comes when a
    /// concurrent write rolls up the message it was waiting for: under concurrent writes such a
    /// listing hangs.
    pub async fn list_metadata(&self) -> Result<Vec<ObjectInfo>, WorkspaceError> {
        let metas = self.read_metadata(DeliverPolicy::LastPerSubject).await?;
        Ok(metas.into_iter().map(|meta| meta.info).collect())
    }

    /// Every metadata message the bucket holds, oldest first: the current ones and the earlier
    /// versions kept apart (see `history`).
    pub async fn all_metadata(&self) -> Result<Vec<ObjectInfo>, WorkspaceError> {
        let metas = self.all_meta().await?;
        Ok(metas.into_iter().map(|meta| meta.info).collect())
    }

    /// [`all_metadata`](Self::all_metadata) with each message's stream sequence.
    pub async fn all_meta(&self) -> Result<Vec<Meta>, WorkspaceError> {
        self.read_metadata(DeliverPolicy::All).await
    }

    /// Reads the metadata messages `deliver_policy` selects through an ephemeral pull consumer.
    /// A fetch whose answer never comes (seen on 2.9 when a purge or rollup races a listing: the
    /// consumer's count of what is pending goes wrong and asking it again does not help) starts
    /// the whole listing again on a fresh consumer, a bounded number of times.
    async fn read_metadata(
        &self,
        deliver_policy: DeliverPolicy,
    ) -> Result<Vec<Meta>, WorkspaceError> {
        let mut unanswered = 0;
        loop {
            match self.read_metadata_once(deliver_policy).await? {
                Some(metas) => return Ok(metas),
                None if unanswered + 1 < LIST_FETCH_ATTEMPTS => unanswered += 1,
                None => {
                    return Err(self.list_failed(&format!(
                        "{LIST_FETCH_ATTEMPTS} listings had a fetch go unanswered"
                    )))
                }
            }
        }
    }

    fn list_failed(&self, e: &dyn std::fmt::Display) -> WorkspaceError {
        WorkspaceError::Unavailable {
            message: format!("cannot list {}: {e}", self.name),
            source: None,
        }
    }

    /// One listing on one consumer: `None` when a fetch went unanswered.
    async fn read_metadata_once(
        &self,
        deliver_policy: DeliverPolicy,
    ) -> Result<Option<Vec<Meta>>, WorkspaceError> {
        use async_nats::jetstream::consumer::{pull, AckPolicy};
        use futures::StreamExt;
        let failed = |e: &dyn std::fmt::Display| self.list_failed(e);
        let consumer = self
            .stream
            .create_consumer(pull::Config {
                filter_subject: format!("$O.{}.M.>", self.name),
                deliver_policy,
                ack_policy: AckPolicy::None,
                inactive_threshold: std::time::Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| failed(&e))?;
        let mut infos = Vec::new();
        let listed = async {
            loop {
                let batch = async {
                    let mut batch = consumer
                        .fetch()
                        .max_messages(LIST_BATCH)
                        .messages()
                        .await
                        .map_err(|e| failed(&e))?;
                    let mut received = Vec::new();
                    while let Some(message) = batch.next().await {
                        let message = message.map_err(|e| failed(&e))?;
                        let seq = message.info().map_err(|e| failed(&e))?.stream_sequence;
                        let info: ObjectInfo =
                            serde_json::from_slice(&message.payload).map_err(|e| failed(&e))?;
                        received.push(Meta { info, seq });
                    }
                    Ok::<_, WorkspaceError>(received)
                };
                match tokio::time::timeout(LIST_FETCH_TIMEOUT, batch).await {
                    Ok(received) => {
                        let received = received?;
                        if received.is_empty() {
                            return Ok(true);
                        }
                        infos.extend(received);
                    }
                    Err(_) => return Ok(false),
                }
            }
        }
        .await;
        // Ephemeral: it also goes by itself once inactive.
        if let Err(e) = self
            .stream
            .delete_consumer(&consumer.cached_info().name)
            .await
        {
            tracing::debug!(error = %e, "listing consumer not deleted; it expires");
        }
        listed.map(|complete| complete.then_some(infos))
    }

    /// The cache key of `object` in this bucket.
    pub fn cache_key(&self, object: &str) -> String {
        format!("{}/{object}", self.name)
    }

    /// The latest metadata message of `object` (live or deleted).
    pub async fn meta(&self, object: &str) -> Result<Option<Meta>, WorkspaceError> {
        let request = self
            .stream
            .raw_message_builder()
            .last_by_subject(meta_subject(&self.name, object));
        self.meta_message(object, request.send().await)
    }

    /// The oldest metadata message of `object` the stream holds.
    pub async fn first_meta(&self, object: &str) -> Result<Option<Meta>, WorkspaceError> {
        let request = self
            .stream
            .raw_message_builder()
            .sequence(1)
            .next_by_subject(meta_subject(&self.name, object));
        self.meta_message(object, request.send().await)
    }

    fn meta_message(
        &self,
        object: &str,
        message: Result<
            async_nats::jetstream::message::StreamMessage,
            async_nats::jetstream::stream::RawMessageError,
        >,
    ) -> Result<Option<Meta>, WorkspaceError> {
        let message = match message {
            Ok(message) => message,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => {
                return Err(WorkspaceError::unavailable(
                    format!("cannot read the metadata of {object}"),
                    e,
                ))
            }
        };
        let info: ObjectInfo = serde_json::from_slice(&message.payload).map_err(|e| {
            WorkspaceError::unavailable(format!("the metadata of {object} is not readable"), e)
        })?;
        Ok(Some(Meta {
            info,
            seq: message.sequence,
        }))
    }

    /// Assembles the chunks of the version `info` describes, checking size and digest.
    pub async fn fetch(&self, info: &ObjectInfo) -> Result<Bytes, Fetch> {
        let subject = chunk_subject(&self.name, &info.nuid);
        let mut content = bytes::BytesMut::with_capacity(info.size);
        let mut next_seq = 1;
        for index in 0..info.chunks {
            let message = self
                .stream
                .raw_message_builder()
                .sequence(next_seq)
                .next_by_subject(subject.clone())
                .send()
                .await;
            let message = match message {
                Ok(message) => message,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => {
                    return Err(Fetch::Replaced(format!(
                        "chunk {} of {} is gone",
                        index + 1,
                        info.chunks
                    )))
                }
                Err(e) => {
                    return Err(Fetch::Failed(WorkspaceError::unavailable(
                        format!("cannot read {}", info.name),
                        e,
                    )))
                }
            };
            content.extend_from_slice(&message.payload);
            if content.len() > info.size {
                return Err(Fetch::Replaced("more bytes than its size".into()));
            }
            next_seq = message.sequence + 1;
        }
        if content.len() != info.size {
            return Err(Fetch::Replaced(format!(
                "{} bytes where {} were expected",
                content.len(),
                info.size
            )));
        }
        if let Some(expected) = &info.digest {
            if digest(&content) != *expected {
                return Err(Fetch::Replaced("its digest does not match".into()));
            }
        }
        Ok(content.freeze())
    }

    /// Publishes `content` as chunks under `nuid`; returns how many.
    pub async fn publish_chunks(
        &self,
        nuid: &str,
        content: &Bytes,
    ) -> Result<usize, WorkspaceError> {
        let subject = chunk_subject(&self.name, nuid);
        let mut pending: VecDeque<PublishAckFuture> = VecDeque::new();
        let mut chunks = 0;
        let publish_error = |e: Box<dyn std::error::Error + Send + Sync>| {
            WorkspaceError::unavailable(format!("cannot store a chunk in {}", self.name), e)
        };
        for chunk in content.chunks(CHUNK_BYTES) {
            if pending.len() >= CHUNKS_IN_FLIGHT {
                if let Some(ack) = pending.pop_front() {
                    ack.await.map_err(|e| publish_error(Box::new(e)))?;
                }
            }
            let ack = self
                .jetstream
                .publish(subject.clone(), content.slice_ref(chunk))
                .await
                .map_err(|e| publish_error(Box::new(e)))?;
            pending.push_back(ack);
            chunks += 1;
        }
        while let Some(ack) = pending.pop_front() {
            ack.await.map_err(|e| publish_error(Box::new(e)))?;
        }
        Ok(chunks)
    }

    /// Publishes `info` as the object's metadata if the last one has sequence `expected_seq`
    /// (0: none); returns the new metadata's sequence.
    pub async fn publish_meta(
        &self,
        info: &ObjectInfo,
        expected_seq: u64,
    ) -> Result<u64, MetaPublish> {
        let payload = serde_json::to_vec(info).map_err(|e| {
            MetaPublish::Failed(WorkspaceError::unavailable(
                "cannot encode object metadata",
                e,
            ))
        })?;
        let mut headers = HeaderMap::new();
        headers.insert(NATS_ROLLUP, HeaderValue::from(ROLLUP_SUBJECT));
        headers.insert(
            NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            HeaderValue::from(expected_seq.to_string().as_str()),
        );
        let failed = |e: async_nats::jetstream::context::PublishError| {
            if e.kind() == PublishErrorKind::WrongLastSequence {
                MetaPublish::Conflict
            } else {
                MetaPublish::Failed(WorkspaceError::unavailable(
                    format!("cannot store the metadata of {}", info.name),
                    e,
                ))
            }
        };
        let ack = self
            .jetstream
            .publish_with_headers(
                meta_subject(&self.name, &info.name),
                headers,
                payload.into(),
            )
            .await
            .map_err(failed)?
            .await
            .map_err(failed)?;
        Ok(ack.sequence)
    }

    /// Appends `info` to the metadata messages of its name, without rolling up the earlier ones or
    /// expecting any (the earlier versions a name keeps apart; see `history`).
    pub async fn append_meta(&self, info: &ObjectInfo) -> Result<u64, WorkspaceError> {
        let failed = |e: &dyn std::fmt::Display| WorkspaceError::Unavailable {
            message: format!("cannot store the metadata of {}: {e}", info.name),
            source: None,
        };
        let payload = serde_json::to_vec(info).map_err(|e| failed(&e))?;
        let ack = self
            .jetstream
            .publish(meta_subject(&self.name, &info.name), payload.into())
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        Ok(ack.sequence)
    }

    /// Deletes the message at `seq` (a metadata message no longer kept).
    pub async fn delete_message(&self, seq: u64) -> Result<(), WorkspaceError> {
        self.stream
            .delete_message(seq)
            .await
            .map(|_| ())
            .map_err(|e| WorkspaceError::unavailable(format!("cannot trim {}", self.name), e))
    }

    /// Removes the chunks of version `nuid`; a failure only leaves unreachable data behind, so
    /// it is logged, not returned.
    pub async fn purge_chunks(&self, nuid: &str) {
        if let Err(e) = self.purge_version(nuid).await {
            tracing::warn!(bucket = %self.name, nuid, error = %e, "could not purge replaced chunks");
        }
    }

    /// Removes the chunks of version `nuid`, saying whether that failed.
    pub async fn purge_version(&self, nuid: &str) -> Result<(), WorkspaceError> {
        if nuid.is_empty() {
            return Ok(());
        }
        self.stream
            .purge()
            .filter(chunk_subject(&self.name, nuid))
            .await
            .map(drop)
            .map_err(|e| {
                WorkspaceError::unavailable(format!("cannot purge chunks of {}", self.name), e)
            })
    }

    /// Removes the metadata messages of `object` up to and including stream sequence `through`;
    /// a later one (a write that landed since) stays.
    pub async fn purge_meta_through(
        &self,
        object: &str,
        through: u64,
    ) -> Result<(), WorkspaceError> {
        self.stream
            .purge()
            .filter(meta_subject(&self.name, object))
            .sequence(through.saturating_add(1))
            .await
            .map(drop)
            .map_err(|e| {
                WorkspaceError::unavailable(format!("cannot purge the metadata of {object}"), e)
            })
    }
}

/// The replicas of handles that only find buckets: they create none and leave every bucket's
/// replicas as they are (a process that removes files, not the workers that set them).
pub(super) const FIND_ONLY: usize = 0;

/// Handles of the tenants' buckets, found or created on demand.
pub(super) struct Buckets {
    jetstream: jetstream::Context,
    /// Replicas of the buckets created, and raised to when opened; [`FIND_ONLY`]: neither.
    replicas: usize,
    kind: BucketKind,
    /// Byte limit of each bucket, set on those created and on those opened (unless
    /// [`FIND_ONLY`]); `None` leaves a bucket's limit as it is.
    max_bytes: Option<u64>,
    known: std::sync::Mutex<HashMap<String, Bucket>>,
}

impl Buckets {
    pub fn new(jetstream: jetstream::Context, replicas: usize) -> Self {
        Self::of_kind(jetstream, replicas, WORKSPACE_BUCKETS)
    }

    /// The buckets of `kind`.
    pub fn of_kind(jetstream: jetstream::Context, replicas: usize, kind: BucketKind) -> Self {
        Self {
            jetstream,
            replicas,
            kind,
            max_bytes: None,
            known: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The same buckets, each held to `max_bytes` (`None`: no limit of their own).
    pub fn with_max_bytes(mut self, max_bytes: Option<u64>) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The byte limit as a stream has it (0: none).
    fn stream_max_bytes(&self) -> Option<i64> {
        self.max_bytes
            .map(|bytes| i64::try_from(bytes).unwrap_or(i64::MAX))
    }

    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The bucket of `tenant`, created if `create` and missing; `None` if missing otherwise.
    pub async fn get(&self, tenant: &str, create: bool) -> Result<Option<Bucket>, WorkspaceError> {
        if let Some(bucket) = self.lock().get(tenant).cloned() {
            return Ok(Some(bucket));
        }
        let name = self.kind.bucket_name(tenant);
        let found = match self.open(&name).await? {
            Some(bucket) => bucket,
            None if !create || self.replicas == FIND_ONLY => return Ok(None),
            None => {
                let config = object_store::Config {
                    bucket: name.clone(),
                    description: Some(format!("Skein {} of tenant {tenant}", self.kind.holds)),
                    max_age: self.kind.max_age.unwrap_or_default(),
                    max_bytes: self.stream_max_bytes().unwrap_or_default(),
                    num_replicas: self.replicas,
                    storage: StorageType::File,
                    ..Default::default()
                };
                // Another process may create it at the same time: whoever wins, open it.
                let created = self.jetstream.create_object_store(config).await;
                match (created, self.open(&name).await) {
                    (_, Ok(Some(bucket))) => bucket,
                    (Err(e), _) => {
                        return Err(WorkspaceError::unavailable(
                            format!("cannot create the workspace bucket {name}"),
                            e,
                        ))
                    }
                    (Ok(_), Ok(None)) => {
                        return Err(WorkspaceError::Unavailable {
                            message: format!("the workspace bucket {name} vanished after creation"),
                            source: None,
                        })
                    }
                    (Ok(_), Err(e)) => return Err(e),
                }
            }
        };
        let mut known = self.lock();
        if known.len() >= MAX_KNOWN_BUCKETS {
            known.clear();
        }
        known.insert(tenant.to_owned(), found.clone());
        Ok(Some(found))
    }

    /// Drops the handle of `tenant`'s bucket, so the next call looks it up again.
    pub fn forget(&self, tenant: &str) {
        self.lock().remove(tenant);
    }

    /// The tenants that have a bucket of this kind (names that are not tokens left out).
    pub async fn tenants(&self) -> Result<Vec<String>, WorkspaceError> {
        use futures::TryStreamExt;
        let prefix = stream_name(self.kind.prefix);
        let names: Vec<String> = self
            .jetstream
            .stream_names()
            .try_collect()
            .await
            .map_err(|e| WorkspaceError::unavailable("cannot list the buckets", e))?;
        let mut tenants: Vec<String> = names
            .iter()
            .filter_map(|name| name.strip_prefix(&prefix))
            .filter(|tenant| crate::protocol::validate_token("tenant", tenant).is_ok())
            .map(str::to_owned)
            .collect();
        tenants.sort();
        Ok(tenants)
    }

    async fn open(&self, name: &str) -> Result<Option<Bucket>, WorkspaceError> {
        let stream = stream_name(name);
        let found = match self.jetstream.get_stream(&stream).await {
            Ok(found) => found,
            Err(e) => {
                if let GetStreamErrorKind::JetStream(js) = e.kind() {
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND {
                        return Ok(None);
                    }
                }
                return Err(WorkspaceError::unavailable(
                    format!("cannot look up the workspace bucket {name}"),
                    e,
                ));
            }
        };
        let config = &found.cached_info().config;
        if self.replicas != FIND_ONLY {
            if let Err(e) = crate::bus::raise_replicas(&self.jetstream, config, self.replicas).await
            {
                tracing::error!(bucket = %name, error = %e, "workspace bucket keeps fewer replicas than configured");
            }
            if let Some(max_bytes) = self.stream_max_bytes() {
                if config.max_bytes != max_bytes {
                    let mut bounded = config.clone();
                    bounded.max_bytes = max_bytes;
                    match self.jetstream.update_stream(&bounded).await {
                        Ok(_) => {
                            tracing::info!(bucket = %name, from = config.max_bytes, to = max_bytes, "workspace bucket's byte limit set")
                        }
                        Err(e) => {
                            tracing::error!(bucket = %name, error = %e, "workspace bucket keeps its byte limit")
                        }
                    }
                }
            }
        }
        let stream = self
            .jetstream
            .get_stream_no_info(&stream)
            .await
            .map_err(|e| {
                WorkspaceError::unavailable(format!("cannot open the workspace bucket {name}"), e)
            })?;
        Ok(Some(Bucket {
            name: name.to_owned(),
            jetstream: self.jetstream.clone(),
            stream,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bucket>> {
        // Every update is one map operation, so a poisoned map is still consistent.
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_object_store_layout() {
        assert_eq!(bucket_name("acme"), "skein-ws-acme");
        assert_eq!(stream_name("skein-ws-acme"), "OBJ_skein-ws-acme");
        // URL-safe base64 with padding, as the object store encodes names.
        assert_eq!(meta_subject("b", "s/a"), "$O.b.M.cy9h");
        assert_eq!(chunk_subject("b", "n1"), "$O.b.C.n1");
    }
}
