//! A turn's checkpoint written under the session lease: small ones by a script that takes them
//! as an argument, large ones staged by a plain `SET` and moved into place by a script, so their
//! bytes never pass through Lua (see `scripts::PLACE_CHECKPOINT_SCRIPT`).

use std::sync::atomic::{AtomicU64, Ordering};

use redis::{ErrorKind, ServerErrorKind};

use super::scripts::{CHECKPOINT_SCRIPT, PLACE_CHECKPOINT_SCRIPT};
use super::{keys, SessionStore, StoreError, TurnCheckpoint, CHECKPOINT_TTL_SECS};

/// Checkpoints larger than this (bytes of JSON) are staged by a plain `SET` and moved into place
/// by `PLACE_CHECKPOINT_SCRIPT`; smaller ones go through `CHECKPOINT_SCRIPT` as an argument, one
/// command instead of two. The two cost about the same near 4 KB: Lua's copies of an argument
/// cost Redis about 1 µs per KB, staging about 4 µs more in all.
const STAGE_CHECKPOINTS_ABOVE: usize = 4 * 1024;
/// How long a staged checkpoint write outlives a script that never ran (see
/// `PLACE_CHECKPOINT_SCRIPT`).
const STAGED_CHECKPOINT_TTL_SECS: u64 = 60;
/// Numbers the checkpoint writes of this process, so each stages under a key of its own.
static STAGED_WRITES: AtomicU64 = AtomicU64::new(0);

impl SessionStore {
    /// Records a turn's progress if `lease_token` still holds the session lease; false if not.
    pub async fn save_checkpoint(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
        lease_token: &str,
        checkpoint: &TurnCheckpoint,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        // Sized for the messages up front: grown from serde_json's 128 bytes, a 10 KB checkpoint
        // took seven reallocations.
        let size_hint = 256
            + checkpoint
                .new_messages
                .iter()
                .map(|message| message.content.len() + 96)
                .sum::<usize>();
        let mut json = Vec::with_capacity(size_hint);
        serde_json::to_writer(&mut json, checkpoint).map_err(StoreError::Corrupt)?;
        if json.len() <= STAGE_CHECKPOINTS_ABOVE {
            let saved: i64 = CHECKPOINT_SCRIPT
                .key(keys::lease(tenant, session))
                .key(keys::checkpoint(tenant, session, task_id))
                .arg(lease_token)
                .arg(json)
                .arg(CHECKPOINT_TTL_SECS)
                .invoke_async(&mut conn)
                .await?;
            return Ok(saved == 1);
        }
        let staged = keys::staged_checkpoint(
            tenant,
            session,
            task_id,
            lease_token,
            STAGED_WRITES.fetch_add(1, Ordering::Relaxed),
        );
        let mut write = redis::pipe();
        write
            .set_ex(&staged, json, STAGED_CHECKPOINT_TTL_SECS)
            .ignore()
            .invoke_script(
                PLACE_CHECKPOINT_SCRIPT
                    .key(keys::lease(tenant, session))
                    .key(&staged)
                    .key(keys::checkpoint(tenant, session, task_id))
                    .arg(lease_token)
                    .arg(CHECKPOINT_TTL_SECS),
            );
        let (saved,): (i64,) = match write.query_async(&mut conn).await {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                PLACE_CHECKPOINT_SCRIPT.load_async(&mut conn).await?;
                write.query_async(&mut conn).await?
            }
            saved => saved?,
        };
        match saved {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(StoreError::UnexpectedReply(
                "the checkpoint script: nothing staged",
            )),
        }
    }
}
