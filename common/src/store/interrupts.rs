//! Interrupt requests between the turns of one session (`multitask: interrupt`): a task that finds
//! older tasks of its session unfinished records, for each, that it interrupts it; the lead that
//! runs (or later starts) such a task looks before each model call of its turn and, finding the
//! record, ends the turn there, keeping its work.
//!
//! Invariants: a record names the interrupting task and is written, never changed by the task it
//! names; writing it again is harmless (the same value, the expiry renewed); it expires after
//! [`INTERRUPT_TTL_SECS`], as a cancel request does, and `forget_turn` removes it.

use redis::AsyncCommands;

use super::{keys, SessionStore, StoreError};

/// How long an interrupt request is kept (as long as `SKEIN_CANCEL` keeps a cancel request).
pub const INTERRUPT_TTL_SECS: u64 = 24 * 3600;

impl SessionStore {
    /// Records that task `by` interrupts task `task_id` of the same session.
    pub async fn request_interrupt(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        by: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let () = conn
            .set_ex(
                keys::interrupt(tenant, session, task_id),
                by,
                INTERRUPT_TTL_SECS,
            )
            .await?;
        Ok(())
    }

    /// The task that interrupted `task_id`, if one did.
    pub async fn interrupted_by(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut conn = self.connection.clone();
        Ok(conn.get(keys::interrupt(tenant, session, task_id)).await?)
    }
}
