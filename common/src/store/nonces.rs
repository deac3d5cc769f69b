//! Signature nonces seen lately, so a signed operation published again inside its signature
//! window (a replay) is refused: `SET NX` with an expiry of twice the window, after which the
//! signature's time refuses it anyway (see `principals`).

use std::time::Duration;

use super::{keys, SessionStore, StoreError};

impl SessionStore {
    /// Remembers the nonce of a signature by `key` as used by `message` (what identifies the
    /// stored message, its stream sequence); false when another message used it before (a
    /// replay). The same message delivered again is no replay.
    pub async fn first_use_of_nonce(
        &self,
        tenant: &str,
        key: &str,
        nonce: &str,
        message: &str,
        memory: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let earlier: Option<String> = redis::cmd("SET")
            .arg(keys::nonce(tenant, key, nonce))
            .arg(message)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(memory.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await?;
        Ok(earlier.is_none_or(|earlier| earlier == message))
    }
}
