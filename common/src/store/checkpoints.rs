//! A turn's checkpoint, written under the session lease without a script: each lead writes its
//! own field of the turn's checkpoints hash and reads the lease in the same round trip; the
//! turn-start script decides whose field counts and sets the hash's expiry (see
//! `scripts::BEGIN_SCRIPT`), which a running turn's writes refresh only hourly (`TurnLease`).

use super::{keys, SessionStore, StoreError, TurnCheckpoint, CHECKPOINT_TTL_SECS};

impl SessionStore {
    /// Records a turn's progress if `lease_token` still holds the session lease; false if not.
    /// Sets the checkpoint's expiry (24 h) too; see [`SessionStore::write_checkpoint`].
    pub async fn save_checkpoint(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        lease_token: &str,
        checkpoint: &TurnCheckpoint,
    ) -> Result<bool, StoreError> {
        self.write_checkpoint(
            CheckpointWriter {
                tenant,
                session,
                task_id,
                lease_token,
            },
            checkpoint,
            Expiry::Set,
        )
        .await
    }

    /// Records a turn's progress if the writer's token still holds the session lease; false if
    /// not.
    ///
    /// One round trip of plain commands: `HSET` the checkpoint into the writer's own field,
    /// `EXPIRE` the hash when `expiry` asks for it, `GET` the lease. The bytes never pass through
    /// Lua (as a script argument a 10 KB checkpoint cost Redis 15 µs of CPU, against 0.35 µs for
    /// a `SET` of it). A write by a lead that lost the lease lands in its own field, which nothing
    /// reads: the lead that took the turn over was named the holder when it took the lease, and
    /// writes its own field.
    pub(super) async fn write_checkpoint(
        &self,
        writer: CheckpointWriter<'_>,
        checkpoint: &TurnCheckpoint,
        expiry: Expiry,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        // Sized for the messages up front: grown from serde_json's 128 bytes, a 10 KB checkpoint
        // took seven reallocations. Written a word at a time (`TurnCheckpoint::write_json`):
        // escaping a byte at a time was most of a long checkpoint's cost.
        let size_hint = 256
            + checkpoint
                .new_messages
                .iter()
                .map(|message| message.content.len() + 96)
                .sum::<usize>();
        let mut json = Vec::with_capacity(size_hint);
        checkpoint
            .write_json(&mut json)
            .map_err(StoreError::Corrupt)?;
        let key = keys::checkpoint(writer.tenant, writer.session, writer.task_id);
        let mut write = redis::pipe();
        write.hset(&key, writer.lease_token, json).ignore();
        if expiry == Expiry::Set {
            write.expire(&key, CHECKPOINT_TTL_SECS as i64).ignore();
        }
        let (holder,): (Option<String>,) = write
            .get(keys::lease(writer.tenant, writer.session))
            .query_async(&mut conn)
            .await?;
        Ok(holder.as_deref() == Some(writer.lease_token))
    }
}

/// Who writes a checkpoint: the turn, and the lease token it holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct CheckpointWriter<'a> {
    pub(super) tenant: &'a str,
    pub(super) session: &'a str,
    pub(super) task_id: &'a str,
    pub(super) lease_token: &'a str,
}

/// Whether a checkpoint write sets the checkpoints' expiry again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    Set,
    /// Set recently enough (by the turn's start or an earlier write) to stand.
    Kept,
}
