//! The audit trail: one [`AuditRecord`] per decision and operation — who, what, which task, the
//! verdict and why — in the replicated `SKEIN_AUDIT` stream (subject
//! `skein.audit.{tenant}.{action}`, limits retention, kept for `SKEIN_AUDIT_RETENTION`).
//!
//! Writers: leads (approval answers, pauses, resumes, steers and cancels they hear, and every
//! operation they refuse), and the CLI (dead-letter replay, removal and purge; session and
//! workspace removal). `skein audit` reads it back, filtered by tenant, principal, task and time.
//!
//! Invariant: a record is published with a message id derived from what it records
//! ([`AuditRecord::dedup_id`]), so the same operation heard by several leads is stored once.

use serde::{Deserialize, Serialize};

use crate::bus::{outgoing_headers, Bus, BusError};
use crate::principals::{Acting, Proof, Refusal};
use crate::protocol::now_ms;

/// The audit stream.
pub use crate::subjects::AUDIT_STREAM;
/// All its subjects.
pub const AUDIT_ALL: &str = "skein.audit.>";

/// The subject token of the records that belong to every tenant (`*`, an operator's whole purge):
/// `~`, which no tenant token contains and which is no wildcard.
const EVERY_TENANT_TOKEN: &str = "~";

fn tenant_token(tenant: &str) -> &str {
    if tenant == crate::principals::EVERY_TENANT {
        EVERY_TENANT_TOKEN
    } else {
        tenant
    }
}

/// Where a tenant's records of `action` go.
pub fn subject(tenant: &str, action: &str) -> String {
    format!("skein.audit.{}.{action}", tenant_token(tenant))
}

/// What became of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Carried out (an answer recorded, a control written, letters replayed, …).
    Done,
    /// Refused: who, or the signature, or the rules did not allow it.
    Refused,
}

/// One decision or operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When it was recorded (unix ms).
    pub at_ms: u64,
    pub tenant: String,
    /// Who acted: the verified principal, or the claim of an unsigned message (see `proof`).
    pub principal: String,
    /// How the principal is known: `signed`, `delegated:<by>` (the gateway's signature), or
    /// `claimed` (unsigned, signatures not required), or `unknown` for a refused signature.
    pub proof: String,
    /// `approve`, `deny`, `cancel`, `pause`, `resume`, `steer`, `submit`, `dlq_replay`,
    /// `dlq_remove`, `dlq_purge`, `session_remove`, `workspace_remove`.
    pub action: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    /// The call answered, or the letters or files acted on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl AuditRecord {
    /// A record of an operation by `acting`.
    pub fn done(acting: &Acting, tenant: &str, action: &str, task_id: &str) -> Self {
        Self {
            at_ms: now_ms(),
            tenant: tenant.to_owned(),
            principal: acting.name().to_owned(),
            proof: proof_text(&acting.proof),
            action: action.to_owned(),
            task_id: task_id.to_owned(),
            target: String::new(),
            verdict: Verdict::Done,
            reason: String::new(),
        }
    }

    /// A record of a refused operation.
    pub fn refused(refusal: &Refusal, tenant: &str, action: &str, task_id: &str) -> Self {
        Self {
            at_ms: now_ms(),
            tenant: tenant.to_owned(),
            principal: refusal.principal.clone().unwrap_or_default(),
            proof: if refusal.principal.is_some() {
                "signed".into()
            } else {
                "unknown".into()
            },
            action: action.to_owned(),
            task_id: task_id.to_owned(),
            target: String::new(),
            verdict: Verdict::Refused,
            reason: refusal.reason.clone(),
        }
    }

    pub fn with_target(mut self, target: impl Into<String>) -> Self {
        self.target = target.into();
        self
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }

    /// The message id that stores one operation once, whichever process records it: what it
    /// records, and `what` identifies the message it came from (its nonce, or its stream
    /// sequence).
    pub fn dedup_id(&self, what: &str) -> String {
        format!(
            "audit:{}:{}:{}:{}:{what}",
            self.tenant, self.action, self.task_id, self.target
        )
    }
}

fn proof_text(proof: &Proof) -> String {
    match proof {
        Proof::Signed => "signed".into(),
        Proof::Delegated { by } => format!("delegated:{by}"),
        Proof::Claimed => "claimed".into(),
    }
}

impl Bus {
    /// Stores an audit record; `what` identifies the message it came from (see
    /// [`AuditRecord::dedup_id`]). A record that cannot be stored is logged at error level: the
    /// operation itself is not undone.
    pub async fn audit(&self, record: &AuditRecord, what: &str) {
        let stored = async {
            let payload = self.encode(record)?;
            let mut headers = outgoing_headers();
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                record.dedup_id(what).as_str(),
            );
            self.publish_durable(subject(&record.tenant, &record.action), headers, payload)
                .await
        }
        .await;
        if let Err(error) = stored {
            tracing::error!(%error, tenant = %record.tenant, action = %record.action, principal = %record.principal, "audit record not stored");
        }
    }
}

/// Which records `skein audit` lists.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant: Option<String>,
    pub principal: Option<String>,
    pub task_id: Option<String>,
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
}

impl AuditFilter {
    pub fn admits(&self, record: &AuditRecord) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == record.tenant)
            && self
                .principal
                .as_ref()
                .is_none_or(|p| *p == record.principal)
            && self.task_id.as_ref().is_none_or(|t| *t == record.task_id)
            && self.since_ms.is_none_or(|s| record.at_ms >= s)
            && self.until_ms.is_none_or(|u| record.at_ms <= u)
    }
}

impl Bus {
    /// The audit records `filter` admits, oldest first (at most `limit`); a record that does not
    /// decode is skipped with a warning.
    pub async fn audit_records(
        &self,
        filter: &AuditFilter,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, BusError> {
        use async_nats::jetstream::consumer::{self, DeliverPolicy};
        use futures::StreamExt;
        let stream = self.stream_no_info(AUDIT_STREAM).await?;
        let deliver_policy = match filter.since_ms {
            Some(since) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::from_unix_timestamp_nanos(
                    i128::from(since) * 1_000_000,
                )
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
            },
            None => DeliverPolicy::All,
        };
        let filter_subject = match &filter.tenant {
            Some(tenant) => format!("skein.audit.{}.>", tenant_token(tenant)),
            None => AUDIT_ALL.to_owned(),
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject,
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| crate::bus::stream_error(AUDIT_STREAM, e.to_string()))?;
        let mut pending = consumer.cached_info().num_pending;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| crate::bus::stream_error(AUDIT_STREAM, e.to_string()))?;
        let mut records = Vec::new();
        while pending > 0 && records.len() < limit {
            let Some(message) = messages.next().await else {
                break;
            };
            let message =
                message.map_err(|e| crate::bus::stream_error(AUDIT_STREAM, e.to_string()))?;
            pending = message.info().map(|i| i.pending).unwrap_or(0);
            match serde_json::from_slice::<AuditRecord>(&message.payload) {
                Ok(record) if filter.admits(&record) => records.push(record),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, subject = %message.subject, "audit record that does not decode; skipped")
                }
            }
        }
        Ok(records)
    }
}

/// The cancel requests a lead hears, recorded (each once, however many leads hear it).
pub fn cancel_audit(bus: Bus) -> crate::cancel::CancelAudit {
    std::sync::Arc::new(
        move |request: &async_nats::Message, checked: &Result<Acting, Refusal>| {
            let (tenant, task_id, call) = match crate::subjects::parse_cancel(&request.subject) {
                Some((tenant, task_id)) => (tenant, task_id, ""),
                None => match crate::subjects::parse_cancel_call(&request.subject) {
                    Some(parts) => parts,
                    None => return,
                },
            };
            let record = match checked {
                Ok(acting) => AuditRecord::done(acting, tenant, "cancel", task_id),
                Err(refusal) => AuditRecord::refused(refusal, tenant, "cancel", task_id),
            }
            .with_target(call);
            let what =
                message_identity(&request.subject, request.headers.as_ref(), &request.payload);
            let bus = bus.clone();
            tokio::spawn(async move { bus.audit(&record, &what).await });
        },
    )
}

/// What identifies one published message across the processes that hear it: its signature's
/// nonce, or else a digest of its subject and payload.
pub fn message_identity(
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) -> String {
    use sha2::{Digest, Sha256};
    if let Some(nonce) = headers.and_then(|h| h.get(crate::principals::HEADER_NONCE)) {
        return nonce.as_str().to_owned();
    }
    let mut digest = Sha256::new();
    digest.update(subject.as_bytes());
    digest.update(payload);
    digest.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
