//! `LeaseCheckpoints`: the checkpoint seam over Redis. A turn's progress is saved under the
//! session lease: a lead that lost the lease cannot overwrite the progress of the lead that took
//! it over (the save is refused, and the turn stops).

use futures::future::BoxFuture;

use crate::agent::seams::{CheckpointSink, TurnCheckpoint};
use crate::protocol::{Failure, FailureKind};
use crate::store::SessionStore;

/// Where a lead's turn records its progress.
pub struct LeaseCheckpoints {
    pub store: SessionStore,
    pub tenant: String,
    pub session: String,
    pub task_id: String,
    pub lease_token: String,
}

impl CheckpointSink for LeaseCheckpoints {
    fn save<'a>(&'a self, state: &'a TurnCheckpoint) -> BoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let saved = self
                .store
                .save_checkpoint(
                    &self.tenant,
                    &self.session,
                    &self.task_id,
                    &self.lease_token,
                    state,
                )
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
