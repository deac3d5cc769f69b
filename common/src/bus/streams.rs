//! Skein's JetStream streams: created at start-up by every process, and bounded (`STREAM_LIMITS`);
//! a stream created before its limits gets them.

use std::time::Duration;

use async_nats::jetstream::stream;

use crate::subjects;

use super::intake::PULL_RETRY;
use super::{Bus, BusError, JETSTREAM_READY_WAIT};

impl Bus {
    /// Creates Skein's streams if they do not exist, and gives streams created before their
    /// limits (see [`STREAM_LIMITS`]) those limits (idempotent; safe from every process).
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
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
            ..Default::default()
        };
        let streams = [
            queue(subjects::SUBMIT_STREAM, vec![subjects::SUBMIT_ALL.into()]),
            queue(
                subjects::WORK_STREAM,
                subjects::WORK_ALL.iter().map(|s| s.to_string()).collect(),
            ),
            stream::Config {
                name: subjects::CANCEL_STREAM.into(),
                subjects: vec![subjects::CANCEL_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(24 * 3600),
                max_messages_per_subject: 1,
                ..Default::default()
            },
            stream::Config {
                name: subjects::APPROVALS_STREAM.into(),
                subjects: vec![subjects::APPROVALS_ALL.into()],
                retention: stream::RetentionPolicy::WorkQueue,
                max_age: Duration::from_secs(14 * 24 * 3600),
                ..Default::default()
            },
            stream::Config {
                name: subjects::DLQ_STREAM.into(),
                subjects: vec![subjects::DLQ_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(14 * 24 * 3600),
                max_bytes: STREAM_LIMITS.dlq_bytes,
                ..Default::default()
            },
            stream::Config {
                name: subjects::EVENTS_STREAM.into(),
                subjects: vec![subjects::EVENTS_ALL.into()],
                retention: stream::RetentionPolicy::Limits,
                max_age: Duration::from_secs(24 * 3600),
                max_bytes: STREAM_LIMITS.events_bytes,
                // Direct gets name the subject in their API subject (fenceable per tenant).
                allow_direct: true,
                ..Default::default()
            },
        ];
        // A server that just started (or restarted) may take a moment before JetStream answers.
        let deadline = tokio::time::Instant::now() + JETSTREAM_READY_WAIT;
        for config in streams {
            loop {
                match self.jetstream.get_or_create_stream(config.clone()).await {
                    Ok(mut existing) => {
                        let current = existing.info().await.map(|i| i.config.clone());
                        if let Ok(current) = current {
                            self.bound_stream(&current, &config).await?;
                        }
                        break;
                    }
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
            }
        }
        Ok(())
    }

    /// Gives a stream created before Skein bounded it the limits it should have (and the events
    /// stream its direct gets); other settings are kept.
    async fn bound_stream(
        &self,
        current: &stream::Config,
        wanted: &stream::Config,
    ) -> Result<(), BusError> {
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
        if limits(current) == limits(wanted) {
            return Ok(());
        }
        tracing::warn!(stream = %current.name, "stream limits differ from this build's; updating them");
        let mut bounded = current.clone();
        bounded.max_messages = wanted.max_messages;
        bounded.max_bytes = wanted.max_bytes;
        bounded.max_age = wanted.max_age;
        bounded.discard = wanted.discard;
        bounded.allow_direct = wanted.allow_direct;
        self.jetstream
            .update_stream(bounded)
            .await
            .map(|_| ())
            .map_err(|e| BusError::Stream {
                stream: current.name.clone(),
                message: format!("cannot set its limits: {e}"),
            })
    }
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
