//! The session lease on its own: taken for a task that is not a turn (a session's removal),
//! renewed and released by its holder. A turn takes its lease as it starts (`begin_turn`).
//!
//! Invariants: renewing and releasing act only while the key holds the caller's token; a lease
//! found held with no expiry (which no lead writes) is given the time to live the caller asked
//! for, so it lapses then as the lease of a stopped lead does, and is never taken over while it
//! might still be someone's.

use std::time::Duration;

use super::scripts::{LEASE_SCRIPT, TRY_LEASE_SCRIPT};
use super::{keys, SessionStore, StoreError};

/// What the turn-start script adds to `busy` when the lease it met had no expiry.
pub(super) const UNBOUNDED: &str = "unbounded";

/// Says that a lease with no expiry was found, and given `ttl` to live.
pub(super) fn warn_unbounded(tenant: &str, session: &str, ttl: Duration) {
    tracing::warn!(
        tenant,
        session,
        lapses_in = ?ttl,
        "the session's lease had no expiry (no lead writes one: set by hand or by a broken tool); \
         it was given the lease's time to live and lapses then"
    );
}

impl SessionStore {
    /// Tries to take the session's lease for `ttl`; true if taken.
    pub async fn try_lease(
        &self,
        tenant: &str,
        session: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let taken: i64 = TRY_LEASE_SCRIPT
            .key(keys::lease(tenant, session))
            .arg(token)
            .arg(ttl.as_millis().max(1) as u64)
            .invoke_async(&mut conn)
            .await?;
        if taken == -1 {
            warn_unbounded(tenant, session, ttl);
        }
        Ok(taken == 1)
    }

    /// Extends a lease the caller holds; false if it was lost.
    pub async fn renew_lease(
        &self,
        tenant: &str,
        session: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.lease_op(tenant, session, token, ttl.as_millis().max(1) as u64)
            .await
    }

    /// Releases a lease the caller holds (a no-op if it was lost).
    pub async fn release_lease(
        &self,
        tenant: &str,
        session: &str,
        token: &str,
    ) -> Result<bool, StoreError> {
        self.lease_op(tenant, session, token, 0).await
    }

    async fn lease_op(
        &self,
        tenant: &str,
        session: &str,
        token: &str,
        ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let done: i64 = LEASE_SCRIPT
            .key(keys::lease(tenant, session))
            .arg(token)
            .arg(ttl_ms)
            .invoke_async(&mut conn)
            .await?;
        Ok(done == 1)
    }
}
