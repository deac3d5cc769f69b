//! Sessions as an operator sees them: the sessions of a tenant with their size and time left, and
//! removing one whole (every key of its tag) when no turn runs in it.
//!
//! A removal holds the session's lease from before it deletes anything until it is done
//! ([`SessionHold`]), so no turn starts in the session half-way through; what the session keeps
//! outside Redis (its workspace's files) is removed while the hold lasts, before its keys.

use redis::AsyncCommands;

use super::{decode, keys, SessionState, SessionStore, StoreError};

/// Keys asked for per `SCAN` step.
const SCAN_COUNT: usize = 1000;

/// How long a removal holds the session's lease (it releases it when done).
const REMOVAL_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// One session of a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    pub session: String,
    pub turns: u64,
    /// Messages in its history.
    pub messages: u64,
    /// Seconds until it expires if left idle; `None` when it is kept.
    pub expires_in_secs: Option<u64>,
}

/// How removing a session went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Every key of the session is gone (this many).
    Removed(usize),
    /// A turn holds the session's lease: nothing removed.
    Busy,
}

impl SessionStore {
    /// The turn running in a session now, if any: its task id (from the lease's token,
    /// `{instance}:{task_id}`) and its latest checkpoint, if it wrote one yet.
    pub async fn running_turn(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<(String, Option<crate::agent::seams::TurnCheckpoint>)>, StoreError> {
        let mut conn = self.connection.clone();
        let token: Option<String> = conn.get(keys::lease(tenant, session)).await?;
        let Some((token, task_id)) = token.and_then(|token| {
            let task_id = token.rsplit_once(':')?.1.to_owned();
            Some((token, task_id))
        }) else {
            return Ok(None);
        };
        // The holder's own field: the one its writes go to, and what it resumed from.
        let checkpoint: Option<String> = conn
            .hget(keys::checkpoint(tenant, session, &task_id), &token)
            .await?;
        let checkpoint = checkpoint.as_deref().map(decode).transpose()?;
        Ok(Some((task_id, checkpoint)))
    }

    /// The tenant's sessions, sorted by name.
    pub async fn sessions(&self, tenant: &str) -> Result<Vec<SessionSummary>, StoreError> {
        let pattern = keys::session(tenant, "*");
        let mut found = Vec::new();
        for key in self.scan(&pattern).await? {
            let Some(session) = session_of_key(tenant, &key) else {
                continue;
            };
            found.push(session.to_owned());
        }
        found.sort();
        found.dedup();
        let mut summaries = Vec::with_capacity(found.len());
        for session in found {
            let mut conn = self.connection.clone();
            let (state, messages, ttl): (Option<String>, u64, i64) = redis::pipe()
                .hget(keys::session(tenant, &session), "state")
                .llen(keys::history(tenant, &session))
                .ttl(keys::session(tenant, &session))
                .query_async(&mut conn)
                .await?;
            let state: SessionState = match state.as_deref() {
                None | Some("") => SessionState::default(),
                Some(json) => serde_json::from_str(json).map_err(StoreError::Corrupt)?,
            };
            summaries.push(SessionSummary {
                messages: messages.max(state.history.len() as u64),
                turns: state.turns,
                expires_in_secs: u64::try_from(ttl).ok(),
                session,
            });
        }
        Ok(summaries)
    }

    /// Removes every key of a session (history, state, results, checkpoints, approvals it
    /// granted), unless a turn holds its lease. The removal holds the lease itself while it
    /// deletes, so no turn can start in the session half-way through.
    pub async fn remove_session(&self, tenant: &str, session: &str) -> Result<Removal, StoreError> {
        match self.hold_for_removal(tenant, session).await? {
            Some(hold) => hold.remove().await.map(Removal::Removed),
            None => Ok(Removal::Busy),
        }
    }

    /// Takes the session's lease for a removal (for at most a minute), unless a turn holds it
    /// (`None`): while held, no turn starts in the session.
    pub async fn hold_for_removal(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<SessionHold>, StoreError> {
        let token = format!("remove-session-{}", uuid::Uuid::new_v4().simple());
        if !self
            .try_lease(tenant, session, &token, REMOVAL_LEASE)
            .await?
        {
            return Ok(None);
        }
        Ok(Some(SessionHold {
            store: self.clone(),
            tenant: tenant.to_owned(),
            session: session.to_owned(),
            token,
            released: false,
        }))
    }

    /// Claims the next sweep of expired sessions' workspaces for `holder`, unless another process
    /// claimed one less than `every` ago; true if claimed. The claim is not released: it lapses,
    /// so the sweeps of every lead together run about once per `every`.
    pub async fn claim_workspace_sweep(
        &self,
        holder: &str,
        every: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let claimed: Option<String> = redis::cmd("SET")
            .arg(keys::WORKSPACE_SWEEP)
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(every.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await?;
        Ok(claimed.is_some())
    }

    /// Every key matching `pattern` (SCAN, so Redis is never blocked; every primary of a Redis
    /// Cluster).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.connection.scan(pattern, SCAN_COUNT).await?)
    }
}

/// A session's lease, held by a removal ([`SessionStore::hold_for_removal`]): no turn starts in
/// the session until the removal ends with [`remove`](Self::remove) or
/// [`release`](Self::release) (or the lease lapses, a minute after it was taken).
pub struct SessionHold {
    store: SessionStore,
    tenant: String,
    session: String,
    token: String,
    released: bool,
}

impl SessionHold {
    /// Whether the session still has what a turn loads or a client reads: its state, its
    /// history or its thread record (none of them once the session expired).
    pub async fn is_live(&self) -> Result<bool, StoreError> {
        let mut conn = self.store.connection.clone();
        let found: u64 = redis::cmd("EXISTS")
            .arg(keys::session(&self.tenant, &self.session))
            .arg(keys::history(&self.tenant, &self.session))
            .arg(keys::thread(&self.tenant, &self.session))
            .query_async(&mut conn)
            .await?;
        Ok(found > 0)
    }

    /// Deletes every key of the session but the lease, then releases the lease; returns how many
    /// keys were deleted. The lease is released even when the deletion fails.
    pub async fn remove(mut self) -> Result<usize, StoreError> {
        let deleted = self.delete_keys().await;
        let released = self.release_lease().await;
        let deleted = deleted?;
        released?;
        Ok(deleted)
    }

    /// Releases the lease and removes nothing.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.release_lease().await
    }

    async fn delete_keys(&self) -> Result<usize, StoreError> {
        let (tenant, session) = (self.tenant.as_str(), self.session.as_str());
        let lease = keys::lease(tenant, session);
        let pattern = format!(
            "{}*",
            keys::session(tenant, session).trim_end_matches("session")
        );
        let found: Vec<String> = self
            .store
            .scan(&pattern)
            .await?
            .into_iter()
            .filter(|key| *key != lease)
            .collect();
        let mut conn = self.store.connection.clone();
        for batch in found.chunks(SCAN_COUNT) {
            let _: i64 = conn.del(batch).await?;
        }
        Ok(found.len())
    }

    async fn release_lease(&mut self) -> Result<(), StoreError> {
        self.released = true;
        self.store
            .release_lease(&self.tenant, &self.session, &self.token)
            .await
            .map(drop)
    }
}

impl Drop for SessionHold {
    fn drop(&mut self) {
        if !self.released {
            tracing::warn!(
                tenant = %self.tenant,
                session = %self.session,
                "a session held for removal was not released; its lease lapses within a minute"
            );
        }
    }
}

/// The session a session key names (`skein:{tenant:session}:session`).
fn session_of_key<'a>(tenant: &str, key: &'a str) -> Option<&'a str> {
    key.strip_prefix(&format!("skein:{{{tenant}:"))?
        .strip_suffix("}:session")
}

#[cfg(test)]
mod tests {
    #[test]
    fn session_keys_name_their_session() {
        assert_eq!(
            super::session_of_key("acme", "skein:{acme:s-1}:session"),
            Some("s-1")
        );
        assert_eq!(
            super::session_of_key("acme", "skein:{other:s-1}:session"),
            None
        );
        assert_eq!(
            super::session_of_key("acme", "skein:{acme:s-1}:history"),
            None
        );
    }
}
