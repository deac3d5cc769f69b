//! The checkpoint seam over Redis. `LeaseCheckpoints`: a lead turn's progress is saved under the
//! session lease: a lead that lost the lease cannot overwrite the progress of the lead that took
//! it over (the save is refused, and the turn stops). `CallCheckpoints`: a subagent call's child
//! turn, saved by the call's key in the child session, so a worker that takes the call over after
//! a crash resumes it instead of running its finished steps again.

use futures::future::BoxFuture;

use crate::agent::seams::{CheckpointSink, TurnCheckpoint};
use crate::protocol::{Failure, FailureKind};
use crate::store::{SessionStore, TurnLease};

/// Where a lead's turn records its progress: under its lease.
pub struct LeaseCheckpoints<'a> {
    pub turn: &'a TurnLease,
}

impl CheckpointSink for LeaseCheckpoints<'_> {
    fn save<'a>(&'a self, state: &'a TurnCheckpoint) -> BoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let saved = self
                .turn
                .checkpoint(state)
                .await
                .map_err(|e| e.to_failure())?;
            if saved {
                Ok(())
            } else {
                Err(Failure::new(
                    FailureKind::Unavailable,
                    "session lease lost; progress not recorded",
                ))
            }
        })
    }
}

/// Where a subagent call's child turn records its progress.
pub struct CallCheckpoints {
    pub store: SessionStore,
    pub tenant: String,
    pub child_session: String,
    pub call_key: String,
}

impl CheckpointSink for CallCheckpoints {
    fn save<'a>(&'a self, state: &'a TurnCheckpoint) -> BoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            self.store
                .save_call_checkpoint(&self.tenant, &self.child_session, &self.call_key, state)
                .await
                .map_err(|e| e.to_failure())
        })
    }
}
