//! Workspaces of expired sessions. With `SKEIN_SESSION_TTL`, a session's keys in Redis expire that
//! long after its last turn; its workspace's files, in the NATS object store, have no such expiry
//! of their own (a bucket's `max_age` would count from each object's write, so a file written
//! early in a long session would go while the session lives). So the leads sweep them: every
//! [`sweep_every`] (a quarter of the TTL, from 1 s to 15 min) one lead, which claims the sweep in
//! Redis, removes the whole workspace of every session that
//!
//! - has not been written for the TTL (its last write or removal of a file, by the writer's clock),
//!   and
//! - has no state, history or thread record in Redis (it expired, was removed, or never ran),
//!
//! holding the session's lease meanwhile, so no turn starts in it half-way through (a session
//! whose lease a turn holds is left for a later sweep).
//!
//! The bound: a session's last write comes before the end of its last turn, so its files go at most
//! one interval after the session expires (and after a lead is running again, if none was). Files
//! written after the last turn, or seeded for a session that never ran, go at most one TTL and one
//! interval after their last write. Without `SKEIN_SESSION_TTL` sessions are kept for ever and
//! nothing is swept; workspaces on a shared volume (`SKEIN_WORKSPACE=volume`) are not swept.

use std::time::Duration;

use skein_common::bus::Bus;
use skein_common::store::{SessionStore, StoreError};
use skein_common::workspace::objects::StoredSession;
use skein_common::workspace::{ObjectWorkspaces, WorkspaceError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shortest and longest time between two sweeps.
const SWEEP_EVERY_MIN: Duration = Duration::from_secs(1);
const SWEEP_EVERY_MAX: Duration = Duration::from_secs(15 * 60);

/// How often the workspaces are swept when sessions expire after `ttl`.
pub fn sweep_every(ttl: Duration) -> Duration {
    (ttl / 4).clamp(SWEEP_EVERY_MIN, SWEEP_EVERY_MAX)
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Sessions whose workspaces were removed.
    pub sessions: usize,
    /// Files they held.
    pub files: usize,
    /// Tenants or sessions the sweep could not finish (logged; the next sweep tries again).
    pub failed: usize,
}

/// Why a session's workspace could not be swept.
#[derive(Debug, thiserror::Error)]
enum SweepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
}

/// Starts the sweeps of a lead whose sessions expire after `ttl`, as background work in
/// `tracker` until `stop`; `holder` names this lead in the claims.
pub fn start(
    bus: &Bus,
    store: SessionStore,
    ttl: Duration,
    holder: String,
    tracker: &TaskTracker,
    stop: CancellationToken,
) {
    let objects = ObjectWorkspaces::finder(bus);
    let every = sweep_every(ttl);
    tracker.spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            match store.claim_workspace_sweep(&holder, every).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim the sweep of expired workspaces");
                    continue;
                }
            }
            let now_ms = skein_common::protocol::now_ms();
            let swept = tokio::select! {
                _ = stop.cancelled() => break,
                swept = sweep(&store, &objects, ttl, now_ms) => swept,
            };
            if swept != Swept::default() {
                tracing::info!(
                    sessions = swept.sessions,
                    files = swept.files,
                    failed = swept.failed,
                    "swept the workspaces of expired sessions"
                );
            }
        }
    });
}

/// Removes, as of `now_ms` (Unix milliseconds), the workspace of every session that has not been
/// written for `ttl` and has no state in Redis (see the module documentation). Failures are
/// logged and counted; the sweep goes on with the other sessions.
pub async fn sweep(
    store: &SessionStore,
    objects: &ObjectWorkspaces,
    ttl: Duration,
    now_ms: u64,
) -> Swept {
    let mut swept = Swept::default();
    let tenants = match objects.tenants().await {
        Ok(tenants) => tenants,
        Err(e) => {
            tracing::warn!(error = %e.describe(), "could not list the workspace buckets");
            swept.failed += 1;
            return swept;
        }
    };
    for tenant in tenants {
        let stored = match objects.stored_sessions(&tenant).await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(tenant, error = %e.describe(), "could not list a workspace bucket");
                swept.failed += 1;
                continue;
            }
        };
        for session in stored.iter().filter(|s| s.idle_at(now_ms) >= ttl) {
            match remove_if_expired(store, objects, session).await {
                Ok(false) => {}
                Ok(true) => {
                    swept.sessions += 1;
                    swept.files += session.files;
                }
                Err(e) => {
                    tracing::warn!(tenant, session = %session.session, error = %e, "could not remove an expired session's workspace");
                    swept.failed += 1;
                }
            }
        }
    }
    swept
}

/// Removes `stored` if its session has no state in Redis and no turn holds its lease; true if
/// removed.
async fn remove_if_expired(
    store: &SessionStore,
    objects: &ObjectWorkspaces,
    stored: &StoredSession,
) -> Result<bool, SweepError> {
    let Some(hold) = store
        .hold_for_removal(&stored.tenant, &stored.session)
        .await?
    else {
        return Ok(false);
    };
    let removed = match hold.is_live().await {
        Ok(true) => Ok(false),
        Ok(false) => objects
            .remove_stored(stored)
            .await
            .map(|_| true)
            .map_err(SweepError::from),
        Err(e) => Err(e.into()),
    };
    let released = hold.release().await;
    let removed = removed?;
    released?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_come_four_times_a_ttl_within_bounds() {
        assert_eq!(
            sweep_every(Duration::from_secs(3600)),
            Duration::from_secs(900)
        );
        assert_eq!(
            sweep_every(Duration::from_secs(60)),
            Duration::from_secs(15)
        );
        assert_eq!(sweep_every(Duration::from_secs(1)), SWEEP_EVERY_MIN);
        assert_eq!(
            sweep_every(Duration::from_secs(30 * 24 * 3600)),
            SWEEP_EVERY_MAX
        );
    }
}
