//! Sessions as an operator sees them: the sessions of a tenant with their size and time left, and
//! removing one whole (every key of its tag) when no turn runs in it.

use redis::AsyncCommands;

use super::{keys, SessionState, SessionStore, StoreError};

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
        let Some(task_id) = token.and_then(|t| t.rsplit_once(':').map(|(_, task)| task.to_owned()))
        else {
            return Ok(None);
        };
        let checkpoint = self
            .get_json(keys::checkpoint(tenant, session, &task_id))
            .await?;
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
        let token = format!("remove-session-{}", uuid::Uuid::new_v4().simple());
        if !self
            .try_lease(tenant, session, &token, REMOVAL_LEASE)
            .await?
        {
            return Ok(Removal::Busy);
        }
        let lease = keys::lease(tenant, session);
        let pattern = format!(
            "{}*",
            keys::session(tenant, session).trim_end_matches("session")
        );
        let found: Vec<String> = self
            .scan(&pattern)
            .await?
            .into_iter()
            .filter(|key| *key != lease)
            .collect();
        let mut conn = self.connection.clone();
        for batch in found.chunks(SCAN_COUNT) {
            let _: i64 = conn.del(batch).await?;
        }
        self.release_lease(tenant, session, &token).await?;
        Ok(Removal::Removed(found.len()))
    }

    /// Every key matching `pattern` (SCAN, so Redis is never blocked; every primary of a Redis
    /// Cluster).
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.connection.scan(pattern, SCAN_COUNT).await?)
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
