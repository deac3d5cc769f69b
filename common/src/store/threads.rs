//! Sessions as threads of the gateway's Agent Protocol, and the runs started on them: when a
//! thread was made and changed and its metadata (`ThreadRecord`), which task each run follows
//! (`RunRecord`), and the tenant's threads by creation time for search.
//!
//! Invariants: a thread's and its runs' keys share the session's hash tag, so removing the
//! session removes them, and they expire as sessions do (`SKEIN_SESSION_TTL`); the tenant's index
//! may name a thread whose record is gone (expired): readers drop it. A thread is made once
//! (`SET NX`): a second create of the same id finds the first.

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{decode, keys, SessionStore, StoreError};

/// A thread: a session as the Agent Protocol shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRecord {
    /// The thread id, which is the session's name.
    pub thread_id: String,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// The caller's metadata (a JSON object).
    #[serde(default)]
    pub metadata: Value,
}

/// A run: one stretch of a task on a thread, from its start (or from the interrupt it resumes)
/// to its end or its next interrupt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub thread_id: String,
    /// The agent.
    pub assistant_id: String,
    /// The task whose events the run is: its own, or the one whose interrupt it resumes.
    pub task_id: String,
    pub created_at_ms: u64,
    #[serde(default)]
    pub metadata: Value,
    /// `reject`, `interrupt`, `rollback` or `enqueue`.
    pub multitask_strategy: String,
    /// The user's input that started its task.
    #[serde(default)]
    pub input: String,
    /// The events of its task before the run begins: a run that resumes its task starts after
    /// the events it held when the run answered its calls.
    #[serde(default)]
    pub after_events: u64,
    /// Set once a later run resumes this run's interrupt: the run ended interrupted.
    #[serde(default)]
    pub resumed_by: Option<String>,
    /// The stream modes it was started with (none: a background run that asked for none), so a
    /// client that reconnects without naming them reads the parts it saw.
    #[serde(default)]
    pub stream_mode: Vec<String>,
}

impl SessionStore {
    /// Makes thread `record` unless it exists; returns the record that stands and whether it is
    /// new.
    pub async fn create_thread(
        &self,
        tenant: &str,
        record: &ThreadRecord,
    ) -> Result<(ThreadRecord, bool), StoreError> {
        let key = keys::thread(tenant, &record.thread_id);
        if !self.set_new_json(&key, record).await? {
            let standing = self
                .thread(tenant, &record.thread_id)
                .await?
                .ok_or(StoreError::UnexpectedReply("SET NX of a thread record"))?;
            return Ok((standing, false));
        }
        let mut conn = self.connection.clone();
        let () = conn
            .zadd(
                keys::threads(tenant),
                &record.thread_id,
                record.created_at_ms,
            )
            .await?;
        Ok((record.clone(), true))
    }

    /// Replaces an existing thread's record (its metadata, when it changed); false when there is
    /// none.
    pub async fn update_thread(
        &self,
        tenant: &str,
        record: &ThreadRecord,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(record).map_err(StoreError::Corrupt)?;
        let mut set = redis::cmd("SET");
        set.arg(keys::thread(tenant, &record.thread_id))
            .arg(&json)
            .arg("XX");
        if self.session_ttl_secs > 0 {
            set.arg("EX").arg(self.session_ttl_secs);
        }
        let mut conn = self.connection.clone();
        let stored: Option<String> = set.query_async(&mut conn).await?;
        Ok(stored.is_some())
    }

    /// Thread `thread_id` of `tenant`, if it exists.
    pub async fn thread(
        &self,
        tenant: &str,
        thread_id: &str,
    ) -> Result<Option<ThreadRecord>, StoreError> {
        self.get_json(keys::thread(tenant, thread_id)).await
    }

    /// The tenant's threads, newest first (those whose records expired dropped from the index).
    pub async fn threads(&self, tenant: &str) -> Result<Vec<ThreadRecord>, StoreError> {
        let mut conn = self.connection.clone();
        let ids: Vec<String> = conn.zrevrange(keys::threads(tenant), 0, -1).await?;
        let mut found = Vec::with_capacity(ids.len());
        let mut gone = Vec::new();
        for batch in ids.chunks(256) {
            let mut pipe = redis::pipe();
            for id in batch {
                pipe.get(keys::thread(tenant, id));
            }
            let records: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
            for (id, record) in batch.iter().zip(records) {
                match record {
                    Some(json) => found.push(decode::<ThreadRecord>(&json)?),
                    None => gone.push(id.clone()),
                }
            }
        }
        if !gone.is_empty() {
            let () = conn.zrem(keys::threads(tenant), gone).await?;
        }
        Ok(found)
    }

    /// Takes a removed thread out of the tenant's index (its keys go with its session).
    pub async fn forget_thread(&self, tenant: &str, thread_id: &str) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let () = conn.zrem(keys::threads(tenant), thread_id).await?;
        Ok(())
    }

    /// Records (or replaces) a run of a thread.
    pub async fn put_run(&self, tenant: &str, run: &RunRecord) -> Result<(), StoreError> {
        let key = keys::thread_runs(tenant, &run.thread_id);
        let json = serde_json::to_string(run).map_err(StoreError::Corrupt)?;
        let mut pipe = redis::pipe();
        pipe.hset(&key, &run.run_id, json).ignore();
        if self.session_ttl_secs > 0 {
            // A thread in use lives as long as its session: each run renews both records.
            let ttl = self.session_ttl_secs as i64;
            pipe.expire(&key, ttl).ignore();
            pipe.expire(keys::thread(tenant, &run.thread_id), ttl)
                .ignore();
        }
        let mut conn = self.connection.clone();
        let () = pipe.query_async(&mut conn).await?;
        Ok(())
    }

    /// Run `run_id` of thread `thread_id`, if recorded.
    pub async fn run(
        &self,
        tenant: &str,
        thread_id: &str,
        run_id: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        let mut conn = self.connection.clone();
        let json: Option<String> = conn
            .hget(keys::thread_runs(tenant, thread_id), run_id)
            .await?;
        json.map(|json| decode(&json)).transpose()
    }

    /// The thread's runs, newest first.
    pub async fn runs(&self, tenant: &str, thread_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let mut conn = self.connection.clone();
        let all: Vec<(String, String)> = conn.hgetall(keys::thread_runs(tenant, thread_id)).await?;
        let mut runs = all
            .iter()
            .map(|(_, json)| decode::<RunRecord>(json))
            .collect::<Result<Vec<_>, _>>()?;
        runs.sort_by(|a, b| {
            b.created_at_ms
                .cmp(&a.created_at_ms)
                .then_with(|| b.run_id.cmp(&a.run_id))
        });
        Ok(runs)
    }
}
