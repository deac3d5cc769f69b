//! `TurnLease`: the life of one lead turn under its session's lease, as one type, with who
//! claims it (`TurnClaim`), how its start came out (`TurnStart`) and how its end was stored
//! (`Ended`). A turn is begun (its attempt counted, the lease taken, the session and any
//! checkpoint loaded, the trace of a task submitted without one kept, and the delivery's event
//! epoch taken, in one trip), renewed and checkpointed while it runs, and ended one way:
//! completed (session, final result and lease release in one atomic step), or given up — the
//! lease released, and the attempt taken back when it was not the task's fault (shutdown, a
//! suspension, a start that must not stand).
//!
//! Invariants: every write after the start is fenced by the lease token, so a lead that lost the
//! lease writes nothing that counts (a checkpoint it writes lands in its own field of the turn's
//! checkpoints, which nothing reads once another lead took the turn over); a start whose reply
//! could not be read (a corrupt session or checkpoint) leaves no lease behind, so the session's
//! next turn does not wait out the lease's time to live.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::checkpoints::{CheckpointWriter, Expiry};
use super::{
    control, keys, FinalResult, LoadedSession, SessionState, SessionStore, StoreError,
    TurnCheckpoint,
};

/// How a lead's attempt to start a turn came out ([`SessionStore::begin_turn`]).
#[derive(Debug, Clone, PartialEq)]
pub enum TurnStart {
    /// The task already ended: its stored result.
    Finished(FinalResult),
    /// Another lead holds the session's lease; nothing was counted.
    Busy,
    /// This attempt (its number given) is over the limit; the lease was not taken.
    Exhausted(u64),
    /// The lease is held: the attempt's number, the session and any checkpoint to resume from.
    Started {
        attempt: u64,
        session: LoadedSession,
        checkpoint: Option<Box<TurnCheckpoint>>,
        /// What was asked of the task (pause, steer, interrupt) before this start.
        controls: control::Controls,
    },
}

/// How storing a task's final result came out: a task's final result is written once.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// This final result is stored now.
    Stored,
    /// The task had ended already: this is the final result that stands.
    Earlier(Box<FinalResult>),
}

/// Who starts a turn and under which limits ([`SessionStore::begin_turn`]).
#[derive(Debug, Clone, Copy)]
pub struct TurnClaim<'a> {
    pub tenant: &'a str,
    pub session: &'a str,
    pub task_id: &'a str,
    pub lease_token: &'a str,
    pub lease_ttl: Duration,
    pub max_attempts: u64,
    /// The `traceparent` to keep as the task's trace if none is kept yet: the span of a delivery
    /// whose submission carried no trace context (`None` when it carried its sender's).
    pub trace: Option<&'a str>,
}

/// How long a turn's checkpoints keep the expiry they were last given before a checkpoint write
/// sets it again (it is 24 hours: a write refreshes it at most hourly, not at every step).
const CHECKPOINT_EXPIRY_REFRESH_MS: u64 = 3_600_000;

/// One turn of one task on one session, claimed by one lead (its lease token).
pub struct TurnLease {
    store: SessionStore,
    tenant: String,
    session: String,
    task_id: String,
    token: String,
    ttl: Duration,
    max_attempts: u64,
    trace: Option<String>,
    /// When (ms since the Unix epoch) the turn's checkpoints were last given their expiry: by
    /// the turn's start or a checkpoint write; 0 before either.
    checkpoint_expiry_set_ms: AtomicU64,
    /// This delivery's event epoch, taken by its first start that Redis answered; 0 before.
    event_epoch: AtomicU64,
}

impl SessionStore {
    /// The turn `claim` describes; nothing is asked of Redis until it is begun.
    pub fn turn(&self, claim: TurnClaim<'_>) -> TurnLease {
        TurnLease {
            store: self.clone(),
            tenant: claim.tenant.to_owned(),
            session: claim.session.to_owned(),
            task_id: claim.task_id.to_owned(),
            token: claim.lease_token.to_owned(),
            ttl: claim.lease_ttl,
            max_attempts: claim.max_attempts,
            trace: claim.trace.map(str::to_owned),
            checkpoint_expiry_set_ms: AtomicU64::new(0),
            event_epoch: AtomicU64::new(0),
        }
    }
}

impl TurnLease {
    fn claim(&self) -> TurnClaim<'_> {
        TurnClaim {
            tenant: &self.tenant,
            session: &self.session,
            task_id: &self.task_id,
            lease_token: &self.token,
            lease_ttl: self.ttl,
            max_attempts: self.max_attempts,
            trace: self.trace.as_deref(),
        }
    }

    /// Starts the turn (see [`SessionStore::begin_turn`]); the first start Redis answers also
    /// takes this delivery's event epoch ([`Self::event_epoch`]) in the same trip. A start whose
    /// reply could not be read (or that met a key of the wrong type) may have taken the lease: it
    /// is released before the error is returned.
    pub async fn begin(&self) -> Result<TurnStart, StoreError> {
        let take_epoch = self.event_epoch().is_none();
        let start = self
            .store
            .start_turn(self.claim(), take_epoch)
            .await
            .map(|(start, epoch)| {
                if let Some(epoch) = epoch {
                    self.event_epoch.store(epoch, Ordering::Relaxed);
                }
                start
            });
        if start.as_ref().is_err_and(StoreError::is_persistent) {
            self.release().await;
        }
        if let Ok(TurnStart::Started { .. }) = start {
            self.checkpoint_expiry_set_ms
                .store(crate::protocol::now_ms(), Ordering::Relaxed);
        }
        start
    }

    /// This delivery's event epoch (`BusEvents::with_epoch`): the number, from 1, of the
    /// task's deliveries that began a start; `None` until a start was answered.
    pub fn event_epoch(&self) -> Option<u64> {
        Some(self.event_epoch.load(Ordering::Relaxed)).filter(|&epoch| epoch > 0)
    }

    /// Extends the lease; false if another lead holds it now.
    pub async fn renew(&self) -> Result<bool, StoreError> {
        self.store
            .renew_lease(&self.tenant, &self.session, &self.token, self.ttl)
            .await
    }

    /// Records the turn's progress while the lease is held; false if it was lost. The
    /// checkpoints' expiry is set again only when it was last set an hour ago or more.
    pub async fn checkpoint(&self, checkpoint: &TurnCheckpoint) -> Result<bool, StoreError> {
        let now = crate::protocol::now_ms();
        let set_at = self.checkpoint_expiry_set_ms.load(Ordering::Relaxed);
        let expiry = if now.saturating_sub(set_at) >= CHECKPOINT_EXPIRY_REFRESH_MS {
            Expiry::Set
        } else {
            Expiry::Kept
        };
        let writer = CheckpointWriter {
            tenant: &self.tenant,
            session: &self.session,
            task_id: &self.task_id,
            lease_token: &self.token,
        };
        let written = self
            .store
            .write_checkpoint(writer, checkpoint, expiry)
            .await?;
        if expiry == Expiry::Set {
            self.checkpoint_expiry_set_ms.store(now, Ordering::Relaxed);
        }
        Ok(written)
    }

    /// Ends the turn (see [`SessionStore::complete_turn`]): the lease is released with it.
    pub async fn complete(
        &self,
        expected_version: u64,
        state: Option<SessionState>,
        result: &FinalResult,
        record: Option<super::history::TurnRecord>,
    ) -> Result<Ended, StoreError> {
        self.store
            .complete_turn(&self.token, expected_version, state, result, record)
            .await
    }

    /// Releases the lease if it is still held (a failure is logged: it then expires on its own).
    pub async fn release(&self) {
        if let Err(e) = self
            .store
            .release_lease(&self.tenant, &self.session, &self.token)
            .await
        {
            tracing::warn!(error = %e, "lease not released; it expires on its own");
        }
    }

    /// Takes this attempt back: it does not count toward the task's limit (logged on failure).
    pub async fn uncount(&self) {
        let work = keys::turn_attempts_field(&self.task_id);
        if let Err(e) = self
            .store
            .uncount_attempt(&self.tenant, &self.session, &work)
            .await
        {
            tracing::warn!(error = %e, "attempt not taken back");
        }
    }

    /// Takes back a start that must not stand: the lease is released if it was taken and the
    /// attempt uncounted if it was counted.
    pub async fn take_back(&self, start: &Result<TurnStart, StoreError>) {
        let (counted, leased) = match start {
            Ok(TurnStart::Started { .. }) => (true, true),
            Ok(TurnStart::Exhausted(_)) => (true, false),
            _ => (false, false),
        };
        if leased {
            self.release().await;
        }
        if counted {
            self.uncount().await;
        }
    }
}
