//! Who performs the operations a lead records — approval answers, pauses, resumes and steers:
//! the principal its message proves (see `skein_common::principals`), checked for a replayed
//! signature, and each refusal recorded in the audit trail.

use skein_common::audit::AuditRecord;
use skein_common::bus::Envelope;
use skein_common::principals::{Acting, Operation, Refusal};

use crate::server::Lead;

/// What a check of an operation's principal found.
pub(crate) enum Admission {
    /// It may go on, by this principal.
    Admitted(Acting),
    /// Refused, and already recorded as such: set the message aside with the reason.
    Refused(String),
    /// The replay check could not be made (Redis away): offer the message again later.
    Unchecked,
}

impl Lead {
    /// Checks the principal of an operation on `tenant`'s `task_id` (the message's body claims
    /// `claimed` as its author): signature, tenant, role, and that its nonce was not used by
    /// another message.
    pub(crate) async fn admit(
        &self,
        envelope: &Envelope,
        tenant: &str,
        task_id: &str,
        operation: Operation,
        claimed: &str,
    ) -> Admission {
        let action = operation.as_str();
        let acting = match envelope.acting(tenant, operation, claimed) {
            Ok(acting) => acting,
            Err(refusal) => {
                return self
                    .refused(envelope, &refusal, tenant, action, task_id)
                    .await
            }
        };
        if let Some((key, nonce)) = &acting.nonce {
            let message = envelope.stream_sequence().to_string();
            let memory = self.bus.gate().nonce_memory();
            match self
                .store
                .first_use_of_nonce(tenant, key, nonce, &message, memory)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    let refusal = Refusal {
                        reason: format!(
                            "replayed: the signature of {} was already used by another message",
                            acting.name()
                        ),
                        principal: Some(acting.name().to_owned()),
                    };
                    return self
                        .refused(envelope, &refusal, tenant, action, task_id)
                        .await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check the signature's nonce; retrying");
                    return Admission::Unchecked;
                }
            }
        }
        Admission::Admitted(acting)
    }

    /// Records a refused operation in the audit trail.
    pub(crate) async fn refused(
        &self,
        envelope: &Envelope,
        refusal: &Refusal,
        tenant: &str,
        action: &str,
        task_id: &str,
    ) -> Admission {
        let record = AuditRecord::refused(refusal, tenant, action, task_id);
        self.bus
            .audit(&record, &envelope.stream_sequence().to_string())
            .await;
        Admission::Refused(refusal.reason.clone())
    }
}
