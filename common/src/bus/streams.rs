//! Skein's JetStream streams: created at start-up by every process with the configured replicas
//! (`SKEIN_STREAM_REPLICAS`), and bounded (`STREAM_LIMITS`); a stream created before its limits
//! gets them.
//!
//! Invariants:
//! - replicas only grow: an existing stream (or workspace bucket) with fewer replicas than this
//!   process's setting is raised to it (NATS 2.9 scales a stream and its consumers up in place);
//!   one with more keeps them, so a process with a smaller setting (a CLI, an older pod) never
//!   shrinks what another raised. A raise that the servers refuse (fewer servers than replicas)
//!   is reported at error level, naming the stream and both counts, and the stream keeps serving;
//! - the work, submit and events streams are partitions (`SKEIN_PARTITIONS`): a process creates
//!   those of its setting and never removes one, so a partition another process made keeps its
//!   tasks until they are served ([`Bus::work_partitions`] finds every one) and its events until
//!   they age out;
//! - creation is safe from many processes at once: a process that loses the race to create a
//!   stream (the server answers that the name is in use) reads the winner's stream and reconciles
//!   it like any existing one.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use futures::TryStreamExt;

use crate::subjects;

use super::intake::PULL_RETRY;

/// How often a running process looks for partition streams made since it started (a listing of
/// every stream's name, so not more often): workers for work partitions, leads for submit
/// partitions.
pub const PARTITIONS_LOOK_EVERY: Duration = Duration::from_secs(10);
use super::{Bus, BusError, JETSTREAM_READY_WAIT};

impl Bus {
    /// Creates Skein's streams if they do not exist (a work, submit and events stream for each
    /// of [`Bus::partitions`]), with [`Bus::stream_replicas`] replicas;
    /// gives streams created before their limits (see [`STREAM_LIMITS`]) those limits, and
    /// raises streams with fewer replicas (idempotent; safe from every process at once).
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        // A server that just started (or restarted) may take a moment before JetStream answers,
        // and a cluster before it has elected its leaders.
        let deadline = tokio::time::Instant::now() + JETSTREAM_READY_WAIT;
        for config in self.stream_configs() {
            let current = loop {
                // Found, or created by this process; a process that loses a race to create it
                // (its create is refused: the name is in use) finds the winner's on the next try.
                match self.jetstream.get_or_create_stream(config.clone()).await {
                    Ok(existing) => break existing.cached_info().config.clone(),
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(stream = %config.name, error = %e, "JetStream not ready; retrying");
                        tokio::time::sleep(PULL_RETRY).await;
                    }
                    Err(e) => {
                        return Err(BusError::Stream {
                            stream: config.name.clone(),
                            message: e.to_string(),
                        })
                    }
                }
            };
            let current = self.bound_stream(current, &config).await?;
            if let Err(e) = raise_replicas(&self.jetstream, &current, self.stream_replicas).await {
                tracing::error!(stream = %config.name, error = %e, "stream keeps fewer replicas than configured");
            }
        }
        Ok(())
    }

    /// What [`Bus::ensure_streams`] creates: Skein's streams, with every work partition's of
    /// this process's setting last.
    pub fn stream_configs(&self) -> Vec<stream::Config> {
        let replicas = self.stream_replicas;
        let queue = |name: &str, subjects: Vec<String>| stream::Config {
            name: name.into(),
            subjects,
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: Duration::from_secs(120),
            // Full: a new message is refused (its publisher gets the error), none is dropped.
            discard: stream::DiscardPolicy::New,
            max_messages: STREAM_LIMITS.queue_messages,
            max_bytes: STREAM_LIMITS.queue_bytes,
            max_age: STREAM_LIMITS.queue_age,
            num_replicas: replicas,
            ..Default::default()
        };
        let work = (0..self.partitions)
            .map(|k| queue(&subjects::work_stream(k), subjects::work_subjects(k)));
        let events = (0..self.partitions).map(|k| stream::Config {
            name: subjects::events_stream(k),
            subjects: vec![subjects::events_subjects(k)],
            retention: stream::RetentionPolicy::Limits,
            max_age: Duration::from_secs(24 * 3600),
            max_bytes: STREAM_LIMITS.events_bytes,
            // Direct gets name the subject in their API subject (fenceable per tenant).
            allow_direct: true,
            num_replicas: replicas,
            ..Default::default()
        });
        // Direct gets answer a turn's order look (`Bus::first_in_line`).
        let submit_queue = |name: &str, subjects: Vec<String>| stream::Config {
            allow_direct: true,
            ..queue(name, subjects)
        };
        let submit = (1..self.partitions).map(|k| {
            submit_queue(
                &subjects::submit_stream(k),
                vec![subjects::submit_subjects(k)],
            )
        });
        let others = [
            submit_queue(subjects::SUBMIT_STREAM, vec![subjects::SUBMIT_ALL.into()]),
            stream::Config {
                name: subjects::CANCEL_STREAM.into(),
                subjects: vec![subjects::CANCEL_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(24 * 3600),
                max_messages_per_subject: 1,
                num_replicas: replicas,
                ..Default::default()
            },
            stream::Config {
                name: subjects::APPROVALS_STREAM.into(),
                subjects: vec![subjects::APPROVALS_ALL.into(), subjects::CONTROL_ALL.into()],
                retention: stream::RetentionPolicy::WorkQueue,
                max_age: Duration::from_secs(14 * 24 * 3600),
                num_replicas: replicas,
                ..Default::default()
            },
            stream::Config {
                name: subjects::DLQ_STREAM.into(),
                subjects: vec![subjects::DLQ_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(14 * 24 * 3600),
                max_bytes: STREAM_LIMITS.dlq_bytes,
                num_replicas: replicas,
                ..Default::default()
            },
            stream::Config {
                name: crate::audit::AUDIT_STREAM.into(),
                subjects: vec![crate::audit::AUDIT_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: self.audit_retention,
                duplicate_window: Duration::from_secs(120),
                num_replicas: replicas,
                ..Default::default()
            },
        ];
        others
            .into_iter()
            .chain(events)
            .chain(submit)
            .chain(work)
            .collect()
    }

    /// Partitions this process creates and publishes submissions, calls and events to
    /// (`SKEIN_PARTITIONS`).
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The partition of a session's submissions and calls (see [`subjects::session_partition`]).
    pub fn session_partition(&self, tenant: &str, session: &str) -> u32 {
        subjects::session_partition(tenant, session, self.partitions)
    }

    /// The work partitions whose streams exist: this process's `SKEIN_PARTITIONS`, and those
    /// another process with more made (a cluster being re-partitioned), in order.
    pub async fn work_partitions(&self) -> Result<Vec<u32>, BusError> {
        self.partitions_of(subjects::WORK_STREAM).await
    }

    /// The submit partitions whose streams exist, in order; also remembered as the partitions
    /// a session's unfinished submissions are looked for in ([`Bus::known_submit_partitions`]).
    pub async fn submit_partitions(&self) -> Result<Vec<u32>, BusError> {
        let found = self.partitions_of(subjects::SUBMIT_STREAM).await?;
        self.know_submit_partitions(&found);
        Ok(found)
    }

    /// The partitions of the partitioned stream `base` whose streams exist, in order.
    pub(super) async fn partitions_of(&self, base: &str) -> Result<Vec<u32>, BusError> {
        let mut names = self.jetstream.stream_names();
        let mut partitions = Vec::new();
        while let Some(name) = names.try_next().await.map_err(|e| BusError::Stream {
            stream: format!("{base}*"),
            message: format!("cannot list the streams: {e}"),
        })? {
            partitions.extend(subjects::parse_partition_stream(base, &name));
        }
        partitions.sort_unstable();
        Ok(partitions)
    }

    /// Raises every stream whose name starts with `prefix` (the workspace buckets' streams, say)
    /// to `wanted` replicas; returns how many were raised. A raise the servers refuse is
    /// reported at error level and the others still run; listing the streams may fail.
    pub async fn raise_replicas_of(&self, prefix: &str, wanted: usize) -> Result<usize, BusError> {
        let list_error = |e: jetstream::context::StreamsError| BusError::Stream {
            stream: format!("{prefix}*"),
            message: format!("cannot list the streams: {e}"),
        };
        let mut listed = self.jetstream.streams();
        let mut raised = 0;
        while let Some(info) = listed.try_next().await.map_err(list_error)? {
            if !info.config.name.starts_with(prefix) {
                continue;
            }
            match raise_replicas(&self.jetstream, &info.config, wanted).await {
                Ok(true) => raised += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(stream = %info.config.name, error = %e, "stream keeps fewer replicas than configured")
                }
            }
        }
        Ok(raised)
    }

    /// Gives a stream created before Skein bounded it the limits it should have (and the events
    /// stream its direct gets); other settings are kept. Returns the configuration in force.
    async fn bound_stream(
        &self,
        current: stream::Config,
        wanted: &stream::Config,
    ) -> Result<stream::Config, BusError> {
        // The server reports "no limit" as -1 where a config says 0.
        let unlimited = |v: i64| if v <= 0 { -1 } else { v };
        let limits = |c: &stream::Config| {
            (
                unlimited(c.max_messages),
                unlimited(c.max_bytes),
                c.max_age,
                c.discard,
                c.allow_direct,
            )
        };
        // A stream made by an earlier build gains the subjects this one added (never loses any).
        let missing: Vec<String> = wanted
            .subjects
            .iter()
            .filter(|s| !current.subjects.contains(s))
            .cloned()
            .collect();
        // … and loses those this build narrowed.
        let narrowed: Vec<String> = current
            .subjects
            .iter()
            .filter(|s| NARROWED.contains(&(current.name.as_str(), s.as_str())))
            .cloned()
            .collect();
        if limits(&current) == limits(wanted) && missing.is_empty() && narrowed.is_empty() {
            return Ok(current);
        }
        tracing::warn!(stream = %current.name, ?missing, ?narrowed, "stream limits or subjects differ from this build's; updating them");
        let mut bounded = current.clone();
        bounded.subjects.retain(|s| !narrowed.contains(s));
        bounded.subjects.extend(missing);
        bounded.max_messages = wanted.max_messages;
        bounded.max_bytes = wanted.max_bytes;
        bounded.max_age = wanted.max_age;
        bounded.discard = wanted.discard;
        bounded.allow_direct = wanted.allow_direct;
        self.jetstream
            .update_stream(bounded)
            .await
            .map(|info| info.config)
            .map_err(|e| BusError::Stream {
                stream: current.name.clone(),
                message: format!("cannot set its limits: {e}"),
            })
    }
}

/// Subjects an earlier build gave a stream that this one replaces with narrower ones: the events
/// stream took all of `skein.events.>` before its partitions needed subjects beside it.
const NARROWED: [(&str, &str); 1] = [(subjects::EVENTS_STREAM, subjects::EVENTS_ALL)];

/// Raises `current` (an existing stream's configuration) to `wanted` replicas if it has fewer;
/// tells whether it did. A stream with more replicas keeps them (said at info level). Other
/// settings are kept.
pub async fn raise_replicas(
    jetstream: &jetstream::Context,
    current: &stream::Config,
    wanted: usize,
) -> Result<bool, BusError> {
    // The server reports a stream created without a count as having one replica.
    let has = current.num_replicas.max(1);
    if has >= wanted {
        if has > wanted {
            tracing::info!(stream = %current.name, replicas = has, configured = wanted, "stream has more replicas than configured; kept");
        }
        return Ok(false);
    }
    tracing::warn!(stream = %current.name, from = has, to = wanted, "raising the stream's replicas");
    let mut raised = current.clone();
    raised.num_replicas = wanted;
    jetstream
        .update_stream(&raised)
        .await
        .map_err(|e| BusError::Stream {
            stream: current.name.clone(),
            message: format!("cannot raise its replicas from {has} to {wanted}: {e}"),
        })?;
    Ok(true)
}

/// The bounds of Skein's streams.
pub struct StreamLimits {
    /// Submissions or work waiting at once, per stream (work queues refuse more).
    pub queue_messages: i64,
    pub queue_bytes: i64,
    /// Longest a submission or a task waits before the stream drops it.
    pub queue_age: Duration,
    /// Events kept at most (the oldest go first; events also go after 24 hours).
    pub events_bytes: i64,
    /// Dead letters kept at most (the oldest go first; they also go after 14 days).
    pub dlq_bytes: i64,
}

/// What every Skein stream is bounded by (docs/ARCHITECTURE.md, "Bounds").
pub const STREAM_LIMITS: StreamLimits = StreamLimits {
    queue_messages: 1_000_000,
    queue_bytes: 1 << 30,
    queue_age: Duration::from_secs(7 * 24 * 3600),
    events_bytes: 4 << 30,
    dlq_bytes: 1 << 30,
};
