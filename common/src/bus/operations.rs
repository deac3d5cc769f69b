//! The operations a person or a client publishes about a task, each signed by its principal
//! and kept in a stream so that work starting later sees it: cancel requests (and the look-up of
//! a stored one, `Bus::cancel_requested`), approval decisions, and pauses, resumes and steers.

use super::{stream_error, Bus, BusError};
use crate::subjects;

impl Bus {
    /// Asks every process to stop a task; kept so that work starting later sees it too.
    pub async fn request_cancel(
        &self,
        request: &crate::protocol::CancelRequest,
    ) -> Result<(), BusError> {
        let subject = match &request.call_id {
            Some(call) => subjects::cancel_call(&request.tenant, &request.task_id, call),
            None => subjects::cancel(&request.tenant, &request.task_id),
        };
        self.publish_signed(subject, request).await
    }

    /// Publishes an answer to a task's approval requests (durably: any lead records it, also one
    /// started after the publish).
    pub async fn publish_decision(
        &self,
        decision: &crate::protocol::ApprovalDecision,
    ) -> Result<(), BusError> {
        let subject = subjects::approval(&decision.tenant, &decision.task_id);
        self.publish_signed(subject, decision).await
    }

    /// Publishes a pause, resume or steer of a task durably (`SKEIN_APPROVALS`).
    pub async fn publish_control(
        &self,
        control: &crate::protocol::RunControl,
    ) -> Result<(), BusError> {
        let subject = subjects::control(&control.tenant, &control.task_id);
        self.publish_signed(subject, control).await
    }

    /// Publishes an operation durably on `subject`, signed by the process's principal.
    async fn publish_signed(
        &self,
        subject: String,
        operation: &impl serde::Serialize,
    ) -> Result<(), BusError> {
        let payload = self.encode(operation)?;
        let headers = self.signed_headers(&subject, &payload);
        self.publish_durable(subject, headers, payload).await
    }

    /// Whether a cancel request for the task was published.
    pub async fn cancel_requested(&self, tenant: &str, task_id: &str) -> Result<bool, BusError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let stream = self.stream_no_info(subjects::CANCEL_STREAM).await?;
        let stream_error = |message: String| stream_error(subjects::CANCEL_STREAM, message);
        let subject = subjects::cancel(tenant, task_id);
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => {
                let stored_at_ms =
                    u64::try_from(message.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
                let presented = crate::principals::Presented {
                    subject: &subject,
                    headers: Some(&message.headers),
                    payload: &message.payload,
                    stored_at_ms,
                };
                let checked = self.gate.check(
                    presented,
                    tenant,
                    crate::principals::Operation::Cancel,
                    "",
                    false,
                );
                match checked {
                    Ok(_) => Ok(true),
                    Err(refusal) => {
                        tracing::warn!(%tenant, %task_id, reason = %refusal, "stored cancel request refused");
                        Ok(false)
                    }
                }
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(stream_error(e.to_string())),
        }
    }
}
