//! Approval requests of suspended turns and the answers given to them, in Redis.
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `skein:approvals:{tenant}` | hash request key → `ApprovalRequest` (without answers) | the tenant's suspended turns and waiting subagent runs |
//! | `skein:answers:{tenant}:{key}` | hash call_id → `ApprovalAnswer` | answers, first answer wins (expire 30 days after the last) |
//!
//! A request's key is its task id for the task's own turn, `{task_id}/{child session}` for a
//! subagent run of the task (`protocol::approval_key`).
//! | `skein:{t:s}:approved` | set of rules | rules a person approved for the rest of a session (`--always`) |
//!
//! Invariants: a request is written only by the lead holding the session's lease, or by the
//! worker holding the subagent task's delivery (so two writes of one request never race); an answer is recorded only for a call the stored request waits on,
//! and never replaced (the first answer wins, so a person's `deny` cannot be overturned by a late
//! `approve`, nor the reverse); the two tenant keys share the hash tag `{tenant}`.

use redis::AsyncCommands;

use super::{decode, keys, lua::Lua, SessionStore, StoreError};
use crate::protocol::{ApprovalAnswer, ApprovalRequest};

/// How long answers are kept after the last one.
const ANSWERS_TTL_SECS: i64 = 30 * 24 * 3600;

/// Records an answer for one call (`ARGV[2]`) or for every call of the request (`ARGV[2]` empty).
/// KEYS: requests hash, answers hash. ARGV: request key, call id or '', answer JSON, ttl seconds.
/// Returns -1 when no request is stored, -2 when the call is not one it waits on, else how many
/// calls got this answer (0: all were answered already).
static ANSWER_SCRIPT: Lua = Lua::new(
    r#"
local request = redis.call('HGET', KEYS[1], ARGV[1])
if not request then return -1 end
local calls = cjson.decode(request).calls
local recorded = 0
local known = false
for _, call in ipairs(calls) do
  if ARGV[2] == '' or call.call_id == ARGV[2] then
    known = true
    recorded = recorded + redis.call('HSETNX', KEYS[2], call.call_id, ARGV[3])
  end
end
if not known then return -2 end
redis.call('EXPIRE', KEYS[2], ARGV[4])
return recorded
"#,
);

/// How recording an answer came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// This many calls got the answer (0: they were answered already).
    Recorded(u64),
    /// No turn of the tenant waits with this task id.
    NoRequest,
    /// The task waits, but not on this call.
    UnknownCall,
}

impl SessionStore {
    /// Stores (or refreshes) the request of a suspended turn; an earlier request of the same task
    /// keeps its first request time and expiry.
    pub async fn save_approval_request(
        &self,
        request: &ApprovalRequest,
    ) -> Result<ApprovalRequest, StoreError> {
        let key = keys::approvals(&request.tenant);
        let field = request.key();
        let mut conn = self.connection.clone();
        let earlier: Option<String> = conn.hget(&key, &field).await?;
        let mut stored = request.clone();
        stored.answers.clear();
        if let Some(earlier) = earlier {
            if let Ok(earlier) = decode::<ApprovalRequest>(&earlier) {
                stored.requested_at_ms = earlier.requested_at_ms;
                stored.expires_at_ms = earlier.expires_at_ms;
            }
        }
        let json = serde_json::to_string(&stored).map_err(StoreError::Corrupt)?;
        let () = conn.hset(&key, &field, json).await?;
        Ok(stored)
    }

    /// A request with its answers, by its key (`protocol::approval_key`: the task id for the
    /// task's own turn), if that turn or run waits.
    pub async fn approval_request(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        let mut conn = self.connection.clone();
        let (request, answers): (Option<String>, Vec<(String, String)>) = redis::pipe()
            .hget(keys::approvals(tenant), key)
            .hgetall(keys::answers(tenant, key))
            .query_async(&mut conn)
            .await?;
        let Some(request) = request else {
            return Ok(None);
        };
        let mut request: ApprovalRequest = decode(&request)?;
        for (call_id, answer) in answers {
            request.answers.insert(call_id, decode(&answer)?);
        }
        Ok(Some(request))
    }

    /// Every request of a tenant's suspended turns (without answers), oldest first.
    pub async fn approval_requests(
        &self,
        tenant: &str,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let mut conn = self.connection.clone();
        let all: Vec<(String, String)> = conn.hgetall(keys::approvals(tenant)).await?;
        let mut requests = Vec::with_capacity(all.len());
        for (key, json) in all {
            match decode::<ApprovalRequest>(&json) {
                Ok(request) => requests.push(request),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "unreadable approval request skipped")
                }
            }
        }
        requests.sort_by_key(|r| r.requested_at_ms);
        Ok(requests)
    }

    /// Records an answer to one call (`call_id`) of the request under `key`, or to all its
    /// waiting calls.
    pub async fn answer_approval(
        &self,
        tenant: &str,
        key: &str,
        call_id: Option<&str>,
        answer: &ApprovalAnswer,
    ) -> Result<Answered, StoreError> {
        let json = serde_json::to_string(answer).map_err(StoreError::Corrupt)?;
        let mut conn = self.connection.clone();
        let recorded: i64 = ANSWER_SCRIPT
            .key(keys::approvals(tenant))
            .key(keys::answers(tenant, key))
            .arg(key)
            .arg(call_id.unwrap_or(""))
            .arg(json)
            .arg(ANSWERS_TTL_SECS)
            .invoke_async(&mut conn)
            .await?;
        Ok(match recorded {
            -1 => Answered::NoRequest,
            -2 => Answered::UnknownCall,
            n => Answered::Recorded(n.max(0) as u64),
        })
    }

    /// Forgets a request and its answers, by its key (its turn or run ended, or was cancelled).
    pub async fn clear_approval(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let () = redis::pipe()
            .hdel(keys::approvals(tenant), key)
            .ignore()
            .del(keys::answers(tenant, key))
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Rules approved for the rest of a session.
    pub async fn session_rules(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self.connection.clone();
        Ok(conn.smembers(keys::approved_rules(tenant, session)).await?)
    }

    /// Approves `rule` for the rest of a session.
    pub async fn add_session_rule(
        &self,
        tenant: &str,
        session: &str,
        rule: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = conn
            .sadd(keys::approved_rules(tenant, session), rule)
            .await?;
        Ok(())
    }
}
