//! Call state on the store: a call's recorded result (the first write wins), its attempt count
//! (admission in one trip), the marker of a run in progress (so a redelivered copy waits for the
//! running one instead of running beside it), the checkpoints of a subagent call's child turn and
//! its outcome saved with the child session, and forgetting a call's outcome for a replay.

use redis::AsyncCommands;

use super::{
    keys, lua::Lua, parse_number, CallAdmission, SessionStore, StoreError, TurnCheckpoint,
    ATTEMPTS_TTL_SECS, CHECKPOINT_TTL_SECS, RESULTS_TTL_SECS,
};
use crate::protocol::{CallOutcome, SubagentTask, TaskSubmission, ToolResult, ToolTask};

/// What an earlier delivery of a subagent call left in its child session.
#[derive(Debug)]
pub enum ChildProgress {
    /// Nothing: the child turn starts from the beginning.
    Fresh,
    /// The child turn's progress, to resume from.
    Resume(TurnCheckpoint),
    /// The child turn ended and was saved with this outcome: only its recording is left.
    Ended(CallOutcome),
}

/// Admits a call on a worker in one trip: its recorded result if there is one; else, when
/// another run holds the call's marker, who; else counts the attempt and takes the marker.
/// KEYS[1] results, KEYS[2] attempts, KEYS[3] running marker; ARGV call key, attempts ttl
/// seconds, owner, marker ttl milliseconds. Returns {0, result}; {3, owner}; {1, n} (n counted,
/// the first count of the call); {2, n} (counted before).
static ADMIT_SCRIPT: Lua = Lua::new(
    r#"
local recorded = redis.call('HGET', KEYS[1], ARGV[1])
if recorded then return {0, recorded} end
local running = redis.call('GET', KEYS[3])
if running and running ~= ARGV[3] then return {3, running} end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
local existed = redis.call('HEXISTS', KEYS[2], ARGV[1])
local n = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return {1 + existed, tostring(n)}
"#,
);

/// Takes or renews a call's running marker for ARGV[1] (ttl ARGV[2] ms) unless another owner
/// holds it. KEYS[1] the marker. Returns 1 if held by ARGV[1] now, 0 if held by another.
static CLAIM_SCRIPT: Lua = Lua::new(
    r#"
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#,
);

/// Drops a call's running marker if ARGV[1] holds it. KEYS[1] the marker.
static RELEASE_SCRIPT: Lua = Lua::new(
    r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#,
);

/// Where a call's result is recorded: its task's results hash and the call's field in it. A call
/// waiting for its result keeps this, not its task's origin.
#[derive(Debug, Clone)]
pub struct ResultSlot {
    hash: String,
    call_key: String,
}

impl ResultSlot {
    pub fn new(tenant: &str, session: &str, call_key: &str) -> Self {
        Self {
            hash: keys::results(tenant, session, call_key),
            call_key: call_key.to_owned(),
        }
    }
}

/// A call's run in progress, as the store knows it: who runs it and for how long the marker lives
/// without renewal.
#[derive(Debug, Clone, Copy)]
pub struct RunMarker<'a> {
    /// Unique to one run (worker instance and a nonce), so a worker's own redelivered copy waits
    /// too.
    pub owner: &'a str,
    /// Lifetime of the marker without renewal; shorter than the broker's ack wait, so the marker
    /// of a run whose worker died has expired by the time its task is redelivered.
    pub ttl: std::time::Duration,
}

impl SessionStore {
    /// Takes or renews a call's running marker for `marker.owner`; false when another run holds
    /// it (two runs of one call are then under way: the caller logs it; the result recorded
    /// first wins either way).
    pub async fn claim_call(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
        marker: RunMarker<'_>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let held: i64 = CLAIM_SCRIPT
            .key(keys::running_call(tenant, session, call_key))
            .arg(marker.owner)
            .arg(marker.ttl.as_millis().max(1) as u64)
            .invoke_async(&mut conn)
            .await?;
        Ok(held == 1)
    }

    /// Drops a call's running marker if `owner` holds it (a run handed back: the next delivery
    /// need not wait for the marker to expire).
    pub async fn release_call(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
        owner: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = RELEASE_SCRIPT
            .key(keys::running_call(tenant, session, call_key))
            .arg(owner)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

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

    /// What an earlier delivery of a subagent call left in its child session: the child turn's
    /// outcome, when it ended and was saved; else its progress, if it checkpointed any.
    pub async fn child_progress(
        &self,
        tenant: &str,
        child_session: &str,
        call_key: &str,
    ) -> Result<ChildProgress, StoreError> {
        let mut conn = self.connection.clone();
        let (outcome, checkpoint): (Option<String>, Option<String>) = redis::pipe()
            .get(keys::call_outcome(tenant, child_session, call_key))
            .get(keys::call_checkpoint(tenant, child_session, call_key))
            .query_async(&mut conn)
            .await?;
        Ok(match (outcome, checkpoint) {
            (Some(outcome), _) => ChildProgress::Ended(parse_json(&outcome)?),
            (None, Some(checkpoint)) => ChildProgress::Resume(parse_json(&checkpoint)?),
            (None, None) => ChildProgress::Fresh,
        })
    }

    /// Saves a subagent call's child session and the call's outcome in one write (one script on
    /// the child session's slot): a worker that dies after it leaves the outcome for the next
    /// delivery to record, which does not run the child turn again. `Conflict` when the child
    /// session changed since it was loaded at `expected_version`; nothing is written then.
    pub async fn save_child_turn(
        &self,
        tenant: &str,
        child_session: &str,
        expected_version: u64,
        state: &super::SessionState,
        call_key: &str,
        outcome: &CallOutcome,
    ) -> Result<u64, StoreError> {
        let json = crate::json_out::to_string(outcome).map_err(StoreError::Corrupt)?;
        let key = keys::call_outcome(tenant, child_session, call_key);
        self.save_with(
            tenant,
            child_session,
            expected_version,
            state,
            Some((key, json)),
        )
        .await
    }

    /// Drops what a subagent call's child turn left (its checkpoint, its saved outcome) once the
    /// call's result is recorded.
    pub async fn drop_call_checkpoint(
        &self,
        tenant: &str,
        child_session: &str,
        call_key: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = conn
            .del(&[
                keys::call_checkpoint(tenant, child_session, call_key),
                keys::call_outcome(tenant, child_session, call_key),
            ])
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
        let json = crate::json_out::to_string(result).map_err(StoreError::Corrupt)?;
        let key = keys::results(tenant, session, call_key);
        // The run is over once its result is recorded: its marker goes in the same trip (a copy
        // waiting on it finds the result first).
        let (fresh, _, _): (bool, bool, i64) = redis::pipe()
            .atomic()
            .hset_nx(&key, call_key, json)
            .expire(&key, RESULTS_TTL_SECS as i64)
            .del(keys::running_call(tenant, session, call_key))
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
        self.recorded_result_in(&ResultSlot::new(tenant, session, call_key))
            .await
    }

    /// The result recorded in `slot`, if any.
    pub async fn recorded_result_in(
        &self,
        slot: &ResultSlot,
    ) -> Result<Option<ToolResult>, StoreError> {
        let mut conn = self.connection.clone();
        let json: Option<String> = conn.hget(&slot.hash, &slot.call_key).await?;
        json.map(|j| serde_json::from_str(&j).map_err(StoreError::Corrupt))
            .transpose()
    }

    /// Admits a call on a worker: its recorded result if an earlier delivery finished it; that
    /// another run is in progress (its marker held by another owner); else the number of this
    /// attempt (counted), its marker taken for `marker.owner`. Counting attempts ourselves keeps
    /// retries bounded without relying on the broker's max-deliveries advisories, which
    /// nats-server 2.9 sends as core messages only.
    pub async fn admit_call(
        &self,
        tenant: &str,
        session: &str,
        call_key: &str,
        marker: RunMarker<'_>,
    ) -> Result<CallAdmission, StoreError> {
        let mut conn = self.connection.clone();
        let (answer, value): (i64, String) = ADMIT_SCRIPT
            .key(keys::results(tenant, session, call_key))
            .key(keys::attempts(tenant, session, call_key))
            .key(keys::running_call(tenant, session, call_key))
            .arg(call_key)
            .arg(ATTEMPTS_TTL_SECS)
            .arg(marker.owner)
            .arg(marker.ttl.as_millis().max(1) as u64)
            .invoke_async(&mut conn)
            .await?;
        match answer {
            0 => Ok(CallAdmission::Recorded(
                serde_json::from_str(&value).map_err(StoreError::Corrupt)?,
            )),
            3 => Ok(CallAdmission::RunningElsewhere { owner: value }),
            _ => Ok(CallAdmission::Attempt {
                count: parse_number("attempt count", &value)?,
                first_count: answer == 1,
            }),
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
    /// letter). A run still in progress keeps its marker: the replayed copy waits for it.
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

/// Why a dead letter's outcome could not be forgotten.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    /// The letter's body is not the work its subject names: it cannot be replayed.
    #[error("it cannot be decoded as a {0} task, so it cannot be replayed")]
    Undecodable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SessionStore {
    /// Forgets what the work set aside as a dead letter left behind — a submission's turn, a
    /// tool or subagent call's result and attempts — so that its replay runs the work again
    /// instead of answering with the old failure. `original_subject` names the work
    /// (`skein.submit.…`, `skein.tool.…`, `skein.agent.…`); `payload` is its body.
    pub async fn forget_dead_work(
        &self,
        original_subject: &str,
        payload: &[u8],
    ) -> Result<(), ForgetError> {
        let kind = crate::subjects::kind(original_subject);
        let undecodable = || ForgetError::Undecodable(kind.to_owned());
        match kind {
            "submit" => {
                let task: TaskSubmission =
                    serde_json::from_slice(payload).map_err(|_| undecodable())?;
                self.forget_turn(&task.tenant, &task.session, &task.task_id)
                    .await?;
            }
            "tool" => {
                let task: ToolTask = serde_json::from_slice(payload).map_err(|_| undecodable())?;
                self.forget_call(&task.origin.tenant, &task.origin.session, &task.call_key)
                    .await?;
            }
            "agent" => {
                let task: SubagentTask =
                    serde_json::from_slice(payload).map_err(|_| undecodable())?;
                self.forget_call(&task.origin.tenant, &task.origin.session, &task.call_key)
                    .await?;
            }
            _ => return Err(undecodable()),
        }
        Ok(())
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, StoreError> {
    serde_json::from_str(json).map_err(StoreError::Corrupt)
}
