//! The unfinished submissions of one session, read from the work-queue stream `SKEIN_SUBMIT`:
//! finished submissions are acknowledged and so removed, and a session's tasks share its submit
//! subject, so what the stream holds on that subject, in sequence order, is the session's queue
//! (the task running first).
//!
//! Only reads (gets by subject from the stream leader); each message is named by its task id as
//! the submitter gave it — its `Nats-Msg-Id` (`<tenant>:<task_id>`), or else the body's `task_id`
//! — and only when that is a valid token.

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::message::StreamMessage;

use super::{Bus, BusError};
use crate::protocol::{validate_token, TaskSubmission};
use crate::subjects;

/// One unfinished submission of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedSubmission {
    /// Its sequence in `SKEIN_SUBMIT`: older tasks have lower ones.
    pub sequence: u64,
    /// Its task id; `None` when neither its message id nor its body names a valid one.
    pub task_id: Option<String>,
}

impl Bus {
    /// The stream sequence of a session's oldest unfinished submission (finished ones are removed
    /// from the work-queue stream), if any.
    pub async fn oldest_submission(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<u64>, BusError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let stream = self.stream_no_info(subjects::SUBMIT_STREAM).await?;
        let stream_error = |message: String| super::stream_error(subjects::SUBMIT_STREAM, message);
        match stream
            .get_first_raw_message_by_subject(subjects::submit(tenant, session), 1)
            .await
        {
            Ok(message) => Ok(Some(message.sequence)),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(stream_error(e.to_string())),
        }
    }

    /// The session's unfinished submissions with a sequence below `before`, oldest first, at
    /// most `limit` of them.
    pub async fn unfinished_submissions(
        &self,
        tenant: &str,
        session: &str,
        before: u64,
        limit: usize,
    ) -> Result<Vec<QueuedSubmission>, BusError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let stream = self.stream_no_info(subjects::SUBMIT_STREAM).await?;
        let stream_error = |message: String| super::stream_error(subjects::SUBMIT_STREAM, message);
        let subject = subjects::submit(tenant, session);
        let mut queued = Vec::new();
        let mut from = 1;
        while queued.len() < limit {
            let message = match stream
                .get_first_raw_message_by_subject(&subject, from)
                .await
            {
                Ok(message) => message,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(e) => return Err(stream_error(e.to_string())),
            };
            if message.sequence >= before {
                break;
            }
            from = message.sequence + 1;
            queued.push(QueuedSubmission {
                sequence: message.sequence,
                task_id: self.task_id_of(tenant, &message),
            });
        }
        Ok(queued)
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
