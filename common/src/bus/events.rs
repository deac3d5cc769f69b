//! A task's events in the events partitions: the subject a process publishes them on, and every
//! way they are read back — the first or latest one (a direct get, whose API subject names the
//! event subject, so a server can fence it by tenant), how many there are, an ordered replay, and
//! the tasks of a tenant the streams hold (their subject counts, so no consumer is made).
//!
//! Invariants:
//! - a process publishes a task's events to the partition its `SKEIN_PARTITIONS` gives the task
//!   ([`subjects::events_partition`]);
//! - a reader looks there first and, when that partition holds none of the task's events, in
//!   every other events partition there is: a task whose events another setting placed (a
//!   cluster being re-partitioned, a client with another count) is still found. The streams are
//!   listed at most every [`PARTITIONS_LOOK_EVERY`], and only on such a miss;
//! - what the streams no longer hold (older than their retention) is not found.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Instant;

use async_nats::jetstream::{consumer, stream};
use futures::TryStreamExt;

use super::streams::PARTITIONS_LOOK_EVERY;
use super::{Bus, BusError};
use crate::protocol::TurnEvent;
use crate::subjects;

/// How many times a task's events replay is created before a timed-out creation is an error.
const REPLAY_CREATE_ATTEMPTS: u32 = 3;

/// Which end of a task's events a direct get reads.
#[derive(Debug, Clone, Copy)]
enum EventEnd {
    First,
    Last,
}

impl EventEnd {
    fn name(self) -> &'static str {
        match self {
            EventEnd::First => "first",
            EventEnd::Last => "last",
        }
    }
}

/// The events partitions listed last, and when: shared by a bus's clones.
pub(super) type SeenEventPartitions = std::sync::Arc<std::sync::Mutex<Option<(Instant, Vec<u32>)>>>;

impl Bus {
    /// The subject this process publishes a task's events on (and a live watcher of a task it
    /// submitted listens on).
    pub fn events_subject(&self, tenant: &str, task_id: &str) -> String {
        subjects::events_in(self.events_partition(tenant, task_id), tenant, task_id)
    }

    /// The events partition this process gives a task.
    fn events_partition(&self, tenant: &str, task_id: &str) -> u32 {
        subjects::events_partition(tenant, task_id, self.partitions)
    }

    /// The events partitions whose streams exist, in order.
    pub async fn event_partitions(&self) -> Result<Vec<u32>, BusError> {
        let found = self.partitions_of(subjects::EVENTS_STREAM).await?;
        *self.lock_seen_event_partitions() = Some((Instant::now(), found.clone()));
        Ok(found)
    }

    fn lock_seen_event_partitions(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Vec<u32>)>> {
        self.seen_event_partitions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The events partitions there are, listed again when the last listing is older than
    /// [`PARTITIONS_LOOK_EVERY`].
    async fn recent_event_partitions(&self) -> Result<Vec<u32>, BusError> {
        if let Some((at, seen)) = self.lock_seen_event_partitions().as_ref() {
            if at.elapsed() < PARTITIONS_LOOK_EVERY {
                return Ok(seen.clone());
            }
        }
        self.event_partitions().await
    }

    /// Asks `probe` about this process's partition of the task, then about every other events
    /// partition there is, and returns the first answer found with its partition.
    async fn first_found<T, Probe, Answer>(
        &self,
        tenant: &str,
        task_id: &str,
        probe: Probe,
    ) -> Result<Option<(u32, T)>, BusError>
    where
        Probe: Fn(u32) -> Answer,
        Answer: Future<Output = Result<Option<T>, BusError>>,
    {
        let own = self.events_partition(tenant, task_id);
        if let Some(found) = probe(own).await? {
            return Ok(Some((own, found)));
        }
        for k in self.recent_event_partitions().await? {
            if k == own {
                continue;
            }
            if let Some(found) = probe(k).await? {
                return Ok(Some((k, found)));
            }
        }
        Ok(None)
    }

    /// The partition holding a task's events; this process's partition of it while none holds
    /// any (where its events will go if this process publishes them).
    pub async fn task_events_partition(
        &self,
        tenant: &str,
        task_id: &str,
    ) -> Result<u32, BusError> {
        let found = self
            .first_found(tenant, task_id, |k| {
                self.event_in(k, tenant, task_id, EventEnd::First)
            })
            .await?;
        Ok(found.map_or_else(|| self.events_partition(tenant, task_id), |(k, _)| k))
    }

    /// A task's first event, with its stream sequence.
    pub async fn first_event(
        &self,
        tenant: &str,
        task_id: &str,
    ) -> Result<Option<(u64, TurnEvent)>, BusError> {
        self.event_at(tenant, task_id, EventEnd::First).await
    }

    /// A task's latest event, with its stream sequence.
    pub async fn last_event(
        &self,
        tenant: &str,
        task_id: &str,
    ) -> Result<Option<(u64, TurnEvent)>, BusError> {
        self.event_at(tenant, task_id, EventEnd::Last).await
    }

    async fn event_at(
        &self,
        tenant: &str,
        task_id: &str,
        end: EventEnd,
    ) -> Result<Option<(u64, TurnEvent)>, BusError> {
        let found = self
            .first_found(tenant, task_id, |k| self.event_in(k, tenant, task_id, end))
            .await?;
        Ok(found.map(|(_, event)| event))
    }

    /// Partition `partition`'s events stream, to read from.
    async fn events_stream(&self, partition: u32) -> Result<stream::Stream<()>, String> {
        self.jetstream
            .get_stream_no_info(subjects::events_stream(partition))
            .await
            .map_err(|e| e.to_string())
    }

    /// The first or the latest event of a task in one events partition, by a direct get.
    async fn event_in(
        &self,
        partition: u32,
        tenant: &str,
        task_id: &str,
        end: EventEnd,
    ) -> Result<Option<(u64, TurnEvent)>, BusError> {
        use async_nats::jetstream::stream::DirectGetErrorKind;
        let subject = subjects::events_in(partition, tenant, task_id);
        let lookup_error = read_failed(format!("{}({subject})", end.name()));
        let stream = self.events_stream(partition).await.map_err(&lookup_error)?;
        let found = match end {
            EventEnd::First => stream.direct_get_first_for_subject(&subject).await,
            EventEnd::Last => stream.direct_get_last_for_subject(&subject).await,
        };
        match found {
            Ok(message) => Ok(Some((message.sequence, self.decode(&message.payload)?))),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(lookup_error(e.to_string())),
        }
    }

    /// How many events a task has (all its runs'): where a follower that goes on from now
    /// starts its replay.
    pub async fn event_count(&self, tenant: &str, task_id: &str) -> Result<u64, BusError> {
        let found = self
            .first_found(tenant, task_id, |k| async move {
                let subject = subjects::events_in(k, tenant, task_id);
                let counted = self.subject_counts(k, &subject).await?;
                let count: u64 = counted.iter().map(|(_, n)| *n as u64).sum();
                Ok((count > 0).then_some(count))
            })
            .await?;
        Ok(found.map_or(0, |(_, count)| count))
    }

    /// A task's latest event in one events partition, with its stream sequence.
    pub async fn last_event_in(
        &self,
        partition: u32,
        tenant: &str,
        task_id: &str,
    ) -> Result<Option<(u64, TurnEvent)>, BusError> {
        self.event_in(partition, tenant, task_id, EventEnd::Last)
            .await
    }

    /// A replaying, ordered view of a task's events from its first one, in the partition that
    /// holds them ([`Bus::task_events_partition`]).
    pub async fn replay(
        &self,
        tenant: &str,
        task_id: &str,
    ) -> Result<consumer::pull::Ordered, BusError> {
        let partition = self.task_events_partition(tenant, task_id).await?;
        self.replay_in(partition, tenant, task_id).await
    }

    /// A replaying, ordered view of a task's events in one events partition.
    pub async fn replay_in(
        &self,
        partition: u32,
        tenant: &str,
        task_id: &str,
    ) -> Result<consumer::pull::Ordered, BusError> {
        let subject = subjects::events_in(partition, tenant, task_id);
        let consumer_error = read_failed(format!("ordered({subject})"));
        let stream = self
            .events_stream(partition)
            .await
            .map_err(&consumer_error)?;
        let consumer = create_retrying_timeouts(REPLAY_CREATE_ATTEMPTS, &subject, || {
            // Named, so the create request's API subject carries the filter (and a server can
            // fence which events a user may watch); each try under a new name.
            let name = format!("watch_{}", uuid::Uuid::new_v4().simple());
            stream.create_consumer(consumer::pull::OrderedConfig {
                name: Some(name),
                filter_subject: subject.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
        })
        .await
        .map_err(|e| consumer_error(e.to_string()))?;
        consumer
            .messages()
            .await
            .map_err(|e| consumer_error(e.to_string()))
    }

    /// The ids of `tenant`'s tasks that have events in any events partition, with how many.
    pub async fn tenant_tasks(&self, tenant: &str) -> Result<Vec<(String, usize)>, BusError> {
        let mut tasks = BTreeMap::<String, usize>::new();
        for k in self.event_partitions().await? {
            let filter = subjects::events_in(k, tenant, "*");
            for (subject, count) in self.subject_counts(k, &filter).await? {
                if let Some((_, _, task)) = subjects::parse_events(&subject) {
                    *tasks.entry(task.to_owned()).or_default() += count;
                }
            }
        }
        Ok(tasks.into_iter().collect())
    }

    /// Partition `partition`'s events subjects matching `filter`, with how many events each
    /// holds.
    async fn subject_counts(
        &self,
        partition: u32,
        filter: &str,
    ) -> Result<Vec<(String, usize)>, BusError> {
        let counting_error = read_failed(format!("count({filter})"));
        let stream = self
            .events_stream(partition)
            .await
            .map_err(&counting_error)?;
        stream
            .info_with_subjects(filter)
            .await
            .map_err(|e| counting_error(e.to_string()))?
            .try_collect()
            .await
            .map_err(|e| counting_error(e.to_string()))
    }
}

/// The error of a read of the events streams named `read` (`first(subject)`, `count(filter)`, …).
fn read_failed(read: String) -> impl Fn(String) -> BusError {
    move |message| BusError::Consumer {
        consumer: read.clone(),
        message,
    }
}

/// Runs `create` until it gives anything but a timed-out creation, at most `attempts` times.
/// Until the servers see a lost node gone, they may place a new consumer on it, and its creation
/// times out; the next one is placed afresh.
async fn create_retrying_timeouts<T, F, Fut>(
    attempts: u32,
    subject: &str,
    mut create: F,
) -> Result<T, stream::ConsumerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, stream::ConsumerError>>,
{
    let mut attempt = 1;
    loop {
        match create().await {
            Err(e) if e.kind() == stream::ConsumerErrorKind::TimedOut && attempt < attempts => {
                tracing::warn!(%subject, attempt, "creating an events replay timed out; trying again");
                attempt += 1;
            }
            created => return created,
        }
    }
}

#[cfg(test)]
mod replay_creation_tests {
    use std::cell::Cell;

    use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};

    use super::*;

    /// Runs the retry over a creation that fails with `kinds` in turn, then succeeds (giving its
    /// try's number); how it ended, and how many tries it made.
    async fn tried(kinds: &[ConsumerErrorKind]) -> (Result<usize, ConsumerErrorKind>, usize) {
        let tries = Cell::new(0);
        let ended = create_retrying_timeouts(REPLAY_CREATE_ATTEMPTS, "skein.events.t.x", || {
            tries.set(tries.get() + 1);
            let outcome = match kinds.get(tries.get() - 1) {
                Some(kind) => Err(ConsumerError::new(kind.clone())),
                None => Ok(tries.get()),
            };
            async move { outcome }
        })
        .await;
        (ended.map_err(|e| e.kind()), tries.get())
    }

    #[tokio::test]
    async fn a_timed_out_creation_is_tried_again_until_one_is_made() {
        let timed_out = ConsumerErrorKind::TimedOut;
        assert_eq!(tried(std::slice::from_ref(&timed_out)).await, (Ok(2), 2));
        assert_eq!(tried(&[timed_out.clone(), timed_out]).await, (Ok(3), 3));
    }

    #[tokio::test]
    async fn creation_times_out_at_most_three_times_and_other_errors_are_not_retried() {
        let timed_out = ConsumerErrorKind::TimedOut;
        let always = vec![timed_out.clone(); 5];
        let attempts = REPLAY_CREATE_ATTEMPTS as usize;
        assert_eq!(tried(&always).await, (Err(timed_out), attempts));
        let refused = ConsumerErrorKind::Request;
        assert_eq!(
            tried(std::slice::from_ref(&refused)).await,
            (Err(refused), 1)
        );
        assert_eq!(tried(&[]).await, (Ok(1), 1));
    }
}
