//! Call state on the store: a call's recorded result (the first write wins), its attempt count
//! (admission in one trip), the checkpoints of a subagent call's child turn, and forgetting a
//! call's outcome for a replay.

use redis::{AsyncCommands, Script};

use super::{
    keys, parse_number, CallAdmission, SessionStore, StoreError, TurnCheckpoint, ATTEMPTS_TTL_SECS,
    CHECKPOINT_TTL_SECS, RESULTS_TTL_SECS,
};
use crate::protocol::ToolResult;

/// Admits a call on a worker in one trip: its recorded result if there is one, else counts the
/// attempt. KEYS[1] results, KEYS[2] attempts; ARGV call key, attempts ttl seconds. Returns
/// {0, result}; {1, n} (n counted, the first count of the call); {2, n} (counted before).
const ADMIT_SCRIPT: &str = r#"
local recorded = redis.call('HGET', KEYS[1], ARGV[1])
if recorded then return {0, recorded} end
local existed = redis.call('HEXISTS', KEYS[2], ARGV[1])
local n = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {1 + existed, tostring(n)}
"#;

impl SessionStore {
    /// Saves the progress of a subagent call's child turn. Not fenced by a lease: a subagent task
    /// runs on one worker at a time (its delivery is kept alive by progress acks), and the call's
    /// key is unique to it.
    pub async fn save_call_checkpoint(
        &self,
        tenant: &str,
        child_session: &str,
        call_key: &str,
        checkpoint: &TurnCheckpoint,
    ) -> Result<(), StoreError> {
        let key = keys::call_checkpoint(tenant, child_session, call_key);
        self.set_json(key, checkpoint, CHECKPOINT_TTL_SECS).await
    }

    /// The saved progress of a subagent call's child turn, if an earlier delivery left any.
    pub async fn call_checkpoint(
        &self,
        tenant: &str,
        child_session: &str,
        call_key: &str,
    ) -> Result<Option<TurnCheckpoint>, StoreError> {
        self.get_json(keys::call_checkpoint(tenant, child_session, call_key))
            .await
    }

    /// Drops a subagent call's checkpoint once its result is recorded.
    pub async fn drop_call_checkpoint(
        &self,
        tenant: &str,
        child_session: &str,
        call_key: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = conn
            .del(keys::call_checkpoint(tenant, child_session, call_key))
            .await?;
        Ok(())
    }

    /// Records a call's result under its key (`protocol::call_key`) unless one is already
    /// recorded; true if this one was recorded. The session's results live for
    /// [`RESULTS_TTL_SECS`] after the last one recorded (longer than a checkpoint that could need
    /// them).
    pub async fn record_result(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
        result: &ToolResult,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let json = serde_json::to_string(result).map_err(StoreError::Corrupt)?;
        let key = keys::results(tenant, session, call_key);
        let (fresh, _): (bool, bool) = redis::pipe()
            .atomic()
            .hset_nx(&key, call_key, json)
            .expire(&key, RESULTS_TTL_SECS as i64)
            .query_async(&mut conn)
            .await?;
        Ok(fresh)
    }

    /// The recorded result of a call, if any.
    pub async fn recorded_result(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
    ) -> Result<Option<ToolResult>, StoreError> {
        let mut conn = self.connection.clone();
        let json: Option<String> = conn
            .hget(keys::results(tenant, session, call_key), call_key)
            .await?;
        json.map(|j| serde_json::from_str(&j).map_err(StoreError::Corrupt))
            .transpose()
    }

    /// Admits a call on a worker: its recorded result if an earlier delivery finished it, else
    /// the number of this attempt (counted). Counting attempts ourselves keeps retries bounded
    /// without relying on the broker's max-deliveries advisories, which nats-server 2.9 sends as
    /// core messages only.
    pub async fn admit_call(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
    ) -> Result<CallAdmission, StoreError> {
        let mut conn = self.connection.clone();
        let (recorded, value): (i64, String) = Script::new(ADMIT_SCRIPT)
            .key(keys::results(tenant, session, call_key))
            .key(keys::attempts(tenant, session, call_key))
            .arg(call_key)
            .arg(ATTEMPTS_TTL_SECS)
            .invoke_async(&mut conn)
            .await?;
        if recorded == 0 {
            Ok(CallAdmission::Recorded(
                serde_json::from_str(&value).map_err(StoreError::Corrupt)?,
            ))
        } else {
            Ok(CallAdmission::Attempt {
                count: parse_number("attempt count", &value)?,
                first_count: recorded == 1,
            })
        }
    }

    /// Notes that a call's first delivery, which runs without being counted, was handed back: it
    /// was no attempt, so later deliveries must not count it as one (which they do for a first
    /// delivery that left no trace: its worker crashed).
    pub async fn note_uncounted_hand_back(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let key = keys::attempts(tenant, session, call_key);
        let () = redis::pipe()
            .atomic()
            .hset_nx(&key, call_key, 0)
            .ignore()
            .expire(&key, ATTEMPTS_TTL_SECS as i64)
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Forgets a call's recorded result and attempts, so it can run again (replay of a dead
    /// letter).
    pub async fn forget_call(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let () = redis::pipe()
            .atomic()
            .hdel(keys::results(tenant, session, call_key), call_key)
            .ignore()
            .hdel(keys::attempts(tenant, session, call_key), call_key)
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}
