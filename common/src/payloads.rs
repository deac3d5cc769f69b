//! Values by reference: a value too large for one broker message — a tool call's arguments, a
//! subagent's input, the arguments an event shows, a final answer — is stored whole in the NATS
//! object store ([`PayloadStore`]), and a [`PayloadRef`] travels in its place, beside a head and
//! tail preview where the message shows the value. Tool results have their own path (a worker
//! keeps them in the session's workspace, where the model reads on with the file tools).
//!
//! Invariants:
//! - one bucket per tenant, `skein-payloads-<tenant>` (stream `OBJ_skein-payloads-<tenant>`,
//!   created on the tenant's first stored value, with the stream replicas), so NATS permissions
//!   can fence a tenant's values like its streams (`deploy/nats/tenants.conf`);
//! - objects are named `<session>/<task_id>/<SHA-256 of the value, hex>`: a value stored twice
//!   for one task (the event that announces a call, then the task that runs it) is written once,
//!   and names never depend on what a model chose (call ids);
//! - the bucket keeps an object [`RETENTION`] (its max age) after it was written: longer than
//!   anything that refers to it lives (a queued task at most 7 days, events 24 hours); no other
//!   clean-up is needed, and none removes a value a queued task still needs;
//! - a reference is read only within the tenant that asks (its bucket), within the session when
//!   the reader knows it (a worker), and only as the exact bytes it names (size and digest);
//! - a stored value is at most [`MAX_STORED_BYTES`]; a larger one fails the publish as before
//!   (`too_large`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use crate::bus::Bus;
use crate::protocol::{validate_token, Failure, FailureKind, FinalResult, PayloadRef, TaskOrigin};
use crate::text::{ceil_char_boundary, floor_char_boundary};
use crate::workspace::objects::{BucketKind, Expect, ObjectWorkspaces};
use crate::workspace::{Limits, SessionRef, WorkspaceError, WorkspacePath};

/// Bucket names are this and the tenant.
pub const BUCKET_PREFIX: &str = crate::protocol::payload::PAYLOAD_BUCKET_PREFIX;

/// How long a stored value is kept after it was written.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The payload buckets.
pub const PAYLOAD_BUCKETS: BucketKind = BucketKind {
    prefix: BUCKET_PREFIX,
    holds: "values stored by reference",
    max_age: Some(RETENTION),
};

/// Longest value (bytes of JSON for arguments, of text otherwise) that travels inline in a task
/// or an event; a longer one goes by reference. Lower on a bus with small messages
/// ([`inline_limit`]).
pub const INLINE_MAX: usize = 256 * 1024;

/// Largest value stored.
pub const MAX_STORED_BYTES: u64 = 64 * 1024 * 1024;

/// The inline limit on a bus whose messages carry at most `max_payload` bytes: [`INLINE_MAX`],
/// or a quarter of a message if that is less (room for the rest of the message and a preview).
pub fn inline_limit(max_payload: usize) -> usize {
    INLINE_MAX.min(max_payload / 4)
}

/// The bucket holding `tenant`'s values.
pub fn bucket_name(tenant: &str) -> String {
    PAYLOAD_BUCKETS.bucket_name(tenant)
}

/// Values stored by reference, for every tenant. Cheap to clone.
#[derive(Clone)]
pub struct PayloadStore {
    objects: Arc<ObjectWorkspaces>,
}

impl std::fmt::Debug for PayloadStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PayloadStore").finish_non_exhaustive()
    }
}

impl PayloadStore {
    /// The payload buckets reached through `bus` (no I/O until a value is stored or read).
    pub fn new(bus: &Bus) -> Self {
        let limits = Limits {
            max_file_bytes: MAX_STORED_BYTES,
            max_session_bytes: u64::MAX,
        };
        Self {
            objects: Arc::new(ObjectWorkspaces::of_kind(bus, PAYLOAD_BUCKETS, limits)),
        }
    }

    /// Stores `value` for task `task_id` of `tenant`'s `session`, unless the task stored the same
    /// value already; returns its reference.
    pub async fn store(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        value: Bytes,
    ) -> Result<PayloadRef, WorkspaceError> {
        let owner = SessionRef::new(tenant, session)?;
        validate_token("task_id", task_id).map_err(|f| WorkspaceError::Denied(f.message))?;
        let path = WorkspacePath::parse(&format!("{task_id}/{}", sha256_hex(&value)))?;
        let reference = PayloadRef {
            bucket: bucket_name(tenant),
            name: format!("{session}/{path}"),
            size: value.len() as u64,
            digest: crate::workspace::digest(&value),
        };
        let stored = self.objects.stat(&owner, &path).await?;
        let same = stored.is_some_and(|version| {
            version.size == reference.size
                && version.digest.as_deref() == Some(reference.digest.as_str())
        });
        if !same {
            self.objects
                .write_prechecked(&owner, &path, value, Expect::Any)
                .await?;
        }
        Ok(reference)
    }

    /// The value `reference` names, for a reader of `tenant` — and, when `session` is given,
    /// only a value of that session. Refused ([`WorkspaceError::Denied`]) when the reference
    /// points elsewhere; [`WorkspaceError::Invalid`] when what is stored is not what it names.
    pub async fn load(
        &self,
        tenant: &str,
        session: Option<&str>,
        reference: &PayloadRef,
    ) -> Result<Bytes, WorkspaceError> {
        if reference.bucket != bucket_name(tenant) {
            return Err(WorkspaceError::Denied(format!(
                "a reference to bucket {:?} cannot be read for tenant {tenant}",
                crate::text::cut(&reference.bucket, 256)
            )));
        }
        let (owner, path) = reference
            .name
            .split_once('/')
            .ok_or_else(|| WorkspaceError::Denied("a reference names <session>/<path>".into()))?;
        if session.is_some_and(|session| session != owner) {
            return Err(WorkspaceError::Denied(format!(
                "a reference to session {:?} cannot be read here",
                crate::text::cut(owner, 256)
            )));
        }
        let owner = SessionRef::new(tenant, owner)?;
        let path = WorkspacePath::parse(path)?;
        if reference.size > MAX_STORED_BYTES {
            return Err(WorkspaceError::TooLarge(format!(
                "a referenced value of {} bytes is over the {MAX_STORED_BYTES}-byte cap",
                reference.size
            )));
        }
        let (content, version) = self.objects.read(&owner, &path).await?;
        if content.len() as u64 != reference.size
            || version.digest.as_deref() != Some(reference.digest.as_str())
        {
            return Err(WorkspaceError::Invalid(format!(
                "{} does not hold the value its reference names",
                reference.name
            )));
        }
        Ok(content)
    }

    /// Arguments as a task carries them: inline when their JSON is within `limit` bytes;
    /// otherwise stored, and `null` with their reference.
    pub async fn arguments_for_task(
        &self,
        origin: &TaskOrigin,
        arguments: Value,
        limit: usize,
    ) -> Result<(Value, Option<PayloadRef>), Failure> {
        // Measured without building the JSON: almost every call's arguments travel inline.
        if crate::text::json_len(&arguments) <= limit {
            return Ok((arguments, None));
        }
        let json = encode(&arguments)?;
        // Boxed, as in `load_arguments`.
        let reference =
            Box::pin(self.store(&origin.tenant, &origin.session, &origin.task_id, json))
                .await
                .map_err(|e| failure("the call's arguments could not be stored", &e))?;
        Ok((Value::Null, Some(reference)))
    }

    /// Text as a task carries it: inline within `limit` bytes; otherwise stored, and empty with
    /// its reference.
    pub async fn text_for_task(
        &self,
        origin: &TaskOrigin,
        text: String,
        limit: usize,
    ) -> Result<(String, Option<PayloadRef>), Failure> {
        if text.len() <= limit {
            return Ok((text, None));
        }
        let reference = Box::pin(self.store(
            &origin.tenant,
            &origin.session,
            &origin.task_id,
            text.into(),
        ))
        .await
        .map_err(|e| failure("the input could not be stored", &e))?;
        Ok((String::new(), Some(reference)))
    }

    /// The arguments a task's reference names (`origin`'s tenant and session only).
    pub async fn load_arguments(
        &self,
        origin: &TaskOrigin,
        reference: &PayloadRef,
    ) -> Result<Value, Failure> {
        // Boxed: the read is deep, and the task futures that await it are deep already (the
        // compiler's layout depth limit).
        let bytes = Box::pin(self.load(&origin.tenant, Some(&origin.session), reference))
            .await
            .map_err(|e| failure("the call's arguments could not be read", &e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::new(
                FailureKind::InvalidInput,
                format!("the stored arguments are not JSON: {e}"),
            )
        })
    }

    /// The text a task's reference names (`origin`'s tenant and session only).
    pub async fn load_text(
        &self,
        origin: &TaskOrigin,
        reference: &PayloadRef,
    ) -> Result<String, Failure> {
        // Boxed, as in `load_arguments`.
        let bytes = Box::pin(self.load(&origin.tenant, Some(&origin.session), reference))
            .await
            .map_err(|e| failure("the input could not be read", &e))?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Failure::new(FailureKind::InvalidInput, "the stored input is not UTF-8"))
    }

    /// Arguments as an event shows them: inline when their JSON is within `limit` bytes;
    /// otherwise a string previewing that JSON and, when they could be stored, their reference.
    /// Never fails: an event is best effort.
    pub async fn arguments_for_event(
        &self,
        origin: &TaskOrigin,
        arguments: Value,
        limit: usize,
    ) -> (Value, Option<PayloadRef>) {
        let Ok(json) = encode(&arguments) else {
            return (arguments, None);
        };
        if json.len() <= limit {
            return (arguments, None);
        }
        let text = String::from_utf8_lossy(&json).into_owned();
        let owner = Owner {
            tenant: &origin.tenant,
            session: &origin.session,
            task_id: &origin.task_id,
        };
        let (preview, reference) = self
            .preview_stored(owner, "arguments", text, json, limit)
            .await;
        (Value::String(preview), reference)
    }

    /// `result` as it travels in one message: an answer over `limit` bytes is stored and replaced
    /// by a preview, with `answer_ref` (and its parsed `output` left out, `output_ref` set). If it cannot be stored, the answer keeps what fits
    /// `message_limit` ([`FinalResult::fitted`]): the stored final result and the session's
    /// history still hold it whole.
    pub async fn final_for_message(
        &self,
        mut result: FinalResult,
        limit: usize,
        message_limit: usize,
    ) -> FinalResult {
        let too_long = result.answer.as_ref().is_some_and(|a| a.len() > limit);
        if too_long && result.answer_ref.is_none() {
            let answer = result.answer.take().unwrap_or_default();
            let owner = Owner {
                tenant: &result.tenant,
                session: &result.session,
                task_id: &result.task_id,
            };
            let bytes = Bytes::from(answer.clone().into_bytes());
            let (preview, reference) = self
                .preview_stored(owner, "answer", answer, bytes, limit)
                .await;
            match reference {
                Some(reference) => {
                    result.answer = Some(preview);
                    result.answer_ref = Some(Box::new(reference));
                    // The output is the answer's JSON: it travels in the stored answer.
                    result.output_ref = result.output.take().is_some();
                }
                None => {
                    result.answer = Some(preview);
                    result.output = None;
                }
            }
        }
        result.fitted(message_limit)
    }

    /// Stores `bytes` (whose text is `text`) and previews `text` within `limit` bytes, saying
    /// where the whole `what` is; a value that cannot be stored is previewed with a note saying
    /// so.
    async fn preview_stored(
        &self,
        owner: Owner<'_>,
        what: &str,
        text: String,
        bytes: Bytes,
        limit: usize,
    ) -> (String, Option<PayloadRef>) {
        let total = text.len();
        // Boxed, as in `load_arguments`.
        match Box::pin(self.store(owner.tenant, owner.session, owner.task_id, bytes)).await {
            Ok(reference) => {
                let note = format!(
                    "[... {what}: {total} bytes in all; the whole is object {} of bucket {} \
                     ({what}_ref) ...]",
                    reference.name, reference.bucket
                );
                (preview(&text, limit, &note), Some(reference))
            }
            Err(e) => {
                tracing::warn!(task_id = %owner.task_id, error = %e.describe(), "a large {what} was not stored; previewed only");
                let note = format!("[... {what}: {total} bytes in all, not stored: shortened ...]");
                (preview(&text, limit, &note), None)
            }
        }
    }
}

/// Whose value is stored.
#[derive(Clone, Copy)]
struct Owner<'a> {
    tenant: &'a str,
    session: &'a str,
    task_id: &'a str,
}

/// The failure a stored value's trouble stands for, with what was being done.
pub fn failure(doing: &str, error: &WorkspaceError) -> Failure {
    let kind = match error {
        WorkspaceError::Denied(_) => FailureKind::Denied,
        WorkspaceError::TooLarge(_) => FailureKind::TooLarge,
        WorkspaceError::Unavailable { .. } => FailureKind::Unavailable,
        WorkspaceError::NotFound(_) | WorkspaceError::Invalid(_) | WorkspaceError::Conflict(_) => {
            FailureKind::InvalidInput
        }
    };
    let expired = if matches!(error, WorkspaceError::NotFound(_)) {
        format!(
            " (stored values are kept {} days)",
            RETENTION.as_secs() / 86_400
        )
    } else {
        String::new()
    };
    Failure::new(kind, format!("{doing}: {}{expired}", error.describe()))
}

/// `text`'s head and tail within `limit` bytes (cut at character boundaries), with `note`
/// between them; `text` itself when it fits.
pub fn preview(text: &str, limit: usize, note: &str) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let room = limit.saturating_sub(note.len() + 2);
    let head_end = floor_char_boundary(text, room * 3 / 4);
    let tail_start = ceil_char_boundary(text, text.len() - room / 4).max(head_end);
    format!("{}\n{note}\n{}", &text[..head_end], &text[tail_start..])
}

fn encode(value: &Value) -> Result<Bytes, Failure> {
    crate::json_out::to_bytes(value)
        .map_err(|e| Failure::new(FailureKind::Internal, format!("cannot encode a value: {e}")))
}

fn sha256_hex(value: &[u8]) -> String {
    use sha2::Digest;
    use std::fmt::Write;
    sha2::Sha256::digest(value)
        .iter()
        .fold(String::with_capacity(64), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preview_keeps_head_and_tail_within_the_limit_on_char_boundaries() {
        let text = format!("HEAD{}TAIL", "é".repeat(10_000));
        let shown = preview(&text, 1_000, "[note]");
        assert!(shown.len() <= 1_000, "{}", shown.len());
        assert!(
            shown.starts_with("HEAD") && shown.ends_with("TAIL"),
            "{shown}"
        );
        assert!(shown.contains("\n[note]\n"));
        assert_eq!(preview("short", 1_000, "[note]"), "short");
    }

    #[test]
    fn names_and_limits() {
        assert_eq!(bucket_name("acme"), "skein-payloads-acme");
        assert_eq!(inline_limit(1024 * 1024), INLINE_MAX);
        assert_eq!(inline_limit(4096), 1024);
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_missing_value_is_not_retried_and_says_how_long_values_are_kept() {
        let gone = failure(
            "reading",
            &WorkspaceError::NotFound("x: no such file".into()),
        );
        assert_eq!(gone.kind, FailureKind::InvalidInput);
        assert!(!gone.retryable);
        assert!(gone.message.contains("kept 7 days"), "{}", gone.message);
        let away = failure(
            "reading",
            &WorkspaceError::Unavailable {
                message: "down".into(),
                source: None,
            },
        );
        assert!(away.retryable);
    }
}
