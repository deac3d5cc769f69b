//! The unfinished submissions of one session, read from the work-queue submit streams
//! (`SKEIN_SUBMIT` and its partitions `SKEIN_SUBMIT_{k}`): finished submissions are acknowledged
//! and so removed, and a session's tasks share its submit subject, so what the streams hold on
//! that subject, in order, is the session's queue (the task running first).
//!
//! A session's submissions go to one partition while the partition count stays the same; a
//! re-partition can leave older ones in another. So each look asks every submit partition known
//! to exist (one stream at the default of one partition): those of this process's setting, and
//! those found since by [`Bus::submit_partitions`]. Places in one partition are ordered by
//! sequence, places in two by when their streams stored them ([`SubmissionPlace`]).
//!
//! Only reads: gets by subject from the stream leaders, a direct get answered by any replica
//! where a stale answer cannot mislead ([`Bus::first_in_line`]), and the streams' last sequences
//! ([`Bus::submit_stream_ends`]). Each message is named by its task id as the submitter gave it
//! — its `Nats-Msg-Id` (`<tenant>:<task_id>`), or else the body's `task_id` — and only when that
//! is a valid token.

use std::cmp::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, RawMessageErrorKind};
use futures::future::try_join_all;
use tokio::time::Instant;

use super::{Bus, BusError};
use crate::protocol::{validate_token, TaskSubmission};
use crate::subjects;

/// Where a submission waits: its submit partition, its sequence in that partition's stream, and
/// when the stream stored it (nanoseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmissionPlace {
    pub partition: u32,
    pub sequence: u64,
    pub stored_ns: i128,
}

impl SubmissionPlace {
    /// The first place of every partition: any submission is at or after it.
    pub const START: SubmissionPlace = SubmissionPlace {
        partition: 0,
        sequence: 0,
        stored_ns: i128::MIN,
    };
    /// A place after every submission.
    pub const END: SubmissionPlace = SubmissionPlace {
        partition: u32::MAX,
        sequence: u64::MAX,
        stored_ns: i128::MAX,
    };

    /// The order of two places: by sequence in one partition (a stream's own order), else by when
    /// they were stored, then by partition.
    pub fn order(&self, other: &SubmissionPlace) -> Ordering {
        if self.partition == other.partition {
            return self.sequence.cmp(&other.sequence);
        }
        (self.stored_ns, self.partition).cmp(&(other.stored_ns, other.partition))
    }

    /// Whether this place comes before `other`.
    pub fn is_before(&self, other: &SubmissionPlace) -> bool {
        self.order(other) == Ordering::Less
    }
}

/// How long a direct get of a turn's order look may take before the leader is asked instead.
const DIRECT_LOOK_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the order looks ask only the leaders after a submit stream did not answer a direct
/// get (a stream made without direct gets by an earlier build: its server does not refuse the
/// request, it leaves it unanswered).
const DIRECT_LOOKS_OFF_FOR: Duration = Duration::from_secs(60);

/// Until when the order looks skip direct gets, shared by a bus's clones.
#[derive(Debug, Clone, Default)]
pub(super) struct DirectLooks(Arc<Mutex<Option<Instant>>>);

impl DirectLooks {
    fn on(&self) -> bool {
        let mut off_until = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match *off_until {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                *off_until = None;
                true
            }
            None => true,
        }
    }

    fn turn_off(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Instant::now() + DIRECT_LOOKS_OFF_FOR);
    }
}

/// One unfinished submission of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedSubmission {
    /// Where it waits: older tasks come before.
    pub place: SubmissionPlace,
    /// Its task id; `None` when neither its message id nor its body names a valid one.
    pub task_id: Option<String>,
}

impl Bus {
    /// The submit partitions a session's unfinished submissions are looked for in.
    pub fn known_submit_partitions(&self) -> Vec<u32> {
        self.known_submit_partitions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Adds `found` to the submit partitions known to exist (never removes one: a partition's
    /// stream is never removed).
    pub(super) fn know_submit_partitions(&self, found: &[u32]) {
        let mut known = self
            .known_submit_partitions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for &k in found {
            if let Err(at) = known.binary_search(&k) {
                known.insert(at, k);
            }
        }
    }

    /// The place of a session's oldest unfinished submission (finished ones are removed from the
    /// work-queue streams), if any.
    pub async fn oldest_submission(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<SubmissionPlace>, BusError> {
        let partitions = self.known_submit_partitions();
        let firsts = try_join_all(
            partitions
                .iter()
                .map(|&k| self.first_submission(k, tenant, session, 1)),
        )
        .await?;
        Ok(firsts
            .into_iter()
            .flatten()
            .map(|(place, _)| place)
            .min_by(SubmissionPlace::order))
    }

    /// Whether no unfinished submission of the session comes before `own`, a submission still in
    /// its stream: the order look of a turn's start. `own`'s partition is asked first with a
    /// direct get, which any replica answers and which costs the server a quarter of a get
    /// through the stream API. An answer that `own` is its partition's first stands: a replica
    /// that holds `own` holds every older submission of the session, or their removal. Any other
    /// answer (an older submission, which a replica behind the leader may still show; none; a
    /// stream without direct gets) is asked again of the leaders, as [`Bus::oldest_submission`]
    /// asks, and so is every other known partition.
    pub async fn first_in_line(
        &self,
        tenant: &str,
        session: &str,
        own: SubmissionPlace,
    ) -> Result<bool, BusError> {
        let in_line = |oldest: Option<SubmissionPlace>| oldest.is_none_or(|o| !o.is_before(&own));
        if !self.first_in_partition(tenant, session, own).await {
            return Ok(in_line(self.oldest_submission(tenant, session).await?));
        }
        let partitions = self.known_submit_partitions();
        let others = try_join_all(
            partitions
                .iter()
                .filter(|&&k| k != own.partition)
                .map(|&k| self.first_submission(k, tenant, session, 1)),
        )
        .await?;
        Ok(others
            .into_iter()
            .flatten()
            .all(|(place, _)| in_line(Some(place))))
    }

    /// Whether a replica of `own`'s partition answers a direct get with `own` as the session's
    /// first submission there (false for any other answer, and when it cannot be asked).
    async fn first_in_partition(&self, tenant: &str, session: &str, own: SubmissionPlace) -> bool {
        if !self.direct_looks.on() {
            return false;
        }
        let Ok(stream) = self
            .stream_no_info(&subjects::submit_stream(own.partition))
            .await
        else {
            return false;
        };
        let subject = subjects::submit_in(own.partition, tenant, session);
        let first = stream.direct_get_first_for_subject(subject);
        match tokio::time::timeout(DIRECT_LOOK_TIMEOUT, first).await {
            Ok(Ok(first)) => first.sequence == own.sequence,
            Ok(Err(e)) if e.kind() == DirectGetErrorKind::NotFound => false,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "direct get refused; order looks ask the leader for a while");
                self.direct_looks.turn_off();
                false
            }
            Err(_) => {
                tracing::debug!("direct get unanswered; order looks ask the leader for a while");
                self.direct_looks.turn_off();
                false
            }
        }
    }

    /// The last sequence each known submit partition's stream has stored: a submission stored
    /// after this call answers has a higher one. One request per partition, to its leader.
    pub async fn submit_stream_ends(&self) -> Result<Vec<(u32, u64)>, BusError> {
        try_join_all(
            self.known_submit_partitions()
                .into_iter()
                .map(|k| async move {
                    let name = subjects::submit_stream(k);
                    let stream = self
                        .jetstream
                        .get_stream(&name)
                        .await
                        .map_err(|e| super::stream_error(&name, e.to_string()))?;
                    Ok((k, stream.cached_info().state.last_sequence))
                }),
        )
        .await
    }

    /// The session's unfinished submissions placed before `before`, oldest first, at most `limit`
    /// of them.
    pub async fn unfinished_submissions(
        &self,
        tenant: &str,
        session: &str,
        before: SubmissionPlace,
        limit: usize,
    ) -> Result<Vec<QueuedSubmission>, BusError> {
        let mut queued = Vec::new();
        for partition in self.known_submit_partitions() {
            let (mut from, mut taken) = (1, 0);
            while taken < limit {
                let Some((place, message)) = self
                    .first_submission(partition, tenant, session, from)
                    .await?
                else {
                    break;
                };
                if !place.is_before(&before) {
                    break;
                }
                (from, taken) = (place.sequence + 1, taken + 1);
                queued.push(QueuedSubmission {
                    place,
                    task_id: self.task_id_of(tenant, &message),
                });
            }
        }
        queued.sort_by(|a, b| a.place.order(&b.place));
        queued.truncate(limit);
        Ok(queued)
    }

    /// The session's first unfinished submission in `partition` at sequence `from` or later.
    async fn first_submission(
        &self,
        partition: u32,
        tenant: &str,
        session: &str,
        from: u64,
    ) -> Result<Option<(SubmissionPlace, StreamMessage)>, BusError> {
        let name = subjects::submit_stream(partition);
        let stream = self.stream_no_info(&name).await?;
        match stream
            .get_first_raw_message_by_subject(subjects::submit_in(partition, tenant, session), from)
            .await
        {
            Ok(message) => Ok(Some((
                SubmissionPlace {
                    partition,
                    sequence: message.sequence,
                    stored_ns: message.time.unix_timestamp_nanos(),
                },
                message,
            ))),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(super::stream_error(&name, e.to_string())),
        }
    }

    /// The task id a submission message names: its `Nats-Msg-Id` without the tenant's scope,
    /// else its body's.
    fn task_id_of(&self, tenant: &str, message: &StreamMessage) -> Option<String> {
        let from_id = message
            .headers
            .get(NATS_MESSAGE_ID)
            .and_then(|id| id.as_str().strip_prefix(tenant)?.strip_prefix(':'))
            .map(str::to_owned);
        let task_id = from_id.or_else(|| {
            self.decode::<TaskSubmission>(&message.payload)
                .ok()
                .map(|submission| submission.task_id)
        })?;
        validate_token("task_id", &task_id).ok().map(|()| task_id)
    }
}

#[cfg(test)]
mod tests {
    use super::SubmissionPlace;

    fn place(partition: u32, sequence: u64, stored_ns: i128) -> SubmissionPlace {
        SubmissionPlace {
            partition,
            sequence,
            stored_ns,
        }
    }

    #[test]
    fn places_of_one_partition_follow_its_sequence_whatever_the_clock() {
        // A stream's sequence is its order, even if its leader's clock stepped back.
        assert!(place(2, 5, 900).is_before(&place(2, 6, 100)));
        assert!(!place(2, 6, 100).is_before(&place(2, 5, 900)));
        assert!(!place(2, 5, 1).is_before(&place(2, 5, 1)));
    }

    #[test]
    fn places_of_two_partitions_follow_when_they_were_stored() {
        assert!(place(0, 900, 100).is_before(&place(3, 1, 200)));
        assert!(place(3, 1, 100).is_before(&place(0, 900, 200)));
        // Stored in the same nanosecond: the lower partition first, so the order is total.
        assert!(place(0, 9, 100).is_before(&place(1, 1, 100)));
        assert!(!place(1, 1, 100).is_before(&place(0, 9, 100)));
    }

    #[test]
    fn start_and_end_bound_every_place() {
        for p in [place(0, 1, 0), place(7, u64::MAX - 1, i128::MAX - 1)] {
            assert!(SubmissionPlace::START.is_before(&p));
            assert!(p.is_before(&SubmissionPlace::END));
        }
    }
}
