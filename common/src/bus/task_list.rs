//! The tasks the events stream knows, for a console's list of runs and for followers that go on
//! from now: the task ids of a tenant whose events it holds (its subjects, `skein.events.{tenant}.{task}`, read from the stream's
//! subject counts, so no consumer is made), how many events a task has, and a task's first event (a direct get, whose API
//! subject names the event subject, so a server can fence it by tenant). What the stream no
//! longer holds (older than its retention) is not listed.

use futures::TryStreamExt;

use super::{Bus, BusError, EventEnd};
use crate::protocol::TurnEvent;
use crate::subjects;

impl Bus {
    /// The ids of `tenant`'s tasks that have events in the events stream, with how many.
    pub async fn tenant_tasks(&self, tenant: &str) -> Result<Vec<(String, usize)>, BusError> {
        let prefix = subjects::events(tenant, "");
        let counted = self.subject_counts(&format!("{prefix}*")).await?;
        Ok(counted
            .into_iter()
            .filter_map(|(subject, count)| {
                subject
                    .strip_prefix(&prefix)
                    .map(|task| (task.to_owned(), count))
            })
            .collect())
    }

    /// How many events one subject of the events stream holds (a task's, all its runs'): where a
    /// follower that goes on from now starts.
    pub async fn event_count(&self, subject: &str) -> Result<u64, BusError> {
        let counted = self.subject_counts(subject).await?;
        Ok(counted.iter().map(|(_, n)| *n as u64).sum())
    }

    /// The events stream's subjects matching `filter`, with how many events each holds.
    async fn subject_counts(&self, filter: &str) -> Result<Vec<(String, usize)>, BusError> {
        let counting_error = |message: String| BusError::Consumer {
            consumer: format!("count({filter})"),
            message,
        };
        let stream = self
            .jetstream
            .get_stream_no_info(subjects::EVENTS_STREAM)
            .await
            .map_err(|e| counting_error(e.to_string()))?;
        stream
            .info_with_subjects(filter)
            .await
            .map_err(|e| counting_error(e.to_string()))?
            .try_collect()
            .await
            .map_err(|e| counting_error(e.to_string()))
    }

    /// The first event on one subject of the events stream, with its stream sequence.
    pub async fn first_event(&self, subject: &str) -> Result<Option<(u64, TurnEvent)>, BusError> {
        self.event_at(subject, EventEnd::First).await
    }
}
