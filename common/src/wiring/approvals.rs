//! `StoredApprovals`: the approval seam over Redis. A turn asks only when a call needs approval;
//! the answer comes from the stored request of its task (or of its subagent run) (answers by call, the request's expiry,
//! the calls already announced) and the rules approved for its session.

use futures::future::BoxFuture;

use crate::agent::seams::{Answers, ApprovalGate};
use crate::protocol::{approval_key, Failure, TaskOrigin};
use crate::store::SessionStore;

/// The answers stored for a lead's turns (`run` none) or for a subagent run (`run`: its child
/// session).
pub struct StoredApprovals {
    pub store: SessionStore,
    pub run: Option<String>,
}

impl ApprovalGate for StoredApprovals {
    fn answers<'a>(&'a self, origin: &'a TaskOrigin) -> BoxFuture<'a, Result<Answers, Failure>> {
        Box::pin(async move {
            let key = approval_key(&origin.task_id, self.run.as_deref());
            let (request, rules) = tokio::join!(
                self.store.approval_request(&origin.tenant, &key),
                self.store.session_rules(&origin.tenant, &origin.session),
            );
            let request = request.map_err(|e| e.to_failure())?;
            let session_rules = rules.map_err(|e| e.to_failure())?;
            let Some(request) = request else {
                return Ok(Answers {
                    session_rules,
                    ..Answers::default()
                });
            };
            Ok(Answers {
                by_call: request.answers.into_iter().collect(),
                requested: request.calls.into_iter().map(|c| c.call_id).collect(),
                expires_at_ms: request.expires_at_ms,
                session_rules,
            })
        })
    }
}
