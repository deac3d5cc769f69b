//! The dead-letter stream: setting a message aside with why and how often it was tried, listing,
//! replaying and removing letters, and which tenant and task a letter belongs to.
//!
//! The stream is cluster-wide. A letter belongs to a tenant when what it carries says so without
//! contradiction ([`DeadLetter::tenant`]):
//! - a submission's subject (`skein.submit.{tenant}.{session}`) names its tenant; its body's
//!   `tenant`, when it has one, must name the same;
//! - a work message (`skein.tool.…`, `skein.agent.…`) names it in its body's `origin.tenant`;
//! - any other letter, or one whose subject and body disagree, or whose body is cut or not JSON
//!   (except a submission's, attributed by its subject), belongs to no tenant: only an operator
//!   of every tenant sees or acts on it.
//!
//! Every reader that scopes letters by tenant (the console, `skein dlq`) uses this one rule.

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;

use crate::subjects;

use super::{message_id, outgoing_headers, Bus, BusError};

/// Header of a dead letter: the subject the message was first published on.
pub const HEADER_ORIGINAL_SUBJECT: &str = "Skein-Original-Subject";
/// Header of a dead letter: why it was set aside.
pub const HEADER_DEAD_REASON: &str = "Skein-Dead-Reason";
/// Header of a dead letter: how often it was tried.
pub const HEADER_ATTEMPTS: &str = "Skein-Attempts";
/// Header of a dead letter: the original message's `Nats-Msg-Id`, if it had one.
pub const HEADER_ORIGINAL_ID: &str = "Skein-Original-Id";
/// Header of a dead letter whose body was cut to fit the broker's payload limit: the original
/// body's size in bytes. Such a letter is kept for inspection and cannot be replayed.
pub const HEADER_TRUNCATED: &str = "Skein-Truncated";
/// Longest dead-letter reason, in bytes (a reason can echo the offending input).
pub const MAX_DEAD_REASON: usize = 1024;
/// Header of a replayed dead letter: the letter's sequence in the dead-letter stream.
pub const HEADER_REPLAYED: &str = "Skein-Replayed";

/// A message set aside in the dead-letter stream.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Position in the dead-letter stream; names the letter for show, replay and removal.
    pub seq: u64,
    pub original_subject: String,
    pub original_id: Option<String>,
    pub reason: String,
    pub attempts: u64,
    /// The original body's size when the letter holds only its head (it did not fit).
    pub truncated_from: Option<u64>,
    pub payload: Bytes,
}

impl DeadLetter {
    fn from_stream(message: async_nats::jetstream::message::StreamMessage) -> Self {
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
        Self {
            seq: message.sequence,
            original_subject: header(HEADER_ORIGINAL_SUBJECT)
                .unwrap_or_else(|| message.subject.to_string()),
            original_id: header(HEADER_ORIGINAL_ID),
            reason: header(HEADER_DEAD_REASON).unwrap_or_default(),
            attempts: header(HEADER_ATTEMPTS)
                .and_then(|a| a.parse().ok())
                .unwrap_or(0),
            truncated_from: header(HEADER_TRUNCATED).and_then(|n| n.parse().ok()),
            payload: message.payload,
        }
    }

    /// The letter's body read as JSON, if it is (what [`DeadLetter::tenant`] and
    /// [`DeadLetter::task_id`] read).
    pub fn body(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.payload).ok()
    }

    /// What the original message was: `submit`, `tool`, `agent`, … (its subject's second word,
    /// without a work partition's mark).
    pub fn kind(&self) -> &str {
        subjects::kind(&self.original_subject)
    }

    /// The tenant the letter belongs to (see the module documentation), if any; `body` is
    /// [`DeadLetter::body`], read once by the caller.
    pub fn tenant<'a>(&'a self, body: Option<&'a serde_json::Value>) -> Option<&'a str> {
        let tenant = match subjects::parse_submit(&self.original_subject) {
            Some((tenant, _)) => match body.and_then(|b| b.get("tenant")) {
                None => tenant,
                Some(named) if named.as_str() == Some(tenant) => tenant,
                Some(_) => return None,
            },
            None if matches!(self.kind(), "tool" | "agent") => {
                body?.get("origin")?.get("tenant")?.as_str()?
            }
            None => return None,
        };
        crate::protocol::validate_token("tenant", tenant)
            .is_ok()
            .then_some(tenant)
    }

    /// The task the letter's body names (a submission's `task_id`, a work message's
    /// `origin.task_id`), if it names one; `body` is [`DeadLetter::body`].
    pub fn task_id<'a>(&self, body: Option<&'a serde_json::Value>) -> Option<&'a str> {
        let body = body?;
        body.get("task_id")
            .or_else(|| body.get("origin")?.get("task_id"))?
            .as_str()
    }
}

impl Bus {
    /// Sets a delivered message aside as a dead letter; false (logged) when the broker refused
    /// the letter, in which case the caller must hand the message back rather than settle it, so
    /// it never disappears without its letter.
    pub(super) async fn set_aside(
        &self,
        message: &jetstream::Message,
        reason: &str,
        attempts: u64,
    ) -> bool {
        match self.dead_letter_message(message, reason, attempts).await {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, subject = %message.subject, "cannot dead-letter the message; handing it back");
                false
            }
        }
    }

    /// Sets a delivered work message aside in the dead-letter stream, with why and how often it
    /// was tried. Setting the same delivery aside twice (a retry after a failure to settle it)
    /// stores one letter: the letter's id is the message's stream position.
    async fn dead_letter_message(
        &self,
        message: &jetstream::Message,
        reason: &str,
        attempts: u64,
    ) -> Result<(), BusError> {
        let position = message
            .info()
            .map(|info| format!("dead-{}-{}", info.stream, info.stream_sequence))
            .ok();
        let id = message_id(message);
        self.dead_letter(
            &message.subject,
            id.as_deref(),
            position.as_deref(),
            message.payload.clone(),
            reason,
            attempts,
        )
        .await
    }

    /// Sets a message aside in the dead-letter stream, with why and how often it was tried;
    /// `dedup_id` (if any) keeps a repeated call from storing a second letter.
    pub async fn dead_letter(
        &self,
        original_subject: &str,
        original_id: Option<&str>,
        dedup_id: Option<&str>,
        payload: Bytes,
        reason: &str,
        attempts: u64,
    ) -> Result<(), BusError> {
        let mut headers = outgoing_headers();
        if let Some(dedup_id) = dedup_id {
            headers.insert(NATS_MESSAGE_ID, dedup_id);
        }
        headers.insert(HEADER_ORIGINAL_SUBJECT, original_subject);
        let reason = crate::text::cut(&reason.replace(['\r', '\n'], " "), MAX_DEAD_REASON);
        headers.insert(HEADER_DEAD_REASON, reason.as_str());
        headers.insert(HEADER_ATTEMPTS, attempts.to_string().as_str());
        if let Some(id) = original_id {
            headers.insert(HEADER_ORIGINAL_ID, id);
        }
        // The letter must fit the broker's limit with its headers, or it could never be stored
        // and its message would come back for ever: a body that does not fit keeps its head.
        let limit = self.client.server_info().max_payload;
        let header_bytes: usize = headers
            .iter()
            .flat_map(|(name, values)| {
                let name = AsRef::<str>::as_ref(name).len();
                values
                    .iter()
                    .map(move |value| name + value.as_str().len() + 4)
            })
            .sum::<usize>()
            + 64;
        let room = limit.saturating_sub(header_bytes);
        let payload = if payload.len() > room {
            headers.insert(HEADER_TRUNCATED, payload.len().to_string().as_str());
            payload.slice(..room)
        } else {
            payload
        };
        tracing::warn!(
            subject = original_subject,
            %reason,
            attempts,
            "message dead-lettered"
        );
        self.publish_durable(subjects::dead_letter(original_subject), headers, payload)
            .await
    }

    /// Every dead letter, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, BusError> {
        let mut stream = self.dlq_stream().await?;
        let state = stream
            .info()
            .await
            .map_err(|e| dlq_error(e.to_string()))?
            .state
            .clone();
        let mut letters = Vec::new();
        if state.messages == 0 {
            return Ok(letters);
        }
        for seq in state.first_sequence..=state.last_sequence {
            if let Some(letter) = self.dead_letter_at(seq).await? {
                letters.push(letter);
            }
        }
        Ok(letters)
    }

    /// The dead letter at `seq`, if there is one.
    pub async fn dead_letter_at(&self, seq: u64) -> Result<Option<DeadLetter>, BusError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let stream = self.dlq_stream().await?;
        match stream.get_raw_message(seq).await {
            Ok(message) => Ok(Some(DeadLetter::from_stream(message))),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(dlq_error(e.to_string())),
        }
    }

    /// Publishes a dead letter's message again on its original subject, then removes the letter.
    /// The message is signed when this connection has a key (a replay is an operation of whoever
    /// replays it: the lead lets an `operate` principal of the letter's tenant replay any
    /// operation).
    pub async fn replay_dead_letter(&self, letter: &DeadLetter) -> Result<(), BusError> {
        if let Some(size) = letter.truncated_from {
            return Err(BusError::Stream {
                stream: subjects::DLQ_STREAM.into(),
                message: format!(
                    "letter {} holds only the head of a {size}-byte message (it did not fit the broker's limit) and cannot be replayed",
                    letter.seq
                ),
            });
        }
        let mut headers = self.signed_headers(&letter.original_subject, &letter.payload);
        let id = format!(
            "{}-replay-{}",
            letter.original_id.as_deref().unwrap_or("dlq"),
            letter.seq
        );
        headers.insert(NATS_MESSAGE_ID, id.as_str());
        headers.insert(HEADER_REPLAYED, letter.seq.to_string().as_str());
        self.publish_durable(
            letter.original_subject.clone(),
            headers,
            letter.payload.clone(),
        )
        .await?;
        self.remove_dead_letter(letter.seq).await.map(|_| ())
    }

    /// Removes one dead letter; false if there was none at `seq`.
    pub async fn remove_dead_letter(&self, seq: u64) -> Result<bool, BusError> {
        let stream = self.dlq_stream().await?;
        use async_nats::jetstream::stream::DeleteMessageErrorKind;
        use async_nats::jetstream::ErrorCode;
        match stream.delete_message(seq).await {
            Ok(deleted) => Ok(deleted),
            Err(e) if matches!(e.kind(), DeleteMessageErrorKind::JetStream(j) if j.error_code() == ErrorCode::NO_MESSAGE_FOUND) => {
                Ok(false)
            }
            Err(e) => Err(dlq_error(e.to_string())),
        }
    }

    /// Removes every dead letter; returns how many there were.
    pub async fn purge_dead_letters(&self) -> Result<u64, BusError> {
        let stream = self.dlq_stream().await?;
        let purged = stream.purge().await.map_err(|e| dlq_error(e.to_string()))?;
        Ok(purged.purged)
    }

    async fn dlq_stream(&self) -> Result<stream::Stream, BusError> {
        self.jetstream
            .get_stream(subjects::DLQ_STREAM)
            .await
            .map_err(|e| dlq_error(e.to_string()))
    }
}

fn dlq_error(message: String) -> BusError {
    BusError::Stream {
        stream: subjects::DLQ_STREAM.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(subject: &str, body: &str) -> DeadLetter {
        DeadLetter {
            seq: 1,
            original_subject: subject.to_owned(),
            original_id: None,
            reason: String::new(),
            attempts: 1,
            truncated_from: None,
            payload: body.as_bytes().to_vec().into(),
        }
    }

    #[test]
    fn letters_belong_to_the_tenant_they_name_without_contradiction() {
        let cases = [
            (
                "skein.submit.acme.s1",
                r#"{"tenant":"acme","task_id":"t"}"#,
                Some("acme"),
            ),
            ("skein.submit.acme.s1", "{ not json", Some("acme")),
            ("skein.submit.acme.s1", r#"{"tenant":"globex"}"#, None),
            (
                "skein.tool.default.read_file",
                r#"{"origin":{"tenant":"acme"}}"#,
                Some("acme"),
            ),
            (
                "skein.agent.default.helper",
                r#"{"origin":{"tenant":"globex"}}"#,
                Some("globex"),
            ),
            ("skein.tool.default.read_file", "garbage", None),
            ("skein.tool.default.read_file", r#"{"tenant":"acme"}"#, None),
            ("skein.result.acme.s1.t", r#"{"tenant":"acme"}"#, None),
            (
                "skein.tool.default.x",
                r#"{"origin":{"tenant":"a.b"}}"#,
                None,
            ),
        ];
        for (subject, body, tenant) in cases {
            let letter = letter(subject, body);
            let read = letter.body();
            assert_eq!(letter.tenant(read.as_ref()), tenant, "{subject} {body}");
        }
    }

    #[test]
    fn a_letter_names_its_task_from_a_submission_or_a_work_message() {
        let submission = letter("skein.submit.acme.s1", r#"{"task_id":"t1"}"#);
        assert_eq!(submission.task_id(submission.body().as_ref()), Some("t1"));
        let work = letter("skein.tool.p.x", r#"{"origin":{"task_id":"t2"}}"#);
        assert_eq!(work.task_id(work.body().as_ref()), Some("t2"));
        let garbage = letter("skein.tool.p.x", "garbage");
        assert_eq!(garbage.task_id(garbage.body().as_ref()), None);
        assert_eq!(work.kind(), "tool");
        assert_eq!(letter("nodots", "").kind(), "");
    }
}
