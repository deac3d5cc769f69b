//! Requests counted per API key in fixed one-minute windows, across every gateway: the gateway's
//! rate limit (`SKEIN_GATEWAY_REQUESTS_PER_MINUTE`, or a key's own).
//!
//! Invariants: one `INCR` and one `EXPIRE` per request, in one pipeline; a window's counter
//! expires a minute after the window ends.

use super::{keys, SessionStore, StoreError};

/// The length of a counting window, in seconds.
pub const WINDOW_SECS: u64 = 60;

impl SessionStore {
    /// Counts one request of key `key_id` of `tenant` in the window holding `now_secs`; returns
    /// how many the window has seen, this one included.
    pub async fn count_request(
        &self,
        tenant: &str,
        key_id: &str,
        now_secs: u64,
    ) -> Result<u64, StoreError> {
        let window = now_secs / WINDOW_SECS;
        let key = keys::requests(tenant, key_id, window);
        let mut conn = self.connection.clone();
        let (count,): (u64,) = redis::pipe()
            .cmd("INCR")
            .arg(&key)
            .cmd("EXPIRE")
            .arg(&key)
            .arg(2 * WINDOW_SECS)
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(count)
    }
}
